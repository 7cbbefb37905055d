"""Learner throughput on a GPU: our packed trainer step vs a plain padded Hugging Face loop.

Run on the H200 (not in CI)::

    python -m learner.bench_gpu --out runs/bench_learner.json

and on any CPU, in seconds, with a tiny model (what the unit test does)::

    python -m learner.bench_gpu --tiny --out /tmp/bench.json

Both contenders train the same model (Qwen2-0.5B-shaped, random weights from
a config, bf16 autocast over fp32 master weights, AdamW, grad clip 1.0) on the
same samples with the same loss (DAPO, ``learner.losses``), in the same run:

- ``packed``: ``learner.trainer.Trainer.step`` -- first-fit-decreasing packing
  into ``--seq-tokens`` rows, attention confined per sample, each row topped up
  to the fixed row size (``--pad-to-multiple``, a few % of slack) because on
  the GPU every new sequence length costs a fresh cuDNN attention plan;
- ``padded``: the usual loop -- fixed-size batches in data order, each padded to
  its longest sample (rounded up to ``--baseline-pad-multiple``, like HF's
  ``pad_to_multiple_of``) with a 2D attention mask, same loss on the padded grid.

First H200 readings (3 timed steps of 32 samples, mean 1213 tokens; one run
each, so rough): rows of varying length 18.2k tokens/s (5.9% MFU); fixed 4096
rows 29.0k tokens/s (9.5% MFU) against the padded loop's 18.4k at multiple 256
(10.5k unrounded). A bare forward + backward of one 4096-token row reached
~12% MFU, so the gap to the 35% goal is in the model step itself (fp32 master
weights under autocast, full-vocabulary fp32 logits, unfused kernels), not in
packing; the loss matched the CPU fp32 reference to 7.5e-5.

Tokens/s counts *real* tokens for both (padding is waste, not work). MFU is
model FLOPs / (time x peak): ``6 N`` per token (``N`` = matmul parameters, the
LM head included) plus causal attention ``6 n^2 d L`` per sample of length ``n``.

Loss check: on a small slice, the loss and logprobs of the GPU bf16 path are
compared with a CPU fp32 reference of the same weights; the rollout logprobs
are the reference's plus noise, so the ratio (and the loss) depends on the
logprobs being right. Tolerance: bf16's, |diff| <= 2e-2 (1 + |ref|).
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
from transformers import Qwen2Config

from learner.losses import policy_loss
from learner.model import PolicyModel
from learner.packing import make_batch, pack
from learner.trainer import Trainer
from learner.types import LossConfig, TrainerConfig, TrainItem

H200_BF16_TFLOPS = 989.0  # dense, SXM


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
    cfg: Qwen2Config, items: Sequence[TrainItem], device: torch.device, seed: int, attn: str
) -> dict[str, Any]:
    """GPU (bf16 autocast) vs CPU fp32 loss and logprobs of the same weights on a packed slice."""
    loss_cfg = LossConfig.dapo(is_correction="none")
    ref_model = PolicyModel.from_config(cfg, seed=seed).eval()
    batch = make_batch(items)
    with torch.no_grad():
        ref_logp, _ = ref_model.logprobs(batch.input_ids_BT, batch.position_ids_BT)
    g = torch.Generator().manual_seed(seed)
    mu = (ref_logp + 0.1 * torch.randn(ref_logp.shape, generator=g)) * batch.loss_mask_BT
    adv = torch.ones_like(batch.adv_BT)

    def loss_on(model: PolicyModel, dev: torch.device, bf16: bool) -> tuple[float, torch.Tensor]:
        b = batch.to(dev)
        with torch.no_grad(), torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
            logp, _ = model.logprobs(b.input_ids_BT, b.position_ids_BT)
        out = policy_loss(logp, mu.to(dev), adv.to(dev), b.loss_mask_BT, b.seg_BT, loss_cfg, old_logp_BT=mu.to(dev))
        return float(out.loss), logp.cpu()

    ref_loss, _ = loss_on(ref_model, torch.device("cpu"), False)
    test_model = PolicyModel.from_config(cfg, seed=seed, attn_implementation=attn).to(device).eval()
    test_loss, test_logp = loss_on(test_model, device, device.type == "cuda")
    on = batch.loss_mask_BT > 0
    logp_diff = (test_logp - ref_logp)[on].abs()
    tol = 2e-2 * (1.0 + abs(ref_loss))
    return {
        "tokens": batch.num_tokens, "loss_device": test_loss, "loss_cpu_fp32": ref_loss,
        "abs_diff": abs(test_loss - ref_loss), "tolerance": tol, "ok": abs(test_loss - ref_loss) <= tol,
        "logp_abs_diff_mean": float(logp_diff.mean()), "logp_abs_diff_max": float(logp_diff.max()),
    }


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

    results: dict[str, Any] = {}
    for name in ("packed", "padded"):
        model = PolicyModel.from_config(cfg, seed=args.seed, attn_implementation=args.attn).to(device)
        trainer = Trainer(model, loss_cfg, TrainerConfig(
            lr=1e-6, micro_batch_tokens=args.seq_tokens, bf16=bf16, pad_to_multiple=args.pad_to_multiple))
        times: list[float] = []
        for k, batch in enumerate(per_step):
            t0 = _sync(device)
            if name == "packed":
                trainer.step(batch)
            else:
                padded_step(model, trainer.optimizer, batch, baseline_bs, loss_cfg, device, bf16,
                            args.baseline_pad_multiple)
            if k >= args.warmup:
                times.append(_sync(device) - t0)
        timed = [len(it) for b in per_step[args.warmup:] for it in b]
        seconds = sum(times)
        flops = train_flops(cfg, timed)
        results[name] = {
            "tokens_per_s": sum(timed) / seconds, "mfu": flops / seconds / (args.peak_tflops * 1e12),
            "step_s_mean": seconds / len(times), "tokens": sum(timed),
            "peak_mem_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
        }
        if name == "packed":
            rows = [b for step in per_step[args.warmup:] for b in pack(step, args.seq_tokens)]
            slots = sum(-(-b.num_tokens // args.pad_to_multiple) * args.pad_to_multiple for b in rows)
            results[name]["pad_fraction"] = 1.0 - sum(timed) / slots
        if name == "padded":
            mult = args.baseline_pad_multiple
            slots = sum(-(-max(len(it) for it in b[i:i + baseline_bs]) // mult) * mult * len(b[i:i + baseline_bs])
                        for b in per_step[args.warmup:] for i in range(0, len(b), baseline_bs))
            results[name]["pad_fraction"] = 1.0 - sum(timed) / slots
            results[name]["batch_size"] = baseline_bs
        del trainer, model
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)

    slice_items = [TrainItem(it.token_ids[:args.check_len], it.rollout_logprobs[:args.check_len],
                             it.loss_mask[:args.check_len], 1.0) for it in items[:args.check_samples]]
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "model": "tiny" if args.tiny else "qwen2-0.5b-shape", "matmul_params": matmul_params(cfg),
        "dtype": "bf16-autocast" if bf16 else "fp32", "attn": args.attn, "seq_tokens": args.seq_tokens,
        "samples_per_step": args.samples_per_step, "pad_to_multiple": args.pad_to_multiple,
        "baseline_pad_multiple": args.baseline_pad_multiple, "steps": args.steps, "mean_len": mean_len,
        "peak_tflops": args.peak_tflops, "packed": results["packed"], "padded": results["padded"],
        "speedup": results["packed"]["tokens_per_s"] / results["padded"]["tokens_per_s"],
        "loss_check": loss_check(cfg, slice_items, device, args.seed, args.attn),
        "torch": torch.__version__,
    }


def table(r: dict[str, Any]) -> str:
    rows = [f"learner benchmark: {r['model']} on {r['device']} ({r['dtype']}, attn={r['attn']}, "
            f"{r['seq_tokens']}-token rows, mean sample {r['mean_len']:.0f} tokens)",
            f"{'':8} {'tokens/s':>12} {'MFU':>7} {'step s':>8} {'pad %':>6}"]
    for name in ("packed", "padded"):
        x = r[name]
        pad = f"{100 * x['pad_fraction']:.0f}"
        rows.append(f"{name:8} {x['tokens_per_s']:12.0f} {100 * x['mfu']:6.1f}% {x['step_s_mean']:8.3f} {pad:>6}")
    c = r["loss_check"]
    rows.append(f"speedup {r['speedup']:.2f}x; loss device {c['loss_device']:.5f} vs cpu fp32 {c['loss_cpu_fp32']:.5f} "
                f"(|diff| {c['abs_diff']:.1e} <= {c['tolerance']:.1e}: {'ok' if c['ok'] else 'FAIL'}; "
                f"mean |dlogp| {c['logp_abs_diff_mean']:.1e})")
    return "\n".join(rows)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tiny", action="store_true", help="tiny config and sizes: runs on a CPU in seconds")
    p.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    p.add_argument("--attn", default="sdpa", help="sdpa | flash_attention_2 | eager | flex_attention")
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
    p.add_argument("--check-samples", type=int, default=4)
    p.add_argument("--check-len", type=int, default=None)
    p.add_argument("--peak-tflops", type=float, default=H200_BF16_TFLOPS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    defaults = ({"seq_tokens": 128, "min_len": 8, "max_len": 96, "samples_per_step": 8, "steps": 2, "warmup": 1,
                 "check_len": 32, "baseline_pad_multiple": 16} if args.tiny else
                {"seq_tokens": 4096, "min_len": 128, "max_len": 4096, "samples_per_step": 64, "steps": 5,
                 "warmup": 2, "check_len": 512, "baseline_pad_multiple": 256})
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.pad_to_multiple is None:
        args.pad_to_multiple = args.seq_tokens
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    print(table(result))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))
    return 0 if result["loss_check"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
