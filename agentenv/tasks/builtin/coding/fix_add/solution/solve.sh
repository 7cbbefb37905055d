sed -i '2s/a - b/a + b/' /workspace/calc.py
