"""What ``trainer.deterministic`` costs: the RL learner step with deterministic kernels on and off.

    python -m benches.determinism [--samples 16] [--repeats 5] [--out runs/bench_determinism.json]

``TrainerConfig.deterministic`` calls ``learner.trainer.make_deterministic``: a fixed thread count
and ``torch.use_deterministic_algorithms(True)`` (plus deterministic cuBLAS / cuDNN settings on a
GPU). Both sides run the same agent-shaped items (``benches.learner_step.agent_items``) on two copies of the
same model at the same thread count, interleaved step by step in one run, alternating which goes first (the machine is noisy:
the ratio is the result). The losses are compared too: on CPU both modes compute the same numbers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import track
from rich.table import Table

from benches.learner_step import agent_items
from learner.model import PolicyModel
from learner.trainer import Trainer
from learner.types import LossConfig, TrainerConfig
from rollout.policy.models import tiny_config
from rollout.tokenizer import build_tokenizer

__all__ = ["run_bench"]


def run_bench(*, samples: int = 16, prompt: int = 1500, response: int = 40, repeats: int = 5,
              threads: int = 2) -> dict[str, Any]:
    torch.set_num_threads(threads)
    config = tiny_config(build_tokenizer(), hidden_size=128, num_layers=2, init_std=0.02)
    items = agent_items(samples, config.vocab_size, prompt=prompt, response=response)
    sides = {"default": False, "deterministic": True}
    trainers = {name: Trainer(PolicyModel.from_config(config, seed=0), LossConfig.grpo(),
                              TrainerConfig(lr=1e-4, micro_batch_tokens=4096, logprobs_at_loss_tokens=True))
                for name in sides}
    times: dict[str, list[float]] = {name: [] for name in sides}
    losses: dict[str, list[float]] = {name: [] for name in sides}
    before = torch.are_deterministic_algorithms_enabled()
    try:
        for r in track(range(repeats + 1), description="learner steps"):
            for name in sorted(trainers, reverse=bool(r % 2)):  # alternate which side goes first
                trainer = trainers[name]
                torch.use_deterministic_algorithms(sides[name])
                t0 = time.perf_counter()
                metrics = trainer.step(items)
                if r:  # the first step is warm-up
                    times[name].append(time.perf_counter() - t0)
                losses[name].append(metrics.loss)
    finally:
        torch.use_deterministic_algorithms(before)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    return {"samples": samples, "prompt_tokens": prompt, "response_tokens": response, "threads": threads,
            "repeats": repeats, "step_s": med, "cost": med["deterministic"] / med["default"],
            "same_losses": losses["default"] == losses["deterministic"], "losses": losses}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benches.determinism", description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=16)
    p.add_argument("--prompt", type=int, default=1500)
    p.add_argument("--response", type=int, default=40)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    res = run_bench(samples=args.samples, prompt=args.prompt, response=args.response, repeats=args.repeats,
                    threads=args.threads)
    table = Table(title=f"RL learner step, {res['samples']} samples x ({res['prompt_tokens']} + "
                        f"{res['response_tokens']}) tokens, {res['threads']} threads, median of {res['repeats']}")
    for col in ("kernels", "step s", "vs default"):
        table.add_column(col, justify="left" if col == "kernels" else "right")
    for name, s in res["step_s"].items():
        table.add_row(name, f"{s:.3f}", f"{s / res['step_s']['default']:.2f}x")
    console = Console()
    console.print(table)
    console.print(f"same losses on both sides: {res['same_losses']}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
