python3 - <<'PY'
import random, sqlite3
rng = random.Random({{ seed }})
statuses = ["pending"] * {{ pending }} + [rng.choice(["shipped", "cancelled"]) for _ in range(rng.randint(10, 40))]
rng.shuffle(statuses)
db = sqlite3.connect("/workspace/shop.db")
db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, customer TEXT NOT NULL, status TEXT NOT NULL)")
db.executemany("INSERT INTO orders (customer, status) VALUES (?, ?)",
               [(f"customer-{rng.randint(1, 12)}", s) for s in statuses])
db.commit()
PY
