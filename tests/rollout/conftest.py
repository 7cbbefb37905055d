"""Make the repository's ``rollout`` win over the test folder of the same name.

``tests/conftest.py`` puts ``tests/`` on ``sys.path`` (rootdir-style import),
where ``tests/rollout`` would otherwise be picked up as a namespace package
named ``rollout`` before the editable install's finder is consulted.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
for _name in [m for m in sys.modules if m == "rollout" or m.startswith("rollout.")]:
    if getattr(sys.modules[_name], "__file__", None) is None:
        del sys.modules[_name]  # a namespace stand-in from tests/rollout
