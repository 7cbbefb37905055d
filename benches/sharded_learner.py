"""The sharded learner at world size 1 against today's fast path, on ``benches.learner_gpu``'s shape, in one run.

Run on the H200 (not in CI)::

    python -m benches.sharded_learner --verbose --out runs/bench_sharded.json

and on any CPU with a tiny model, in seconds::

    python -m benches.sharded_learner --tiny

Both contenders train the same model (Qwen2-0.5B-shaped, random weights, the
same seed) on the same samples with the same loss and the same
``TrainerConfig`` (``benches.learner_gpu.packed_config``: packed 4096-token rows,
8 rows per micro-batch, varlen attention, chunked logprobs with bf16 logits
kept, compiled layers, fused AdamW):

- ``fast``: ``learner.trainer.Trainer`` on the unsharded model (fp32 weights,
  bf16 autocast): today's fast path.
- ``sharded``: what each rank of ``learner.group.LearnerGroup`` runs, here as
  rank 0 of a world of 1 in this process (no Ray: the device machine has none):
  a process group (NCCL on GPU, gloo on CPU), ``fully_shard`` per decoder layer
  and the root with bf16 parameters and fp32 reduction on GPU, the weights
  set from rank 0, ``learner.sharded_trainer.ShardedTrainer``.

H200 readings (torch 2.11.0+cu130, transformers 5.17; 5 timed steps of 64
samples after 2 warm-up steps, one run each, so rough; step time stdev ~0.1 s):
fast path 109.6k tokens/s, 35.8% MFU, peak 54.3 GiB; sharded at world size 1
102.0k tokens/s, 33.3% MFU, peak 52.5 GiB: 2.5 points below (fwd+bwd 0.630 s
vs 0.593 s, optimizer 23 ms vs 12 ms on DTensor shards); first-step loss
|diff| 2.6e-5. With each layer resharded after forward (the multi-rank
setting) 31.0%; with fp32 FSDP parameters under autocast 30.5%, so bf16
parameters and no reshard at world size 1 are the defaults.

Every other flag is ``benches.learner_gpu``'s (``--steps``, ``--samples-per-step``,
``--no-compile`` ...). MFU as there: model FLOPs / (time x peak); peak memory is
``torch.cuda.max_memory_allocated`` per contender.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from benches.learner_gpu import make_items, matmul_params, model_config, packed_config, train_flops
from benches.learner_gpu import parse_args as bench_gpu_args
from learner.model import PolicyModel
from learner.trainer import Trainer
from learner.types import LossConfig


def _sync(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def sharded_trainer(
    model: PolicyModel, loss_cfg: LossConfig, tcfg: Any, device: torch.device, *, param_dtype: str = "bf16",
    reshard_after_forward: bool | None = None,
) -> Any:
    """Rank 0 of a world of 1: the group's own code path (``LearnerRank.setup``), without the Ray actor."""
    from learner.distributed import broadcast_weights, free_address, init_distributed, shard_model
    from learner.sharded_trainer import ShardedTrainer

    host, port = free_address()
    mesh = init_distributed(0, 1, "127.0.0.1", port, device_type=device.type, timeout_s=tcfg.distributed_timeout_s)
    state = {k: v.detach().clone() for k, v in model.lm.state_dict().items()}
    mixed = device.type == "cuda" and tcfg.bf16 is not False and param_dtype == "bf16"
    shard_model(model, mesh, mixed_precision=mixed, compile_layers=tcfg.compile_layers,
                activation_checkpointing=tcfg.activation_checkpointing, reshard_after_forward=reshard_after_forward)
    broadcast_weights(model, state)
    del state
    return ShardedTrainer(model, loss_cfg, tcfg)


def run(args: argparse.Namespace, contenders: Sequence[str], opts: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    bf16 = device.type == "cuda" and not args.fp32
    cfg = model_config(args.tiny)
    steps = args.warmup + args.steps
    items = make_items(args.samples_per_step * steps, cfg.vocab_size, args.min_len, args.max_len, args.seed)
    per_step = [items[i * args.samples_per_step:(i + 1) * args.samples_per_step] for i in range(steps)]
    loss_cfg = LossConfig.dapo()
    tcfg = packed_config(args, bf16).model_copy(update={"world_size": 1})
    timed = [len(it) for b in per_step[args.warmup:] for it in b]
    flops = train_flops(cfg, timed)
    results: dict[str, Any] = {}
    for name in contenders:
        model = PolicyModel.from_config(cfg, seed=args.seed, attn_implementation=args.attn).to(device)
        t_setup = time.perf_counter()
        trainer = Trainer(model, loss_cfg, tcfg) if name == "fast" else sharded_trainer(
            model, loss_cfg, tcfg, device, param_dtype=opts.sharded_params, reshard_after_forward=opts.reshard)
        setup_s = time.perf_counter() - t_setup
        times, losses, norms, phases = [], [], [], []
        for k, batch in enumerate(per_step):
            t0 = _sync(device)
            m = trainer.step(batch)
            elapsed = _sync(device) - t0
            losses.append(m.loss)
            norms.append(m.grad_norm)
            if k >= args.warmup:
                times.append(elapsed)
                phases.append((m.pack_s, m.forward_backward_s, m.optimizer_s))
            elif args.verbose:
                print(f"  {name} warmup step {k}: {elapsed:.1f} s", flush=True)
        seconds = sum(times)
        results[name] = {
            "tokens_per_s": sum(timed) / seconds, "mfu": flops / seconds / (args.peak_tflops * 1e12),
            "step_s_mean": seconds / len(times), "step_s_stdev": statistics.pstdev(times), "setup_s": setup_s,
            "peak_mem_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
            "pack_s": statistics.mean(p[0] for p in phases), "fwd_bwd_s": statistics.mean(p[1] for p in phases),
            "optimizer_s": statistics.mean(p[2] for p in phases),
            "loss_per_step": losses, "grad_norm_per_step": norms,
        }
        if args.verbose:
            print(f"  {name}: {json.dumps({k: v for k, v in results[name].items() if not k.endswith('_per_step')})}", flush=True)
        del trainer, model
        if name == "sharded":
            from learner.distributed import teardown

            teardown()
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
    out: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "model": "tiny" if args.tiny else "qwen2-0.5b-shape", "matmul_params": matmul_params(cfg),
        "dtype": "bf16 (fast: autocast over fp32 weights; sharded: FSDP2 bf16 params, fp32 reduce + master)"
        if bf16 else "fp32", "attn": args.attn, "seq_tokens": args.seq_tokens, "rows": args.rows,
        "logprob_chunk": args.logprob_chunk, "keep_logits": args.keep_logits, "compile": args.compile,
        "fused_adamw": args.fused_adamw, "samples_per_step": args.samples_per_step, "steps": args.steps,
        "warmup": args.warmup, "peak_tflops": args.peak_tflops, "torch": torch.__version__,
        "sharded_params": opts.sharded_params, "reshard_after_forward": opts.reshard, **results,
    }
    if "fast" in results and "sharded" in results:
        out["mfu_points_sharded_minus_fast"] = 100 * (results["sharded"]["mfu"] - results["fast"]["mfu"])
        out["first_step_loss_abs_diff"] = abs(results["sharded"]["loss_per_step"][0] - results["fast"]["loss_per_step"][0])
    return out


def table(r: dict[str, Any]) -> str:
    rows = [f"sharded learner (world size 1) vs fast path: {r['model']} on {r['device']} ({r['dtype']}; torch {r['torch']})",
            f"{'':8} {'tokens/s':>12} {'MFU':>7} {'step s':>8} {'fwd+bwd':>8} {'optim':>7} {'peak GiB':>9} "
            f"{'setup s':>8}"]
    for name in ("fast", "sharded"):
        if name in r:
            x = r[name]
            mem = f"{x['peak_mem_gib']:.1f}" if x["peak_mem_gib"] is not None else "-"
            rows.append(f"{name:8} {x['tokens_per_s']:12.0f} {100 * x['mfu']:6.1f}% {x['step_s_mean']:8.3f} "
                        f"{x['fwd_bwd_s']:8.3f} {x['optimizer_s']:7.3f} {mem:>9} {x['setup_s']:8.1f}")
    if "mfu_points_sharded_minus_fast" in r:
        rows.append(f"MFU sharded - fast: {r['mfu_points_sharded_minus_fast']:+.1f} points; first-step loss |diff| "
                    f"{r['first_step_loss_abs_diff']:.1e}")
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    mine = argparse.ArgumentParser(description=__doc__.splitlines()[0], add_help=False)
    mine.add_argument("--contenders", default="fast,sharded", help="comma list of fast, sharded")
    mine.add_argument("--sharded-params", choices=("bf16", "fp32"), default="bf16",
                      help="sharded path on GPU: FSDP2 bf16 parameters (default, the group's), or fp32 ones under "
                      "bf16 autocast (the fast path's numerics)")
    mine.add_argument("--reshard", action=argparse.BooleanOptionalAction, default=None,
                      help="reshard each layer after forward (default: only when world size > 1)")
    known, rest = mine.parse_known_args(argv)
    args = bench_gpu_args(rest)
    contenders = [c.strip() for c in known.contenders.split(",") if c.strip()]
    if not contenders or any(c not in ("fast", "sharded") for c in contenders):
        print(f"--contenders: expected a comma list of fast, sharded; got {known.contenders!r}", file=sys.stderr)
        return 2
    result = run(args, contenders, known)
    print(table(result))
    if args.out is not None:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
