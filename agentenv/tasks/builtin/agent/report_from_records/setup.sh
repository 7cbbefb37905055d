mkdir -p /workspace/records
python3 - <<'PY'
import json, random
rng = random.Random({{ seed }})
departments = ["sales", "engineering", "support", "finance", "legal"]
for i in range({{ people }}):
    person = {"name": f"person{i:03d}", "department": rng.choice(departments), "salary": rng.randint(40, 160) * 1000,
              "hired": rng.randint(2010, 2024), "active": rng.random() > 0.2}
    json.dump(person, open(f"/workspace/records/{person['name']}.json", "w"))
PY
