mkdir -p /workspace/logs
python3 - <<'PY'
import random
rng = random.Random({{ seed }})
services = ["auth", "billing", "search", "checkout", "inventory", "mailer"]
weights = [rng.random() for _ in services]
top = rng.randrange(len(services))
weights[top] += 1.5  # one clear winner, so the answer is unique
levels = ["INFO", "INFO", "INFO", "DEBUG", "WARN", "ERROR"]
counts = {}
with open("/workspace/logs/app.log", "w") as fh:
    for i in range({{ lines }}):
        level = rng.choice(levels)
        service = rng.choices(services, weights=weights)[0] if level in ("ERROR", "WARN") else rng.choice(services)
        counts[(service, level)] = counts.get((service, level), 0) + 1
        fh.write(f"2024-05-01T{i // 3600:02d}:{i // 60 % 60:02d}:{i % 60:02d}Z {level} {service}: event {rng.randint(1000, 9999)}\n")
    # make the winner unique for the asked level
    best = max(services, key=lambda s: counts.get((s, "{{ level }}"), 0))
    for _ in range(3):
        fh.write(f"2024-05-01T23:59:59Z {{ level }} {best}: burst\n")
PY
