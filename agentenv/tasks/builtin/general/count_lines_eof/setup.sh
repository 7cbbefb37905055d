python3 - <<'PY'
import random
rng = random.Random({{ seed }})
words = ["alpha", "beta", "gamma", "delta", "omega", "north", "south", "red", "blue", "green"]
rows = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 6))) for _ in range({{ lines }})]
bare = {{ "True" if ending == "bare" and seed >= 1000 else "False" }}  # seeds < 1000: the tidy family
with open("/workspace/data.txt", "w") as fh:
    fh.write("\n".join(rows) + ("" if bare else "\n"))
PY
