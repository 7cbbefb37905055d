"""Benchmark: a real CLI through the gateway against the emulated harness of the same surface, same tasks, same run.

Prints one table: per harness, the mean episode time, its ratio to the
emulated harness measured in the same run, where the time went (sandbox
start and setup, the CLI's own run less the policy, the policy behind the
gateway, grading), the mean model calls, and for the CLIs the token
exactness: the share of episodes whose recorded tokens are append-only (one
sequence, no break), with each break counted by its cause.

    python -m benches.gateway --episodes 100 --explore 3 --task all --json runs/gateway-bench.json

Both sides replay the task's oracle after ``explore`` harmless shell calls
(``ls -la``; fewer where the task's turn limit leaves no room for the oracle and
the answer), so the episodes are multi-turn and the two sides make the same
tool calls: the difference is the harness, not a model. ``--task all`` cycles
the episodes through every built-in task (episode i runs task i mod the number of registered tasks, seed i).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import statistics
import time
from pathlib import Path
from typing import Any

from agentenv.intents import Intent
from rollout.episode import EpisodeRequest, EpisodeRunner
from rollout.harnesses.native import NATIVE_HARNESSES
from rollout.policy.scripted import NativeDoNothingPolicy, NativeOraclePolicy, ScriptedPolicy
from rollout.policy.types import FinishReason, Generation, Policy, Prompt, SamplingParams, ThinkingBudget


class ExploringOracle:
    """The emulated side: ``explore`` ``ls -la`` calls in the harness's own format, then the oracle replay."""

    name = "exploring-oracle"
    version = 0

    def __init__(self, explore: int) -> None:
        self.explore = explore
        self._oracle = ScriptedPolicy()

    def for_episode(self, ctx: Any) -> Policy:
        explore = min(self.explore, max(ctx.task.limits.max_turns - 2, 0))  # as NativeOraclePolicy: the oracle and the answer fit
        return _Exploring(explore, ctx, self._oracle.for_episode(ctx))


class _Exploring(Policy):
    name, version = "exploring-oracle", 0

    def __init__(self, explore: int, ctx: Any, oracle: Policy) -> None:
        self._left, self._ctx, self._oracle, self._turn = explore, ctx, oracle, 0

    async def generate(self, prompt: Prompt, sampling: SamplingParams, budget: ThinkingBudget | None = None) -> Generation:
        if self._turn < self._left:
            text = self._ctx.harness.render_turn([Intent("exec_shell", {"command": f"ls -la # look {self._turn}"})])
            self._turn += 1
            return Generation(text, (), (), FinishReason.STOP, 0)
        return await self._oracle.generate(prompt, sampling, budget)


def _tasks(spec: str) -> list[str]:
    if spec == "all":
        from agentenv.registry import list_tasks

        return [t.id for t in list_tasks()]
    return [t for t in spec.split(",") if t]


def _one_per_image(tasks: list[str]) -> list[str]:
    """The first task of each distinct task image: warming these builds every CLI image the run needs."""
    from agentenv.registry import get_task

    firsts: dict[str, str] = {}
    for task_id in tasks:
        firsts.setdefault(get_task(task_id).sandbox_spec(build=False).image, task_id)
    return list(firsts.values())


def _row(harness: str, base: str, trajs: list[Any], wall: float) -> dict[str, Any]:
    def mean(values: list[float]) -> float:
        return statistics.mean(values) if values else 0.0

    times = [t.timings.total_s for t in trajs]
    causes: collections.Counter[str] = collections.Counter()
    exact = 0
    for t in trajs:
        for b in t.verifier.get("gateway_breaks", []):
            causes[b["cause"]] += 1
        exact += bool(t.verifier.get("append_only", not t.verifier.get("template_breaks")))
    cli = [t for t in trajs if "cli_s" in t.verifier]
    return {
        "harness": harness, "base": base, "n": len(trajs), "wall_s": wall,
        "mean_s": mean(times), "p50_s": statistics.median(times) if times else 0.0,
        # CLI episodes: the sandbox's start and task setup (their sandbox_s also holds the CLI's own time)
        "sandbox_s": mean([t.verifier.get("start_s", t.timings.sandbox_s) for t in trajs]), "policy_s": mean([t.timings.policy_s for t in trajs]),
        "verifier_s": mean([t.timings.verifier_s for t in trajs]),
        "cli_s": mean([t.verifier["cli_s"] for t in cli]) if cli else None,
        # the gateway's own time (HTTP body, splicing, rendering, the reply) less the policy's
        "gateway_s": mean([t.verifier["gateway_s"] - t.timings.policy_s for t in cli]) if cli else None,
        "calls": mean([len(t.turns) for t in trajs]), "reward": mean([t.reward for t in trajs]),
        "not_ok": collections.Counter(t.status.value for t in trajs if t.status.value != "ok"),
        "exact": exact / len(trajs) if trajs else 0.0, "breaks": dict(causes),
        "multi_turn": sum(len(t.turns) >= 3 for t in trajs),
    }


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benches.gateway", description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--episodes", type=int, default=3, help="episodes per harness (the issue's exactness goal: >= 100; 0: only --startup)")
    ap.add_argument("--explore", type=int, default=2, help="shell calls before the oracle, on both sides")
    ap.add_argument("--task", default="general/answer_number", help="a task id, a comma list, or 'all' (cycled)")
    ap.add_argument("--clis", default=",".join(sorted(NATIVE_HARNESSES)))
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    ap.add_argument("--startup", type=int, default=0,
                    help="also this many do-nothing episodes per CLI (one model call, then the CLI exits): its start-up cost")
    args = ap.parse_args()

    import docker

    from rollout.tokenizer import build_tokenizer
    from sandboxes.docker_backend import DockerBackend

    client = docker.from_env(timeout=600)
    backend = DockerBackend(client)
    tok = build_tokenizer()
    tasks = _tasks(args.task)
    warm = _one_per_image(tasks)
    rows: list[dict[str, Any]] = []
    starts: list[dict[str, Any]] = []
    for cli_name in args.clis.split(","):
        emulated = NATIVE_HARNESSES[cli_name].emulated
        pair: tuple[tuple[str, Policy | Any], ...] = (
            (emulated, ExploringOracle(args.explore)), (cli_name, NativeOraclePolicy(explore=args.explore)))
        for harness, policy in pair if args.episodes > 0 else ():
            runner = EpisodeRunner(policy, backend=backend, tokenizer=tok, pool_size=1)
            gate = asyncio.Semaphore(args.concurrency)

            async def one(i: int, task: str = "", harness: str = harness, runner: EpisodeRunner = runner):
                async with gate:
                    task = task or tasks[i % len(tasks)]
                    return await runner.run(EpisodeRequest(f"bench-{harness}-{i}", "bench", task, i, harness, effort="high"))

            async def run_all():
                return await asyncio.gather(*(one(i) for i in range(args.episodes)))

            async def warm_up():  # one episode per task image (image builds, pools), not counted
                return await asyncio.gather(*(one(10_000 + j, task) for j, task in enumerate(warm)))

            asyncio.run(warm_up())
            t0 = time.monotonic()
            trajs = asyncio.run(run_all())
            wall = time.monotonic() - t0
            runner.close()
            rows.append(_row(harness, emulated, list(trajs), wall))
            r = rows[-1]
            print(f"  {harness}: {r['n']} episodes in {wall:.0f}s, mean {r['mean_s']:.2f}s, append-only {r['exact']:.0%}", flush=True)
        if args.startup:
            runner = EpisodeRunner(NativeDoNothingPolicy(), backend=backend, tokenizer=tok, pool_size=1)

            async def idle(n: int, first: int = 0, harness: str = cli_name, runner: EpisodeRunner = runner):
                out = []
                for i in range(first, first + n):  # one at a time: the CLI's own start, not a queue
                    out.append(await runner.run(EpisodeRequest(f"bench-idle-{harness}-{i}", "bench", tasks[0], i, harness, effort="high")))
                return out

            asyncio.run(idle(1, 10_000))  # the image, not counted
            trajs = asyncio.run(idle(args.startup))
            runner.close()
            starts.append({"harness": cli_name, "n": len(trajs), "cli_s": statistics.mean(t.verifier.get("cli_s", 0.0) for t in trajs),
                           "p50_cli_s": statistics.median(t.verifier.get("cli_s", 0.0) for t in trajs),
                           "start_s": statistics.mean(t.verifier.get("start_s", 0.0) for t in trajs)})
    base = {r["harness"]: r["mean_s"] for r in rows}
    for r in rows:
        r["ratio"] = r["mean_s"] / base[r["base"]] if base[r["base"]] else None
    print(f"tasks {args.task}, {args.episodes} episodes per harness, explore={args.explore}, concurrency={args.concurrency}")
    print(f"{'harness':16} {'n':>4} {'mean s':>7} {'p50 s':>7} {'x emul':>7} {'sandbox':>7} {'cli-pol':>7} {'policy':>7} "
          f"{'grade':>6} {'gw':>5} {'calls':>5} {'reward':>6} {'append-only':>11}  breaks by cause / not ok")
    for r in rows:
        cli_less_policy = f"{r['cli_s'] - r['policy_s']:>7.2f}" if r["cli_s"] is not None else f"{'-':>7}"
        gateway = f"{r['gateway_s']:>5.2f}" if r.get("gateway_s") is not None else f"{'-':>5}"
        print(f"{r['harness']:16} {r['n']:>4} {r['mean_s']:>7.2f} {r['p50_s']:>7.2f} {r['ratio']:>7.2f} {r['sandbox_s']:>7.2f} "
              f"{cli_less_policy} {r['policy_s']:>7.2f} {r['verifier_s']:>6.2f} {gateway} {r['calls']:>5.1f} {r['reward']:>6.2f} "
              f"{r['exact']:>10.0%}  {r['breaks'] or '-'} {dict(r['not_ok']) or ''}")
    for st in starts:
        print(f"{st['harness']}: do-nothing episode (start, one model call, exit) {st['cli_s']:.2f}s mean, {st['p50_cli_s']:.2f}s p50, "
              f"sandbox start {st['start_s']:.2f}s, n={st['n']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        doc = {"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows, "startup": starts}
        args.json.write_text(json.dumps(doc, indent=1, default=dict))


if __name__ == "__main__":
    main()
