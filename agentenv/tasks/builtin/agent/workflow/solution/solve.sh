python3 - <<'PY'
import csv, sqlite3
db = sqlite3.connect("/workspace/crm.db")
customers = dict(db.execute("SELECT email, id FROM customers"))
skus = {row[0] for row in db.execute("SELECT sku FROM products")}
rows = list(csv.reader(open("/workspace/inbox/orders.csv", newline="")))
header, body = rows[0], rows[1:]
rejected = []
imported = 0
for order_id, email, sku, qty in body:
    ok = email in customers and sku in skus and qty.isdigit() and 1 <= int(qty) <= {{ max_qty }}
    if ok:
        db.execute("INSERT INTO orders VALUES (?, ?, ?, ?)", (int(order_id), customers[email], sku, int(qty)))
        imported += 1
    else:
        rejected.append([order_id, email, sku, qty])
db.commit()
with open("/workspace/rejected.csv", "w", newline="") as fh:
    csv.writer(fh).writerows([header, *rejected])
open("/workspace/summary.txt", "w").write(f"imported {imported} rejected {len(rejected)}\n")
PY
