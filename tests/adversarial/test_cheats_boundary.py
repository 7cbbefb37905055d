"""A hostile agent's final states against the ``calls`` boundary: every attack earns 0, in Docker, real grading.

Each case sets up a built-in coding task (graded through ``calls`` now), leaves the planted bug
unfixed, plants one attack from ``boundary_attacks`` as the sandbox user, and grades a fork of that
state with ``grade_episode`` (and in place, for two). Paid means reward > 0 or ``passed``; an
``invalid`` must be the agent's (counted as a failure). ``boundary_replay.py`` plants the same
attacks against the in-process graders these tasks used before, to show which ones paid there.

Also here: the in-process mode (``unit_tests``) against the attacks it can close (code past the
scanner's limits, a shadowing ``.pyc``) and its canaries, and what never enters the sandbox.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from boundary_attacks import ATTACKS, Attack

import agentenv.tasks.builtin as builtin_pkg
from agentenv.grading import clear_oracle_cache, grade_episode
from agentenv.task import FolderTask
from agentenv.types import Episode

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

BUILTIN = Path(builtin_pkg.__path__[0])
IN_PROCESS = Path(__file__).parent / "tasks" / "fix_bug_pytest"


def load(task_id: str) -> FolderTask:
    return FolderTask.load(BUILTIN / task_id)


@pytest.fixture(scope="module", autouse=True)
def _fresh_oracle_cache() -> Iterator[None]:
    clear_oracle_cache()
    yield


def attacked(backend: Any, task: FolderTask, commands: tuple[str, ...], seed: int = 0) -> tuple[Any, Any]:
    variant = task.variant(seed)
    sandbox = backend.create(task.sandbox_spec())
    task.setup(sandbox, variant)
    for command in commands:
        done = sandbox.exec(["bash", "-c", command], timeout=120, cwd="/workspace")
        assert done.exit_code == 0, f"the attack's own step failed: {command[:80]}: {done.stderr[-300:]}"
    return sandbox, variant


def assert_not_paid(result: Any) -> None:
    assert result.reward == 0.0 and not result.passed, f"cheat PAID: {result}"
    if result.invalid:
        assert result.invalid_cause == "agent", f"an agent-made state was judged the grader's fault: {result}"


@pytest.mark.parametrize("attack", ATTACKS, ids=[a.id for a in ATTACKS])
def test_attack_on_the_boundary_earns_nothing(backend: Any, attack: Attack) -> None:
    task = load(attack.task)
    sandbox, variant = attacked(backend, task, attack.commands)
    try:
        result = grade_episode(backend, sandbox, task, Episode(task.id, variant))
        assert_not_paid(result)
        assert not result.invalid, f"a failed check is a decided 0, not an undecided episode: {result}"
        if attack.id == "exception_class_named_like_the_expected_one":
            gone = next(d for d in result.details if d.name.endswith("renamed_and_old_name_gone"))
            assert not gone.passed and "impostor" in gone.detail, gone
    finally:
        sandbox.close()


@pytest.mark.parametrize("attack_id", ["exit_0_at_import", "always_equal_from_an_encoded_string"])
def test_attack_graded_in_place_earns_nothing(backend: Any, attack_id: str) -> None:
    attack = next(a for a in ATTACKS if a.id == attack_id)
    task = load(attack.task)
    sandbox, variant = attacked(backend, task, attack.commands)
    try:
        assert_not_paid(grade_episode(backend, sandbox, task, Episode(task.id, variant), in_place=True))
    finally:
        sandbox.close()


def test_the_oracle_with_the_attack_residue_beside_it_still_earns_full_reward(backend: Any) -> None:
    """The boundary does not fail honest code for what sits next to it (padding files, a stale .pyc)."""
    task = load("coding/fix_bug")
    pad = next(a for a in ATTACKS if a.id == "always_equal_in_a_shadowing_pyc")
    sandbox, variant = attacked(backend, task, ())
    try:
        task.oracle(sandbox, variant)
        for command in pad.commands:  # a .pyc with the always-equal code, stamped as the fixed source's cache
            assert sandbox.exec(["bash", "-c", command], timeout=60).exit_code == 0
        result = grade_episode(backend, sandbox, task, Episode(task.id, variant))
        assert result.reward == 1.0 and result.passed, result
    finally:
        sandbox.close()


def test_expected_values_never_enter_the_sandbox(backend: Any) -> None:
    """What a check's process is given: targets and arguments; no expected value is anywhere it can read."""
    task = load("coding/fix_add")
    spy = ("cat > /workspace/calc.py <<'ADVPY'\n# advmark\nimport os, sys, glob\n"
           "seen = [open('/proc/self/cmdline','rb').read().decode(errors='replace'), sys.stdin.read() if not sys.stdin.isatty() else '',\n"
           "        repr(dict(os.environ))] + [open(p, errors='replace').read() for p in glob.glob('/tmp/**', recursive=True)\n"
           "        if os.path.isfile(p) and os.path.getsize(p) < 1 << 20]\n"
           "open('/workspace/advmark_seen.txt', 'a').write('\\n'.join(seen))\n"
           "def add(a, b): return a - b\ndef sub(a, b): return a - b\nADVPY")
    sandbox, variant = attacked(backend, task, (spy,), seed=3)
    try:
        result = grade_episode(backend, sandbox, task, Episode(task.id, variant), in_place=True)
        assert_not_paid(result)
        seen = sandbox.read_file("/workspace/advmark_seen.txt").decode()
        assert "Unencodable" in seen, "the spy did not run inside a check's process"
        a, b = variant.params["a"], variant.params["b"]
        assert "returns:" not in seen and "calls.yaml" not in seen, "the checks file reached the sandbox"
        assert f"returns: {a + b}" not in seen
    finally:
        sandbox.close()


# ---------------------------------------------------------------- the in-process mode (unit_tests)


@pytest.mark.parametrize("attack_id", ["always_equal_in_a_file_past_the_size_limit", "always_equal_past_the_file_count_limit",
                                       "always_equal_in_a_shadowing_pyc", "pytest_internals_patched_from_encoded_strings"])
def test_in_process_mode_closes_what_it_can(backend: Any, attack_id: str) -> None:
    """Unscanned code is a strong finding (agent invalid), a .pyc is never read, a forced pass trips the canary."""
    attack = next(a for a in ATTACKS if a.id == attack_id)
    task = FolderTask.load(IN_PROCESS)
    sandbox, variant = attacked(backend, task, attack.commands)
    try:
        assert_not_paid(grade_episode(backend, sandbox, task, Episode(task.id, variant)))
    finally:
        sandbox.close()


def test_in_process_mode_catches_a_pass_forced_with_the_scan_off(backend: Any) -> None:
    """With the scan off, code that makes every failure a pass (hex-encoded, so nothing reads as pytest)
    is still caught at run time: by the integrity check, and, had it slipped past that, by the
    fail-canary passing (shown on its own in test_unit_tests_verifier.py)."""
    from agentenv.types import UnitTestsVerifierSpec
    from agentenv.verifiers import build_verifier

    attack = next(a for a in ATTACKS if a.id == "pytest_internals_patched_from_encoded_strings")
    task = FolderTask.load(IN_PROCESS)
    sandbox, variant = attacked(backend, task, attack.commands)
    try:
        verifier = build_verifier(UnitTestsVerifierSpec(detect_tampering="off"), task.folder, variant)
        result = verifier.verify(sandbox, Episode(task.id, variant))
        assert_not_paid(result)
        assert result.invalid and ("canary" in result.reason or "pytest internals" in result.reason), result
    finally:
        sandbox.close()

