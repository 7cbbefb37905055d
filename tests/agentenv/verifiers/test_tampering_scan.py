"""The caller-inspection detector (``preflight.scan_source``): each pattern it flags, and what it leaves alone."""

from __future__ import annotations

import pytest

from agentenv.verifiers.preflight import neutralised, scan_source, scan_tree

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("source", "what"),
    [
        ("import sys\nf = sys._getframe(1)\n", "sys._getframe"),
        ("import inspect\ninspect.stack()\n", "inspect.stack"),
        ("from inspect import currentframe as cf\ncf()\n", "inspect.currentframe"),
        ("import gc\ngc.get_objects()\n", "gc.get_objects"),
        ("import os\nos._exit(0)\n", "os._exit"),
        ("import atexit\natexit.register(print)\n", "atexit.register"),
        ("import sys\nsys.settrace(None)\n", "sys.settrace"),
        ("import _pytest.runner\n", "import _pytest.runner"),
        ("import pytest\n", "import pytest"),
        ("open('/proc/self/fd/3', 'w')\n", "'/proc/self/fd/3'"),
        ("import os\nos.environ.get('PYTEST_CURRENT_TEST')\n", "'PYTEST_CURRENT_TEST'"),
        ("import builtins\nbuiltins.open = None\n", "builtins assignment"),
        ("__builtins__['len'] = None\n", "builtins assignment"),
        ("import builtins\nsetattr(builtins, 'print', None)\n", "setattr(builtins, ...)"),
        ("import sys\ngetattr(sys, '_getframe')(1)\n", "'_getframe'"),
        ("import sys\n'pytest' in sys.modules\n", "'pytest'"),
    ],
)
def test_each_pattern_is_flagged(source: str, what: str) -> None:
    found = scan_source(source, "lib.py")
    assert what in [f["what"] for f in found], found


def test_plain_code_and_an_agents_own_test_file_importing_pytest_are_left_alone() -> None:
    assert scan_source("import os, json\n\ndef clamp(x, lo, hi):\n    return max(lo, min(x, hi))\n", "mathutils.py") == []
    assert scan_source("import pytest\n\ndef test_x():\n    assert True\n", "test_mine.py") == []
    assert scan_source("def broken(:\n", "bad.py") == []


def test_the_tree_scan_and_the_neutralised_list(tmp_path) -> None:  # noqa: ANN001
    (tmp_path / "lib.py").write_text("import os\nos._exit(0)\n")
    (tmp_path / "conftest.py").write_text("x = 1\n")
    (tmp_path / "pyproject.toml").write_text("[tool.pytest.ini_options]\naddopts = '-p lib'\n")
    (tmp_path / "setup.cfg").write_text("[metadata]\nname = x\n")
    (tmp_path / "sitecustomize.py").write_text("")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "hook.py").write_text("import os\nos._exit(0)\n")
    report = scan_tree(str(tmp_path))
    assert [f["path"] for f in report["findings"]] == ["lib.py"] and not report["truncated"]
    names = sorted(p.rsplit("/", 1)[1] for p in neutralised(str(tmp_path)))
    assert names == ["conftest.py", "pyproject.toml", "sitecustomize.py"]
