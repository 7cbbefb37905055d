cd /workspace
cat > shop/pricing.py <<'PY'
TAX_RATE = 0.2


def {{ new_name }}(prices, discount_pct=0.0):
    """Sum of prices, less discount_pct percent, plus tax, rounded to cents."""
    subtotal = sum(prices) * (1 - discount_pct / 100)
    return round(subtotal * (1 + TAX_RATE), 2)
PY
cat > shop/cart.py <<'PY'
from shop.pricing import {{ new_name }}


class Cart:
    def __init__(self):
        self.items = []

    def add(self, name, price):
        self.items.append((name, price))

    def total(self, discount_pct=0.0):
        return {{ new_name }}([price for _, price in self.items], discount_pct=discount_pct)
PY
python3 - <<'PY'
path = "shop/cli.py"
src = open(path).read()
src = src.replace('    args = parser.parse_args(argv)\n',
                  '    parser.add_argument("--code", default=None)\n    args = parser.parse_args(argv)\n')
src = src.replace("cart.total()", "cart.total(discount_pct=10.0 if args.code == '{{ code }}' else 0.0)")
open(path, "w").write(src)
PY
