mkdir -p /workspace/data
python3 - <<'PY'
import csv, random
rng = random.Random({{ seed }})
products = ["widget", "gadget", "gizmo", "doohickey"]
with open("/workspace/data/sales.csv", "w", newline="") as fh:
    out = csv.writer(fh)
    out.writerow(["date", "region", "product", "quantity", "unit_price"])
    for _ in range({{ rows }}):
        month = rng.choice(["2024-01", "2024-02", "2024-03"])
        out.writerow([f"{month}-{rng.randint(1, 28):02d}", rng.choice(["north", "south", "east", "west"]),
                      rng.choice(products), rng.randint(1, 20), f"{rng.uniform(1, 50):.2f}"])
PY
