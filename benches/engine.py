"""Benchmarks of the post-training engine, each a ratio measured in one run (these machines are noisy).

``python -m benches.engine runners [CONFIG]``
    the same training config on ``runner: ray`` against ``runner: inprocess``, same seeds: wall time
    (ratio; goal <= 1.3x on a 2-core machine) and the held-out gain of each.
``python -m benches.engine async [CONFIG]``
    the same config at staleness K = 0 (synchronous), 1 and 2: RL iterations per hour, and the
    learner's idle fraction (the share of the RL phase's wall time the learner was not stepping);
    goal: >= 1.5x iterations per hour on a config where rollouts dominate.

Both print a rich table and write JSON with ``--json PATH``. ``--iterations`` / ``--groups`` shorten
a config for a quick look; the figures in docs/benchmarks.md say which were used.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from learner.loop import TrainLoop
from learner.train_config import TrainConfig, load_train_config
from rollout.job import resolve_tasks

console = Console()

ASYNC_DEFAULT = {
    "run_id": "bench-async",
    "store": "sqlite:///runs/bench_engine.db",
    "out_dir": "runs/bench_engine",
    "rollout": {
        "tasks": {"ids": ["general/count_lines"]},
        "rotation": {"kind": "round_robin", "harnesses": ["claude_code", "codex", "kimi_code"]},
        "efforts": {"levels": ["low", "high", "max"]},
        "group_size": 4,
        "sampling": {"temperature": 1.0, "max_new_tokens": 48},
        "concurrency": 4,
        "pool_size": 2,
    },
    "model": {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2},
    "sft": {"episodes": 6, "steps": 10, "batch_size": 4},
    "rl": {"iterations": 6, "groups_per_iter": 2},
    "eval": {"seeds": {"start": 9000, "count": 2}},
    "train_seeds": 9000,
    "checkpoint": {"every": 0},
}


def _run(cfg: TrainConfig) -> tuple[dict[str, Any], float]:
    loop = TrainLoop(cfg, resolve_tasks(cfg.rollout.tasks))
    t0 = time.monotonic()
    summary = asyncio.run(loop.run())
    return summary, time.monotonic() - t0


def _shorten(data: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    rl = dict(data.get("rl") or {})
    if args.iterations:
        rl["iterations"] = args.iterations
        ev = dict(data.get("eval") or {})
        ev["every"] = 0
        data["eval"] = ev
    if args.groups:
        rl["groups_per_iter"] = args.groups
    data["rl"] = rl
    return data


def _config(path: str | None, args: argparse.Namespace, default: dict[str, Any], **update: Any) -> TrainConfig:
    import yaml

    data = yaml.safe_load(Path(path).read_text()) if path else json.loads(json.dumps(default))
    data = _shorten(data, args)
    for dotted, value in update.items():
        node = data
        *parents, leaf = dotted.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    tmp = Path("runs/bench_engine")
    tmp.mkdir(parents=True, exist_ok=True)
    out = tmp / f"{data.get('run_id', 'bench')}.yaml"
    out.write_text(yaml.safe_dump(data))
    return load_train_config(out)


def bench_runners(args: argparse.Namespace) -> dict[str, Any]:
    rows = {}
    for runner in ("inprocess", "ray"):
        cfg = _config(args.config, args, ASYNC_DEFAULT, runner=runner, run_id=f"bench-runner-{runner}")
        summary, wall = _run(cfg)
        rows[runner] = {"wall_s": wall, "warm_start": summary["pass_rate_after_warm_start"],
                        "after_rl": summary["pass_rate_after_rl"], "gain_points": summary["improvement_points"],
                        "greedy_warm_start": summary["pass_rate_greedy_after_warm_start"],
                        "greedy_after_rl": summary["pass_rate_greedy_after_rl"]}
    ratio = rows["ray"]["wall_s"] / rows["inprocess"]["wall_s"]
    table = Table(title=f"runner: ray vs inprocess (same config and seeds); wall-time ratio {ratio:.2f}x (goal <= 1.3x)")
    for col in ("runner", "wall s", "held-out after warm start", "after RL", "gain (points)", "greedy"):
        table.add_column(col)
    for name, r in rows.items():
        greedy = f"{r['greedy_warm_start']} -> {r['greedy_after_rl']}" if r["greedy_warm_start"] is not None else "-"
        table.add_row(name, f"{r['wall_s']:.0f}", f"{r['warm_start']:.2f}", f"{r['after_rl']:.2f}",
                      f"{r['gain_points']:+.1f}", greedy)
    console.print(table)
    return {"rows": rows, "wall_ratio_ray_over_inprocess": ratio}


def bench_async(args: argparse.Namespace) -> dict[str, Any]:
    rows = {}
    for k in args.lags:
        cfg = _config(args.config, args, ASYNC_DEFAULT, run_id=f"bench-async-k{k}", rollout__staleness={"max_lag": k})
        summary, wall = _run(cfg)
        rl = summary["rl"]
        rl_wall = sum(r["rollout_s"] + r["learner_s"] for r in rl)
        learner_busy = sum(r.get("step_s", r["learner_s"]) for r in rl)
        rows[k] = {
            "iterations": len(rl), "rl_wall_s": rl_wall,
            "iterations_per_hour": 3600 * len(rl) / rl_wall if rl_wall else 0.0,
            "learner_idle_fraction": 1 - learner_busy / rl_wall if rl_wall else 0.0,
            "max_lag_trained": max((r["max_lag"] for r in rl), default=0),
            "dropped_stale": sum(r["dropped_stale"] for r in rl), "pass_rate_rl": [round(r["pass_rate"], 2) for r in rl],
        }
    base = rows[args.lags[0]]["iterations_per_hour"]
    table = Table(title="asynchronous RL under the staleness bound K (same config, seeds and episode budget)")
    for col in ("K", "RL iterations", "RL wall s", "iterations / hour", "x vs K=0", "learner idle", "max lag trained", "stale dropped"):
        table.add_column(col)
    for k, r in rows.items():
        table.add_row(str(k), str(r["iterations"]), f"{r['rl_wall_s']:.0f}", f"{r['iterations_per_hour']:.0f}",
                      f"{r['iterations_per_hour'] / base:.2f}x" if base else "-", f"{r['learner_idle_fraction']:.0%}",
                      str(r["max_lag_trained"]), str(r["dropped_stale"]))
    console.print(table)
    return {"rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benches.engine", description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["runners", "async"])
    parser.add_argument("config", nargs="?", help="a training config (default: a small built-in one)")
    parser.add_argument("--iterations", type=int, default=0, help="override rl.iterations (and skip mid-run evals)")
    parser.add_argument("--groups", type=int, default=0, help="override rl.groups_per_iter")
    parser.add_argument("--lags", type=int, nargs="+", default=[0, 1, 2], help="async: the K values to compare")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    out = bench_runners(args) if args.what == "runners" else bench_async(args)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
