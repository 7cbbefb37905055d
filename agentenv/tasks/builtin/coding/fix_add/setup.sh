cat > /workspace/calc.py <<'PY'
def add(a, b):
    return a - b


def sub(a, b):
    return a - b
PY
