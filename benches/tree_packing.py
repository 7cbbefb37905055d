"""Prefix-shared training on branched groups, on CPU: tokens forwarded and step time, shared vs unshared.

    python -m benches.tree_packing --out runs/bench_tree_packing.json

A branched group (an episode forked after turn t into N continuations) holds
N sequences that share their first ``prefix`` tokens exactly. The unshared
step forwards every leaf whole; ``TrainerConfig.prefix_sharing`` forwards the
prefix once per tree under a tree attention mask (``learner.tree``). Both
sides train the same model on the same items (tree advantages), interleaved in
one run (the machine is noisy: the ratio is the result); the first step's
gradients are compared, so the saving is known to be exact.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
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
from learner.tree import tree_items
from learner.types import AdvantageConfig, LossConfig, StepMetrics, TrainerConfig
from rollout.policy.models import tiny_config
from rollout.tokenizer import build_tokenizer
from rollout.types import Sample, Status, Trajectory

__all__ = ["branched_group", "run_bench"]


def branched_group(
    name: str, vocab: int, *, leaves: int, prompt: int, prefix: int, suffix: int, seed: int = 0,
) -> list[Trajectory]:
    """``leaves`` episodes sharing ``prompt`` prompt tokens (mask 0) and ``prefix`` tokens of earlier turns
    (sampled, mask 1, with a masked tool output in the middle), then ``suffix`` tokens of their own; reward 1 on
    every other leaf. The shared part carries the same rollout logprobs on every leaf, as a fork copies them."""
    rng = random.Random(seed)
    tok = lambda n: [rng.randrange(1, vocab) for _ in range(n)]  # noqa: E731
    lp = lambda n: [-7.7 + 0.2 * rng.random() for _ in range(n)]  # noqa: E731 - near a tiny model's own
    tool = prefix // 4
    head_ids, head_mask = tok(prompt + prefix), [0] * prompt + [1] * prefix
    head_mask[prompt + prefix // 2: prompt + prefix // 2 + tool] = [0] * tool
    head_lp = [x * m for x, m in zip(lp(prompt + prefix), head_mask)]
    out = []
    for k in range(leaves):
        ids = head_ids + tok(suffix)
        mask = head_mask + [1] * suffix
        lps = head_lp + lp(suffix)
        out.append(Trajectory(
            episode_id=f"{name}-{k}", run_id="bench", task_id=name, domain="coding", seed=0, harness="codex",
            effort="low", policy_version=0, status=Status.OK, reward=float(k % 2),
            samples=(Sample(tuple(ids), tuple(lps), tuple(mask)),),
        ))
    return out


def run_bench(
    *, trees: int = 4, leaves: int = 4, prompt: int = 256, prefix: int = 768, suffix: int = 128, hidden: int = 128,
    layers: int = 2, repeats: int = 3, threads: int = 2, micro_batch_tokens: int = 4096,
) -> dict[str, Any]:
    torch.set_num_threads(threads)
    config = tiny_config(build_tokenizer(), hidden_size=hidden, num_layers=layers, init_std=0.02)
    vocab = config.vocab_size
    groups = [branched_group(f"tree{i}", vocab, leaves=leaves, prompt=prompt, prefix=prefix, suffix=suffix, seed=i)
              for i in range(trees)]
    items = tree_items(groups, AdvantageConfig())
    model = PolicyModel.from_config(config, seed=0, attn_implementation="sdpa")
    sides = {"unshared": False, "prefix-shared": True}
    trainers = {name: Trainer(copy.deepcopy(model), LossConfig.dapo(),
                              TrainerConfig(lr=1e-4, micro_batch_tokens=micro_batch_tokens, logprobs_at_loss_tokens=True,
                                            prefix_sharing=shared))
                for name, shared in sides.items()}
    times: dict[str, list[float]] = {name: [] for name in sides}
    metrics: dict[str, StepMetrics] = {}
    grads: dict[str, dict[str, torch.Tensor]] = {}
    for r in track(range(repeats + 1), description="learner steps"):
        for name, trainer in trainers.items():
            t0 = time.perf_counter()
            m = trainer.step(items)
            if r == 0:  # warm-up; same weights on both sides, so compare the gradients and losses here
                grads[name] = {k: p.grad.clone() for k, p in trainer.model.named_parameters() if p.grad is not None}
                metrics[name] = m
            else:
                times[name].append(time.perf_counter() - t0)
    a, b = grads["unshared"], grads["prefix-shared"]
    max_diff = max(float((a[k] - b[k]).abs().max()) for k in a)
    grad_scale = max(float(g.abs().max()) for g in a.values())
    med = {name: statistics.median(ts) for name, ts in times.items()}
    forward = {name: m.forward_tokens for name, m in metrics.items()}
    return {
        "trees": trees, "leaves": leaves, "prompt_tokens": prompt, "prefix_tokens": prefix, "suffix_tokens": suffix,
        "hidden": hidden, "layers": layers, "vocab": vocab, "repeats": repeats, "threads": threads,
        "micro_batch_tokens": micro_batch_tokens,
        "micro_batches": {name: m.num_micro_batches for name, m in metrics.items()}, "forward_tokens": forward, "step_s": med, "loss": {name: m.loss for name, m in metrics.items()},
        "fallback_groups": {name: m.shared_fallback_groups for name, m in metrics.items()},
        "token_ratio": forward["prefix-shared"] / forward["unshared"],
        "time_ratio": med["prefix-shared"] / med["unshared"],
        "max_grad_diff": max_diff, "grad_scale": grad_scale,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benches.tree_packing", description=__doc__.splitlines()[0])
    p.add_argument("--trees", type=int, default=4)
    p.add_argument("--leaves", type=int, default=4)
    p.add_argument("--prompt", type=int, default=256)
    p.add_argument("--prefix", type=int, default=768, help="shared tokens of earlier turns after the prompt")
    p.add_argument("--suffix", type=int, default=128, help="each leaf's own tokens after the branch")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--micro-batch-tokens", type=int, default=4096,
                   help="both sides' TrainerConfig.micro_batch_tokens (a tree longer than this is trained unshared)")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    res = run_bench(trees=args.trees, leaves=args.leaves, prompt=args.prompt, prefix=args.prefix,
                    suffix=args.suffix, hidden=args.hidden, layers=args.layers, repeats=args.repeats,
                    threads=args.threads, micro_batch_tokens=args.micro_batch_tokens)
    table = Table(title=f"learner step on {res['trees']} trees x {res['leaves']} leaves "
                        f"({res['prompt_tokens']} prompt + {res['prefix_tokens']} shared + {res['suffix_tokens']} own "
                        f"tokens), hidden {res['hidden']} x {res['layers']}, CPU")
    for col in ("side", "tokens forwarded", "micro-batches", "step s (median)", "loss", "vs unshared (tokens)",
                "vs unshared (time)"):
        table.add_column(col, justify="left" if col == "side" else "right")
    for name in ("unshared", "prefix-shared"):
        table.add_row(name, f"{res['forward_tokens'][name]:,}", str(res["micro_batches"][name]),
                      f"{res['step_s'][name]:.3f}", f"{res['loss'][name]:.6f}",
                      f"{res['forward_tokens'][name] / res['forward_tokens']['unshared']:.2f}x",
                      f"{res['step_s'][name] / res['step_s']['unshared']:.2f}x")
    console = Console()
    console.print(table)
    console.print(f"max |grad difference|: {res['max_grad_diff']:.2e} (largest |grad| {res['grad_scale']:.2e}); "
                  f"groups trained unshared by the shared side: {res['fallback_groups']['prefix-shared']}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
