"""``agentenv new``: a small task folder that already passes ``agentenv check``.

Authors learn the format fastest by editing something that works, so the
scaffold is a complete task (a seeded parameter, a workspace file, an oracle,
a hidden test) with comments on every part, not a blank template.
"""

from __future__ import annotations

import re
from pathlib import Path

from agentenv.errors import AgentEnvError
from agentenv.types import Domain

_TASK_YAML = """\
# The spec of this task. `agentenv check {name}` validates every field and proves the task.
id: {name}                      # unique id; `agentenv list` shows it
domain: {domain}                # general | agent | coding (which teacher grades it)
description: Implement scale(x) in calc.py.

instruction: instruction.md     # Jinja2 template; {{{{ factor }}}} is a parameter below
workspace: workspace            # copied into the sandbox's /workspace before setup
setup: setup.sh                 # runs in the sandbox before the agent starts (optional)
solution: solution/solve.sh     # the oracle: what a perfect agent would do
tests: tests                    # hidden: the agent never sees this folder

# Variants: drawn from the seed in this order, so the same seed is always the same task.
params:
  factor: {{type: int, low: 2, high: 9}}
  # name: {{type: choice, choices: [a, b]}}   also: float (low, high, digits), word (length)

# How the final state is graded (weights combine several verifiers).
verifiers:
  - type: unit_tests
    fail_to_pass: [test_calc.py::test_scale]   # must pass after the agent's work

limits:
  max_turns: 10
  command_timeout_s: 30
"""

_INSTRUCTION = """\
The file `calc.py` in your working directory has a function `scale(x)`.
Implement it so that it returns `x` multiplied by {{ factor }}.
Submit when you are done.
"""

_WORKSPACE_CALC = '''\
def scale(x):
    """Return x multiplied by the factor given in the task."""
    raise NotImplementedError
'''

_SETUP = """\
#!/bin/bash
# Runs in the sandbox (cwd = /workspace) after workspace/ is copied in. Templated like the instruction.
set -euo pipefail
echo "factor is between 2 and 9" > NOTES.txt
"""

_SOLVE = """\
#!/bin/bash
# The oracle. `agentenv check` runs it on several seeds and expects full reward.
# For tasks graded by a final answer, print the answer as the last stdout line.
set -euo pipefail
cat > calc.py <<'EOF'
def scale(x):
    return x * {{ factor }}
EOF
"""

_TEST = '''\
"""Hidden test: staged into the grading sandbox only after the agent is done.

variant.json (seed and parameters) is staged beside it, so tests can depend on the variant.
"""
import json
from pathlib import Path

from calc import scale  # the agent's workspace is on sys.path

PARAMS = json.loads((Path(__file__).parent / "variant.json").read_text())["params"]


def test_scale():
    for x in (0, 1, 7, -3):
        assert scale(x) == x * PARAMS["factor"]
'''


def scaffold(name: str, domain: Domain | str, parent: Path) -> Path:
    """Write a working task folder ``parent/name``; refuses to overwrite."""
    if not re.fullmatch(r"[a-z0-9][a-z0-9_.\-]*", name):
        raise AgentEnvError(f"task name {name!r}: expected lowercase letters, digits, '_', '-' or '.' (e.g. my_task)")
    domain = Domain(domain)
    folder = Path(parent) / name
    if folder.exists():
        raise FileExistsError(f"{folder}: already exists; choose another name or --dir")
    files = {
        "task.yaml": _TASK_YAML.format(name=name, domain=domain.value),
        "instruction.md": _INSTRUCTION,
        "workspace/calc.py": _WORKSPACE_CALC,
        "setup.sh": _SETUP,
        "solution/solve.sh": _SOLVE,
        "tests/test_calc.py": _TEST,
    }
    for rel, text in files.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if rel.endswith(".sh"):
            path.chmod(0o755)
    return folder


__all__ = ["scaffold"]
