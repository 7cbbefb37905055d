"""Learner throughput on a GPU: our packed trainer step vs a plain padded Hugging Face loop.

Run on the H200 (not in CI; the defaults are the fast configuration on CUDA)::

    python -m benches.learner_gpu --verbose --out runs/bench_learner.json

and on any CPU, in seconds, with a tiny model (what the unit test does)::

    python -m benches.learner_gpu --tiny --out /tmp/bench.json

Both contenders train the same model (Qwen2-0.5B-shaped, random weights from
a config, bf16 autocast over fp32 weights, AdamW, grad clip 1.0) on the same
samples with the same loss (DAPO, ``learner.losses``), in the same run:

- ``packed``: ``learner.trainer.Trainer.step`` -- first-fit-decreasing packing
  into ``--seq-tokens`` (4096) rows, each topped up to that fixed size, ``--rows``
  (8) rows per micro-batch, attention confined per sample by PyTorch's own
  FlashAttention-2 varlen kernel (``--attn packed_varlen``; no T x T mask, no
  FLOPs across samples), the LM head + fp32 log-softmax in ``--logprob-chunk``
  (8192) token chunks with fused kernels and bf16 logits kept for backward
  (``--keep-logits``), each decoder layer under ``torch.compile``
  (``--compile``), fused AdamW (``--fused-adamw``). Each is a ``TrainerConfig``
  field (or the model's ``attn_implementation``), off by default in the trainer;
  ``--rows 1 --logprob-chunk 0 --attn sdpa --no-compile --no-fused-adamw`` is
  the trainer's default path.
- ``padded``: the usual loop -- fixed-size batches in data order, each padded to
  its longest sample (rounded up to ``--baseline-pad-multiple``, like HF's
  ``pad_to_multiple_of``) with a 2D attention mask, sdpa, full fp32 logits,
  default AdamW, same loss on the padded grid.

Why fp32 weights (and fp32 Adam state) rather than pure bf16: at the RL
learning rates here (~1e-6) an update is ~1e-4 of a weight, below bf16's
resolution (2^-8), so bf16 weights would drop most updates; the cost is one
weight cast per micro-batch and a 9 ms fused optimizer step.

H200 readings (torch 2.11, transformers 5.17; 5 timed steps of 64 samples,
mean 1114 tokens, after 2 warm-up steps that include the ~15-20 s compile; one
run each, so rough): fast path 111.8k tokens/s, 36.5% MFU, against the padded
loop's 20.9k (5.35x) in the same run; recomputing logits in backward instead
of keeping them 106.3k (34.7%); without compile 52k (17%); the trainer's
default path (one row per micro-batch, sdpa, full logits, eager) 36.9k (12.0%).
Loss vs the CPU fp32 reference: 1.9e-4 (tolerance 4e-2); gradient cosine
0.9988. ``docs/benchmarks.md`` has the table.

Tokens/s counts *real* tokens for both (padding is waste, not work). MFU is
model FLOPs / (time x peak): ``6 N`` per token (``N`` = matmul parameters, the
LM head included) plus causal attention ``6 n^2 d L`` per sample of length
``n``; recomputation (none on the fast path, one LM-head forward with
``--no-keep-logits``) counts as time, not as FLOPs.

Loss check: on a slice packed exactly as the trainer packs it, the trained
model's loss, logprobs and gradient on the GPU path are compared with a CPU
fp32 copy of the same weights on the plain path (default attention, full
logits); the rollout logprobs are the reference's plus noise, so the ratio (and
the loss) depends on the logprobs being right. Tolerance: bf16's, |diff| <=
2e-2 (1 + |ref|), and gradient cosine >= 0.95.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import Qwen2Config

from learner.losses import policy_loss
from learner.model import VARLEN_ATTENTION, PolicyModel
from learner.packing import pack
from learner.trainer import Trainer
from learner.types import LossConfig, TrainerConfig, TrainItem

H200_BF16_TFLOPS = 989.0  # dense, SXM
GRAD_COS_MIN = 0.95  # bf16 vs fp32 gradients of one micro-batch; a broken backward lands far below


def model_config(tiny: bool) -> Qwen2Config:
    """Qwen2-0.5B's shape (or a tiny one); weights are random, nothing is downloaded."""
    if tiny:
        return Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, vocab_size=512, max_position_embeddings=1024,
                           tie_word_embeddings=True)
    return Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                       num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768,
                       rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0}, tie_word_embeddings=True)


def make_items(n: int, vocab: int, min_len: int, max_len: int, seed: int) -> list[TrainItem]:
    """Agent-like samples: log-uniform lengths, the first 20% prompt (mask 0), advantages +-1."""
    g = torch.Generator().manual_seed(seed)
    items = []
    for i in range(n):
        u = float(torch.rand(1, generator=g))
        k = int(math.exp(math.log(min_len) + u * (math.log(max_len) - math.log(min_len))))
        ids = torch.randint(0, vocab, (k,), generator=g).tolist()
        prompt = max(1, k // 5)
        mask = [0] * prompt + [1] * (k - prompt)
        lps = [-math.log(vocab) * m for m in mask]
        items.append(TrainItem(tuple(ids), tuple(lps), tuple(mask), 1.0 if i % 2 == 0 else -1.0, sample_id=str(i)))
    return items


def matmul_params(cfg: Qwen2Config) -> int:
    """Parameters that take part in a matmul per token: every layer's weights plus the LM head."""
    d, f, L = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    kv = int(cfg.num_key_value_heads or cfg.num_attention_heads) * (d // cfg.num_attention_heads)
    per_layer = d * d + 2 * d * kv + d * d + 3 * d * f  # q, k, v, o, gate/up/down
    return L * per_layer + cfg.vocab_size * d


def train_flops(cfg: Qwen2Config, lengths: Sequence[int]) -> float:
    """Forward + backward model FLOPs of training on samples of these lengths (causal attention)."""
    dense = 6.0 * matmul_params(cfg) * sum(lengths)
    attn = 6.0 * cfg.hidden_size * cfg.num_hidden_layers * sum(n * n for n in lengths)
    return dense + attn


def padded_step(
    model: PolicyModel, optimizer: torch.optim.Optimizer, items: Sequence[TrainItem], batch_size: int,
    loss_cfg: LossConfig, device: torch.device, bf16: bool, pad_to_multiple: int = 1,
) -> None:
    """The plain loop: batches in data order, padded to their longest sample, 2D attention mask."""
    n_tok = sum(it.num_loss_tokens for it in items)
    optimizer.zero_grad(set_to_none=True)
    for at in range(0, len(items), batch_size):
        chunk = items[at:at + batch_size]
        t = -(-max(len(it) for it in chunk) // pad_to_multiple) * pad_to_multiple
        pad = lambda xs, v: list(xs) + [v] * (t - len(xs))  # noqa: E731
        ids = torch.tensor([pad(it.token_ids, 0) for it in chunk], device=device)
        attn = torch.tensor([pad([1] * len(it), 0) for it in chunk], device=device)
        mask = torch.tensor([pad((0,) + it.loss_mask[1:], 0) for it in chunk], dtype=torch.float32, device=device)
        mu = torch.tensor([pad(it.rollout_logprobs, 0.0) for it in chunk], device=device)
        adv = torch.tensor([pad(it.advantage if isinstance(it.advantage, tuple) else [it.advantage] * len(it), 0.0)
                            for it in chunk], device=device)
        seg = torch.arange(len(chunk), device=device)[:, None].expand(len(chunk), t)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            logp, _ = model.logprobs(ids, pos, attention_mask=attn, with_entropy=True)
        out = policy_loss(logp, mu, adv, mask, seg, loss_cfg, num_tokens=n_tok, num_seqs=len(items))
        out.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()


def _sync(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def loss_check(
    model: PolicyModel, cfg: Qwen2Config, items: Sequence[TrainItem], tcfg: TrainerConfig, bf16: bool,
) -> dict[str, Any]:
    """The trained model's loss, logprobs and gradient on the GPU path vs a CPU fp32 copy of the same weights.

    The slice is packed exactly as the trainer packs (same rows, attention,
    chunking, compiled layers), and the reference is the plain path: CPU, fp32,
    default attention, full logits. Rollout logprobs are the reference's plus
    noise, so the ratio (and the loss) depends on the logprobs being right.
    """
    loss_cfg = LossConfig.dapo(is_correction="none")
    device = model.device
    ref_model = PolicyModel.from_config(cfg)
    ref_model.load_state_dict({k: v.detach().float().cpu() for k, v in model.state_dict().items()})
    batch = pack(items, tcfg.micro_batch_tokens, pad_to_multiple=tcfg.pad_to_multiple,
                 rows=tcfg.rows_per_micro_batch)[0]
    with torch.no_grad():
        ref_logp, _ = ref_model.logprobs(batch.input_ids_BT, batch.position_ids_BT)
    g = torch.Generator().manual_seed(0)
    mu = (ref_logp + 0.1 * torch.randn(ref_logp.shape, generator=g)) * batch.loss_mask_BT
    adv = torch.ones_like(batch.adv_BT)

    def loss_and_grads(m: PolicyModel, dev: torch.device, bf16: bool, fast: bool) -> tuple[float, Any, Any]:
        b = batch.to(dev)
        m.train()
        m.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
            logp, _ = m.logprobs(b.input_ids_BT, b.position_ids_BT, with_entropy=True,
                                 chunk_tokens=tcfg.logprob_chunk_tokens if fast else None,
                                 keep_logits=tcfg.logprob_keep_logits)
        out = policy_loss(logp, mu.to(dev), adv.to(dev), b.loss_mask_BT, b.seg_BT, loss_cfg, old_logp_BT=mu.to(dev))
        out.loss.backward()
        grads = torch.cat([torch.zeros(p.numel()) if p.grad is None else p.grad.detach().float().cpu().flatten()
                           for _, p in sorted(m.named_parameters())])
        m.zero_grad(set_to_none=True)
        return float(out.loss.detach()), logp.detach().cpu(), grads

    ref_loss, _, ref_grad = loss_and_grads(ref_model, torch.device("cpu"), False, False)
    test_loss, test_logp, test_grad = loss_and_grads(model, device, bf16, True)
    on = batch.loss_mask_BT > 0
    logp_diff = (test_logp - ref_logp)[on].abs()
    tol = 2e-2 * (1.0 + abs(ref_loss))
    # float64: F.cosine_similarity in fp32 over ~5e8 entries drifts past 1 (seen: 1.10)
    test64, ref64 = test_grad.double(), ref_grad.double()
    grad_cos = float(test64 @ ref64 / (test64.norm() * ref64.norm()))
    ok = abs(test_loss - ref_loss) <= tol and grad_cos >= GRAD_COS_MIN
    return {
        "tokens": batch.num_tokens, "rows": batch.input_ids_BT.shape[0], "loss_device": test_loss,
        "loss_cpu_fp32": ref_loss, "abs_diff": abs(test_loss - ref_loss), "tolerance": tol,
        "logp_abs_diff_mean": float(logp_diff.mean()), "logp_abs_diff_max": float(logp_diff.max()),
        "grad_cosine": grad_cos, "grad_norm_ratio": float(test_grad.norm() / ref_grad.norm()), "ok": ok,
    }


def packed_config(args: argparse.Namespace, bf16: bool) -> TrainerConfig:
    """The trainer configuration under test (``--rows`` etc.); the defaults are the fast one."""
    return TrainerConfig(
        lr=1e-6, micro_batch_tokens=args.seq_tokens, bf16=bf16, pad_to_multiple=args.pad_to_multiple,
        rows_per_micro_batch=args.rows, logprob_chunk_tokens=args.logprob_chunk or None,
        logprob_keep_logits=args.keep_logits, compile_layers=args.compile, fused_optimizer=args.fused_adamw,
    )


def compile_stats() -> dict[str, int]:
    """``torch.compile``'s counters so far: distinct graphs and graph breaks (shared with ``benches.distill_gpu``
    and ``benches.engine_generate``)."""
    from torch._dynamo.utils import counters

    return {"unique_graphs": int(counters["stats"]["unique_graphs"]),
            "graph_breaks": int(sum(counters["graph_break"].values()))}


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    bf16 = device.type == "cuda" and not args.fp32
    cfg = model_config(args.tiny)
    steps = args.warmup + args.steps
    items = make_items(args.samples_per_step * steps, cfg.vocab_size, args.min_len, args.max_len, args.seed)
    per_step = [items[i * args.samples_per_step:(i + 1) * args.samples_per_step] for i in range(steps)]
    loss_cfg = LossConfig.dapo()
    mean_len = statistics.mean(len(it) for it in items)
    baseline_bs = args.baseline_batch or max(1, round(args.seq_tokens / mean_len))
    tcfg = packed_config(args, bf16)
    timed = [len(it) for b in per_step[args.warmup:] for it in b]
    flops = train_flops(cfg, timed)

    results: dict[str, Any] = {}
    check: dict[str, Any] | None = None
    for name in args.contenders:
        if name == "packed":
            model = PolicyModel.from_config(cfg, seed=args.seed, attn_implementation=args.attn).to(device)
            trainer = Trainer(model, loss_cfg, tcfg)
        else:  # the plain loop: default attention, default AdamW, full logits
            model = PolicyModel.from_config(cfg, seed=args.seed, attn_implementation=args.baseline_attn).to(device)
            trainer = Trainer(model, loss_cfg, TrainerConfig(lr=1e-6, bf16=bf16))
        times: list[float] = []
        phases: list[tuple[float, float, float]] = []
        for k, batch in enumerate(per_step):
            t0 = _sync(device)
            if name == "packed":
                m = trainer.step(batch)
                if k >= args.warmup:
                    phases.append((m.pack_s, m.forward_backward_s, m.optimizer_s))
            else:
                padded_step(model, trainer.optimizer, batch, baseline_bs, loss_cfg, device, bf16,
                            args.baseline_pad_multiple)
            elapsed = _sync(device) - t0
            if k >= args.warmup:
                times.append(elapsed)
            elif args.verbose:
                print(f"  {name} warmup step {k}: {elapsed:.1f} s", flush=True)
        seconds = sum(times)
        results[name] = {
            "tokens_per_s": sum(timed) / seconds, "mfu": flops / seconds / (args.peak_tflops * 1e12),
            "step_s_mean": seconds / len(times), "tokens": sum(timed),
            "peak_mem_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
        }
        if name == "packed":
            rows = [r for step in per_step[args.warmup:]
                    for mb in pack(step, args.seq_tokens, pad_to_multiple=args.pad_to_multiple, rows=args.rows)
                    for r in mb.seg_BT]
            slots = sum(r.numel() for r in rows)
            results[name] |= {
                "pad_fraction": 1.0 - sum(timed) / slots, "micro_batches_per_step": len(rows) / args.steps / args.rows,
                "pack_s": statistics.mean(p[0] for p in phases), "fwd_bwd_s": statistics.mean(p[1] for p in phases),
                "optimizer_s": statistics.mean(p[2] for p in phases),
            }
            if args.compile:
                results[name]["compile"] = compile_stats()
            if args.loss_check:
                slice_items = [TrainItem(it.token_ids[:args.check_len], it.rollout_logprobs[:args.check_len],
                                         it.loss_mask[:args.check_len], 1.0) for it in items[:args.check_samples]]
                check = loss_check(model, cfg, slice_items, tcfg, bf16)
        if name == "padded":
            mult = args.baseline_pad_multiple
            slots = sum(-(-max(len(it) for it in b[i:i + baseline_bs]) // mult) * mult * len(b[i:i + baseline_bs])
                        for b in per_step[args.warmup:] for i in range(0, len(b), baseline_bs))
            results[name] |= {"pad_fraction": 1.0 - sum(timed) / slots, "batch_size": baseline_bs}
        if args.verbose:
            print(f"  {name}: {results[name]}", flush=True)
        del trainer, model
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)

    out: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "model": "tiny" if args.tiny else "qwen2-0.5b-shape", "matmul_params": matmul_params(cfg),
        "dtype": "bf16-autocast, fp32 weights" if bf16 else "fp32", "attn": args.attn,
        "baseline_attn": args.baseline_attn, "seq_tokens": args.seq_tokens, "rows": args.rows,
        "logprob_chunk": args.logprob_chunk, "keep_logits": args.keep_logits, "compile": args.compile,
        "fused_adamw": args.fused_adamw,
        "samples_per_step": args.samples_per_step, "pad_to_multiple": args.pad_to_multiple,
        "baseline_pad_multiple": args.baseline_pad_multiple, "steps": args.steps, "mean_len": mean_len,
        "peak_tflops": args.peak_tflops, "torch": torch.__version__, "transformers": transformers.__version__,
        **results,
    }
    if "packed" in results and "padded" in results:
        out["speedup"] = results["packed"]["tokens_per_s"] / results["padded"]["tokens_per_s"]
    if check is not None:
        out["loss_check"] = check
    return out


def table(r: dict[str, Any]) -> str:
    rows = [f"learner benchmark: {r['model']} on {r['device']} ({r['dtype']}, {r['seq_tokens']}-token rows, "
            f"mean sample {r['mean_len']:.0f} tokens; torch {r['torch']}, transformers {r['transformers']})",
            f"packed = {r['rows']} rows/micro-batch, attn {r['attn']}, logprob chunk {r['logprob_chunk'] or 'off'}"
            f"{' (bf16 logits kept)' if r['keep_logits'] and r['logprob_chunk'] else ''}, "
            f"compile {'on' if r['compile'] else 'off'}, fused AdamW {'on' if r['fused_adamw'] else 'off'}; "
            f"padded = plain HF loop, attn {r['baseline_attn']}",
            f"{'':8} {'tokens/s':>12} {'MFU':>7} {'step s':>8} {'pad %':>6} {'peak GiB':>9}"]
    for name in ("packed", "padded"):
        if name not in r:
            continue
        x = r[name]
        mem = f"{x['peak_mem_gib']:.1f}" if x["peak_mem_gib"] is not None else "-"
        rows.append(f"{name:8} {x['tokens_per_s']:12.0f} {100 * x['mfu']:6.1f}% {x['step_s_mean']:8.3f} "
                    f"{100 * x['pad_fraction']:6.0f} {mem:>9}")
    if "speedup" in r:
        rows.append(f"speedup {r['speedup']:.2f}x")
    if "loss_check" in r:
        c = r["loss_check"]
        rows.append(f"loss check: device {c['loss_device']:.5f} vs cpu fp32 {c['loss_cpu_fp32']:.5f} "
                    f"(|diff| {c['abs_diff']:.1e} <= {c['tolerance']:.1e}; mean |dlogp| "
                    f"{c['logp_abs_diff_mean']:.1e}; grad cosine {c['grad_cosine']:.4f}): "
                    f"{'ok' if c['ok'] else 'FAIL'}")
    return "\n".join(rows)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benches.learner_gpu", description=__doc__.split("\n\n")[0])
    p.add_argument("--tiny", action="store_true", help="tiny config and sizes: runs on a CPU in seconds")
    p.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    p.add_argument("--attn", default=VARLEN_ATTENTION,
                   help=f"packed path's attention: {VARLEN_ATTENTION} (default) | sdpa | flex_attention | eager")
    p.add_argument("--baseline-attn", default="sdpa", help="the padded loop's attention")
    p.add_argument("--rows", type=int, default=None, help="packed rows per micro-batch (default 8; tiny 2)")
    p.add_argument("--logprob-chunk", type=int, default=None,
                   help="LM head + logprobs this many tokens at a time; 0 = full logits (default 8192; tiny 64)")
    p.add_argument("--keep-logits", action=argparse.BooleanOptionalAction, default=None,
                   help="keep the chunks' logits for backward instead of recomputing them (default: on CUDA)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="torch.compile the decoder layers (default: on CUDA)")
    p.add_argument("--fused-adamw", action=argparse.BooleanOptionalAction, default=None,
                   help="fused AdamW for the packed trainer (default: on CUDA)")
    p.add_argument("--contenders", default="packed,padded", help="comma list of packed, padded")
    p.add_argument("--loss-check", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--fp32", action="store_true", help="no bf16 autocast on GPU")
    p.add_argument("--seq-tokens", type=int, default=None, help="tokens per packed row (default 4096; tiny 128)")
    p.add_argument("--min-len", type=int, default=None)
    p.add_argument("--max-len", type=int, default=None)
    p.add_argument("--samples-per-step", type=int, default=None)
    p.add_argument("--baseline-batch", type=int, default=None, help="padded batch size (default: tokens/mean len)")
    p.add_argument("--pad-to-multiple", type=int, default=None,
                   help="round packed rows up to this (default: --seq-tokens, i.e. one fixed shape)")
    p.add_argument("--baseline-pad-multiple", type=int, default=None,
                   help="round padded batches up to this, like HF's pad_to_multiple_of (default 256; tiny 16)")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--check-samples", type=int, default=None)
    p.add_argument("--check-len", type=int, default=None)
    p.add_argument("--peak-tflops", type=float, default=H200_BF16_TFLOPS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--verbose", action="store_true", help="print warmup times and each contender's result")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    defaults = ({"seq_tokens": 128, "min_len": 8, "max_len": 96, "samples_per_step": 8, "steps": 2, "warmup": 1,
                 "check_samples": 4, "check_len": 32, "baseline_pad_multiple": 16, "rows": 2, "logprob_chunk": 64}
                if args.tiny else
                {"seq_tokens": 4096, "min_len": 128, "max_len": 4096, "samples_per_step": 64, "steps": 5,
                 "warmup": 2, "check_samples": 8, "check_len": 1024, "baseline_pad_multiple": 256, "rows": 8,
                 "logprob_chunk": 8192})
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.pad_to_multiple is None:
        args.pad_to_multiple = args.seq_tokens
    on_gpu = (args.device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")
    for k in ("keep_logits", "compile", "fused_adamw"):
        if getattr(args, k) is None:
            setattr(args, k, on_gpu)
    args.contenders = [c.strip() for c in args.contenders.split(",") if c.strip()]
    bad = [c for c in args.contenders if c not in ("packed", "padded")]
    if bad or not args.contenders:
        p.error(f"--contenders: expected a comma list of packed, padded; got {bad or 'nothing'}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    print(table(result))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))
    return 0 if result.get("loss_check", {"ok": True})["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
