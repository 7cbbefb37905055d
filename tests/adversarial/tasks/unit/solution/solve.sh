sed -i 's/a - b/a + b/' /workspace/calc.py
