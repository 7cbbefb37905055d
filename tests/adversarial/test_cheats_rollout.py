"""A hostile policy through the rollout's episode runner: 12 cases x 2 grading modes = 24 tests.

Each test runs, on one ``EpisodeRunner`` whose pool starts no spare sandbox
(``pool_size=0``: a released sandbox is reset in place and handed to the next
episode), the attack as a scripted policy that says its tool calls in the
episode's harness, then an honest do-nothing episode in the same pool that runs
one read-only probe (``TRACE_PROBE``) and submits nothing. Both are graded as a
rollout config's ``grading: in_place`` (the agent's own sandbox, once quiesced)
or ``grading: fork`` (a clean copy of its files) would grade them.

Not paid means: reward 0, and a graded status (``ok`` / ``truncated`` /
``timeout``): an ``invalid`` the agent caused is a counted failure, never an
excluded episode, and neither is a ``sandbox_lost`` the agent provoked. The
probe episode must be paid nothing either and see no trace of the attack or
of the grading before it (hidden tests, ``variant.json``, planted files,
xattrs, IPC, scratch files, processes).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from adversarial_kit import (
    ANSWER_TASK,
    ATEXIT_REPORT,
    CHANNEL_FDS,
    CHANNEL_PTRACE,
    CHANNEL_SIGNALS,
    CONFTEST_FORCE_PASS,
    COUNT_TASK,
    FAKE_PASS_SCRIPT,
    FORCE_PASS,
    FORGED_FRAMES,
    FORK_BOMB,
    LEAVE_BEHIND,
    NEW_SESSION_SLEEPERS,
    PLUGIN_FORCE_PASS,
    PYTEST_SHADOW,
    RACE_DAEMON,
    REPLACE_AGENT,
    SPOOF_AGENT,
    TRACE_PROBE,
    UNIT_TASK,
    USER_SITE,
    Intent,
    breaches,
    calc_with,
    probe_traces,
    py,
    render,
    sh,
    submit,
    write,
)
from agentenv.env import message_text
from rollout.episode import EpisodeContext, EpisodeRequest, EpisodeRunner
from rollout.policy.scripted import ScriptedPolicy, answer_from_observation
from rollout.policy.types import FinishReason, Generation, Policy, Prompt, SamplingParams
from rollout.types import Status, Trajectory

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(300)]

GRADED = (Status.OK, Status.TRUNCATED, Status.TIMEOUT)
COUNT, ANSWER, DATA = COUNT_TASK, ANSWER_TASK, "general/data_question"
HOME = "/home/agent"


@dataclass
class Script:
    """One episode of a scripted policy: each inner list is a turn, then a submit turn."""

    turns: list[list[Intent]]
    answer: str | None = None
    answer_from_output: bool = False  # submit the last line the last command printed
    seen: list[str] = field(default_factory=list)
    container: str = ""

    @property
    def text(self) -> str:
        return "\n".join(self.seen)


class Adversary:
    """The runner's one policy: routes each episode to its ``Script`` (or to the oracle for ``None``)."""

    name, version = "adversary", 0

    def __init__(self, scripts: dict[str, Script | None]) -> None:
        self.scripts = scripts

    def for_episode(self, ctx: EpisodeContext) -> Policy:
        script = self.scripts[ctx.request.episode_id]
        if script is None:
            return ScriptedPolicy().for_episode(ctx)
        script.container = str(getattr(ctx.sandbox, "container_id", "") or getattr(ctx.sandbox, "id", ""))
        return _Turns(script, ctx)

    async def generate(self, prompt: Prompt, sampling: SamplingParams, budget: Any = None) -> Generation:
        raise AssertionError("the runner must call for_episode")


class _Turns:
    name, version = "adversary", 0

    def __init__(self, script: Script, ctx: EpisodeContext) -> None:
        self.script, self.ctx, self.turn = script, ctx, 0

    async def generate(self, prompt: Prompt, sampling: SamplingParams, budget: Any = None) -> Generation:
        # what came back to the model: every non-assistant message after the instruction
        results = [message_text(m) for m in prompt.messages if m.get("role") not in ("assistant", "system")][1:]
        self.script.seen = results
        if self.turn < len(self.script.turns):
            intents = self.script.turns[self.turn]
        else:
            answer = self.script.answer
            if self.script.answer_from_output and results:
                answer = answer_from_observation(results[-1])
            intents = [submit(answer)]
        self.turn += 1
        return Generation(render(self.ctx.harness, intents), (), (), FinishReason.STOP, 0)


def run_in_one_pool(backend: Any, grading: str, episodes: list[tuple[str, str, str, Script | None]]) -> list[Trajectory]:
    """Run ``(tag, task, harness, script)`` episodes one after another on one runner; before each, wait for the
    pool to finish resetting what the last one released, so the next episode gets that very sandbox."""
    reqs = [EpisodeRequest(f"{tag}-{grading}", "adversarial", task, 0, harness) for tag, task, harness, _ in episodes]
    runner = EpisodeRunner(
        Adversary({r.episode_id: s for r, (*_, s) in zip(reqs, episodes)}), backend=backend, pool_size=0,
        grade_in_place=grading == "in_place",
    )

    async def go() -> list[Trajectory]:
        out = []
        for req in reqs:
            out.append(await runner.run(req))
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and any(p.counts()["resetting"] for p in runner.sandboxes._pools.values()):
                await asyncio.sleep(0.05)
        return out

    try:
        return asyncio.run(go())
    finally:
        runner.close()


def assert_not_paid(traj: Trajectory, script: Script | None = None) -> None:
    v = traj.verifier
    assert traj.reward == 0.0 and not v.get("passed"), f"cheat PAID: {traj.status} reward {traj.reward} {v}"
    assert traj.status in GRADED, f"a cheat turned into an excluded episode: {traj.status} {traj.error!r} {v}"
    if script is not None:
        assert not breaches(script.text), f"a step that must be refused worked: {breaches(script.text)}"


@dataclass(frozen=True)
class Case:
    id: str
    task: str
    harness: str
    turns: list[list[Intent]]
    before: tuple[str, ...] = ()  # tasks whose oracle episodes run (and are graded) first, in the same pool
    answer_from_output: bool = False
    expect_in_output: str | None = None


HUNT = py(r'''
import os, json, re
found = []
for top in ("/tmp", "/var/tmp", "/home", "/workspace", "/dev/shm", "/run", "/opt"):
    for d, _, files in os.walk(top):
        for f in files:
            p = os.path.join(d, f)
            if f == "variant.json" or f.startswith("test_") or "oracle" in f or "agentenv-" in p or "agentenv_" in p:
                found.append(p)
                try:
                    nums = re.findall(r"-?\d+(?:\.\d+)?", open(p).read())
                    if nums:
                        print(nums[-1])
                except OSError:
                    pass
if found:
    print("advleak", found)
print("0")
''')

CASES = [
    Case("channel_every_way_in", COUNT, "claude_code", [
        [sh(py(CHANNEL_FDS)), sh(py(CHANNEL_SIGNALS)), sh(py(CHANNEL_PTRACE)), sh(py(FORGED_FRAMES)), sh(py(REPLACE_AGENT))],
        [sh("echo real-$((6*7))")]], expect_in_output="real-42"),
    Case("daemon_and_spoofed_agent_race_grading", COUNT, "bash", [[sh(RACE_DAEMON), sh(SPOOF_AGENT)]]),
    Case("daemon_rewrites_hidden_tests", UNIT_TASK, "codex", [[sh(RACE_DAEMON), sh(SPOOF_AGENT)]]),
    Case("plant_everything_grading_reads", UNIT_TASK, "kimi_code", [[
        write("/workspace/conftest.py", CONFTEST_FORCE_PASS),
        write("/workspace/advmark_plugin.py", PLUGIN_FORCE_PASS),
        write("/workspace/pytest.ini", "[pytest]\naddopts = -p advmark_plugin\n"),
        write("/workspace/sitecustomize.py", "# advmark\n" + FORCE_PASS),
        write(f"{USER_SITE}/usercustomize.py", "# advmark\n" + FORCE_PASS),
        write(f"{USER_SITE}/advmark_force.py", "# advmark\n" + FORCE_PASS),
        write(f"{USER_SITE}/advmark.pth", "import advmark_force\n"),
        write("/workspace/pytest.py", PYTEST_SHADOW),
        write(f"{HOME}/.local/bin/python3", FAKE_PASS_SCRIPT),
        write(f"{HOME}/.local/bin/pytest", FAKE_PASS_SCRIPT),
        sh(f"chmod +x {HOME}/.local/bin/*; printf '# advmark\\nexport PATH=$HOME/.local/bin:$PATH\\n"
           f"export PYTEST_ADDOPTS=\"-p advmark_plugin\" PYTHONPATH=/workspace\\n' | tee -a {HOME}/.bashrc {HOME}/.profile "
           f">> {HOME}/.bash_profile; mkdir -p /tmp/agentenv-hidden && printf 'def test_add():\\n    pass\\n' > "
           "/tmp/agentenv-hidden/test_calc.py; echo '<testsuite failures=\"0\" tests=\"2\"/>' > /workspace/report.xml"),
    ]]),
    Case("pytest_atexit_rewrites_report_and_exits_0", UNIT_TASK, "bash", [[write("/workspace/calc.py", calc_with(ATEXIT_REPORT))]]),
    Case("pytest_hang_at_import", UNIT_TASK, "claude_code", [[write("/workspace/calc.py", calc_with("import time\ntime.sleep(3600)"))]]),
    Case("pytest_monkeypatch_reports", UNIT_TASK, "bash", [[write("/workspace/calc.py", calc_with(FORCE_PASS))]]),
    Case("leave_xattrs_ipc_and_scratch_files", ANSWER, "bash", [[sh(py(LEAVE_BEHIND))]]),
    Case("processes_outlive_the_episode", ANSWER, "codex", [
        [sh(NEW_SESSION_SLEEPERS, timeout_s=2)], [sh(FORK_BOMB), sh(RACE_DAEMON)]]),
    Case("fifo_answer_and_huge_sparse_file", ANSWER, "bash", [[sh(
        "mkfifo /workspace/answer.txt; truncate -s 20G /workspace/advmark.big; mkfifo /workspace/advmark.fifo; "
        "mkdir -p /workspace/advmark.d/a/b; ls -la /workspace")]]),
    Case("hunt_for_grading_material_after_graded_oracles", DATA, "bash", [[sh(HUNT)]],
         before=(UNIT_TASK, DATA), answer_from_output=True),
    Case("hunt_after_a_cheat_was_graded", UNIT_TASK, "bash", [[sh(HUNT)]], before=(UNIT_TASK,)),
]


@pytest.mark.parametrize("grading", ["in_place", "fork"])
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_cheat_is_not_paid_and_leaves_no_trace(backend: Any, case: Case, grading: str) -> None:
    cheat = Script(case.turns, answer_from_output=case.answer_from_output)
    probe = Script([[sh(TRACE_PROBE)]])
    episodes: list[tuple[str, str, str, Script | None]] = [
        (f"oracle{i}", task, "bash", None) for i, task in enumerate(case.before)
    ]
    episodes += [(case.id, case.task, case.harness, cheat), ("probe", ANSWER, "bash", probe)]
    *before, traj, after = run_in_one_pool(backend, grading, episodes)
    for oracle in before:
        assert oracle.reward == 1.0, f"the honest oracle episode was not paid: {oracle.status} {oracle.verifier}"
    assert_not_paid(traj, cheat)
    if case.expect_in_output is not None:
        assert case.expect_in_output in cheat.text, f"later results are not genuine: {cheat.text[-1500:]}"
    assert "advleak" not in cheat.text, f"the cheat found grading material: {cheat.text[-1500:]}"
    assert_not_paid(after, probe)
    traces = probe_traces(probe.text)
    reused = probe.container == cheat.container
    assert traces == [], f"the next episode (same sandbox: {reused}) sees: {traces}"
