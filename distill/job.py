"""``python -m distill.job CONFIG [--json PATH] [--store URL] [--run-id ID] [--seed N] [--resume]``: MOPD as a process.

The same entry point serves ``agentenv distill`` (which adds rich progress bars)
and ``ray job submit --working-dir . -- python -m distill.job CONFIG`` on a
cluster; with ``runner: ray`` the student's rollouts run on Ray workers while the
teachers score in this driver, next to the learner. Exit codes: 0 done, 2 a bad
config, a grid that does not cover the run, or a checkpoint that does not fit.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from learner.errors import CheckpointError
from learner.job import PrintReporter
from rollout.config import ConfigError
from teachers.types import TeacherConfigError

__all__ = ["main"]

SUMMARY_KEYS = ("run_id", "pass_rate_after_warm_start", "pass_rate_after_rl", "improvement_points", "learning_curve_png")


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    from distill.loop import run_distill
    from distill.types import load_distill_config

    parser = argparse.ArgumentParser(prog="python -m distill.job", description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("--json", type=Path, default=None, help="write the run summary here")
    parser.add_argument("--store", default=None, help="override the config's store URL")
    parser.add_argument("--run-id", default=None)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--resume", action="store_true", help="continue this config's run from its newest checkpoint")
    args = parser.parse_args(argv)
    try:
        cfg, root = load_distill_config(args.config, store=args.store, run_id=args.run_id, seed=args.seed)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _interrupt)  # ray job stop unwinds like Ctrl-C: sandboxes are released
    try:
        summary = run_distill(cfg, root, json_path=args.json, reporter=PrintReporter(), resume=args.resume)
    except (ConfigError, TeacherConfigError, CheckpointError) as exc:
        print(exc, file=sys.stderr)
        return 2
    print("distill-report: " + json.dumps({k: summary[k] for k in SUMMARY_KEYS}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
