#!/usr/bin/env bash
# The MOPD demonstration (docs/distill.md): train the teacher as the quickstart does, copy it into a
# grid, distil the quickstart's warm start toward it. About 50 minutes on a 2-core CPU (33 + 19).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
mkdir -p runs/demo
if [ ! -f runs/demo/teacher.json ]; then
  .venv/bin/python -m learner.job examples/quickstart.yaml --run-id demo-teacher \
      --store sqlite:///runs/demo/demo.db --json runs/demo/teacher.json
fi
ckpt=$(ls -d runs/demo-teacher/checkpoints/iter-* 2>/dev/null | sort | tail -1)  # out_dir runs, run_id demo-teacher
.venv/bin/python -m distill.tiny_grid runs/demo/teacher-grid --per one --from "$ckpt/trainer/model"
exec .venv/bin/agentenv distill examples/distill_demo.yaml --json runs/demo/distill.json "$@"
