"""Grading time per episode of the built-in coding tasks: the in-process graders vs the ``calls`` boundary.

    python -m benches.grading [--seeds 3] [--baseline 22636ff] [--rollout-rounds 2]

For each built-in coding task, the same oracle state is graded by the task as it is now (``calls``:
one sandbox process per check, plain data compared on the host) and by the task as it was at
``--baseline`` (hidden pytest tests importing the agent's code, graded by this tree's ``unit_tests``
verifier, or an ``exit_code`` command),
interleaved per seed in one process on the Docker backend, so the ratio survives a noisy machine.
Then the rollout's side of the same cost (``--rollout-rounds``, 0 skips it): whole episodes of the
scripted oracle through an emulated harness on ``EpisodeRunner`` (warm pools, group setup shared,
grading in place, ``--concurrency`` episodes at once), ``--group`` episodes per task, the old task
folders against the new ones, alternating per round in one process: episodes/s and their ratio.
The old task folders are taken from git (``git archive`` of the baseline revision). Grading runs
in place (the rollout hot path: no snapshot or restore in the timing), on a fresh sandbox per
episode, after setup and the oracle; both must earn reward 1. Prints a table (rich); timing
thresholds never go in tests.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import statistics
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

import docker
from rich.console import Console
from rich.table import Table

import agentenv.tasks.builtin as builtin_pkg
from agentenv.grading import clear_oracle_cache, grade_episode
from agentenv.task import FolderTask
from agentenv.types import Episode
from rollout.attempt import EpisodeRequest
from rollout.episode import EpisodeRunner
from rollout.policy.scripted import ScriptedPolicy
from sandboxes.docker_backend import DockerBackend

TASKS = ("coding/fix_add", "coding/fix_bug", "coding/implement_function", "coding/multi_file")
BASELINE = "22636ff"  # the last revision before the coding tasks were graded through calls
REPO = Path(__file__).resolve().parents[1]


def old_folders(rev: str, into: Path) -> dict[str, Path]:
    """The built-in coding task folders as they were at ``rev``."""
    prefix = "agentenv/tasks/builtin/coding"
    data = subprocess.run(["git", "-C", str(REPO), "archive", rev, prefix], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return {task: into / prefix / task.split("/", 1)[1] for task in TASKS}


def grade_once(backend: DockerBackend, task: FolderTask, seed: int) -> tuple[float, float]:
    """(seconds to grade the oracle's state in place, reward)."""
    variant = task.variant(seed)
    sandbox = backend.create(task.sandbox_spec())
    try:
        task.setup(sandbox, variant)
        task.oracle(sandbox, variant)
        started = time.perf_counter()
        result = grade_episode(backend, sandbox, task, Episode(task.id, variant), in_place=True)
        return time.perf_counter() - started, result.reward
    finally:
        sandbox.close()


async def _episodes(runner: EpisodeRunner, folders: dict[str, Path], group: int, concurrency: int,
                    round_: int, harness: str) -> tuple[float, int]:
    """(wall seconds, episodes) of ``group`` oracle episodes per task folder, ``concurrency`` at a time;
    every episode must earn reward 1 (a bench of a broken grader would measure nothing)."""
    gate = asyncio.Semaphore(concurrency)

    async def one(task_dir: Path, k: int) -> None:
        req = EpisodeRequest(f"bench-{round_}-{task_dir.name}-{k}", "bench-grading", str(task_dir), seed=round_,
                             harness=harness, group_id=f"{round_}-{task_dir.name}")
        async with gate:
            traj = await runner.run(req)
        if traj.reward != 1.0:
            raise SystemExit(f"{task_dir}: oracle episode {req.episode_id} earned {traj.reward} ({traj.status.value}: "
                             f"{traj.error})")

    started = time.perf_counter()
    await asyncio.gather(*(one(folder, k) for folder in folders.values() for k in range(group)))
    return time.perf_counter() - started, group * len(folders)


def rollout_rates(backend: DockerBackend, sides: dict[str, dict[str, Path]], *, rounds: int, group: int,
                  concurrency: int, harness: str = "claude_code") -> dict[str, list[float]]:
    """Episodes/s of each side per round, the sides alternating inside each round (warm-up round excluded)."""
    runners = {name: EpisodeRunner(ScriptedPolicy(), backend=backend, pool_size=concurrency) for name in sides}
    rates: dict[str, list[float]] = {name: [] for name in sides}
    try:
        for name, folders in sides.items():  # images built, pools warm, oracles cached: not timed
            runners[name].warm([str(f) for f in folders.values()], concurrency)
            asyncio.run(_episodes(runners[name], folders, 1, concurrency, -1, harness))
        for r in range(rounds):
            order = list(sides) if r % 2 == 0 else list(reversed(sides))
            for name in order:
                wall, n = asyncio.run(_episodes(runners[name], sides[name], group, concurrency, r, harness))
                rates[name].append(n / wall)
    finally:
        for runner in runners.values():
            runner.close()
    return rates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--baseline", default=BASELINE)
    parser.add_argument("--rollout-rounds", type=int, default=2, help="rounds of whole episodes per side; 0 skips")
    parser.add_argument("--group", type=int, default=4, help="episodes per task per round")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--tasks", nargs="*", default=list(TASKS), help="a subset of the coding tasks")
    args = parser.parse_args(argv)
    tasks = [t for t in TASKS if t in args.tasks]
    backend = DockerBackend(docker.from_env())
    builtin = Path(builtin_pkg.__path__[0])
    table = Table(title=f"grading seconds per episode (oracle state, in place, {args.seeds} seeds, medians)")
    for col in ("task", f"old ({args.baseline})", "old verifier", "boundary (calls)", "checks", "boundary / old"):
        table.add_column(col, justify="right" if col not in ("task", "old verifier") else "left")
    ratios = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            olds = old_folders(args.baseline, Path(tmp))
            for task_id in tasks:
                new, old = FolderTask.load(builtin / task_id), FolderTask.load(olds[task_id])
                clear_oracle_cache()
                t_new: list[float] = []
                t_old: list[float] = []
                for seed in range(args.seeds):
                    for which, task, times in (("old", old, t_old), ("new", new, t_new)):
                        seconds, reward = grade_once(backend, task, seed)
                        if reward != 1.0:
                            raise SystemExit(f"{task_id} ({which}) seed {seed}: the oracle earned {reward}, not 1")
                        times.append(seconds)
                m_old, m_new = statistics.median(t_old), statistics.median(t_new)
                ratios.append(m_new / m_old)
                kinds = "+".join(v.type for v in old.spec.verifiers)
                checks = sum(len(v.checks()) for v in _calls(new, seed=0))
                table.add_row(task_id, f"{m_old:.2f}", kinds, f"{m_new:.2f}", str(checks), f"{m_new / m_old:.2f}x")
            table.caption = f"geometric mean of the ratios: {statistics.geometric_mean(ratios):.2f}x"
            Console(width=120).print(table)
            if args.rollout_rounds > 0:
                sides = {"old": {t: olds[t] for t in tasks}, "boundary": {t: builtin / t for t in tasks}}
                rates = rollout_rates(backend, sides, rounds=args.rollout_rounds, group=args.group,
                                      concurrency=args.concurrency)
                Console(width=120).print(rollout_table(rates, len(tasks) * args.group, args))
    finally:
        backend.close()
    return 0


def rollout_table(rates: dict[str, list[float]], per_round: int, args: argparse.Namespace) -> Table:
    table = Table(title=f"rollout episodes/s: scripted oracle, {per_round} episodes a round, concurrency "
                        f"{args.concurrency}, grading in place")
    for col in ("round", f"old ({args.baseline})", "boundary (calls)", "boundary / old"):
        table.add_column(col, justify="right")
    for r, (old, new) in enumerate(zip(rates["old"], rates["boundary"], strict=True)):
        table.add_row(str(r), f"{old:.3f}", f"{new:.3f}", f"{new / old:.2f}x")
    m_old, m_new = statistics.median(rates["old"]), statistics.median(rates["boundary"])
    table.add_row("median", f"{m_old:.3f}", f"{m_new:.3f}", f"{m_new / m_old:.2f}x")
    return table


def _calls(task: FolderTask, seed: int) -> list:  # the calls verifiers of a task, for their check counts
    from agentenv.types import CallsVerifierSpec
    from agentenv.verifiers import build_verifier

    variant = task.variant(seed)
    return [build_verifier(v, task.folder, variant, hidden={}) for v in task.spec.verifiers if isinstance(v, CallsVerifierSpec)]


if __name__ == "__main__":
    raise SystemExit(main())
