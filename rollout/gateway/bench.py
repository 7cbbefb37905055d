"""Benchmark: a real CLI through the gateway against the emulated harness of the same surface, same task, same run.

Prints one table: per harness, the mean episode time (and its ratio to the
emulated harness measured in the same run), the mean model calls, and for the
CLIs the token exactness: the share of episodes whose recorded tokens are
append-only (one sequence, no break), with each break counted by its cause.

    python -m rollout.gateway.bench --episodes 100 --explore 3 --task general/answer_number

The policy is the oracle replay (``explore`` harmless shell calls first, for
multi-turn episodes), so the numbers are the harness's overhead, not a model's.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import statistics
import time

from rollout.cli_episode import CliOraclePolicy
from rollout.episode import EpisodeRequest, EpisodeRunner
from rollout.harnesses.cli import CLI_HARNESSES
from rollout.policy.scripted import ScriptedPolicy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=3, help="episodes per harness (the issue's exactness goal: 100)")
    ap.add_argument("--explore", type=int, default=2, help="shell calls before the oracle (CLI episodes)")
    ap.add_argument("--task", default="general/answer_number")
    ap.add_argument("--clis", default=",".join(sorted(CLI_HARNESSES)))
    ap.add_argument("--concurrency", type=int, default=1)
    args = ap.parse_args()

    import docker

    from rollout.tokenizer import build_tokenizer
    from sandboxes.docker_backend import DockerBackend

    client = docker.from_env(timeout=600)
    backend = DockerBackend(client)
    tok = build_tokenizer()
    rows = []
    for cli_name in args.clis.split(","):
        emulated = CLI_HARNESSES[cli_name].emulated
        for harness, policy in ((emulated, ScriptedPolicy()), (cli_name, CliOraclePolicy(explore=args.explore))):
            runner = EpisodeRunner(policy, backend=backend, tokenizer=tok, pool_size=1)
            gate = asyncio.Semaphore(args.concurrency)

            async def one(i: int, harness: str = harness, runner: EpisodeRunner = runner):
                async with gate:
                    return await runner.run(EpisodeRequest(f"bench-{harness}-{i}", "bench", args.task, i, harness, effort="high"))

            async def run_all():
                return await asyncio.gather(*(one(i) for i in range(args.episodes)))

            # one warm-up episode (image build, pools, oracle cache) is not counted
            asyncio.run(one(10_000))
            t0 = time.monotonic()
            trajs = asyncio.run(run_all())
            wall = time.monotonic() - t0
            runner.close()
            times = [t.timings.total_s for t in trajs]
            causes: collections.Counter[str] = collections.Counter()
            exact = 0
            for t in trajs:
                for b in t.verifier.get("gateway_breaks", []):
                    causes[b["cause"]] += 1
                exact += bool(t.verifier.get("append_only", not t.verifier.get("template_breaks")))
            rows.append({
                "harness": harness, "n": len(trajs), "mean_s": statistics.mean(times), "p50_s": statistics.median(times),
                "calls": statistics.mean(len(t.turns) for t in trajs), "reward": statistics.mean(t.reward for t in trajs),
                "exact": exact / len(trajs), "breaks": dict(causes), "wall_s": wall, "base": emulated,
            })
    base = {r["harness"]: r["mean_s"] for r in rows}
    print(f"task {args.task}, {args.episodes} episodes per harness, explore={args.explore}")
    print(f"{'harness':18} {'n':>4} {'mean s':>8} {'p50 s':>8} {'x emulated':>10} {'calls':>6} {'reward':>6} {'append-only':>11}  breaks by cause")
    for r in rows:
        ratio = r["mean_s"] / base[r["base"]]
        print(f"{r['harness']:18} {r['n']:>4} {r['mean_s']:>8.2f} {r['p50_s']:>8.2f} {ratio:>10.2f} {r['calls']:>6.1f} {r['reward']:>6.2f} {r['exact']:>10.0%}  {r['breaks'] or '-'}")


if __name__ == "__main__":
    main()
