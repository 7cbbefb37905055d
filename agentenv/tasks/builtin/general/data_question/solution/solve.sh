python3 - <<'PY'
import csv
total = 0.0
for row in csv.DictReader(open("/workspace/data/sales.csv")):
    if row["region"] == "{{ region }}" and row["date"].startswith("{{ month }}"):
        total += int(row["quantity"]) * float(row["unit_price"])
open("/workspace/answer.txt", "w").write(f"{total:.2f}\n")
print(f"{total:.2f}")
PY
