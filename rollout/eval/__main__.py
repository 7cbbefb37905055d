"""``python -m rollout.eval SWEEP.yaml [--out DIR] [--json PATH] [--resume]``: the cluster entry point.

Under ``ray job submit --working-dir . -- python -m rollout.eval SWEEP.yaml`` the
job supervisor sets ``RAY_ADDRESS`` and the sweep connects to that cluster;
otherwise Ray starts embedded. Exit status: 0 when every planned cell is stored
exactly once, 1 when some are missing, 2 for a bad config or a refused resume.
The summary is also printed as one JSON line prefixed ``eval-report:``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console

    from rollout.config import ConfigError
    from rollout.eval.config import load_sweep
    from rollout.eval.live import SweepProgress, print_tables
    from rollout.eval.report import write_outputs
    from rollout.eval.runner import run_sweep
    from rollout.eval.types import EvalError

    parser = argparse.ArgumentParser(prog="python -m rollout.eval", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("sweep", help="sweep YAML (docs/eval.md)")
    parser.add_argument("--out", help="output folder (default: the sweep's out, else runs/eval/<sweep_id>)")
    parser.add_argument("--json", dest="json_path", help="also write results.json here")
    parser.add_argument("--resume", action="store_true", help="continue a sweep: run only the cells not stored yet")
    parser.add_argument("--store", help="override the sweep's store URL")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    console = Console()
    try:
        cfg = load_sweep(args.sweep, out=args.out, store=args.store)
        with SweepProgress(console) as progress:
            run = run_sweep(cfg, resume=args.resume, on_event=progress.on_event, on_start=progress.on_start)
        doc = write_outputs(run, cfg.out_dir, json_path=Path(args.json_path) if args.json_path else None)
    except (EvalError, ConfigError) as exc:
        console.print(f"[red]{exc}[/red]")
        return 2
    print_tables(console, doc)
    console.print(f"wrote {cfg.out_dir}/results.json, episodes.parquet, report.md and {len(doc['pictures'])} PNGs")
    brief = {"sweep_id": cfg.sweep_id, "planned": doc["planned"], "stored": doc["stored"], "missing": len(doc["missing"]),
             "by_policy": {k: {f: v[f] for f in ("n", "pass_rate", "infrastructure", "invalid")} for k, v in doc["by_policy"].items()}}
    print("eval-report: " + json.dumps(brief, sort_keys=True, default=str), flush=True)
    return 0 if run.complete else 1


if __name__ == "__main__":
    sys.exit(main())
