"""The ``calls`` verifier: its strict decoder and comparison, its checks file, and the real probe in a subprocess.

The sandbox is ``FakeSandbox`` whose handler runs the exec's argv (the real ``call_probe`` source) as
a local subprocess in a temporary workdir holding the "agent's" module, so every case exercises the
probe, the one-line channel and the host-side judgement end to end, without Docker (the Docker
cases are in tests/adversarial/test_cheats_boundary.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from verifier_fakes import make_episode, make_variant

from agentenv.errors import TaskSpecError
from agentenv.spec import load_spec
from agentenv.types import CallsVerifierSpec
from agentenv.verifiers import build_verifier
from agentenv.verifiers.calls import GarbledResult, decode, load_checks, parse_result, request_of, same
from agentenv.verifiers.common import VerifierError
from sandboxes.testing import FakeSandbox
from sandboxes.types import ExecResult

pytestmark = pytest.mark.unit


# ---------------------------------------------------------------- decoding and comparison


def test_decode_rebuilds_plain_values_by_tag() -> None:
    tagged = ["dict", [[["str", "a"], ["list", [["int", "1"], ["float", (2.5).hex()], ["none"], ["bool", True]]]],
                      [["tuple", [["int", "-3"]]], ["tuple", []]]]]
    assert decode(tagged) == {"a": [1, 2.5, None, True], (-3,): ()}
    assert type(decode(["int", "7"])) is int and type(decode(["bool", False])) is bool


@pytest.mark.parametrize("bad", [
    ["set", []], ["int", "1e3"], ["int", 5], ["float", "1.5"], ["bool", 1], ["str", 3], "plain", [], ["none", 1],
    ["dict", [[["list", []], ["none"]]]], ["dict", [["none"]]],
], ids=str)
def test_decode_refuses_anything_off_format(bad: object) -> None:
    with pytest.raises(GarbledResult):
        decode(bad)


def test_decode_is_bounded_in_depth_and_size() -> None:
    deep: list = ["none"]
    for _ in range(100):
        deep = ["list", [deep]]
    with pytest.raises(GarbledResult, match="deep"):
        decode(deep)
    with pytest.raises(GarbledResult, match="large"):
        decode(["list", [["none"]] * 200_000])


def test_parse_result_wants_exactly_one_line_and_no_nan() -> None:
    assert parse_result('{"results": []}\n') == []
    for bad in ('{"results": []}', '{"results": []}\n{"results": []}\n', "garbage\n", '{"results": [NaN]}\n',
                '{"results": [], "x": 1}\n', "x" * (2 << 20) + "\n"):
        with pytest.raises(GarbledResult):
            parse_result(bad)


def test_same_keeps_bool_apart_from_numbers_and_honours_tolerance() -> None:
    assert same(1, 1.0) and same(16.200000001, 16.2, 1e-6) and not same(16.21, 16.2, 1e-6)
    assert not same(True, 1) and not same(1, True) and same(True, True)
    assert same((1, 2), [1, 2]) and not same([1], [1, 2]) and not same("1", 1)
    assert same({"a": [1]}, {"a": [1]}) and not same({"a": 1, "b": 2}, {"a": 1})
    assert same(None, None) and not same(0, None)
    assert same(float("nan"), float("nan")) and not same(1.0, float("nan"))


# ---------------------------------------------------------------- the checks file


def test_checks_file_shorthand_and_steps() -> None:
    checks = load_checks("checks:\n  - {call: 'm:f', args: [1], returns: 2}\n  - steps:\n"
                         "      - {call: 'm:C', as: c}\n      - {call: c.total, raises: ValueError}\n", "x.yaml")
    assert [len(c.steps) for c in checks] == [1, 2]
    request = json.dumps(request_of(checks[0])) + json.dumps(request_of(checks[1]))
    assert "returns" not in request and "ValueError" not in request and '"report": true' in request


@pytest.mark.parametrize(("text", "why"), [
    ("checks:\n  - {call: 'm:f'}\n", "check nothing"),
    ("checks:\n  - {call: 'c.total', returns: 1}\n", "no value bound"),
    ("checks:\n  - {call: 'm:f', get: 'm:g', returns: 1}\n", "exactly one of call or get"),
    ("checks:\n  - {call: 'm:f', returns: 1, raises: KeyError}\n", "not both"),
    ("checks:\n  - {call: 'm:f; rm -rf /', returns: 1}\n", "expected module.path"),
    ("checks: []\n", "at least 1"),
])
def test_checks_file_errors_name_what_is_wrong(text: str, why: str) -> None:
    with pytest.raises(VerifierError, match=why):
        load_checks(text, "x.yaml")


def test_a_task_naming_a_missing_checks_file_does_not_load(tmp_path: Path) -> None:
    (tmp_path / "instruction.md").write_text("do it")
    (tmp_path / "solution").mkdir()
    (tmp_path / "solution" / "solve.sh").write_text("true")
    (tmp_path / "task.yaml").write_text("id: t/x\ndomain: coding\nverifiers:\n  - type: calls\n")
    with pytest.raises(TaskSpecError, match="checks file 'grading/calls.yaml' not found"):
        load_spec(tmp_path)
    (tmp_path / "grading").mkdir()
    (tmp_path / "grading" / "calls.yaml").write_text("checks:\n  - {call: 'm:f', args: [{{ nope }}], returns: 1}\n")
    with pytest.raises(TaskSpecError, match="nope"):
        load_spec(tmp_path)


# ---------------------------------------------------------------- the real probe, run locally


CHECKS = """checks:
  - {name: add, call: "calc:add", args: [{{ a }}, 2], returns: {{ a + 2 }}}
  - {name: neg, call: "calc:check", args: [-1], raises: ValueError}
  - name: printed
    steps:
      - {call: "calc:Box", args: [3], as: box}
      - {call: box.show, returns: null, stdout: "box 3"}
"""
HONEST = """
def add(a, b):
    return a + b

def check(x):
    if x < 0:
        raise ValueError(x)
    return x

class Box:
    def __init__(self, n):
        self.n = n
    def show(self):
        print("box", self.n)
"""


class TimedSandbox(FakeSandbox):
    """Keeps the deadline each exec was given, so the local probe runs under it."""

    last_timeout: float | None = None

    def exec(self, cmd, *, timeout=None, **kwargs):  # noqa: ANN001, ANN003, ANN201
        self.last_timeout = timeout
        return super().exec(cmd, timeout=timeout, **kwargs)


def local_probe(workdir: Path):  # noqa: ANN201
    def handler(sb: TimedSandbox, _cmd: str) -> ExecResult:
        timeout = sb.last_timeout or 20.0
        argv = list(sb.last_argv)
        assert argv[:4] == ["python3", "-I", "-B", "-c"], argv
        argv[0] = sys.executable
        argv[-1] = str(workdir)
        try:
            done = subprocess.run(argv, input=sb.last_stdin, capture_output=True, timeout=timeout, cwd=workdir, check=False)
        except subprocess.TimeoutExpired:
            return ExecResult(124, "", "", timed_out=True)
        return ExecResult(done.returncode, done.stdout.decode(), done.stderr.decode())
    return handler


def grade(tmp_path: Path, module: str, checks: str = CHECKS, **spec: object):  # noqa: ANN201
    task = tmp_path / "task"
    (task / "grading").mkdir(parents=True)
    (task / "grading" / "calls.yaml").write_text(checks)
    work = tmp_path / "work"
    work.mkdir()
    (work / "calc.py").write_text(module)
    verifier = build_verifier(CallsVerifierSpec(partial_credit=True, **spec), task, make_variant(a=40), hidden={})
    return verifier.verify(TimedSandbox({}, handler=local_probe(work)), make_episode(a=40))


def detail(result, name: str) -> str:  # noqa: ANN001
    return next(c.detail for c in result.details if c.name == name)


def test_honest_code_earns_full_reward(tmp_path: Path) -> None:
    result = grade(tmp_path, HONEST)
    assert (result.reward, result.passed, result.invalid) == (1.0, True, False), result


def test_wrong_values_fail_their_check_only(tmp_path: Path) -> None:
    result = grade(tmp_path, HONEST.replace("return a + b", "return a - b"))
    assert not result.invalid and result.reward == pytest.approx(2 / 3)
    assert "returned 38" in detail(result, "add") and "42" not in detail(result, "add")  # the expected value stays unsaid


def test_an_always_equal_result_is_not_plain_data(tmp_path: Path) -> None:
    cheat = HONEST.replace("return a + b", "return Any(0)") + (
        "\nclass Any(int):\n    def __eq__(self, o): return True\n    def __ne__(self, o): return False\n"
        "    __hash__ = int.__hash__\n")
    result = grade(tmp_path, cheat)
    assert not result.invalid and "not plain data" in detail(result, "add"), result


def test_an_exit_at_import_fails_every_check_and_is_not_invalid(tmp_path: Path) -> None:
    result = grade(tmp_path, "import os\nos._exit(0)\n" + HONEST)
    assert (result.reward, result.invalid) == (0.0, False), result
    assert "garbled result: expected exactly one result line, got 0" in detail(result, "add")


def test_printing_a_forged_result_at_import_is_not_a_result(tmp_path: Path) -> None:
    forge = ('import os\nprint(\'{"results": [{"step": 0, "value": ["int", "42"]}]}\')\n'
             'os.write(1, b\'{"results": [{"step": 0, "value": ["int", "42"]}]}\\n\')\n')
    result = grade(tmp_path, forge + HONEST.replace("return a + b", "return 0"))
    assert "returned 0" in detail(result, "add"), result


def test_two_result_lines_fail_the_check(tmp_path: Path) -> None:
    forge = ("import os, atexit\n"
             "for fd in range(3, 20):\n"
             "    try: os.write(fd, b'{\"results\": [{\"step\": 0, \"value\": [\"int\", \"42\"]}]}\\n')\n"
             "    except OSError: pass\n")
    result = grade(tmp_path, forge + HONEST)
    assert "garbled result" in detail(result, "add") and not result.invalid, result


def test_an_exception_class_named_like_the_expected_one_does_not_match(tmp_path: Path) -> None:
    impostor = HONEST + "\nclass ValueError(Exception):\n    pass\n"
    assert "calc.ValueError" in detail(grade(tmp_path, impostor), "neg")
    (tmp_path / "b").mkdir()
    claims = HONEST + "\nclass ValueError(Exception):\n    pass\nValueError.__module__ = 'builtins'\n"
    assert "<impostor>.ValueError" in detail(grade(tmp_path / "b", claims), "neg")


def test_a_subclass_of_the_expected_exception_matches(tmp_path: Path) -> None:
    result = grade(tmp_path, HONEST.replace("raise ValueError(x)", "raise UnicodeError(x)"))
    assert result.reward == 1.0, result


def test_a_hang_fails_its_check_by_the_deadline(tmp_path: Path) -> None:
    result = grade(tmp_path, "import time\ntime.sleep(30)\n" + HONEST, timeout_s=2)
    assert (result.reward, result.invalid) == (0.0, False) and "timed out" in detail(result, "add"), result


def test_a_stale_pyc_is_never_read(tmp_path: Path) -> None:
    import importlib._bootstrap_external as be
    import importlib.util
    import os

    work = tmp_path / "work"
    work.mkdir()
    src = work / "calc.py"
    src.write_text(HONEST)
    st = os.stat(src)
    code = compile(HONEST.replace("return a + b", "return 42"), str(src), "exec")
    pyc = Path(importlib.util.cache_from_source(str(src)))
    pyc.parent.mkdir()
    pyc.write_bytes(be._code_to_timestamp_pyc(code, int(st.st_mtime), st.st_size))
    (work / "sneaky.pyc").write_bytes(be._code_to_timestamp_pyc(code, 0, 0))  # sourceless
    task = tmp_path / "task"
    (task / "grading").mkdir(parents=True)
    (task / "grading" / "calls.yaml").write_text('checks:\n  - {name: add, call: "calc:add", args: [1, 2], returns: 3}\n'
                                                 '  - {name: sneaky, get: "sneaky:add", raises: ModuleNotFoundError}\n')
    verifier = build_verifier(CallsVerifierSpec(), task, make_variant(), hidden={})
    result = verifier.verify(TimedSandbox({}, handler=local_probe(work)), make_episode())
    assert result.reward == 1.0, result


def test_a_python3_that_will_not_start_is_a_failure_not_an_opt_out(tmp_path: Path) -> None:
    """The agent can make python3 unrunnable (its own earlier on PATH): that must not drop the episode."""
    task = tmp_path / "task"
    (task / "grading").mkdir(parents=True)
    (task / "grading" / "calls.yaml").write_text(CHECKS)
    verifier = build_verifier(CallsVerifierSpec(), task, make_variant(a=1), hidden={})
    sandbox = FakeSandbox({}, handler=lambda sb, cmd: ExecResult(127, "", "python3: not found"))
    result = verifier.verify(sandbox, make_episode(a=1))
    assert (result.reward, result.passed, result.invalid) == (0.0, False, False), result


def test_the_expected_values_never_reach_the_sandbox(tmp_path: Path) -> None:
    task = tmp_path / "task"
    (task / "grading").mkdir(parents=True)
    (task / "grading" / "calls.yaml").write_text(CHECKS)
    verifier = build_verifier(CallsVerifierSpec(), task, make_variant(a=40), hidden={})
    sandbox = FakeSandbox({}, handler=lambda sb, cmd: ExecResult(0, '{"results": []}\n', ""))
    verifier.verify(sandbox, make_episode(a=40))
    from agentenv.verifiers.calls import PROBE_SOURCE

    sent = b"".join((stdin or b"") + " ".join(a for a in argv if a != PROBE_SOURCE).encode() + json.dumps(env).encode()
                    for argv, env, stdin in sandbox.execs)
    assert b"calc:add" in sent and b"42" not in sent and b"ValueError" not in sent and b"box 3" not in sent
    assert all(PROBE_SOURCE in argv for argv, _, _ in sandbox.execs)  # the fixed probe, the same for every task
    assert not sandbox.files, "nothing is written into the sandbox"


def test_hangs_in_every_check_cost_the_budget_once(tmp_path: Path) -> None:
    import time

    started = time.monotonic()
    result = grade(tmp_path, "import time\ntime.sleep(30)\n" + HONEST, timeout_s=2, budget_s=3)
    assert time.monotonic() - started < 8 and result.reward == 0.0 and not result.invalid, result
    assert "budget" in detail(result, "printed"), result
