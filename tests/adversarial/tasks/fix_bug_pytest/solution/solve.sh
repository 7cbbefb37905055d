python3 - <<'PY'
import re
path = "/workspace/mathutils.py"
src = open(path).read()
src = src.replace("min(x, low)", "min(x, high)").replace("(len(xs) + 1)", "len(xs)").replace('text.split(" ")', "text.split()")
open(path, "w").write(src)
PY
