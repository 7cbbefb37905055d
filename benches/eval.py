"""The sweep's overhead against ``agentenv rollout`` on the same episodes, in the same run.

``python -m benches.eval [--rounds 2] [--seeds 2] [--tag quickstart] [--json PATH]``

Both runners get the same episodes: every (task, seed) of the selection under
each of the three rotated harnesses at effort ``high`` (the rollout plans them
as groups of 3 with ``round_robin`` rotation, the sweep as tasks x seeds x
harnesses with one sample), the scripted oracle, the same workers, slots and
pools, on one embedded Ray. Rounds alternate (rollout, sweep, rollout, ...) so
neither side profits from a warmer machine. Episodes/s is over the scheduler's
run (after workers and warm pools are up, which both pay once per run and
which is reported apart). Prints a table with the ratio sweep / rollout and
saves it as PNG next to the JSON.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import uuid
from pathlib import Path
from statistics import mean
from typing import Any

from rich.console import Console
from rich.table import Table

__all__ = ["main", "run_bench"]


def run_bench(*, rounds: int = 2, seeds: int = 2, tag: str = "quickstart", workers: int = 2, concurrency: int = 2,
              log: Any = print) -> dict[str, Any]:
    import ray

    from rollout.config import parse_config
    from rollout.eval.config import parse_sweep
    from rollout.eval.runner import run_sweep
    from rollout.job import run_rollout

    harnesses = ["claude_code", "codex", "kimi_code"]
    tmp = Path(tempfile.mkdtemp(prefix="eval-bench-"))
    common = {"workers": workers, "concurrency": concurrency, "pool_size": 1, "ray": {"num_cpus": 2}}
    ray.init(address="local", num_cpus=2, include_dashboard=False, resources={"docker_daemon": float(workers)})
    rows: dict[str, list[dict[str, float]]] = {"rollout": [], "sweep": []}
    try:
        for r in range(rounds):
            rid = f"bench-{uuid.uuid4().hex[:6]}"
            rcfg = parse_config({"run_id": f"{rid}-rollout", "store": f"sqlite:///{tmp / 'rollout.db'}",
                                 "tasks": {"tags": [tag]}, "seeds": seeds, "group_size": 3,
                                 "rotation": {"kind": "round_robin", "harnesses": harnesses},
                                 "efforts": {"levels": ["high"]}, "policy": {"kind": "scripted"}, **common})
            t0 = time.perf_counter()
            rep = run_rollout(rcfg)
            wall = time.perf_counter() - t0
            rows["rollout"].append({"episodes": rep.stored, "run_s": rep.elapsed_s, "wall_s": wall,
                                    "ok": rep.by_status.get("ok", 0)})
            log(f"round {r}: rollout {rep.stored} episodes in {rep.elapsed_s:.1f}s ({wall:.1f}s with start-up)")
            scfg = parse_sweep({"sweep_id": f"{rid}-sweep", "store": f"sqlite:///{tmp / 'sweep.db'}",
                                "out": str(tmp / "out"), "policies": [{"name": "oracle", "kind": "oracle"}],
                                "tasks": {"tags": [tag]}, "seeds": seeds, "harnesses": harnesses,
                                "efforts": ["high"], **common})
            t0 = time.perf_counter()
            run = run_sweep(scfg)
            wall = time.perf_counter() - t0
            rows["sweep"].append({"episodes": len(run.results), "run_s": run.counters["elapsed_s"], "wall_s": wall,
                                  "ok": sum(x.outcome.value == "passed" for x in run.results)})
            log(f"round {r}: sweep {len(run.results)} episodes in {run.counters['elapsed_s']:.1f}s ({wall:.1f}s with start-up)")
    finally:
        ray.shutdown()
    out: dict[str, Any] = {"rounds": rounds, "seeds": seeds, "tag": tag, "workers": workers, "concurrency": concurrency}
    for name, rs in rows.items():
        out[name] = {"episodes": rs[0]["episodes"], "ok": rs[-1]["ok"], "run_s": mean(x["run_s"] for x in rs),
                     "wall_s": mean(x["wall_s"] for x in rs),
                     "episodes_per_s": mean(x["episodes"] / x["run_s"] for x in rs), "rounds": rs}
    out["ratio"] = out["sweep"]["episodes_per_s"] / out["rollout"]["episodes_per_s"]
    out["ratio_wall"] = out["rollout"]["wall_s"] / out["sweep"]["wall_s"]
    out["goal"] = 0.9
    return out


def _png(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.5, 3))
    names = ["rollout", "sweep"]
    ax.bar(names, [result[n]["episodes_per_s"] for n in names], color=["#888", "#3a7"])
    ax.set_ylabel("episodes/s (mean of rounds)")
    ax.set_title(f"sweep / rollout = {result['ratio']:.2f} (goal >= {result['goal']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benches.eval", description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--tag", default="quickstart")
    ap.add_argument("--json", dest="json_path", default="runs/eval-bench/bench.json")
    args = ap.parse_args(argv)
    console = Console()
    result = run_bench(rounds=args.rounds, seeds=args.seeds, tag=args.tag, log=console.log)
    t = Table(title=f"sweep vs `agentenv rollout`: same {result['sweep']['episodes']} episodes, scripted oracle, "
                    f"{result['rounds']} alternating rounds")
    for col in ("runner", "episodes", "passed/ok", "run s", "episodes/s", "wall s (with start-up)"):
        t.add_column(col, justify="left" if col == "runner" else "right")
    for name in ("rollout", "sweep"):
        m = result[name]
        t.add_row(name if name == "sweep" else "rollout (baseline)", str(m["episodes"]), str(m["ok"]), f"{m['run_s']:.1f}",
                  f"{m['episodes_per_s']:.2f}", f"{m['wall_s']:.1f}")
    console.print(t)
    console.print(f"ratio (episodes/s, sweep / rollout): [bold]{result['ratio']:.2f}[/bold] (goal >= {result['goal']}); "
                  f"wall with start-up, rollout / sweep: {result['ratio_wall']:.2f}")
    path = Path(args.json_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    _png(result, path.with_suffix(".png"))
    console.print(f"wrote {path} and {path.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
