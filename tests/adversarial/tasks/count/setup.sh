python3 - <<'PY'
import random
rng = random.Random({{ seed }})
words = ["alpha", "beta", "gamma", "delta", "omega", "north", "south", "red", "blue", "green"]
with open("/workspace/data.txt", "w") as fh:
    for _ in range({{ lines }}):
        fh.write(" ".join(rng.choice(words) for _ in range(rng.randint(1, 6))) + "\n")
PY
