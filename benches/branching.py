"""What a tree group costs against independent episodes of the same number of leaves, on real Docker episodes.

    python -m benches.branching [--rounds 2] [--turn 2] [--k 4] [--walk 4] [--sleep 0.3] [--resume-episodes 2] [--kill-at 3]

Each round runs one group of ``k`` leaves two ways, in one process on the Docker backend, through
``EpisodeRunner`` with the real tokenizer: a tree (one root of ``general/shell_script`` forked after
turn ``--turn`` into ``k`` continuations: ``FixedTurns((turn,), k)``) and ``k`` independent episodes.
The policy is ``Walker``: ``--walk`` exploratory shell turns (``echo`` a step drawn from the
episode's sampling seed, then ``sleep --sleep``: a stand-in for a build or test run), then the
oracle's call and submit, or, for some seeds, a wrong submit: leaves differ after the branch and are
graded on their own. Sandbox-seconds, generated tokens and learner tokens (a tree's shared prefix
once, ``rollout.branching.tree_costs``) per group are printed as a rich table with the ratios.
Then the resume table: ``--resume-episodes`` episodes whose container is killed before turn ``--kill-at``
(``Killing``), continued from the last turn-boundary snapshot against rerun from scratch: turns sampled,
sandbox-seconds and wall time. Timing thresholds never go in tests; the smoke test checks the table prints and the tree's leaves
share their prefix.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import random
import statistics
import time
from typing import Any

import docker
from rich.console import Console
from rich.table import Table

from agentenv.intents import Intent
from rollout.attempt import EpisodeContext, EpisodeRequest, SamplingParams
from rollout.branching import BranchRole, FixedTurns, branch_requests, leaves_per_root, tree_costs
from rollout.episode import EpisodeRunner
from rollout.harnesses.base import BaseHarness
from rollout.policy.scripted import ScriptedPolicy
from rollout.policy.types import FinishReason, Generation, Policy, Prompt, ThinkingBudget
from rollout.types import Trajectory

TASK = "general/shell_script"
HARNESS = "bash"


class Walker(Policy):
    """``walk`` exploratory shell turns drawn from the sampling seed, then the oracle (or, with probability
    ``wrong``, a wrong submit). Its per-episode state is in attributes, so ``copy.copy`` forks it."""

    name = "walker"

    def __init__(self, walk: int = 3, sleep_s: float = 0.0, wrong: float = 0.5, *, version: int = 0) -> None:
        self.walk, self.sleep_s, self.wrong = walk, sleep_s, wrong
        self._version = version

    @property
    def version(self) -> int:
        return self._version

    def for_episode(self, ctx: EpisodeContext) -> Policy:
        return _Walk(self, ctx)

    async def generate(self, prompt: Prompt, sampling: SamplingParams, budget: ThinkingBudget | None = None) -> Generation:
        raise RuntimeError("Walker needs its episode: run it through EpisodeRunner")


class _Walk(Policy):
    def __init__(self, parent: Walker, ctx: EpisodeContext) -> None:
        self.name, self.parent, self.ctx, self.turn = parent.name, parent, ctx, 0
        self.oracle = ScriptedPolicy(version=parent.version).for_episode(ctx)

    def __copy__(self) -> _Walk:
        twin = object.__new__(_Walk)
        twin.__dict__.update(self.__dict__)
        twin.oracle = copy.copy(self.oracle)  # its turn counter too, or two leaves would share it
        return twin

    @property
    def version(self) -> int:
        return self.parent.version

    async def generate(self, prompt: Prompt, sampling: SamplingParams, budget: ThinkingBudget | None = None) -> Generation:
        t = self.turn
        self.turn += 1
        harness = self.ctx.harness
        assert isinstance(harness, BaseHarness)  # noqa: S101 - the emulated harnesses are
        rng = random.Random(f"{sampling.seed}:{t}")
        if t < self.parent.walk:
            command = f"echo step{t}-{rng.randrange(10**6)} >> $HOME/walk.log; sleep {self.parent.sleep_s}"
            return _text(harness.render_turn([Intent("exec_shell", {"command": command})]), self.version)
        if t == self.parent.walk and rng.random() < self.parent.wrong:
            return _text(harness.render_turn([Intent("submit", {"answer": "no idea"})]), self.version)
        return await self.oracle.generate(prompt, sampling, budget)


class Killing(Policy):
    """``inner``, killing its episode's container once per episode id, before turn ``at``: a sandbox lost mid-episode.
    Counts every turn it samples (``sampled``), so a resume's saving is the turns it did not sample again."""

    name = "killing"

    def __init__(self, inner: Walker, at: int, client: Any = None) -> None:
        self.inner, self.at, self.client = inner, at, client
        self.killed: set[str] = set()
        self.sampled = 0

    @property
    def version(self) -> int:
        return self.inner.version

    def for_episode(self, ctx: EpisodeContext) -> Policy:
        return _Killing(self, ctx)

    async def generate(self, prompt: Prompt, sampling: SamplingParams, budget: ThinkingBudget | None = None) -> Generation:
        raise RuntimeError("Killing needs its episode: run it through EpisodeRunner")


class _Killing(Policy):
    def __init__(self, parent: Killing, ctx: EpisodeContext) -> None:
        self.name, self.parent, self.ctx = parent.name, parent, ctx
        self.walk = parent.inner.for_episode(ctx)

    def __copy__(self) -> _Killing:
        twin = object.__new__(_Killing)
        twin.__dict__.update(self.__dict__)
        twin.walk = copy.copy(self.walk)
        return twin

    @property
    def version(self) -> int:
        return self.parent.version

    async def generate(self, prompt: Prompt, sampling: SamplingParams, budget: ThinkingBudget | None = None) -> Generation:
        parent, eid = self.parent, self.ctx.request.episode_id
        if getattr(self.walk, "turn", 0) == parent.at and eid not in parent.killed:
            parent.killed.add(eid)
            client = parent.client or docker.from_env()
            client.containers.get(self.ctx.sandbox.container_id).kill()  # type: ignore[attr-defined]
        parent.sampled += 1
        return await self.walk.generate(prompt, sampling, budget)


def _text(text: str, version: int) -> Generation:
    return Generation(text=text, token_ids=(), logprobs=(), finish_reason=FinishReason.STOP, policy_version=version)


def group_requests(kind: str, round_: int, turn: int, k: int) -> list[EpisodeRequest]:
    """``k`` leaves of one (task, seed) group: a tree (``kind == "tree"``) or independent episodes."""
    reqs = [EpisodeRequest(f"bench-{kind}-{round_}/{j}", "bench-branching", TASK, seed=round_, harness=HARNESS,
                           effort="high", group_id=f"bench-{kind}-{round_}",
                           sampling=SamplingParams(seed=1000 * round_ + j + (0 if kind == "tree" else 500)))
            for j in range(k)]
    if kind == "tree":
        return branch_requests(reqs, BranchRole(root="", kind="fixed", turns=(turn,), k=k))
    return reqs


async def run_group(runner: EpisodeRunner, reqs: list[EpisodeRequest]) -> tuple[list[Trajectory], float]:
    started = time.monotonic()
    trajs = await asyncio.gather(*(runner.run(r) for r in reqs))
    return list(trajs), time.monotonic() - started


def measure(rounds: int, turn: int, k: int, walk: int, sleep_s: float) -> dict[str, list[dict[str, Any]]]:
    """Per round and kind: the group's ``TreeCosts``, rewards and wall seconds."""
    from rollout.tokenizer import build_tokenizer
    from sandboxes.docker_backend import DockerBackend

    if leaves_per_root(FixedTurns((turn,), k)) != k:
        raise SystemExit("one branch point of k continuations is k leaves")
    backend = DockerBackend(docker.from_env())
    tok = build_tokenizer()
    runner = EpisodeRunner(Walker(walk, sleep_s), backend=backend, tokenizer=tok, pool_size=k)
    out: dict[str, list[dict[str, Any]]] = {"tree": [], "independent": []}

    async def go() -> None:
        for r in range(rounds):
            order = ("tree", "independent") if r % 2 == 0 else ("independent", "tree")  # alternate: drift cancels
            for kind in order:
                trajs, wall = await run_group(runner, group_requests(kind, r, turn, k))
                out[kind].append({"costs": tree_costs(trajs), "wall_s": wall, "trajs": trajs,
                                  "rewards": [t.reward for t in trajs], "statuses": [t.status.value for t in trajs]})

    try:
        runner.warm([TASK], k)
        asyncio.run(go())
    finally:
        runner.close()
        backend.close()
    return out


def measure_resume(episodes: int, at: int, walk: int, sleep_s: float) -> dict[str, dict[str, Any]]:
    """``episodes`` episodes whose container is killed before turn ``at``, continued from the last snapshot
    (``resume_from_snapshots``) against rerun from scratch (the runner's retry): turns sampled, sandbox-s, wall."""
    from rollout.tokenizer import build_tokenizer
    from sandboxes.docker_backend import DockerBackend

    backend = DockerBackend(docker.from_env())
    tok = build_tokenizer()
    out: dict[str, dict[str, Any]] = {}
    try:
        for mode in ("resume", "rerun"):
            policy = Killing(Walker(walk, sleep_s, wrong=0.0), at, backend.client)
            runner = EpisodeRunner(policy, backend=backend, tokenizer=tok, pool_size=2, sandbox_retries=1)
            reqs = [EpisodeRequest(f"bench-{mode}/{j}", "bench-branching", TASK, seed=j, harness=HARNESS, effort="high",
                                   sampling=SamplingParams(seed=j), resume_from_snapshots=mode == "resume")
                    for j in range(episodes)]
            try:
                runner.warm([TASK], 1)
                trajs, wall = asyncio.run(run_group(runner, reqs))
            finally:
                runner.close()
            out[mode] = {"sampled": policy.sampled, "sandbox_s": sum(t.timings.sandbox_s for t in trajs), "wall_s": wall,
                         "statuses": [t.status.value for t in trajs], "resumes": sum(len(t.verifier.get("resumes", ())) for t in trajs),
                         "reruns": sum(len(t.verifier.get("retries", ())) for t in trajs)}
    finally:
        backend.close()
    return out


def resume_table(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> Table:
    t = Table(title=f"{args.resume_episodes} episodes of {TASK} via {HARNESS}, each container killed before turn "
                    f"{args.kill_at}: continued from the last turn-boundary snapshot vs rerun from scratch (totals)")
    t.caption = ("recorded sandbox-s: what the trajectories record; a rerun's record drops its lost attempt, a resumed "
                 "episode's keeps it, so compare turns sampled and wall time")
    for col in ("mode", "turns sampled", "recorded sandbox-s", "wall s", "resumes", "reruns", "statuses"):
        t.add_column(col, justify="left" if col in ("mode", "statuses") else "right")
    for mode, r in results.items():
        t.add_row(mode, str(r["sampled"]), f"{r['sandbox_s']:.2f}", f"{r['wall_s']:.1f}", str(r["resumes"]), str(r["reruns"]),
                  ",".join(sorted(set(r["statuses"]))))
    res, rer = results["resume"], results["rerun"]
    t.add_row("saved by resume", str(rer["sampled"] - res["sampled"]), "", f"{rer['wall_s'] - res['wall_s']:.1f}", "", "", "")
    return t


def table(results: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> Table:
    t = Table(title=f"per group of {args.k} leaves, {TASK} via {HARNESS}: tree = 1 root forked after turn "
                    f"{args.turn} into {args.k} vs {args.k} independent ({args.rounds} rounds, means)")
    for col in ("group", "leaves", "sandbox-s", "generated tokens", "learner tokens (prefix once)",
                "learner tokens (flat)", "mean reward", "wall s"):
        t.add_column(col, justify="left" if col == "group" else "right")

    def mean(kind: str, field: str) -> float:
        rows = results[kind]
        return statistics.fmean(float(getattr(r["costs"], field)) for r in rows)

    for kind in ("tree", "independent"):
        rows = results[kind]
        t.add_row(kind, f"{mean(kind, 'leaves'):.0f}", f"{mean(kind, 'sandbox_s'):.2f}",
                  f"{mean(kind, 'generated_tokens'):.0f}", f"{mean(kind, 'learner_tokens'):.0f}",
                  f"{mean(kind, 'learner_tokens_flat'):.0f}",
                  f"{statistics.fmean(x for r in rows for x in r['rewards']):.2f}",
                  f"{statistics.fmean(r['wall_s'] for r in rows):.1f}")
    ratio = {f: mean("tree", f) / max(mean("independent", f), 1e-9)
             for f in ("sandbox_s", "generated_tokens", "learner_tokens")}
    wall = statistics.fmean(r["wall_s"] for r in results["tree"]) / statistics.fmean(r["wall_s"] for r in results["independent"])
    t.add_row("tree / independent", "", f"{ratio['sandbox_s']:.2f}x", f"{ratio['generated_tokens']:.2f}x",
              f"{ratio['learner_tokens']:.2f}x", "", "", f"{wall:.2f}x")
    return t


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--turn", type=int, default=2, help="branch after this 0-based turn")
    parser.add_argument("--k", type=int, default=4, help="leaves per group")
    parser.add_argument("--walk", type=int, default=4, help="exploratory turns before the oracle")
    parser.add_argument("--sleep", type=float, default=0.3, help="seconds each exploratory command sleeps")
    parser.add_argument("--resume-episodes", type=int, default=2, help="episodes of the resume table (0 skips it)")
    parser.add_argument("--kill-at", type=int, default=3, help="the resume table kills each container before this turn")
    args = parser.parse_args(argv)
    if not 0 <= args.turn < args.walk:
        raise SystemExit(f"--turn: expected 0 <= turn < --walk ({args.walk}), got {args.turn}")
    if args.resume_episodes and not 0 < args.kill_at <= args.walk:
        raise SystemExit(f"--kill-at: expected 0 < kill_at <= --walk ({args.walk}), got {args.kill_at}")
    results = measure(args.rounds, args.turn, args.k, args.walk, args.sleep)
    bad = [(kind, r["statuses"]) for kind, rows in results.items() for r in rows if set(r["statuses"]) - {"ok"}]
    Console(width=140).print(table(results, args))
    for row in results["tree"]:
        failed = [t.verifier["branch"]["failed"] for t in row["trajs"] if t.verifier["branch"]["failed"]]
        if failed:
            print(f"branch failures: {failed}")
    if args.resume_episodes:
        resumed = measure_resume(args.resume_episodes, args.kill_at, args.walk, args.sleep)
        Console(width=140).print(resume_table(resumed, args))
        bad += [(mode, r["statuses"]) for mode, r in resumed.items() if set(r["statuses"]) - {"ok"}]
        if resumed["resume"]["resumes"] != args.resume_episodes:
            bad.append(("resume", [f"{resumed['resume']['resumes']} resumes for {args.resume_episodes} kills"]))
    if bad:
        print(f"episodes not ok: {bad}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
