python3 - <<'PY'
import glob, json
groups = {}
for path in sorted(glob.glob("/workspace/records/*.json")):
    p = json.load(open(path))
    if p["active"] and p["hired"] >= {{ min_year }}:
        groups.setdefault(p["department"], []).append(p["salary"])
report = {d: {"headcount": len(s), "avg_salary": round(sum(s) / len(s), 2)} for d, s in sorted(groups.items())}
json.dump(report, open("/workspace/report.json", "w"), indent=2)
PY
