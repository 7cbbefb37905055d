mkdir -p /workspace/inbox
python3 - <<'PY'
import csv, random, sqlite3
rng = random.Random({{ seed }})
db = sqlite3.connect("/workspace/crm.db")
db.executescript("""
CREATE TABLE customers (id INTEGER PRIMARY KEY, email TEXT UNIQUE NOT NULL);
CREATE TABLE products (sku TEXT PRIMARY KEY, name TEXT NOT NULL);
CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL, sku TEXT NOT NULL, qty INTEGER NOT NULL);
""")
emails = [f"user{i}@example.com" for i in range(1, 9)]
skus = [f"SKU-{100 + i}" for i in range(6)]
for i, email in enumerate(emails, 1):
    db.execute("INSERT INTO customers VALUES (?, ?)", (i, email))
for sku in skus:
    db.execute("INSERT INTO products VALUES (?, ?)", (sku, sku.lower()))
db.commit()
with open("/workspace/inbox/orders.csv", "w", newline="") as fh:
    out = csv.writer(fh)
    out.writerow(["order_id", "customer_email", "sku", "qty"])
    for n in range({{ rows }}):
        email = rng.choice(emails + ["stranger@example.com"])
        sku = rng.choice(skus + ["SKU-999"])
        qty = rng.choice([str(rng.randint(1, 12)), "0", "two"]) if rng.random() < 0.25 else str(rng.randint(1, 9))
        out.writerow([1000 + n, email, sku, qty])
PY
