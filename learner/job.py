"""``python -m learner.job CONFIG [--json PATH] [--store URL] [--run-id ID] [--seed N] [--resume]``: training as a process.

The same entry point, with the same options, serves ``agentenv train`` (which
adds a rich progress display) and ``ray job submit --working-dir . -- python -m
learner.job CONFIG`` on a cluster. Under a job the supervisor sets
``RAY_ADDRESS``, so a config with ``runner: ray`` connects to that cluster and
places its rollout workers on the nodes that declare the worker resource
(``ray start --head --num-cpus 2 --resources '{"docker_daemon": 2}'``); with
``runner: inprocess`` the whole run stays in the job's driver.
Exit codes: 0 done, 2 bad config or a checkpoint that does not fit, 3 a rank of the sharded learner
(``trainer.world_size``) died or timed out (``--resume`` continues from the last checkpoint).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

from learner.errors import CheckpointError, DistributedError
from learner.loop import Reporter, TrainLoop
from learner.report import write_outputs
from learner.train_config import TrainConfig, load_train_config
from rollout.config import ConfigError

__all__ = ["REPORT_KEYS", "job_parser", "main", "run_training", "unwind_on_sigterm"]


class PrintReporter:
    """Plain lines on stdout: what a Ray job's log shows."""

    def phase(self, name: str, total: int) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {name} ({total})", flush=True)

    def advance(self, detail: str = "") -> None:
        pass

    def log(self, line: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)


def run_training(
    cfg: TrainConfig, *, json_path: Path | None = None, reporter: Reporter | None = None, resume: bool = False
) -> dict[str, Any]:
    """Warm start, RL, evaluations, then the curve / report / summary under ``out_dir/run_id``.

    ``resume``: continue this config's run from its newest checkpoint (``learner.checkpoint``).
    """
    from rollout.job import resolve_tasks

    loop = TrainLoop(cfg, resolve_tasks(cfg.rollout.tasks), reporter=reporter, resume=resume)
    summary = asyncio.run(loop.run())
    return write_outputs(summary, loop.history, cfg.run_dir(), json_path)


#: what a job prints of its summary on its report line (``train-report:`` / ``distill-report:``)
REPORT_KEYS = ("run_id", "pass_rate_after_warm_start", "pass_rate_after_rl", "improvement_points", "learning_curve_png")


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def unwind_on_sigterm() -> None:
    """SIGTERM (ray job stop, kill) unwinds like Ctrl-C, so the runner's finally releases its sandboxes."""
    signal.signal(signal.SIGTERM, _interrupt)


def job_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """The options every training job takes: CONFIG, --json, --store, --run-id, --seed, --resume."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("config")
    parser.add_argument("--json", type=Path, default=None, help="write the run summary here")
    parser.add_argument("--store", default=None, help="override the config's store URL")
    parser.add_argument("--run-id", default=None)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--resume", action="store_true", help="continue this config's run from its newest checkpoint")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = job_parser("python -m learner.job", __doc__.splitlines()[0]).parse_args(argv)
    try:
        cfg = load_train_config(args.config, store=args.store, run_id=args.run_id, seed=args.seed)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    unwind_on_sigterm()
    try:
        summary = run_training(cfg, json_path=args.json, reporter=PrintReporter(), resume=args.resume)
    except CheckpointError as exc:
        print(exc, file=sys.stderr)
        return 2
    except DistributedError as exc:  # a rank of the sharded learner died or timed out: --resume continues
        print(f"{exc}\n(continue with --resume from the last checkpoint)", file=sys.stderr)
        return 3
    print("train-report: " + json.dumps({k: summary[k] for k in REPORT_KEYS}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
