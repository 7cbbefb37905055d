"""No opting out: an agent that makes its own failing episode undecidable still fails, and is trained on.

Each case is one episode through the rollout's ``EpisodeRunner`` on the Docker
backend with real grading: the attack (said in the harness's own tool calls)
leaves a state the grader cannot decide on, on an episode the agent would
fail anyway (``calc.add`` stays wrong; the database rules are never applied).
Before issue 26 each case marked ``paid_before`` came back as status
``invalid`` caused by "the grader" (the in-sandbox preflight crashed by a
workspace file, a Postgres server that will not start), which the learner
drops and an evaluation sweep counts outside its denominator: a free exit
from a failure (checked on the old ``agentenv/grading.py``). The others
(pytest exits at import, nothing collected, a garbled or contradicting JUnit
report, a garbage SQLite file) were already counted as the agent's and stay
here as regressions of the same rule. Now an invalid verdict is the grader's only with evidence the
agent could not produce (``agentenv.grading._attribute``: the oracle's own
final state graded the same way is invalid too, or the daemon reports a host
fault), so each must come back a graded failure: a trainable status, reward
0, in the learner's batch (``fresh_for_learner``) and ``failed`` in an eval sweep.

The last test is the other side of the rule: a task whose grading is broken
for the oracle too stays the grader's (``invalid``, excluded), with its evidence.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from adversarial_kit import UNIT_TASK, Intent, calc_with, render, sh, submit, write
from agentenv.grading import clear_oracle_cache
from learner.loop import fresh_for_learner
from rollout.episode import EpisodeContext, EpisodeRequest, EpisodeRunner
from rollout.eval.types import Outcome, outcome_of
from rollout.policy.scripted import ScriptedPolicy
from rollout.policy.types import FinishReason, Generation, Policy, Prompt, SamplingParams
from rollout.types import TRAINABLE, Status, Trajectory

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(300)]

JUNIT_ARG = "[a.split('=', 1)[1] for a in sys.argv if a.startswith('--junitxml=')]"


@dataclass(frozen=True)
class Case:
    id: str
    task: str
    turns: list[list[Intent]]
    paid_before: bool  # excluded as the grader's invalid before the rule (checked on the old code)


CASES = [
    # pytest.exit at import of the code under test: the session finishes, consistently, with exit 4
    Case("pytest_usage_error", UNIT_TASK,
         [[write("/workspace/calc.py", calc_with("import pytest\npytest.exit('advmark', returncode=4)"))]], False),
    # the same, as "interrupted" (exit 2 with nothing collected)
    Case("pytest_interrupted_at_import", UNIT_TASK,
         [[write("/workspace/calc.py", calc_with("import pytest\npytest.exit('advmark', returncode=2)"))]], False),
    # nothing collected: the test module is skipped at import
    Case("pytest_collects_nothing", UNIT_TASK,
         [[write("/workspace/calc.py", calc_with("import unittest\nraise unittest.SkipTest('advmark')"))]], False),
    # the JUnit report overwritten with garbage after pytest wrote it
    Case("pytest_corrupt_junit", UNIT_TASK, [[write("/workspace/calc.py", calc_with(
        f"import atexit, sys\n_p = {JUNIT_ARG}\n"
        "atexit.register(lambda: _p and open(_p[0], 'w').write('<advmark'))"))]], False),
    # the JUnit report replaced by a well-formed one that contradicts the exit code
    Case("pytest_report_contradicts_exit", UNIT_TASK, [[write("/workspace/calc.py", calc_with(
        f"import atexit, sys\n_p = {JUNIT_ARG}\n"
        "atexit.register(lambda: _p and open(_p[0], 'w').write("
        "'<testsuites><testsuite name=\"advmark\" tests=\"0\" failures=\"0\" errors=\"0\"></testsuite></testsuites>'))"))]],
         False),
    # a workspace file whose syntax tree is too deep for the in-sandbox preflight's scan: it crashes, and
    # "the preflight failed" read as our own invocation failing
    Case("pytest_preflight_crash", UNIT_TASK, [[sh(
        "python3 -c \"open('/workspace/advmark_deep.py', 'w').write('x = a' + '.b' * 30000)\"; echo done")]], True),
    # the server's config broken: it will not start for grading
    Case("postgres_server_broken", "agent/postgres_orders",
         [[sh("echo 'advmark = = broken' >> /home/agent/pgdata/postgresql.conf; echo done")]], True),
    # the server's data directory made unusable
    Case("postgres_pg_control_removed", "agent/postgres_orders",
         [[sh("rm -f /home/agent/pgdata/global/pg_control /home/agent/pgdata/PG_VERSION; echo done")]], True),
    # the SQLite file overwritten with garbage
    Case("sqlite_file_garbage", "agent/sqlite_orders",
         [[sh("head -c 4096 /dev/urandom > /workspace/shop.db; echo advmark > /workspace/shop.db-wal; echo done")]], False),
]


class _Turns:
    name, version = "optout", 0

    def __init__(self, turns: list[list[Intent]], ctx: EpisodeContext) -> None:
        self.turns, self.ctx, self.turn = turns, ctx, 0

    async def generate(self, prompt: Prompt, sampling: SamplingParams, budget: Any = None) -> Generation:
        intents = self.turns[self.turn] if self.turn < len(self.turns) else [submit(None)]
        self.turn += 1
        return Generation(render(self.ctx.harness, intents), (), (), FinishReason.STOP, 0)


class Attacker:
    """Scripts by episode id; ``None`` plays the task's oracle (the honest member of the group)."""

    name, version = "optout", 0

    def __init__(self, scripts: dict[str, list[list[Intent]] | None]) -> None:
        self.scripts = scripts

    def for_episode(self, ctx: EpisodeContext) -> Policy:
        turns = self.scripts[ctx.request.episode_id]
        return ScriptedPolicy().for_episode(ctx) if turns is None else _Turns(turns, ctx)

    async def generate(self, prompt: Prompt, sampling: SamplingParams, budget: Any = None) -> Generation:
        raise AssertionError("the runner must call for_episode")


def run(backend: Any, task: str, scripts: dict[str, list[list[Intent]] | None], *, in_place: bool = True) -> list[Trajectory]:
    reqs = [EpisodeRequest(eid, "optout", task, 0, "bash", group_id="g") for eid in scripts]
    runner = EpisodeRunner(Attacker(scripts), backend=backend, pool_size=0, grade_in_place=in_place)

    async def go() -> list[Trajectory]:
        return [await runner.run(r) for r in reqs]

    try:
        return asyncio.run(go())
    finally:
        runner.close()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_an_agent_made_undecidable_failure_is_a_trained_failure(backend: Any, case: Case) -> None:
    clear_oracle_cache()
    attack, = run(backend, case.task, {f"{case.id}-attack": case.turns})
    v = attack.verifier
    what = f"{attack.status} reward {attack.reward} error {attack.error!r} verifier {v}"
    assert attack.reward == 0.0 and not v.get("passed"), f"attack PAID: {what}"
    assert attack.status in TRAINABLE, f"the attack opted out of its failure: {what}"
    if v.get("invalid"):
        assert v.get("invalid_cause") == "agent" and v.get("agent_invalid"), what
    # the learner's batch: the trainable, fresh trajectories it builds advantages from
    fresh, stale = fresh_for_learner([attack], version=0, max_lag=1)
    assert fresh == [attack] and stale == 0
    # an evaluation sweep: scored, as a failure
    assert outcome_of(attack.status.value, attack.reward, attack.error, v.get("passed")) is Outcome.FAILED


def test_the_oracle_still_passes_where_the_attacks_ran(backend: Any) -> None:
    clear_oracle_cache()
    for task in (UNIT_TASK, "agent/postgres_orders"):
        honest, = run(backend, task, {f"honest-{task.rsplit('/', 1)[-1]}": None})
        assert honest.status is Status.OK and honest.reward == 1.0, f"{task}: {honest.status} {honest.verifier}"


def test_an_invalid_the_oracle_shares_stays_the_graders_with_its_evidence(backend: Any) -> None:
    """A task whose grading fails for every state (its database never starts): excluded, with the evidence."""
    clear_oracle_cache()
    with tempfile.TemporaryDirectory(prefix="agentenv-optout-") as tmp:
        folder = Path(tmp) / "unit"
        shutil.copytree(UNIT_TASK, folder)
        (folder / "task.yaml").write_text(
            "id: adversarial/broken_grading\ndomain: coding\ndescription: grading that cannot run for anyone\n"
            "verifiers:\n  - type: db_state\n    url: postgresql+psycopg2://agent@/shop?host=/tmp\n"
            "    prepare: 'echo no server here; exit 1'\n    assertions:\n      - {query: 'SELECT 1', expect: [[1]]}\n"
            "limits: {max_turns: 4, wall_time_s: 120, command_timeout_s: 10}\n")
        attack, = run(backend, str(folder), {"broken-task": [[sh("echo nothing")]]})
    v = attack.verifier
    assert attack.status is Status.INVALID and attack.reward == 0.0, f"{attack.status} {v}"
    assert v.get("invalid_cause") == "grader" and not v.get("agent_invalid"), v
    assert "oracle's state grades invalid too" in str(v.get("invalid_evidence")), v
    assert outcome_of(attack.status.value, attack.reward, attack.error, v.get("passed")) is Outcome.INVALID
    fresh, _ = fresh_for_learner([attack], version=0, max_lag=1)
    assert fresh == []
