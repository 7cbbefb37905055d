"""The RL learner step on agent-shaped samples, on CPU: LM head everywhere vs only at sampled tokens.

    python -m benches.learner_step --out runs/bench_step.json

Agent episodes are mostly prompt: a 1-2k-token harness prompt (system prompt,
tool schemas, instruction) and a few tens of sampled tokens, the only ones the
loss reads. ``TrainerConfig.logprobs_at_loss_tokens`` runs the LM head (vocab x
hidden, most of a small model's FLOPs) only there. Both sides train the same
model on the same items with the same loss, interleaved in one run (the machine
is noisy: the ratio is the result, absolute times drift); the gradients are
compared so the speed-up is known to be exact.
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
from learner.model import PolicyModel
from learner.trainer import Trainer
from learner.types import LossConfig, TrainerConfig, TrainItem
from rollout.policy.models import tiny_config
from rollout.tokenizer import build_tokenizer

__all__ = ["agent_items", "run_bench"]


def agent_items(n: int, vocab: int, *, prompt: int, response: int, seed: int = 0) -> list[TrainItem]:
    """``n`` episodes: ``prompt`` tokens (mask 0), then ``response`` sampled tokens (mask 1); advantages +-1."""
    g = torch.Generator().manual_seed(seed)
    items = []
    for i in range(n):
        k = prompt + response
        ids = torch.randint(0, vocab, (k,), generator=g).tolist()
        mask = [0] * prompt + [1] * response
        lps = [-8.0 * m for m in mask]
        items.append(TrainItem(tuple(ids), tuple(lps), tuple(mask), 1.0 if i % 2 == 0 else -1.0, sample_id=f"s{i}"))
    return items


def run_bench(
    *, samples: int = 32, prompt: int = 1500, response: int = 40, hidden: int = 128, layers: int = 2,
    repeats: int = 3, threads: int = 2,
) -> dict[str, Any]:
    torch.set_num_threads(threads)
    # The train loop's model: tiny_config over the project tokenizer (vocabulary included).
    config = tiny_config(build_tokenizer(), hidden_size=hidden, num_layers=layers, init_std=0.02)
    vocab = config.vocab_size
    items = agent_items(samples, vocab, prompt=prompt, response=response)
    sides = {"full logits": False, "loss tokens only": True}
    trainers = {name: Trainer(PolicyModel.from_config(config, seed=0), LossConfig.dapo(),
                              TrainerConfig(lr=1e-4, micro_batch_tokens=4096, logprobs_at_loss_tokens=only))
                for name, only in sides.items()}
    times: dict[str, list[float]] = {name: [] for name in sides}
    grads: dict[str, dict[str, torch.Tensor]] = {}
    for r in track(range(repeats + 1), description="learner steps"):
        for name, trainer in trainers.items():
            t0 = time.perf_counter()
            trainer.step(items)
            if r == 0:  # the first step is warm-up; compare its gradients (same weights on both sides)
                grads[name] = {k: p.grad.clone() for k, p in trainer.model.named_parameters() if p.grad is not None}
            else:
                times[name].append(time.perf_counter() - t0)
    a, b = grads["full logits"], grads["loss tokens only"]
    max_diff = max(float((a[k] - b[k]).abs().max()) for k in a)
    tokens = samples * (prompt + response)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    return {
        "samples": samples, "prompt_tokens": prompt, "response_tokens": response, "hidden": hidden,
        "layers": layers, "vocab": vocab, "repeats": repeats, "threads": threads,
        "step_s": med, "tokens_per_s": {k: tokens / v for k, v in med.items()},
        "speedup": med["full logits"] / med["loss tokens only"], "max_grad_diff": max_diff,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benches.learner_step", description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=32)
    p.add_argument("--prompt", type=int, default=1500)
    p.add_argument("--response", type=int, default=40)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    res = run_bench(samples=args.samples, prompt=args.prompt, response=args.response, hidden=args.hidden,
                    layers=args.layers, repeats=args.repeats, threads=args.threads)
    table = Table(title=f"RL learner step, {res['samples']} samples x ({res['prompt_tokens']} prompt + "
                        f"{res['response_tokens']} sampled) tokens, hidden {res['hidden']} x {res['layers']}")
    for col in ("LM head", "step s (median)", "tokens/s", "vs full logits"):
        table.add_column(col, justify="right" if col != "LM head" else "left")
    for name, s in res["step_s"].items():
        table.add_row(name, f"{s:.2f}", f"{res['tokens_per_s'][name]:,.0f}",
                      f"{res['step_s']['full logits'] / s:.2f}x")
    console = Console()
    console.print(table)
    console.print(f"max |grad difference| between the two: {res['max_grad_diff']:.2e}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
