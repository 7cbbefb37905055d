"""Why GRPO collapsed at lr 1e-3 on the main job: one factor at a time, every arm from the same seed.

    python -m examples.collapse_ablation.run [--seed 0] [--iterations 5] [--backend docker|local] [--out DIR]

Each arm is examples/quickstart.yaml with the RL settings below changed, run as its own
``python -m learner.job`` (arms run side by side; give the machine a core or two per arm). The
table shows per arm the training rollouts' pass rate and entropy per iteration and the held-out
pass rate (sampled and greedy) before and after RL. Arms:

- ``old``: the recipe that collapsed: lr 1e-3, a fresh Adam (no moments carried from the warm
  start), no warmup, token_mean aggregation;
- ``old+seq_mean``, ``old+moments``, ``old+warmup``: that recipe with one fix each;
- ``committed``: examples/quickstart.yaml as it is (lr 5e-4, all three fixes).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]

OLD = {"trainer": {"lr": 1.0e-3, "warmup_steps": 0}, "rl": {"continue_sft_optimizer": False},
       "rl.loss": {"aggregation": "token_mean"}}
ARMS: dict[str, list[tuple[str, dict]] | None] = {
    "old": [],
    "old+seq_mean": [("rl.loss", {"aggregation": "seq_mean_token_mean"})],
    "old+moments": [("rl", {"continue_sft_optimizer": True})],
    "old+warmup": [("trainer", {"warmup_steps": 3})],
    "committed": None,
}


def arm_config(base: dict, name: str, iterations: int, backend: str) -> dict:
    cfg = json.loads(json.dumps(base))
    cfg["run_id"] = f"ablate-{name.replace('+', '-')}"
    cfg["rl"]["iterations"] = iterations
    cfg["eval"]["every"] = 0
    cfg["rollout"]["backend"] = backend
    changes = ARMS[name]
    if changes is not None:
        for path, values in [*OLD.items(), *changes]:
            node = cfg
            for key in path.split("."):
                node = node.setdefault(key, {})
            node.update(values)
    return cfg


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.collapse_ablation.run", description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--backend", choices=("docker", "local"), default="docker")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "ablation")
    args = parser.parse_args()
    base = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    args.out.mkdir(parents=True, exist_ok=True)
    procs = {}
    for name in args.arms.split(","):
        cfg = arm_config(base, name, args.iterations, args.backend)
        cfg["out_dir"] = str(args.out)
        cfg["store"] = f"sqlite:///{args.out}/{cfg['run_id']}.db"
        path = args.out / f"{cfg['run_id']}.yaml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        log = open(args.out / f"{cfg['run_id']}.log", "w")
        procs[name] = (subprocess.Popen(
            [sys.executable, "-m", "learner.job", str(path), "--seed", str(args.seed),
             "--json", str(args.out / f"{cfg['run_id']}.json")],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(ROOT)}), cfg)
    rows = []
    for name, (proc, cfg) in procs.items():
        rc = proc.wait()
        out = args.out / f"{cfg['run_id']}.json"
        if rc or not out.exists():
            rows.append(f"| {name} | failed (rc {rc}, see {cfg['run_id']}.log) | | | |")
            continue
        s = json.loads(out.read_text())
        train = " ".join(f"{r['pass_rate']:.2f}" for r in s["rl"])
        ent = " ".join(f"{r.get('entropy', float('nan')):.3f}" for r in s["rl"])
        rows.append(f"| {name} | {train} | {ent} | {s['pass_rate_after_warm_start']:.2f} -> {s['pass_rate_after_rl']:.2f} "
                    f"| {s['pass_rate_greedy_after_warm_start']:.2f} -> {s['pass_rate_greedy_after_rl']:.2f} |")
    print(f"seed {args.seed}, {args.iterations} RL iterations, backend {args.backend}")
    print("| arm | training pass rate per iteration | entropy per iteration | held-out sampled | held-out greedy |")
    print("| --- | --- | --- | --- | --- |")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
