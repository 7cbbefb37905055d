python3 - <<'PY'
import random, sqlite3
rng = random.Random({{ seed }})
db = sqlite3.connect("/workspace/shop.db")
db.executescript("""
CREATE TABLE products (id INTEGER PRIMARY KEY, name TEXT NOT NULL, category TEXT NOT NULL, price REAL NOT NULL);
CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, tier TEXT NOT NULL);
CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customers(id),
                     product_id INTEGER NOT NULL REFERENCES products(id), created TEXT NOT NULL, status TEXT NOT NULL);
""")
cats = ["tools", "garden", "kitchen", "toys"]
for i in range(1, 21):
    db.execute("INSERT INTO products VALUES (?, ?, ?, ?)", (i, f"product-{i}", cats[i % 4], round(rng.uniform(2, 90), 2)))
for i in range(1, 13):
    db.execute("INSERT INTO customers VALUES (?, ?, ?)", (i, f"customer-{i}", rng.choice(["basic", "basic", "gold"])))
for i in range(1, 61):
    db.execute("INSERT INTO orders VALUES (?, ?, ?, ?, ?)", (i, rng.randint(1, 12), rng.randint(1, 20),
               f"2024-0{rng.randint(1, 5)}-{rng.randint(1, 28):02d}", rng.choice(["pending", "pending", "shipped"])))
db.commit()
PY
