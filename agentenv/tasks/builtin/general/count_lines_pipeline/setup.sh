mkdir -p /workspace/pipeline
cat > /workspace/pipeline/common.py <<'PY'
"""What every stage shares: where the stages leave their output, and the digest each checks."""
import hashlib
import json
import sys

DIR = "/workspace/pipeline"
ROUNDS = 300000  # key stretching: a fraction of a second of CPU for each stage


def digest(data: bytes, stage: str) -> str:
    return hashlib.pbkdf2_hmac("sha256", data, stage.encode(), ROUNDS).hex()


def read(path: str, before: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except FileNotFoundError:
        sys.exit(f"{path} is missing: run {before} first")


def checked(name: str, stage: str, before: str) -> bytes:
    """``name``'s bytes, checked against the digest ``before`` wrote beside them (the ``.json`` of the same stem)."""
    data = read(f"{DIR}/{name}", before)
    meta = json.loads(read(f"{DIR}/{name.rsplit('.', 1)[0]}.json", before))
    if digest(data, stage) != meta["digest"]:
        sys.exit(f"{name} does not match its digest: run {before} again")
    return data
PY
cat > /workspace/pipeline/fetch.py <<'PY'
"""Stage 1: fetch the records (here: made from the dataset's seed) and write them compressed, with their digest."""
import json
import random
import zlib

from common import DIR, digest

rng = random.Random({{ seed }})
words = ["alpha", "beta", "gamma", "delta", "omega", "north", "south", "red", "blue", "green"]
rows = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 6))) for _ in range({{ lines }})]
bare = {{ "True" if ending == "bare" and seed >= 1000 else "False" }}  # seeds < 1000: the tidy family
blob = zlib.compress(("\n".join(rows) + ("" if bare else "\n")).encode())
with open(f"{DIR}/fetched.zz", "wb") as fh:
    fh.write(blob)
with open(f"{DIR}/fetched.json", "w") as fh:
    json.dump({"bytes": len(blob), "digest": digest(blob, "fetch")}, fh)
print(f"fetched {len(blob)} bytes")
PY
cat > /workspace/pipeline/unpack.py <<'PY'
"""Stage 2: check the fetched records against their digest and unpack them."""
import json
import zlib

from common import DIR, checked, digest

blob = checked("fetched.zz", "fetch", "fetch.py")
text = zlib.decompress(blob)
with open(f"{DIR}/unpacked.txt", "wb") as fh:
    fh.write(text)
with open(f"{DIR}/unpacked.json", "w") as fh:
    json.dump({"digest": digest(text, "unpack")}, fh)
print(f"unpacked {len(text)} bytes")
PY
cat > /workspace/pipeline/clean.py <<'PY'
"""Stage 3: check the unpacked records and write /workspace/data.txt."""
from common import checked

text = checked("unpacked.txt", "unpack", "unpack.py")
with open("/workspace/data.txt", "wb") as fh:
    fh.write(text)
print("wrote /workspace/data.txt")
PY
