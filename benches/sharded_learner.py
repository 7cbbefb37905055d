"""The sharded learner at world size 1 against today's fast path, on ``benches.learner_gpu``'s shape, in one run.

Run on the H200 (not in CI)::

    python -m benches.sharded_learner --verbose --out runs/bench_sharded.json
    python -m benches.sharded_learner --contenders fast,sharded,sharded-bf16,sharded-dtensor --profile runs/prof

and on any CPU with a tiny model, in seconds::

    python -m benches.sharded_learner --tiny

Every contender trains the same model (Qwen2-0.5B-shaped, random weights, the
same seed) on the same samples with the same loss and the same
``TrainerConfig`` (``benches.learner_gpu.packed_config``: packed 4096-token rows,
8 rows per micro-batch, varlen attention, chunked logprobs with bf16 logits
kept, compiled layers, fused AdamW):

- ``fast``: ``learner.trainer.Trainer`` on the unsharded model (fp32 weights,
  bf16 autocast): today's fast path.
- ``sharded``: what each rank of ``learner.group.LearnerGroup`` runs, here as
  rank 0 of a world of 1 in this process (no Ray: the device machine has none):
  a process group (NCCL on GPU, gloo on CPU), ``fully_shard`` per decoder layer
  and the root, the weights set from rank 0, ``learner.sharded_trainer.ShardedTrainer``.
  At world size 1: fp32 FSDP parameters under bf16 autocast, layers not
  resharded after forward and kept gathered between micro-batches, clipping and
  fused AdamW on the local shards.
- ``sharded-bf16``: the same with bf16 FSDP parameters (fp32 reduction), the
  setting of more than one rank; ``sharded-dtensor``: bf16 parameters, AdamW and
  clipping through DTensor, layers regathered each micro-batch (the sharded path
  as first measured, 2026-12-04).

Measurement: each contender is built and warmed up (2 steps: the compile), then
the timed steps (20 by default) interleave them: round ``k`` runs step ``k``'s
64 samples on every contender, in the listed order on even rounds and reversed
on odd ones, so machine drift falls on all alike; the paired per-step ratio
(same samples, adjacent in time) is the number to read. Printed: tokens/s and
MFU over all timed steps, median [p25, p75] of per-step MFU and step time, the
median phases, each contender's own peak memory (its parameters, gradients and
optimizer state plus the most its step allocated above what was allocated
before it: the contenders share the device), and per contender against ``fast``
the paired step-time ratio and MFU points.

H200 readings (torch 2.11.0+cu130, transformers 5.17; ``dev/LOG.md``, 2026-12-04):
sharded at world size 1 (then named ``sharded-fp32``) against fast, 12 interleaved
steps: step time x1.026 [1.010, 1.031], **-0.88 [-1.02, -0.34] MFU points**
(-1.18 over all steps; fast 34.7%, sharded 33.5%), peak 56.0 vs 54.2 GiB. In
another run of 20 steps, bf16 parameters with the local AdamW and kept gathers
(then named ``sharded``): x1.062, -2.06 [-2.73, -1.32] points; as first measured
(``sharded-dtensor``): x1.119, -3.69 [-4.74, -3.21] points.

Every other flag is ``benches.learner_gpu``'s (``--steps``, ``--samples-per-step``,
``--no-compile`` ...). MFU as there: model FLOPs / (time x peak).
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


#: contenders: the fast path; the sharded path as the group runs it ("sharded": at world size 1 fp32 FSDP
#: parameters under bf16 autocast, AdamW and clipping on the local shards, layers kept gathered between
#: micro-batches); with bf16 FSDP parameters ("sharded-bf16", the multi-rank setting); and as first measured
#: ("sharded-dtensor": bf16 parameters, AdamW through DTensor, layers regathered every micro-batch)
CONTENDERS: dict[str, dict[str, Any] | None] = {
    "fast": None,
    "sharded": {},
    "sharded-bf16": {"param_dtype": "bf16"},
    "sharded-dtensor": {"param_dtype": "bf16", "local_optimizer": False, "keep_gathered": False},
}


def _sync(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def sharded_trainer(
    model: PolicyModel, loss_cfg: LossConfig, tcfg: Any, device: torch.device, *, param_dtype: str = "auto",
    reshard_after_forward: bool | None = None, **trainer_kw: Any,
) -> Any:
    """Rank 0 of a world of 1: the group's own code path (``LearnerRank.setup``), without the Ray actor.

    The process group is made once per process and shared by every sharded contender.
    """
    import torch.distributed as dist

    from learner.distributed import broadcast_weights, free_address, init_distributed, shard_model
    from learner.sharded_trainer import ShardedTrainer

    if not dist.is_initialized():
        _, port = free_address()
        init_distributed(0, 1, "127.0.0.1", port, device_type=device.type, timeout_s=tcfg.distributed_timeout_s)
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device.type, (1,), mesh_dim_names=("fsdp",))
    state = {k: v.detach().clone() for k, v in model.lm.state_dict().items()}
    mixed = device.type == "cuda" and tcfg.bf16 is not False
    shard_model(model, mesh, mixed_precision=mixed, compile_layers=tcfg.compile_layers,
                activation_checkpointing=tcfg.activation_checkpointing, reshard_after_forward=reshard_after_forward,
                bf16_params={"bf16": True, "fp32": False, "auto": None}[param_dtype])
    broadcast_weights(model, state)
    del state
    return ShardedTrainer(model, loss_cfg, tcfg, **trainer_kw)


def resident_bytes(trainer: Any) -> int:
    """Bytes of the trainer's parameters, gradients and optimizer state (local shards; shared storage once)."""
    from torch.distributed.tensor import DTensor

    storages: dict[int, int] = {}

    def add(t: Any) -> None:
        if isinstance(t, DTensor):
            t = t._local_tensor
        if isinstance(t, torch.Tensor) and t.device.type != "cpu":
            st = t.untyped_storage()
            storages[st.data_ptr()] = st.nbytes()

    for p in trainer.model.parameters():
        add(p)
        add(p.grad)
    for state in trainer.optimizer.state.values():
        for v in state.values():
            add(v)
    return sum(storages.values())


def _quantiles(xs: Sequence[float]) -> dict[str, float]:
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
    return {"median": q[1], "p25": q[0], "p75": q[2], "min": min(xs), "max": max(xs)}


def run(args: argparse.Namespace, contenders: Sequence[str], opts: argparse.Namespace) -> dict[str, Any]:
    """Every contender is built and warmed up, then the timed steps interleave them: round ``k`` runs step ``k``'s
    samples on each contender, in the listed order on even rounds and reversed on odd ones (drift cancels)."""
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    bf16 = device.type == "cuda" and not args.fp32
    cfg = model_config(args.tiny)
    steps = args.warmup + args.steps
    items = make_items(args.samples_per_step * steps, cfg.vocab_size, args.min_len, args.max_len, args.seed)
    per_step = [items[i * args.samples_per_step:(i + 1) * args.samples_per_step] for i in range(steps)]
    loss_cfg = LossConfig.dapo()
    tcfg = packed_config(args, bf16).model_copy(update={"world_size": 1})
    timed_steps = per_step[args.warmup:]
    step_flops = [train_flops(cfg, [len(it) for it in b]) for b in timed_steps]
    step_tokens = [sum(len(it) for it in b) for b in timed_steps]
    peak = args.peak_tflops * 1e12
    cuda = device.type == "cuda"

    trainers: dict[str, Any] = {}
    setup: dict[str, float] = {}
    warm: dict[str, list[float]] = {}
    for name in contenders:
        model = PolicyModel.from_config(cfg, seed=args.seed, attn_implementation=args.attn).to(device)
        t0 = time.perf_counter()
        kw = CONTENDERS[name]
        trainers[name] = Trainer(model, loss_cfg, tcfg) if kw is None else sharded_trainer(
            model, loss_cfg, tcfg, device, **{"param_dtype": opts.sharded_params, **kw},
            reshard_after_forward=opts.reshard)
        setup[name] = time.perf_counter() - t0
        warm[name] = []
        for k in range(args.warmup):  # the compile happens here
            t0 = _sync(device)
            trainers[name].step(per_step[k])
            warm[name].append(_sync(device) - t0)
            if args.verbose:
                print(f"  {name} warmup step {k}: {warm[name][-1]:.1f} s", flush=True)

    rec: dict[str, dict[str, list[Any]]] = {n: {"t": [], "phases": [], "loss": [], "norm": [], "peak": []}
                                            for n in contenders}
    for k, batch in enumerate(timed_steps):
        for name in (contenders if k % 2 == 0 else list(reversed(contenders))):
            trainer = trainers[name]
            if cuda:
                own = resident_bytes(trainer)
                base = torch.cuda.memory_allocated(device)
                torch.cuda.reset_peak_memory_stats(device)
            t0 = _sync(device)
            m = trainer.step(batch)
            elapsed = _sync(device) - t0
            r = rec[name]
            r["t"].append(elapsed)
            r["phases"].append((m.pack_s, m.forward_backward_s, m.optimizer_s))
            r["loss"].append(m.loss)
            r["norm"].append(m.grad_norm)
            if cuda:  # this contender's own peak: what it holds between steps + what its step adds
                r["peak"].append((own + torch.cuda.max_memory_allocated(device) - base) / 2**30)
        if args.verbose:
            print(f"  round {k}: " + ", ".join(f"{n} {rec[n]['t'][-1]:.3f} s" for n in contenders), flush=True)

    results: dict[str, Any] = {}
    for name in contenders:
        r = rec[name]
        seconds = sum(r["t"])
        mfu_steps = [f / t / peak for f, t in zip(step_flops, r["t"])]
        results[name] = {
            "tokens_per_s": sum(step_tokens) / seconds, "mfu": sum(step_flops) / seconds / peak,
            "mfu_per_step": _quantiles(mfu_steps), "step_s": _quantiles(r["t"]),
            "step_s_mean": seconds / len(r["t"]), "setup_s": setup[name], "warmup_s": warm[name],
            "peak_mem_gib": max(r["peak"]) if r["peak"] else None,
            "pack_s": statistics.median(p[0] for p in r["phases"]),
            "fwd_bwd_s": statistics.median(p[1] for p in r["phases"]),
            "optimizer_s": statistics.median(p[2] for p in r["phases"]),
            "step_s_per_step": r["t"], "loss_per_step": r["loss"], "grad_norm_per_step": r["norm"],
        }
    out: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "model": "tiny" if args.tiny else "qwen2-0.5b-shape", "matmul_params": matmul_params(cfg),
        "dtype": "bf16 autocast (fast: over fp32 weights; sharded: over FSDP2 fp32 params at world size 1, "
        "sharded-bf16 / -dtensor: bf16 params; fp32 reduce + master)" if bf16 else "fp32",
        "attn": args.attn, "seq_tokens": args.seq_tokens, "rows": args.rows,
        "logprob_chunk": args.logprob_chunk, "keep_logits": args.keep_logits, "compile": args.compile,
        "fused_adamw": args.fused_adamw, "samples_per_step": args.samples_per_step, "steps": args.steps,
        "warmup": args.warmup, "peak_tflops": args.peak_tflops, "torch": torch.__version__,
        "sharded_params": opts.sharded_params, "reshard_after_forward": opts.reshard,
        "order": "interleaved: round k runs step k on every contender, reversed order on odd rounds",
        "tokens_per_step": step_tokens, **results,
    }
    if "fast" in results:
        f = rec["fast"]
        for name in contenders:
            if name == "fast":
                continue
            r = rec[name]
            key = name.replace("-", "_")
            ratio = [t / tf for t, tf in zip(r["t"], f["t"])]  # paired: the same samples, adjacent in time
            points = [100 * fl * (1 / t - 1 / tf) / peak for fl, t, tf in zip(step_flops, r["t"], f["t"])]
            out[f"{key}_vs_fast"] = {
                "step_time_ratio": _quantiles(ratio), "mfu_points_per_step": _quantiles(points),
                "mfu_points_total": 100 * (results[name]["mfu"] - results["fast"]["mfu"]),
                "loss_abs_diff_max": max(abs(a - b) for a, b in zip(r["loss"], f["loss"])),
            }
        if "sharded" in results:
            out["mfu_points_sharded_minus_fast"] = out["sharded_vs_fast"]["mfu_points_total"]
            out["first_step_loss_abs_diff"] = abs(results["sharded"]["loss_per_step"][0] - f["loss"][0])
    if args.profile is not None:
        out["profile"] = profile(trainers, per_step[0], device, Path(args.profile))
    for name in list(trainers):
        del trainers[name]
    from learner.distributed import teardown

    teardown()
    return out


def profile(trainers: dict[str, Any], batch: Sequence[Any], device: torch.device, where: Path) -> dict[str, str]:
    """One more step of each contender under ``torch.profiler``: the top operators by device and by CPU time."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    where.mkdir(parents=True, exist_ok=True)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    files = {}
    for name, trainer in trainers.items():
        with torch_profile(activities=acts) as prof:
            trainer.step(batch)
            _sync(device)
        avg = prof.key_averages()
        by_dev = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
        tables = [avg.table(sort_by=key, row_limit=30, max_name_column_width=70) for key in (by_dev, "cpu_time_total")]
        text = f"== {name}: by device time\n{tables[0]}\n== {name}: by CPU time\n{tables[1]}\n"
        path = where / f"profile_{name}.txt"
        path.write_text(text)
        files[name] = str(path)
    return files


def _q(x: dict[str, float], scale: float = 1.0, fmt: str = ".3f") -> str:
    return f"{scale * x['median']:{fmt}} [{scale * x['p25']:{fmt}}, {scale * x['p75']:{fmt}}]"


def table(r: dict[str, Any]) -> str:
    names = [n for n in CONTENDERS if n in r]
    rows = [f"sharded learner (world size 1) vs fast path: {r['model']} on {r['device']} ({r['dtype']}; "
            f"torch {r['torch']})",
            f"{r['steps']} timed steps after {r['warmup']} warm-up, {r['order']}; median [p25, p75] over steps",
            f"{'':16} {'tokens/s':>9} {'MFU':>6} {'MFU per step':>22} {'step s':>22} {'fwd+bwd':>8} {'optim':>7} "
            f"{'peak GiB':>9} {'setup s':>8}"]
    for name in names:
        x = r[name]
        mem = f"{x['peak_mem_gib']:.1f}" if x["peak_mem_gib"] is not None else "-"
        mfu = _q(x["mfu_per_step"], 100, ".1f")
        rows.append(f"{name:16} {x['tokens_per_s']:9.0f} {100 * x['mfu']:5.1f}% {mfu:>22} "
                    f"{_q(x['step_s']):>22} {x['fwd_bwd_s']:8.3f} {x['optimizer_s']:7.3f} {mem:>9} "
                    f"{x['setup_s']:8.1f}")
    for name in names:
        c = r.get(f"{name.replace('-', '_')}_vs_fast")
        if c is None:
            continue
        ratio = c["step_time_ratio"]
        rows.append(f"{name} / fast, paired per step: step time x{_q(ratio)} (min {ratio['min']:.3f}, max "
                    f"{ratio['max']:.3f}); MFU points {_q(c['mfu_points_per_step'], 1, '+.2f')}, over all steps "
                    f"{c['mfu_points_total']:+.2f}; loss |diff| max {c['loss_abs_diff_max']:.1e}")
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    mine = argparse.ArgumentParser(description=__doc__.splitlines()[0], add_help=False)
    mine.add_argument("--contenders", default="fast,sharded",
                      help=f"comma list of {', '.join(CONTENDERS)} (interleaved in this order)")
    mine.add_argument("--profile", default=None, metavar="DIR",
                      help="after the timed steps, one more step of each under torch.profiler; tables to DIR")
    mine.add_argument("--sharded-params", choices=("auto", "bf16", "fp32"), default="auto",
                      help="the \"sharded\" contender's FSDP2 parameters on GPU: auto (the group's: bf16 with more "
                      "than one rank, fp32 under bf16 autocast at world size 1), bf16, or fp32")
    mine.add_argument("--reshard", action=argparse.BooleanOptionalAction, default=None,
                      help="reshard each layer after forward (default: only when world size > 1)")
    known, rest = mine.parse_known_args(argv)
    args = bench_gpu_args(rest)
    if not any(a == "--steps" or a.startswith("--steps=") for a in rest):
        args.steps = 4 if args.tiny else 20  # learner_gpu's 5 is too few to read a 2-point difference
    args.profile = known.profile
    contenders = [c.strip() for c in known.contenders.split(",") if c.strip()]
    if not contenders or any(c not in CONTENDERS for c in contenders) or len(set(contenders)) < len(contenders):
        print(f"--contenders: expected a comma list of {', '.join(CONTENDERS)}; got {known.contenders!r}",
              file=sys.stderr)
        return 2
    result = run(args, contenders, known)
    print(table(result))
    if args.out is not None:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
