"""``python -m distill.job CONFIG [--json PATH] [--store URL] [--run-id ID] [--seed N] [--resume]``: MOPD as a process.

The same entry point serves ``agentenv distill`` (which adds rich progress bars)
and ``ray job submit --working-dir . -- python -m distill.job CONFIG`` on a
cluster; with ``runner: ray`` the student's rollouts run on Ray workers while the
teachers score in this driver, next to the learner. Exit codes: 0 done, 2 a bad
config, a grid that does not cover the run, or a checkpoint that does not fit.
"""

from __future__ import annotations

import json
import sys

from learner.errors import CheckpointError
from learner.job import REPORT_KEYS, PrintReporter, job_parser, unwind_on_sigterm
from rollout.config import ConfigError
from teachers.types import TeacherConfigError

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    from distill.loop import run_distill
    from distill.types import load_distill_config

    args = job_parser("python -m distill.job", __doc__.splitlines()[0]).parse_args(argv)
    try:
        cfg, root = load_distill_config(args.config, store=args.store, run_id=args.run_id, seed=args.seed)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    unwind_on_sigterm()
    try:
        summary = run_distill(cfg, root, json_path=args.json, reporter=PrintReporter(), resume=args.resume)
    except (ConfigError, TeacherConfigError, CheckpointError) as exc:
        print(exc, file=sys.stderr)
        return 2
    print("distill-report: " + json.dumps({k: summary[k] for k in REPORT_KEYS}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
