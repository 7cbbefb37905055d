"""Does distillation move a student toward its teacher? ``python -m examples.distill_demo.run [AGENTENV DISTILL OPTIONS]``.

Three steps, each its own process, from the repository root (about 50 minutes on a 2-core CPU, 33 + 19):

1. the teacher: ``examples/quickstart.yaml`` trained as the quickstart does (``python -m learner.job``,
   run id ``demo-teacher``); skipped when ``runs/demo/teacher.json`` exists;
2. its grid: the teacher's newest checkpoint copied into every cell (``python -m distill.tiny_grid
   runs/demo/teacher-grid --per one --from CHECKPOINT``);
3. the student: ``agentenv distill examples/distill_demo/config.yaml --json runs/demo/distill.json``
   (extra arguments go here), the quickstart's warm start distilled toward that grid, reward-free.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNS = ROOT / "runs" / "demo"


def main(argv: list[str] | None = None) -> int:
    extra = sys.argv[1:] if argv is None else argv
    RUNS.mkdir(parents=True, exist_ok=True)
    if not (RUNS / "teacher.json").is_file():
        subprocess.run([sys.executable, "-m", "learner.job", "examples/quickstart.yaml", "--run-id", "demo-teacher",
                        "--store", "sqlite:///runs/demo/demo.db", "--json", "runs/demo/teacher.json"], cwd=ROOT, check=True)
    checkpoints = sorted((ROOT / "runs" / "demo-teacher" / "checkpoints").glob("iter-*"))  # out_dir runs, run_id demo-teacher
    if not checkpoints:
        print("distill_demo: the teacher run left no checkpoint under runs/demo-teacher/checkpoints", file=sys.stderr)
        return 1
    subprocess.run([sys.executable, "-m", "distill.tiny_grid", "runs/demo/teacher-grid", "--per", "one",
                    "--from", str(checkpoints[-1] / "trainer" / "model")], cwd=ROOT, check=True)
    return subprocess.run([sys.executable, "-m", "agentenv.cli", "distill", "examples/distill_demo/config.yaml",
                           "--json", "runs/demo/distill.json", *extra], cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main())
