"""The sweep proven on real runs: ``python -m examples.eval_proof.run [--part references|checkpoint|served|all]``.

* ``references``: the scripted oracle and the do-nothing agent over every registered task x 3 harnesses x
  3 efforts x 2 seeds (36 episodes a task; the planned count is computed from the task list, so a new task
  family grows it): every cell must be 1.0 and 0.0, with no infrastructure error, and every planned episode
  stored.
* ``checkpoint``: a tiny model saved as a local checkpoint folder, sampled with its own settings.
* ``served``: the same tiny model behind ``agentenv serve`` (``rollout.serve``), called through the official
  ``openai`` client by ``OpenAIPolicy``, and ``compare`` of the two.

Outputs go to ``runs/eval-proof/<part>/`` (results.json, episodes.parquet, report.md, PNGs); the numbers
are quoted in ``docs/eval.md``. Exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from rollout.eval.config import SweepConfig, parse_sweep
from rollout.eval.live import SweepProgress, print_tables
from rollout.eval.report import write_outputs
from rollout.eval.runner import run_sweep

ROOT = Path("runs/eval-proof")
SMALL = {"tasks": {"ids": ["general/count_lines", "general/answer_number"]}, "harnesses": ["claude_code", "codex", "kimi_code"],
         "efforts": ["low", "high"], "seeds": 2}
#: the references part: every registered task ("tasks": {}), both reference policies, every harness and effort
REFERENCES = {"tasks": {}, "harnesses": ["claude_code", "codex", "kimi_code"], "efforts": ["low", "high", "max"], "seeds": 2,
              "policies": [{"name": "oracle", "kind": "oracle"}, {"name": "nothing", "kind": "do_nothing"}]}
console = Console()


def sweep_config(data: dict[str, Any]) -> SweepConfig:
    """A proof sweep: ``data`` over the shared store, workers and output folder under ``runs/eval-proof``."""
    return parse_sweep({"store": f"sqlite:///{ROOT.resolve() / 'store.db'}", "workers": 2, "concurrency": 2,
                        "out": str(ROOT / data["sweep_id"].split("-")[1]), "ray": {"num_cpus": 2}, **data})


def planned_episodes(cfg: SweepConfig) -> int:
    """What the sweep must plan, counted from its axes: the resolved task list x seeds x harnesses x efforts
    x samples x policies (``plan_cells`` builds the cells; this counts them independently)."""
    from rollout.job import resolve_tasks

    tasks = resolve_tasks(cfg.tasks)
    return len(tasks) * len(cfg.seeds) * len(cfg.harnesses) * len(cfg.efforts) * cfg.samples * len(cfg.policies)


def _run(cfg: SweepConfig) -> dict[str, Any]:
    with SweepProgress(console) as p:
        run = run_sweep(cfg, resume=True, on_event=p.on_event, on_start=p.on_start)
    doc = write_outputs(run, cfg.out_dir)
    print_tables(console, doc)
    console.print(f"{cfg.sweep_id}: counters {json.dumps({k: v for k, v in run.counters.items() if k != 'endpoints'}, default=str)}")
    return doc


def references(tag: str) -> bool:
    cfg = sweep_config({"sweep_id": f"proof-references-{tag}", **REFERENCES})
    expected = planned_episodes(cfg)
    doc = _run(cfg)
    bad = [c for c in doc["cells"]
           if c["infrastructure"] or c["invalid"] or c["pass_rate"] != (1.0 if c["policy"] == "oracle" else 0.0)]
    console.print(f"references: {len(doc['cells'])} cells (policy x task x harness x effort), {doc['stored']} episodes; "
                  f"cells off 1.0 / 0.0 or with infra/invalid: {len(bad)}")
    for c in bad:
        console.print(f"  [red]{c}[/red]")
    console.print(f"references: planned {doc['planned']} episodes, expected {expected} from the task list")
    return doc["planned"] == expected and not bad and doc["complete"]


def _tiny_checkpoint() -> Path:
    from rollout.policy.models import save_checkpoint, tiny_model

    path = ROOT / "tiny-checkpoint"
    if not (path / "config.json").is_file():
        model, tok = tiny_model(seed=0)
        save_checkpoint(model, tok, path)
    return path.resolve()


def checkpoint(tag: str) -> bool:
    ckpt = _tiny_checkpoint()
    doc = _run(sweep_config({"sweep_id": f"proof-checkpoint-{tag}", **SMALL, "samples": 2,
                        "policies": [{"name": "tiny-ckpt", "kind": "checkpoint", "checkpoint": str(ckpt),
                                      "sampling": {"temperature": 1.0, "max_new_tokens": 48}}]}))
    return bool(doc["complete"])


def served(tag: str) -> bool:
    from rollout.policy.hf import HFPolicy
    from rollout.serve import create_app, serve_in_thread

    ckpt = _tiny_checkpoint()
    with serve_in_thread(create_app(HFPolicy(str(ckpt)), "tiny", model_path=str(ckpt))) as url:
        console.print(f"agentenv serve at {url}")
        doc = _run(sweep_config({"sweep_id": f"proof-served-{tag}", **SMALL, "samples": 1,
                            "policies": [{"name": "tiny-served", "kind": "openai", "url": url, "model": "tiny",
                                          "max_concurrency": 2, "timeout_s": 60,
                                          "sampling": {"temperature": 1.0, "max_new_tokens": 48}}]}))
    return bool(doc["complete"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m examples.eval_proof.run")
    ap.add_argument("--part", choices=["references", "checkpoint", "served", "all"], default="all")
    ap.add_argument("--tag", default="v1", help="part of the sweep ids: a new tag is a fresh sweep")
    args = ap.parse_args(argv)
    ROOT.mkdir(parents=True, exist_ok=True)
    parts = {"references": references, "checkpoint": checkpoint, "served": served}
    chosen = list(parts) if args.part == "all" else [args.part]
    verdicts = {name: parts[name](args.tag) for name in chosen}
    console.print(f"proof verdicts: {verdicts}")
    return 0 if all(verdicts.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
