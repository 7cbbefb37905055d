"""Arms x seeds of examples/quickstart.yaml side by side, on the local (bubblewrap) backend.

    python -m examples.seed_sweep.run ARMS_JSON SEEDS [THREADS]
    python -m examples.seed_sweep.run '{"t07": {}, "t085": {"rollout.sampling.temperature": 0.85, "eval.temperature": 0.85}}' 0,1,2 2

Each arm is the quickstart with the dotted config paths of its JSON object changed; every (arm,
seed) is its own ``python -m learner.job`` with ``torch_threads`` THREADS (give the machine that
many cores per run). Logs and summaries go to ``$OUT`` (default ``runs/sweep``); a line per run
gives the held-out evaluations (iteration, sampled, greedy) and the training pass rate per
iteration. Made for a many-core box without Docker (the lent accelerator host): the numbers are
the local backend's, close to but not the same as the Docker main job's.
``python -m examples.seed_sweep.seeds`` reads the summaries back: the per-seed table, the criterion, a band plot.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def arm_config(base: dict, name: str, seed: int, changes: dict, threads: int, work: Path) -> dict:
    cfg = json.loads(json.dumps(base))
    cfg["rollout"]["backend"] = "local"
    cfg["torch_threads"] = threads
    for path, value in changes.items():
        node = cfg
        *parents, leaf = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    cfg["run_id"] = f"{name}-s{seed}"
    cfg["out_dir"] = str(work)
    cfg["store"] = f"sqlite:///{work}/{cfg['run_id']}.db"
    return cfg


def main() -> int:
    if len(sys.argv) < 3 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(sys.argv) > 1 and sys.argv[1] in ("-h", "--help") else 2
    arms = json.loads(sys.argv[1])
    seeds = [int(s) for s in sys.argv[2].split(",")]
    threads = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    out = Path(os.environ.get("OUT", ROOT / "runs" / "sweep"))
    out.mkdir(parents=True, exist_ok=True)
    work = Path("/tmp/agentenv-sweep")
    work.mkdir(exist_ok=True)
    base = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}
    procs = []
    for name, changes in arms.items():
        for seed in seeds:
            cfg = arm_config(base, name, seed, changes, threads, work)
            path = work / f"{cfg['run_id']}.yaml"
            path.write_text(yaml.safe_dump(cfg, sort_keys=False))
            log = open(out / f"{cfg['run_id']}.log", "w")
            procs.append((cfg["run_id"], subprocess.Popen(
                [sys.executable, "-m", "learner.job", str(path), "--seed", str(seed),
                 "--json", str(out / f"{cfg['run_id']}.json")],
                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)))
    t0 = time.time()
    for run_id, proc in procs:
        rc = proc.wait()
        summary = out / f"{run_id}.json"
        if rc or not summary.exists():
            print(run_id, f"FAILED rc {rc} (see {run_id}.log)", flush=True)
            continue
        s = json.loads(summary.read_text())
        evals = [(e["iteration"], round(e["pass_rate"], 2), round(e["greedy_pass_rate"], 2)) for e in s["evals"]]
        train = [round(r["pass_rate"], 2) for r in s["rl"]]
        print(run_id, "evals(it,sampled,greedy)", evals, "train", train, "wall", s["timings_s"]["total_s"], flush=True)
    print("all done", round(time.time() - t0), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
