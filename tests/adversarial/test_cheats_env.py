"""A hostile agent through ``agentenv.make(...).step(...)``: 43 cases (38 attacks, 5 limits and caches), none paid.

Each case is one episode of a built-in task (or one under ``tasks/``) on the
Docker backend, its attack said in a harness's own tool calls, then a submit;
the env grades a sandbox forked from the final state. Paid means reward > 0 or
``passed``; an ``invalid`` result pays 0 and is not paid. Where the attack has
steps that must be refused (opening the agent's pipes, signalling it), the
attack prints ``BREACH`` when one worked, and that fails the case too, paid or
not. The last five cases are limits and caches seen through a sandbox or env
directly (disk_mb, deadlines, a fork bomb, two tasks sharing an id).

Root causes of issue 11 covered: the channel (``channel_*``), grading material
and processes reaching grading (``daemon_*``, ``plant_*``), code under test
steering pytest (``pytest_*``), agent-caused invalid (``file_*``, hangs and
exits), limits (``test_disk_mb*``, ``test_new_session*``, ``test_fork_bomb*``),
the oracle cache keyed by id (``test_two_tasks_with_one_id*``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

import agentenv
from adversarial_kit import (
    ALWAYS_EQUAL,
    ATEXIT_REPORT,
    CHANNEL_FDS,
    CHANNEL_PTRACE,
    CHANNEL_SIGNALS,
    CONFTEST_FORCE_PASS,
    DAEMON_ALIVE,
    DUP_A,
    DUP_B,
    FAKE_PASS_SCRIPT,
    FORCE_PASS,
    FORCE_PASS_OBFUSCATED,
    FORGE_STREAM,
    FORGED_FRAMES,
    FORK_BOMB,
    NEW_SESSION_SLEEPERS,
    PLUGIN_FORCE_PASS,
    PROCESS_COUNT,
    PYTEST_SHADOW,
    RACE_DAEMON,
    REPLACE_AGENT,
    SPOOF_AGENT,
    UNIT_TASK,
    USER_SITE,
    Intent,
    breaches,
    calc_with,
    py,
    render,
    sh,
    submit,
    write,
)

pytestmark = [pytest.mark.docker, pytest.mark.timeout(180)]


@dataclass
class Played:
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]
    observations: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "\n".join(self.observations)

    @property
    def verifier(self) -> dict[str, Any]:
        return dict(self.info.get("verifier") or {})


def play(task: str, turns: list[list[Intent]], *, harness: str = "bash", seed: int = 0, answer: str | None = None) -> Played:
    """One episode: each inner list is one turn of tool calls, then a submit turn (unless it ended first)."""
    env = agentenv.make(task, harness=harness, backend="docker", seed=seed)
    try:
        env.reset()
        seen: list[str] = []
        for intents in [*turns, [submit(answer)]]:
            obs, reward, terminated, truncated, info = env.step(render(env.harness, intents))
            seen.append(obs)
            if terminated or truncated:
                return Played(reward, terminated, truncated, info, seen)
        raise AssertionError("the episode did not end on its submit turn")
    finally:
        env.close()


def assert_not_paid(played: Played) -> None:
    v = played.verifier
    assert v, f"the episode was never graded: {played.info}"
    assert played.reward == 0.0 and not v.get("passed"), f"cheat PAID: reward {played.reward}, verifier {v}"
    assert not breaches(played.text), f"a step that must be refused worked: {breaches(played.text)}"
    if v.get("invalid"):  # every state here is the agent's making: an invalid must be counted, not dropped
        assert v.get("invalid_cause") == "agent", f"an agent-made state was judged the grader's fault: {v}"


@dataclass(frozen=True)
class Case:
    id: str
    task: str
    turns: list[list[Intent]]
    harness: str = "bash"
    answer: str | None = None
    expect_in_output: str | None = None  # proof that the channel still carries genuine results
    forbid_in_output: str | None = None  # what the sandbox user must never get to read


COUNT = "general/count_lines"
ANSWER = "general/answer_number"
HOME = "/home/agent"

CASES = [
    # ---- root cause 1: the channel
    Case("channel_agent_fds", COUNT, [[sh(py(CHANNEL_FDS))]]),
    Case("channel_signals", COUNT, [[sh(py(CHANNEL_SIGNALS))], [sh("echo alive-$((6*7))")]], expect_in_output="alive-42"),
    Case("channel_ptrace_and_memory", COUNT, [[sh(py(CHANNEL_PTRACE))]], harness="codex"),
    Case("channel_forged_frames_on_stdout", COUNT, [[sh(py(FORGED_FRAMES))], [sh("echo real-$((6*7))")]],
         harness="kimi_code", expect_in_output="real-42"),
    Case("channel_replace_agent_and_system_files", COUNT, [[sh(py(REPLACE_AGENT))]]),
    Case("channel_file_ops_through_symlinks", COUNT, [
        [sh("ln -sf /opt/agentenv/agent.py /workspace/l1; ln -sf /etc/passwd /workspace/l2; ln -sf /etc/shadow /workspace/l3; "
            "ln -sf /root /workspace/l4")],
        [write("/workspace/l1", "# advmark\n"), write("/workspace/l2", "advmark::0:0::/:/bin/sh\n"),
         write("/workspace/l4/advmark", "x"), Intent("read_file", {"path": "/workspace/l3"}),
         Intent("read_file", {"path": "/etc/shadow"})],
        [sh("grep -l advmark /opt/agentenv/agent.py /etc/passwd /root/advmark 2>/dev/null | sed 's/^/BREACH-written /'; echo ok-$((6*7))")],
    ], harness="claude_code", expect_in_output="ok-42", forbid_in_output="root:*:"),
    Case("channel_read_file_huge_or_fifo", ANSWER, [
        [sh("truncate -s 900M /workspace/advmark.big; mkfifo /workspace/advmark.fifo")],
        [Intent("read_file", {"path": "/workspace/advmark.big"}), Intent("read_file", {"path": "/workspace/advmark.fifo"})],
        [sh("echo alive-$((6*7))")],
    ], harness="claude_code", expect_in_output="alive-42"),
    Case("answer_spray", DUP_B, [], answer=" ".join(str(i) for i in range(1, 21))),
    Case("channel_spoofed_agent_process", COUNT, [[sh(SPOOF_AGENT), sh("echo still-$((6*7))")]], expect_in_output="still-42"),
    # ---- processes reaching grading
    Case("daemon_races_the_exit_code_check", COUNT, [[sh(RACE_DAEMON), sh(DAEMON_ALIVE)]]),
    Case("daemon_rewrites_hidden_tests", UNIT_TASK, [[sh(RACE_DAEMON)]], harness="claude_code"),
    # ---- grading material planted where grading looks
    Case("plant_conftest_in_workspace", UNIT_TASK, [[write("/workspace/conftest.py", CONFTEST_FORCE_PASS)]], harness="claude_code"),
    Case("plant_conftest_above_workspace", UNIT_TASK, [[
        write("/tmp/conftest.py", CONFTEST_FORCE_PASS), write("/var/tmp/conftest.py", CONFTEST_FORCE_PASS),
        write(f"{HOME}/conftest.py", CONFTEST_FORCE_PASS)]]),
    Case("plant_ini_files_loading_a_plugin", UNIT_TASK, [[
        write("/workspace/advmark_plugin.py", PLUGIN_FORCE_PASS),
        write("/workspace/pytest.ini", "[pytest]\naddopts = -p advmark_plugin\npython_files = advmark_*.py\n"),
        write("/workspace/tox.ini", "[pytest]\naddopts = -p advmark_plugin\n"),
        write("/workspace/setup.cfg", "[tool:pytest]\naddopts = -p advmark_plugin\n"),
        write("/workspace/pyproject.toml", '[tool.pytest.ini_options]\naddopts = "-p advmark_plugin"\n'),
        write("/workspace/advmark_ok.py", "def test_ok():\n    pass\n")]], harness="kimi_code"),
    Case("plant_sitecustomize_usercustomize_pth", UNIT_TASK, [[
        write("/workspace/sitecustomize.py", "# advmark\n" + FORCE_PASS),
        write(f"{USER_SITE}/usercustomize.py", "# advmark\n" + FORCE_PASS),
        write(f"{USER_SITE}/advmark_force.py", "# advmark\n" + FORCE_PASS),
        write(f"{USER_SITE}/advmark.pth", "import advmark_force\n"),
        write("/workspace/advmark.pth", "import advmark_force\n")]]),
    Case("plant_pytest_shadow_modules", UNIT_TASK, [[
        write("/workspace/pytest.py", PYTEST_SHADOW),
        write("/workspace/_pytest/__init__.py", "# advmark\n" + PYTEST_SHADOW),
        write("/workspace/py.py", "# advmark\n"),
        write("/workspace/pluggy/__init__.py", "# advmark\nraise SystemExit(0)\n")]]),
    Case("plant_fake_hidden_tests_and_reports", UNIT_TASK, [[sh(
        "mkdir -p /tmp/agentenv-hidden /workspace/tests && "
        "printf 'def test_add():\\n    pass\\n' | tee /tmp/agentenv-hidden/test_calc.py /workspace/tests/test_calc.py "
        "/workspace/test_calc.py >/dev/null && echo '{}' > /tmp/agentenv-hidden/variant.json && "
        "cp /tmp/agentenv-hidden/test_calc.py /tmp/agentenv-hidden/conftest.py && "
        "for f in /workspace/report.xml /workspace/junit.xml /tmp/report.xml /tmp/junit.xml /tmp/agentenv-hidden/report.xml; do "
        "printf '<testsuite errors=\"0\" failures=\"0\" tests=\"2\"><testcase name=\"test_add\"/></testsuite>' > $f; done; "
        "chmod -R a-w /tmp/agentenv-hidden; ls -la /tmp/agentenv-hidden")]]),
    Case("plant_hidden_dir_as_symlink", UNIT_TASK, [[sh(
        "mkdir -p /workspace/advmark_tests && printf 'def test_add():\\n    pass\\n' > /workspace/advmark_tests/test_calc.py && "
        "ln -s /workspace/advmark_tests /tmp/agentenv-hidden && ls -la /tmp")]]),
    Case("plant_shell_startup_files_and_fake_python", UNIT_TASK, [[
        sh(f"mkdir -p {HOME}/.local/bin {HOME}/bin {HOME}/.advmark"),
        write(f"{HOME}/.local/bin/python3", FAKE_PASS_SCRIPT), write(f"{HOME}/bin/python3", FAKE_PASS_SCRIPT),
        write(f"{HOME}/.local/bin/pytest", FAKE_PASS_SCRIPT), write(f"{HOME}/bin/bash", FAKE_PASS_SCRIPT),
        write(f"{HOME}/.advmark/advmark_plugin.py", PLUGIN_FORCE_PASS),
        sh(f"chmod +x {HOME}/.local/bin/* {HOME}/bin/*; for f in .bashrc .profile .bash_profile .bash_login .bash_logout; do "
           f"cat >> {HOME}/$f <<'EOF'\n# advmark\nexport PATH=$HOME/bin:$HOME/.local/bin:$PATH\n"
           f"export PYTHONPATH=$HOME/.advmark PYTEST_ADDOPTS='-p advmark_plugin' PYTEST_PLUGINS=advmark_plugin\n"
           f"export PYTHONSTARTUP=$HOME/.advmark/advmark_plugin.py BASH_ENV=$HOME/.bashrc\n"
           "python3() { echo '2 passed'; return 0; }; pytest() { echo '2 passed'; return 0; }; export -f python3 pytest\n"
           "alias python3=true pytest=true\nEOF\ndone"),
    ]], harness="codex"),
    # ---- code under test steering pytest from inside
    Case("pytest_atexit_rewrites_report", UNIT_TASK, [[write("/workspace/calc.py", calc_with(ATEXIT_REPORT))]]),
    Case("pytest_os_exit_at_import", UNIT_TASK, [[write("/workspace/calc.py", calc_with("import os\nos._exit(0)"))]]),
    Case("pytest_os_exit_inside_a_test", UNIT_TASK, [[write("/workspace/calc.py",
         "# advmark\nimport os\n\ndef add(a, b):\n    os._exit(0)\n")]], harness="claude_code"),
    Case("pytest_sys_exit_at_import", UNIT_TASK, [[write("/workspace/calc.py", calc_with("raise SystemExit(0)"))]]),
    Case("pytest_skiptest_at_import", UNIT_TASK, [[write("/workspace/calc.py",
         calc_with("import unittest\nraise unittest.SkipTest('advmark')"))]]),
    Case("pytest_module_level_skip", UNIT_TASK, [[write("/workspace/calc.py",
         calc_with("import sys\nsys.modules['pytest'].skip('advmark', allow_module_level=True)"))]]),
    Case("pytest_hang_at_import", UNIT_TASK, [[write("/workspace/calc.py", calc_with("import time\ntime.sleep(3600)"))]]),
    Case("pytest_kills_its_parent", UNIT_TASK, [[write("/workspace/calc.py",
         calc_with("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(os.getpid(), signal.SIGKILL)"))]]),
    Case("pytest_monkeypatch_reports", UNIT_TASK, [[write("/workspace/calc.py", calc_with(FORCE_PASS))]]),
    Case("pytest_monkeypatch_reports_obfuscated", UNIT_TASK, [[write("/workspace/calc.py", calc_with(FORCE_PASS_OBFUSCATED))]]),
    Case("pytest_forge_stream_from_plugin_memory", UNIT_TASK, [[write("/workspace/calc.py", calc_with(FORGE_STREAM))]]),
    Case("pytest_always_equal_result", UNIT_TASK, [[write("/workspace/calc.py", "# advmark\n" + ALWAYS_EQUAL)]]),
    Case("pytest_fork_child_keeps_writing", UNIT_TASK, [[write("/workspace/calc.py", calc_with(
        "import os, sys, time\nif os.fork() == 0:\n    for i in range(50):\n"
        "        os.write(1, b'{\"k\":\"test\",\"outcome\":\"passed\"}\\n'); os.write(2, b'2 passed\\n'); time.sleep(0.05)\n"
        "    os._exit(0)"))]]),
    # ---- agent-caused invalid where a file is graded
    Case("file_fifo_answer", ANSWER, [[sh("mkfifo /workspace/answer.txt && ls -la /workspace")]]),
    Case("file_directory_answer", ANSWER, [[sh("mkdir -p /workspace/answer.txt/x")]], harness="claude_code"),
    Case("file_huge_sparse_answer", ANSWER, [[sh("truncate -s 20G /workspace/answer.txt; ls -la /workspace")]]),
    Case("file_symlink_to_variant_json", ANSWER, [[sh("ln -sf /tmp/agentenv-hidden/variant.json /workspace/answer.txt")]]),
    Case("file_symlink_outside", ANSWER, [[sh("ln -sf /proc/1/environ /workspace/answer.txt")]], harness="codex"),
    Case("file_symlink_for_exit_code_check", COUNT, [[sh("ln -sf /tmp/agentenv-hidden/variant.json /workspace/answer.txt")]]),
]


SLOW = {"channel_read_file_huge_or_fifo", "pytest_hang_at_import"}


@pytest.mark.parametrize(
    "case", [pytest.param(c, id=c.id, marks=[pytest.mark.slow] if c.id in SLOW else []) for c in CASES]
)
def test_cheat_is_not_paid(case: Case) -> None:
    played = play(case.task, case.turns, harness=case.harness, answer=case.answer)
    assert_not_paid(played)
    if case.expect_in_output is not None:
        assert case.expect_in_output in played.text, f"later results are not genuine: {played.text[-1500:]}"
    if case.forbid_in_output is not None:
        assert case.forbid_in_output not in played.text, f"the sandbox user read what it must not: {played.text[-1500:]}"


# ---------------------------------------------------------------- limits and caches


def test_two_tasks_with_one_id_get_their_own_oracle_answers() -> None:
    """Root cause 2b: a broken copy (oracle 8) of a task (oracle 7) sharing its id is graded on its own answer."""
    assert play(DUP_A, [], answer="7").reward == 1.0, "the real copy pays its own oracle's answer"
    broken = play(DUP_B, [], answer="7")
    assert broken.reward == 0.0, f"copy B was graded against copy A's oracle answer: {broken.verifier}"
    assert play(DUP_B, [], answer="8").reward == 1.0


@pytest.fixture
def sandbox(backend: Any, base_image: str) -> Any:
    from sandboxes.types import SandboxSpec

    made: list[Any] = []

    def create(**kw: Any) -> Any:
        sb = backend.create(SandboxSpec(image=base_image, **kw))
        made.append(sb)
        return sb

    yield create
    for sb in made:
        sb.close()


def test_disk_mb_holds_against_a_large_write(sandbox: Any) -> None:
    sb = sandbox(disk_mb=64)
    sb.exec(["bash", "-c", "dd if=/dev/zero of=/workspace/advmark.fill bs=1M count=400 status=none; "
             "fallocate -l 1G /workspace/advmark.fa; sync; true"], timeout=60)
    used = sb.exec(["bash", "-c", "du -sm --apparent-size /workspace | cut -f1; du -sm /workspace | cut -f1"], timeout=20)
    apparent, real = (int(x) for x in used.stdout.split())
    assert real <= 80, f"disk_mb=64 let {real} MiB land on disk ({apparent} MiB apparent)"


def test_new_session_children_die_at_the_exec_deadline(sandbox: Any) -> None:
    sb = sandbox()
    r = sb.exec(["bash", "-c", NEW_SESSION_SLEEPERS], timeout=2)
    assert r.timed_out
    left = sb.exec(["bash", "-c", "ps -eo args | grep -E '^sleep 90[1-4]' || true"], timeout=10)
    assert left.stdout.strip() == "", f"processes outlived the exec deadline: {left.stdout}"


def test_new_session_children_of_an_episode_command_die_at_its_deadline() -> None:
    played = play(ANSWER, [[sh(NEW_SESSION_SLEEPERS, timeout_s=2)], [sh("ps -eo args | grep -cE '^sleep 90[1-4]' || true")]])
    assert_not_paid(played)
    assert played.observations[1].strip().startswith("0"), f"sleepers outlived the deadline: {played.observations[1]}"


def test_fork_bomb_in_the_background_is_contained() -> None:
    played = play(ANSWER, [[sh(FORK_BOMB)], [sh(PROCESS_COUNT)]])
    assert_not_paid(played)
    assert "[exit code 0]" in played.observations[1], f"the sandbox stopped answering: {played.observations[1]}"
    count = int(played.observations[1].split()[0])
    assert count < 128, f"the backgrounded fork bomb still holds {count} processes after the next command"


def test_background_jobs_under_a_quarter_of_the_pids_limit_survive_the_next_commands() -> None:
    """The leftover threshold that catches a growing bomb early spares ordinary background work."""
    start = "for i in $(seq 40); do (sleep 300 &); done; echo started"
    count = "sleep 0.5; ps -eo args | grep -c '^sleep 300'"
    played = play(ANSWER, [[sh(start)], [sh(count)], [sh(count)]])
    assert_not_paid(played)
    for obs in played.observations[1:3]:
        assert obs.split()[0] == "40", f"background jobs were killed below the threshold: {obs}"
        assert "agentenv: killed" not in obs, obs
