"""The stream plugin's integrity check, against real pytest: a workspace module that patches what decides an outcome.

Each case runs the hidden test ``test_add`` (which fails: ``add`` is wrong) under the plugin as the grading exec
does (nonce on stdin, stream on a private fd, ``-I -B``, our ini), with ``calc.py`` patching one pytest internal
at import. The patch keeps behaviour (it wraps the original), since the check must catch any change, not just a
harmful one; the stream must carry a ``tamper`` line and ``outcomes`` must call it the agent's doing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agentenv.verifiers.common import AgentCaused
from agentenv.verifiers.pytest_outcomes import outcomes, parse_stream
from agentenv.verifiers.unit_tests import PYTEST_BOOT, PLUGIN, TOOLS

pytestmark = pytest.mark.unit

NONCE = "ab" * 16
HIDDEN = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
BUGGY = "\n\ndef add(a, b):\n    return a - b\n"


def graded(tmp_path: Path, calc: str, conftest: str | None = None) -> tuple[str, int, str | None]:
    """(stream text with a preflight line first, exit code, JUnit XML) of one grading run of ``calc.py``."""
    tools, root, ws = tmp_path / "tools", tmp_path / "root", tmp_path / "ws"
    for d in (tools, root / "tests", ws):
        d.mkdir(parents=True)
    shutil.copy(TOOLS[f"{PLUGIN}.py"], tools / f"{PLUGIN}.py")
    (root / "pytest.ini").write_text(f"[pytest]\npythonpath = {ws}\naddopts =\n")
    (root / "tests" / "test_calc.py").write_text(HIDDEN)
    if conftest is not None:
        (root / "tests" / "conftest.py").write_text(conftest)
    (ws / "calc.py").write_text(calc)
    junit = tmp_path / "report.xml"
    read, write = os.pipe()
    env = {"PATH": os.environ.get("PATH", ""), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "AGENTENV_STREAM_FD": str(write),
           "AGENTENV_TESTS_DIR": str(root / "tests")}
    proc = subprocess.Popen(
        [sys.executable, "-I", "-B", "-c", PYTEST_BOOT, str(tools), "-c", str(root / "pytest.ini"), f"--rootdir={root}",
         f"--confcutdir={root}", "-p", PLUGIN, "-p", "no:cacheprovider", "-o", "junit_logging=no",
         f"--junitxml={junit}", "-q", str(root / "tests")],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, pass_fds=(write,), env=env, cwd=ws,
    )
    os.close(write)
    assert proc.stdin is not None
    proc.stdin.write((NONCE + "\n").encode())
    proc.stdin.close()
    chunks = []
    while chunk := os.read(read, 65536):
        chunks.append(chunk)
    os.close(read)
    code = proc.wait(timeout=60)
    stream = json.dumps({"preflight": 1}) + "\n" + b"".join(chunks).decode()
    return stream, code, junit.read_text() if junit.exists() else None


def tamper_lines(stream: str) -> list[str]:
    return [w for line in stream.splitlines()[1:] if '"k":"tamper"' in line for w in json.loads(line.split(" ", 1)[1])["what"]]


def test_an_honest_run_has_no_tamper_line_and_reads_as_a_failure(tmp_path: Path) -> None:
    stream, code, junit = graded(tmp_path, BUGGY)
    assert tamper_lines(stream) == []
    cases = outcomes(parse_stream(stream, NONCE), code, junit)
    assert [(c.name, c.status) for c in cases] == [("test_add", "failed")]


def test_a_conftest_of_the_hidden_tests_may_register_hooks(tmp_path: Path) -> None:
    conftest = "def pytest_runtest_logreport(report):\n    pass\n\ndef pytest_sessionfinish(session):\n    pass\n"
    stream, _, _ = graded(tmp_path, BUGGY, conftest=conftest)
    assert tamper_lines(stream) == []



#: (label, code run at import of calc.py, what the tamper line must name)
PATCHES = [
    ("TestReport.__init__", "import _pytest.reports as r\n_o = r.TestReport.__init__\n"
     "def _i(self, *a, **k):\n    _o(self, *a, **k)\nr.TestReport.__init__ = _i\n", "_pytest.reports.TestReport.__init__"),
    ("TestReport.from_item_and_call", "import _pytest.reports as r\n_o = r.TestReport.from_item_and_call.__func__\n"
     "r.TestReport.from_item_and_call = classmethod(lambda cls, *a: _o(cls, *a))\n",
     "_pytest.reports.TestReport.from_item_and_call"),
    ("BaseReport.failed", "import _pytest.reports as r\nr.BaseReport.failed = property(lambda self: False)\n",
     "_pytest.reports.BaseReport.failed"),
    ("BaseReport.passed shadowed on TestReport", "import _pytest.reports as r\n"
     "r.TestReport.passed = property(r.BaseReport.passed.fget)\n", "_pytest.reports.TestReport.passed"),
    ("call_and_report", "import _pytest.runner as r\n_o = r.call_and_report\n"
     "r.call_and_report = lambda *a, **k: _o(*a, **k)\n", "_pytest.runner.call_and_report"),
    ("runtestprotocol", "import _pytest.runner as r\n_o = r.runtestprotocol\n"
     "r.runtestprotocol = lambda *a, **k: _o(*a, **k)\n", "_pytest.runner.runtestprotocol"),
    ("call_runtest_hook code", "import _pytest.runner as r\n"
     "r.call_runtest_hook.__code__ = r.call_runtest_hook.__code__.replace()\n", "_pytest.runner.call_runtest_hook"),
    ("CallInfo.from_call", "import _pytest.runner as r\n_o = r.CallInfo.from_call.__func__\n"
     "r.CallInfo.from_call = classmethod(lambda cls, *a, **k: _o(cls, *a, **k))\n", "_pytest.runner.CallInfo.from_call"),
    ("Function.runtest", "import _pytest.python as p\n_o = p.Function.runtest\n"
     "p.Function.runtest = lambda self: _o(self)\n", "_pytest.python.Function.runtest"),
    ("pytest_pyfunc_call code", "import _pytest.python as p\n"
     "p.pytest_pyfunc_call.__code__ = p.pytest_pyfunc_call.__code__.replace()\n", "_pytest.python.pytest_pyfunc_call"),
    ("Session.perform_collect", "import _pytest.main as m\n_o = m.Session.perform_collect\n"
     "m.Session.perform_collect = lambda self, *a, **k: _o(self, *a, **k)\n", "_pytest.main.Session.perform_collect"),
    ("pytest_runtestloop code", "import _pytest.main as m\n"
     "m.pytest_runtestloop.__code__ = m.pytest_runtestloop.__code__.replace()\n", "_pytest.main.pytest_runtestloop"),
    ("LogXML.pytest_runtest_logreport", "import _pytest.junitxml as j\n_o = j.LogXML.pytest_runtest_logreport\n"
     "def _l(self, report):\n    _o(self, report)\nj.LogXML.pytest_runtest_logreport = _l\n",
     "_pytest.junitxml.LogXML.pytest_runtest_logreport"),
    ("builtins.__import__", "import builtins\n_o = builtins.__import__\n"
     "builtins.__import__ = lambda *a, **k: _o(*a, **k)\n", "builtins.__import__"),
    ("builtins.AssertionError", "import builtins\nclass _E(AssertionError):\n    pass\nbuiltins.AssertionError = _E\n",
     "builtins.AssertionError"),
    ("the plugin's _emit", "import sys\n_s = sys.modules['agentenv_stream']\n_o = _s._emit\n"
     "_s._emit = lambda kind, **f: _o(kind, **f)\n", "agentenv_stream._emit"),
    ("the plugin's hook code", "import sys\n_s = sys.modules['agentenv_stream']\n"
     "_s.pytest_runtest_logreport.__code__ = _s.pytest_runtest_logreport.__code__.replace()\n",
     "agentenv_stream.pytest_runtest_logreport"),
    ("a plugin registered at run time", "import gc, _pytest.config as c\n"
     "cfg = next(o for o in gc.get_objects() if isinstance(o, c.Config))\n"
     "class _P:\n    def pytest_runtest_logreport(self, report):\n        pass\n"
     "cfg.pluginmanager.register(_P(), 'advmark')\n", "hook pytest_runtest_logreport"),
    ("the obfuscated report patch", "_m = __builtins__['__import__'] if isinstance(__builtins__, dict) else "
     "getattr(__builtins__, '__import__')\n_n = ''.join(chr(c) for c in (95, 112, 121, 116, 101, 115, 116))\n"
     "_T = getattr(getattr(_m(_n + '.reports'), 'reports'), 'Test' + 'Report')\n_o = _T.__init__\n"
     "def _i(self, *a, **k):\n    _o(self, *a, **k)\n    if self.outcome == 'failed':\n"
     "        self.outcome, self.longrepr = 'passed', None\nsetattr(_T, '__init__', _i)\n",
     "_pytest.reports.TestReport.__init__"),
]


#: Internals this host's pytest may lack but the grading image's pytest (Debian's 7.2) has: these cases run
#: inside the grading image, against the version they are about, never dropped (8.4 folded ``call_runtest_hook``
#: into ``call_and_report``, which the host cases cover).
IN_IMAGE = {"_pytest.runner.call_runtest_hook"}


@pytest.mark.parametrize(("patch", "named"), [pytest.param(p, n, id=label) for label, p, n in PATCHES if n not in IN_IMAGE])
def test_a_workspace_module_patching_an_internal_writes_a_tamper_line(tmp_path: Path, patch: str, named: str) -> None:
    stream, code, junit = graded(tmp_path, patch + BUGGY)
    assert named in tamper_lines(stream), stream
    with pytest.raises(AgentCaused, match="changed pytest internals"):
        outcomes(parse_stream(stream, NONCE), code, junit)


def graded_in_image(docker_client: Any, image: str, tmp_path: Path, calc: str) -> tuple[str, int, str | None, str]:
    """``graded`` inside ``image`` with its own python3 and pytest; also returns that pytest's version."""
    tools, root, ws = tmp_path / "tools", tmp_path / "root", tmp_path / "ws"
    for d in (tools, root / "tests", ws):
        d.mkdir(parents=True)
    shutil.copy(TOOLS[f"{PLUGIN}.py"], tools / f"{PLUGIN}.py")
    (root / "pytest.ini").write_text("[pytest]\npythonpath = /g/ws\naddopts =\n")
    (root / "tests" / "test_calc.py").write_text(HIDDEN)
    (ws / "calc.py").write_text(calc)
    (tmp_path / "boot.py").write_text(PYTEST_BOOT)
    script = (
        "python3 -c 'import pytest; print(pytest.__version__)' > /g/version; "
        f"printf '%s\\n' {NONCE} | AGENTENV_STREAM_FD=3 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 AGENTENV_TESTS_DIR=/g/root/tests "
        'python3 -I -B -c "$(cat /g/boot.py)" /g/tools -c /g/root/pytest.ini --rootdir=/g/root --confcutdir=/g/root '
        f"-p {PLUGIN} -p no:cacheprovider -o junit_logging=no --junitxml=/g/report.xml -q /g/root/tests "
        "3>/g/stream >/dev/null 2>&1; echo $? > /g/code; chmod -R a+rwX /g"
    )
    docker_client.containers.run(image, ["sh", "-c", script], volumes={str(tmp_path): {"bind": "/g", "mode": "rw"}},
                                 network_mode="none", remove=True, working_dir="/g/ws")
    junit = tmp_path / "report.xml"
    stream = json.dumps({"preflight": 1}) + "\n" + (tmp_path / "stream").read_text()
    code = int((tmp_path / "code").read_text())
    return stream, code, junit.read_text() if junit.exists() else None, (tmp_path / "version").read_text().strip()


@pytest.mark.docker
@pytest.mark.parametrize(("patch", "named"), [pytest.param(p, n, id=label) for label, p, n in PATCHES if n in IN_IMAGE])
def test_a_patch_of_an_internal_of_the_grading_images_pytest_writes_a_tamper_line(
    tmp_path: Path, docker_client: Any, base_image: str, patch: str, named: str
) -> None:
    stream, code, junit, version = graded_in_image(docker_client, base_image, tmp_path, patch + BUGGY)
    assert version.startswith("7."), f"the grading image's pytest is {version}: move this case to the host list"
    assert named in tamper_lines(stream), stream
    with pytest.raises(AgentCaused, match="changed pytest internals"):
        outcomes(parse_stream(stream, NONCE), code, junit)


def test_a_patch_made_during_a_test_is_seen_at_its_report(tmp_path: Path) -> None:
    calc = "def add(a, b):\n    import _pytest.runner as r\n    r.call_and_report = lambda *a, **k: None\n    return a + b\n"
    stream, code, junit = graded(tmp_path, calc)
    assert "_pytest.runner.call_and_report" in tamper_lines(stream)
    with pytest.raises(AgentCaused):
        outcomes(parse_stream(stream, NONCE), code, junit)
