set -e
agentenv-pg-start
psql -h /tmp -d postgres -qAt -c "CREATE DATABASE shop STRATEGY FILE_COPY" >/dev/null
python3 - <<'PY' | psql -h /tmp -d shop -q -v ON_ERROR_STOP=1 >/dev/null
import random
rng = random.Random({{ seed }})
print("CREATE TABLE customers (id integer PRIMARY KEY, name text NOT NULL, loyalty text NOT NULL DEFAULT 'standard');")
print("CREATE TABLE items (id integer PRIMARY KEY, name text NOT NULL, stock integer NOT NULL, price numeric(8,2) NOT NULL);")
print("CREATE TABLE orders (id integer PRIMARY KEY, customer_id integer NOT NULL REFERENCES customers(id), item_id integer NOT NULL REFERENCES items(id));")
for i in range(1, 11):
    print(f"INSERT INTO customers VALUES ({i}, 'customer-{i}', 'standard');")
for i in range(1, 16):
    print(f"INSERT INTO items VALUES ({i}, 'item-{i}', {rng.randint(0, 12)}, {rng.uniform(1, 99):.2f});")
for i in range(1, 51):
    print(f"INSERT INTO orders VALUES ({i}, {rng.randint(1, 10)}, {rng.randint(1, 15)});")
PY
