"""MOPD on a GPU: teacher scoring (9 LoRA adapters vs 9 full copies), learner MFU (MOPD vs RL), one iteration's GPU-seconds.

Issue #15's "On the H200" measurements, on a Qwen2-0.5B-shaped grid built from
a config (random weights; nothing is downloaded). Run on the H200 (not in CI)::

    python -m benches.distill_gpu --shape qwen2-0.5b --json runs/bench_mopd.json   # --verbose: every step's time

and on any CPU, in seconds, with tiny models (what the unit test does)::

    python -m benches.distill_gpu --tiny --json /tmp/bench_mopd.json

Every phase is written to ``--json`` as soon as it is measured (a run cut short keeps what it has), but
the iteration's table needs all three: give the run its time (no 120 s cap: that cut the 2026-12-05
run after its rollout). The H200 run should take about 3 minutes on a 16-core host (three 0.5B models
initialised on the CPU, nine merged copies, a 512-token generate, ~40 s of
compile in the warm-up steps); ``--no-compile``, ``--response-len 256`` or
``--steps 2`` shorten it. It needs ``peft`` (the LoRA teachers) and says so
when it cannot import it.

The workload, shared by all three: 9 cells (general/agent/coding x low/high/max)
x ``--per-cell`` (8) student samples, each a random prompt of ``--prompt-len``
(1024) +-50% tokens followed by ``--response-len`` (512) tokens the student
sampled (HF ``generate``, temperature 1, no top-k/top-p, from a bf16 copy of the
student's weights). Teachers and student score the response positions; the
teacher sees the student's own context (``teacher_context: student``).

1. **Teacher scoring.** The same 9 teachers four ways, scoring the same
   requests through ``teachers.scoring.RoutingScorer`` as
   ``teachers.grid.build_scorer`` would: one bf16 base and 9 ``peft`` adapters
   (r ``--lora-rank``, all linear layers, random A and B so the cells differ)
   in one ``LoRAScorer`` (``LORA_KINDS``: ``lora``, merged per cell, the
   default; ``lora_peft``, ``peft``'s forward with bf16 adapters;
   ``lora_peft_fp32``, with the float32 adapters ``peft`` loads); ``copies``,
   9 bf16 copies with the same adapters merged, one ``HFScorer`` each (the
   baseline). Tokens/s (real tokens, padding is waste), GPU memory after
   loading and peak while scoring (``torch.cuda.max_memory_allocated``, reset
   before each contender loads), and the ratio lora / copies. A check that all
   are the same teachers: their logprobs agree far more closely than two
   different cells' do.
2. **Learner MFU.** One student (fp32 weights, bf16 autocast) and one
   ``learner.trainer.Trainer`` with ``benches.learner_gpu``'s fast path on CUDA
   (8 packed 4096-token rows per micro-batch, ``packed_varlen`` attention,
   8192-token logprob chunks with logits kept, compiled layers, fused AdamW),
   ``LossConfig.dapo()``, the same items; steps interleaved after warm-up:
   ``rl``: GRPO advantages per sequence (random 0/1 rewards per cell's group);
   ``mopd``: ``HFScorer`` over the learner's model scores the sampled tokens
   in fp32 (``MOPDAdvantages(bf16=False)``, what the loop did before the
   first H200 reading), then ``distill.advantages.token_advantages`` (R = 5)
   per token, then the step; ``mopd_bf16``: the same with that forward under
   bf16 autocast, as ``distill.loop.MOPDAdvantages`` now runs it on CUDA
   (``student_logprobs: learner``, ``trainer.bf16`` unset).
   MFU is reported three ways for MOPD: the forward's FLOPs counted as model
   FLOPs; not counted (its time is overhead); the trainer step alone.
3. **One MOPD iteration's GPU-seconds**, from the phases measured above on the
   one GPU: rollout (the generate), teacher prefill (one pass of the LoRA grid;
   the copies' too), student scoring and training (the ``mopd`` step), against
   an RL iteration (rollout + ``rl`` step) in the same run.

MFU = model FLOPs / seconds / ``--peak-tflops`` (H200 dense bf16, 989.4).
Training: ``benches.learner_gpu.train_flops`` (``6 N`` per token, ``N`` = matmul
parameters with the LM head, plus causal attention ``6 n^2 d L`` per sample).
A scoring forward: ``2 (N - V d)`` per token for the body, ``2 V d`` per
position the LM head runs at (the scored ones, plus the one
``logits_to_keep=1`` row end), causal attention ``2 n^2 d L`` -- what it
computes, not ``2 N`` a token. Every interval is read after
``torch.cuda.synchronize``.

H200 readings (2026-12-03, docs/benchmarks.md, four runs): teacher scoring
(run 4) copies 176,844 tokens/s, ``lora`` (merged) 0.873x at 0.505x the peak
memory, ``lora_peft`` 0.596x, ``lora_peft_fp32`` 0.418x; learner MFU RL
33.0-33.6%, ``mopd_bf16`` 2.6-5.3 points under it (``mopd`` fp32: ~23.5
under); one iteration: rollout (HF ``generate``) 94.7% of the GPU-seconds,
MOPD 1.03x an RL iteration.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import Qwen2Config

from distill.advantages import token_advantages
from learner.advantages import group_advantages
from benches.learner_gpu import compile_stats, matmul_params, model_config, packed_config, train_flops
from learner.model import VARLEN_ATTENTION, PolicyModel
from learner.trainer import Trainer
from learner.types import AdvantageConfig, LossConfig, TrainItem
from teachers.scoring import HFScorer, LoRAScorer, RoutingScorer
from teachers.types import DOMAINS, EFFORTS, ScoreRequest, ScoreResult, cell_key

H200_BF16_TFLOPS = 989.4  # dense, SXM
GOAL_POINTS = 5.0  # issue #15: the MOPD step's MFU within 5 points of the RL step's
CLIP = 5.0  # R of distill's default config
CELLS = tuple(cell_key(d, e) for d in DOMAINS for e in EFFORTS)
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
AGREE_FRACTION = 0.25  # lora vs copies must differ by < 1/4 of what two different cells do

Clock = Callable[[], float]


LORA_KINDS = {"lora": ("merge", "base"), "lora_peft": ("peft", "base"), "lora_peft_fp32": ("peft", None)}
"""The LoRA contenders: ``LoRAScorer``'s (mode, adapter_dtype)."""


class Stopwatch:
    """Readings of ``clock`` taken after the device has finished its queued work."""

    def __init__(self, device: torch.device, clock: Clock = time.perf_counter) -> None:
        self.device, self.clock = device, clock

    def now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return float(self.clock())


def score_flops(cfg: Qwen2Config, requests: Sequence[ScoreRequest]) -> float:
    """FLOPs of ``HFScorer`` scoring ``requests``: body at every token, LM head where it runs, causal attention."""
    d, layers, vocab = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size
    body = matmul_params(cfg) - vocab * d
    tokens = sum(len(r.token_ids) for r in requests)
    head = sum(len(r.positions) + 1 for r in requests)  # + the logits_to_keep=1 row end
    attn = 2.0 * d * layers * sum(len(r.token_ids) ** 2 for r in requests)
    return 2.0 * body * tokens + 2.0 * vocab * d * head + attn


def mfu(flops: float, seconds: float, peak_tflops: float) -> float:
    return flops / seconds / (peak_tflops * 1e12)


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def _gib(device: torch.device, peak: bool) -> float | None:
    if device.type != "cuda":
        return None
    return (torch.cuda.max_memory_allocated(device) if peak else torch.cuda.memory_allocated(device)) / 2**30


# ---------------------------------------------------------------- 3a. rollout: the student's samples


def rollout(cfg: Qwen2Config, args: argparse.Namespace, device: torch.device, dtype: torch.dtype,
            watch: Stopwatch) -> tuple[list[tuple[int, ...]], list[int], dict[str, Any]]:
    """Sample ``--response-len`` tokens after each random prompt: (sequences, prompt lengths, stats).

    Two ways in one run, the same prompts and weights: ``rollout.engine.Engine`` (what ``HFPolicy`` episodes,
    evaluation and MOPD generate with: continuous batching, slot KV cache, CUDA graphs on GPU) and HF
    ``generate`` (left padded, one batch; the rollout before the engine, kept as the baseline). The engine's
    samples are what the rest of the bench scores and trains on; ``seconds`` is the engine's."""
    from rollout.engine import Engine, EngineRequest

    g = torch.Generator().manual_seed(args.seed)
    n = len(CELLS) * args.per_cell
    lo, hi = max(1, args.prompt_len // 2), max(1, args.prompt_len * 3 // 2)
    # --group G: G samples a prompt in a row (a GRPO group's first turns), else every sample its own prompt
    plens = [k for k in torch.randint(lo, hi + 1, (-(-n // args.group),), generator=g).tolist()
             for _ in range(args.group)][:n]
    width = max(plens)
    ids_NP = torch.zeros((n, width), dtype=torch.long)
    attn_NP = torch.zeros((n, width), dtype=torch.long)
    for i, p in enumerate(plens):  # left padded, as generate wants
        if i % args.group == 0:
            ids_NP[i, width - p:] = torch.randint(0, cfg.vocab_size, (p,), generator=g)
        else:
            ids_NP[i] = ids_NP[i - 1]
        attn_NP[i, width - p:] = 1
    prompts = [ids_NP[i, width - p:].tolist() for i, p in enumerate(plens)]
    # the rollout engine's copy of the student: same seed, same weights, bf16 on the GPU, sdpa
    lm: Any = PolicyModel.from_config(cfg, seed=args.seed).lm
    lm = lm.to(device=device, dtype=dtype).eval()
    ids_NP, attn_NP = ids_NP.to(device), attn_NP.to(device)
    torch.manual_seed(args.seed)

    def generate(new: int) -> torch.Tensor:
        with torch.inference_mode():
            return lm.generate(input_ids=ids_NP, attention_mask=attn_NP, do_sample=True, temperature=1.0, top_k=0,
                               top_p=1.0, max_new_tokens=new, min_new_tokens=new, pad_token_id=0)

    generate_s = float("nan")  # --skip-generate: the baseline's rows read nan
    if not args.skip_generate:
        generate(min(4, args.response_len))  # warm-up
        t0 = watch.now()
        out = generate(args.response_len)
        generate_s = watch.now() - t0
        del out

    paid: dict[str, dict[str, Any]] = {}  # per engine: what its timed wave still captured or compiled, its admissions

    def timed_engine(label: str, **options: Any) -> tuple[list[Any], float, float]:
        # --group on CPU: a 50 ms admission window (CPU has none), so a wave's samples are admitted together
        window = 0.05 if args.group > 1 and device.type == "cpu" else None
        engine = Engine(lm, max_slots=n, max_len=width + args.response_len, admission_window_s=window, **options)
        engine.reserve(n, width + args.response_len)

        def wave(seed: int) -> list[Any]:  # no stop tokens: every request samples --response-len tokens, as generate does
            futs = engine.submit_many([EngineRequest(prompt_ids=p, max_new_tokens=args.response_len, temperature=1.0,
                                                     seed=seed + i) for i, p in enumerate(prompts)])  # one burst
            return [f.result() for f in futs]

        t0 = watch.now()
        for w in range(args.warm_waves):  # CUDA-graph capture for every (batch, length) bucket the waves meet, compiles
            wave(10_000 + 1_000 * w)
        warm_s = watch.now() - t0
        captures0, graphs0 = engine.slots.captures, compile_stats()["unique_graphs"]
        phases0, prefills0, shared0 = dict(engine.phase_s), engine.prefills, engine.shared_prefills
        engine.admissions.clear()
        t0 = watch.now()
        outs = wave(args.seed)
        seconds = watch.now() - t0
        paid[label] = {"captures": engine.slots.captures - captures0,
                       "compiled_graphs": compile_stats()["unique_graphs"] - graphs0,
                       "admissions": list(engine.admissions), "prefills": engine.prefills - prefills0,
                       "shared_prefills": engine.shared_prefills - shared0,
                       "phases_s": {k: v - phases0[k] for k, v in engine.phase_s.items()}}
        engine.close()
        return outs, seconds, warm_s

    one_step: dict[str, Any] = {}
    options = {**({"rope_in_attention": True} if args.rope_in_attention else {}),
               **({"merge_in_split": True} if args.merge_in_split else {}),
               **({"decode_steps": args.decode_steps} if args.decode_steps else {})}
    if args.group > 1:  # the same engine computing every prompt: what the shared prefill saves, same run
        outs_u, seconds_u, _ = timed_engine("unshared", share_prompts=False, **options)
        one_step.update(unshared_seconds=seconds_u,
                        unshared_new_tokens_per_s=sum(len(o.token_ids) for o in outs_u) / seconds_u)
        del outs_u
        if device.type == "cuda":  # the shared prefill with each copy reading its prompt from its own slot
            outs_o, seconds_o, _ = timed_engine("own_reads", share_prompts=True, shared_reads=False, **options)
            one_step.update(own_reads_seconds=seconds_o,
                            own_reads_new_tokens_per_s=sum(len(o.token_ids) for o in outs_o) / seconds_o)
            del outs_o
    if args.serial:  # the engine starting each multi-step call only after the host took the last one's tokens
        outs_v, seconds_v, _ = timed_engine("serial", overlap=False, **options,
                                            **({"share_prompts": True} if args.group > 1 else {}))
        one_step.update(serial_seconds=seconds_v,
                        serial_new_tokens_per_s=sum(len(o.token_ids) for o in outs_v) / seconds_v)
        del outs_v
    if args.engine_1step:  # the engine as it was before multi-step decode, fused kernels, split-K attention
        outs_1, seconds_1, _ = timed_engine("engine_1step", decode_steps=1, fuse=False, attention="sdpa")
        one_step.update(engine_1step_seconds=seconds_1,
                        engine_1step_new_tokens_per_s=sum(len(o.token_ids) for o in outs_1) / seconds_1)
        del outs_1
    outs, seconds, warm_s = timed_engine("engine", **options, **({"share_prompts": True} if args.group > 1 else {}))
    seqs = [tuple(p + list(o.token_ids)) for p, o in zip(prompts, outs, strict=True)]
    new_tokens = sum(len(o.token_ids) for o in outs)
    stats = {"seconds": seconds, "sequences": n, "new_tokens": new_tokens, "new_tokens_per_s": new_tokens / seconds,
             "warmup_s": warm_s, "generate_seconds": generate_s,
             "generate_new_tokens_per_s": n * args.response_len / generate_s,
             "engine_vs_generate": generate_s / seconds, "peak_mem_gib": _gib(device, True), **one_step,
             "timed_wave": paid,  # per engine: graphs captured and compiled inside the timed wave, its admissions
             "engine": f"rollout.engine, {str(dtype).removeprefix('torch.')}, {n} requests at once"
                       + (", rotary in the attention kernel" if args.rope_in_attention else "")
                       + (", chunks merged in the split kernel" if args.merge_in_split else "")
                       + (f", {args.decode_steps} decode steps a host look" if args.decode_steps else "")
                       + (f", {args.group} samples a prompt" if args.group > 1 else ""),
             "baseline": f"transformers generate, batch {n}, KV cache, eager"}
    del lm
    _free(device)
    return seqs, plens, stats


# ---------------------------------------------------------------- 1. teacher scoring: LoRA vs copies


def make_adapters(base: torch.nn.Module, args: argparse.Namespace, where: Path) -> dict[str, str]:
    """One saved LoRA adapter per cell, A and B drawn N(0, ``--lora-std``) so every cell is a different teacher."""
    from peft import LoraConfig, get_peft_model

    lcfg = LoraConfig(r=args.lora_rank, lora_alpha=2 * args.lora_rank, target_modules=list(LORA_TARGETS),
                      init_lora_weights=False)
    dirs: dict[str, str] = {}
    for k, cell in enumerate(CELLS):
        pm = get_peft_model(base, lcfg)
        g = torch.Generator().manual_seed(args.seed * 1000 + k)
        with torch.no_grad():
            for name, p in pm.named_parameters():
                if "lora_" in name:
                    p.copy_(torch.randn(p.shape, generator=g) * args.lora_std)
        dirs[cell] = str(where / f"cell{k}")
        pm.save_pretrained(dirs[cell])
        base = pm.unload()
    return dirs


def build_teachers(kind: str, base: torch.nn.Module, adapters: dict[str, str], args: argparse.Namespace,
                   device: torch.device) -> RoutingScorer:
    """``lora*``: the base (a copy) with every adapter in one ``LoRAScorer`` (``LORA_KINDS``); ``copies``: one merged model per cell."""
    from peft import PeftModel

    if kind in LORA_KINDS:
        mode, adapter_dtype = LORA_KINDS[kind]
        lora = LoRAScorer(copy.deepcopy(base).to(device), adapters, batch_tokens=args.batch_tokens, device=device,
                          mode=mode, adapter_dtype=adapter_dtype)
        return RoutingScorer({cell: lora for cell in CELLS})
    scorers = {}
    for cell in CELLS:
        merged = PeftModel.from_pretrained(copy.deepcopy(base), adapters[cell]).merge_and_unload()
        scorers[cell] = HFScorer(merged.to(device), batch_tokens=args.batch_tokens, device=device)
    return RoutingScorer(scorers)


def teacher_scoring(cfg: Qwen2Config, requests: list[ScoreRequest], args: argparse.Namespace,
                    device: torch.device, dtype: torch.dtype, watch: Stopwatch) -> tuple[dict[str, Any], list[ScoreResult]]:
    """Both contenders on the same requests; the LoRA grid's logprobs are returned for the MOPD advantage."""
    base: Any = PolicyModel.from_config(cfg, seed=args.seed + 1).lm
    base = base.to(dtype).eval()
    tokens = sum(len(r.token_ids) for r in requests)
    scored = sum(len(r.positions) for r in requests)
    flops = score_flops(cfg, requests)
    out: dict[str, Any] = {"requests": len(requests), "tokens": tokens, "scored_tokens": scored,
                           "batch_tokens": args.batch_tokens, "lora_rank": args.lora_rank}
    logps: dict[str, list[ScoreResult]] = {}
    with tempfile.TemporaryDirectory(prefix="bench_mopd_adapters_") as tmp:
        adapters = make_adapters(base, args, Path(tmp))
        for kind in ("copies", *LORA_KINDS):
            _free(device)
            scorer = build_teachers(kind, base, adapters, args, device)
            weights = _gib(device, False)
            scorer.score(requests)  # warm-up
            t0 = watch.now()
            for _ in range(args.score_reps):
                logps[kind] = scorer.score(requests)
            seconds = watch.now() - t0
            out[kind] = {"passes": args.score_reps, "seconds": seconds, "pass_s": seconds / args.score_reps,
                         "tokens_per_s": tokens * args.score_reps / seconds,
                         "scored_per_s": scored * args.score_reps / seconds,
                         "mfu": mfu(flops * args.score_reps, seconds, args.peak_tflops),
                         "weights_gib": weights, "peak_mem_gib": _gib(device, True),
                         "backends": len({id(s) for s in scorer.scorers.values()})}
            if kind == "copies":  # what two different teachers disagree by: each request scored by the next cell's
                shifted = [ScoreRequest(CELLS[(CELLS.index(r.cell) + 1) % len(CELLS)], r.token_ids, r.positions,
                                        r.sample_id) for r in requests]
                other = scorer.score(shifted)
            del scorer
    del base
    _free(device)
    diffs = {kind: _abs_diffs(logps[kind], logps["copies"]) for kind in LORA_KINDS}
    cells = _abs_diffs(logps["copies"], other)
    agree = {f"{kind}_vs_copies_mean": sum(d) / len(d) for kind, d in diffs.items()}
    agree |= {"lora_vs_copies_max": max(diffs["lora"]), "between_cells_mean": sum(cells) / len(cells)}
    agree["ok"] = agree["lora_vs_copies_mean"] < AGREE_FRACTION * agree["between_cells_mean"]
    out["agreement"] = agree
    out["flops_per_pass"] = flops
    out["ratio"] = {"tokens_per_s": out["lora"]["tokens_per_s"] / out["copies"]["tokens_per_s"]}
    if device.type == "cuda":
        out["ratio"] |= {"weights_mem": out["lora"]["weights_gib"] / out["copies"]["weights_gib"],
                         "peak_mem": out["lora"]["peak_mem_gib"] / out["copies"]["peak_mem_gib"]}
    return out, logps["lora"]


def _abs_diffs(xs: Sequence[ScoreResult], ys: Sequence[ScoreResult]) -> list[float]:
    """|a - b| for every scored position of two scorers' results on the same requests."""
    return [abs(a - b) for x, y in zip(xs, ys) for a, b in zip(x.logprobs, y.logprobs)]


# ---------------------------------------------------------------- 2. learner steps: RL vs MOPD


def _at_positions(values: Sequence[float], positions: Sequence[int], length: int) -> tuple[float, ...]:
    out = [0.0] * length
    for p, v in zip(positions, values):
        out[p] = float(v)
    return tuple(out)


def learner_steps(cfg: Qwen2Config, requests: list[ScoreRequest], teacher: list[ScoreResult],
                  args: argparse.Namespace, device: torch.device, watch: Stopwatch) -> dict[str, Any]:
    """RL and MOPD steps interleaved on one trainer, the same items but for the advantage (module docstring, 2)."""
    bf16 = device.type == "cuda"
    student = PolicyModel.from_config(cfg, seed=args.seed, attn_implementation=args.attn).to(device)
    trainer = Trainer(student, LossConfig.dapo(), packed_config(args, bf16))

    def student_scorer(autocast: bool = False) -> HFScorer:  # as MOPDAdvantages.student_scorer, built anew each step
        return HFScorer(student.lm, batch_tokens=args.batch_tokens, device=device,
                        autocast=torch.bfloat16 if autocast else None)

    seqs = [r.token_ids for r in requests]
    masks = [(0,) * r.positions[0] + (1,) * len(r.positions) for r in requests]  # the response: the sample's end
    # the rollout logprobs (mu): the student's own at its initial weights, 0 on the prompt
    initial = student_scorer().score(requests)
    mu = [_at_positions(res.logprobs, r.positions, len(r.token_ids)) for r, res in zip(requests, initial)]
    rewards = [[float((i + g) % 2) for i in range(args.per_cell)] for g in range(len(CELLS))]
    adv = [a for group in group_advantages(rewards, AdvantageConfig()) for a in group]
    rl_items = [TrainItem(s, m_lp, m, a, str(i)) for i, (s, m_lp, m, a) in enumerate(zip(seqs, mu, masks, adv))]
    lengths = [len(s) for s in seqs]
    tflops = train_flops(cfg, lengths)
    sflops = score_flops(cfg, requests)

    def rl() -> list[float]:
        t0 = watch.now()
        trainer.step(rl_items)
        return [watch.now() - t0]

    def mopd(autocast: bool) -> list[float]:
        t0 = watch.now()
        student_lp = student_scorer(autocast).score(requests)
        t1 = watch.now()
        items = [TrainItem(r.token_ids, m_lp, m, token_advantages(tr.logprobs, st.logprobs, r.positions,
                                                                   len(r.token_ids), CLIP), r.sample_id)
                 for r, m_lp, m, tr, st in zip(requests, mu, masks, teacher, student_lp)]
        t2 = watch.now()
        trainer.step(items)
        return [t1 - t0, t2 - t1, watch.now() - t2]

    kinds: dict[str, Callable[[], list[float]]] = {"rl": rl, "mopd": lambda: mopd(False), "mopd_bf16": lambda: mopd(True)}
    times: dict[str, list[list[float]]] = {k: [] for k in kinds}
    for step in range(args.warmup + args.steps):
        for kind, fn in kinds.items():
            t = fn()
            if step >= args.warmup:
                times[kind].append(t)
            if args.verbose:
                what = "warm-up" if step < args.warmup else "timed"
                print(f"  {what} step {step} {kind}: {sum(t):.3f} s ({' + '.join(f'{x:.3f}' for x in t)})", flush=True)
    out: dict[str, Any] = {"steps": args.steps, "warmup": args.warmup, "tokens": sum(lengths),
                           "loss_tokens": sum(len(r.positions) for r in requests), "train_flops": tflops,
                           "score_flops": sflops, "peak_mem_gib": _gib(device, True)}
    rl_s = sum(t[0] for t in times["rl"]) / args.steps
    out["rl"] = {"step_s": rl_s, "tokens_per_s": sum(lengths) / rl_s, "mfu": mfu(tflops, rl_s, args.peak_tflops)}
    for kind in ("mopd", "mopd_bf16"):
        score_s, adv_s, train_s = (sum(t[j] for t in times[kind]) / args.steps for j in range(3))
        step_s = score_s + adv_s + train_s
        row = {"score_s": score_s, "advantages_s": adv_s, "train_s": train_s, "step_s": step_s,
               "tokens_per_s": sum(lengths) / step_s,
               "mfu_forward_counted": mfu(tflops + sflops, step_s, args.peak_tflops),
               "mfu_forward_not_counted": mfu(tflops, step_s, args.peak_tflops),
               "mfu_train_only": mfu(tflops, train_s, args.peak_tflops)}
        row["points_vs_rl"] = {k.removeprefix("mfu_"): 100 * (row[k] - out["rl"]["mfu"])
                               for k in ("mfu_forward_counted", "mfu_forward_not_counted", "mfu_train_only")}
        row["within_goal"] = abs(row["points_vs_rl"]["forward_counted"]) <= GOAL_POINTS
        out[kind] = row
    if args.compile:
        out["compile"] = compile_stats()
    del trainer, student
    _free(device)
    return out


# ---------------------------------------------------------------- the run


def run(args: argparse.Namespace, clock: Clock = time.perf_counter,
        done: Callable[[str, dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """All three measurements; ``done(phase, result)`` after each one (main writes it out: a killed run keeps it)."""
    try:
        import peft
    except ImportError as exc:
        raise SystemExit(f"benches.distill_gpu: the teacher contenders need peft, which could not be imported "
                         f"({type(exc).__name__}: {exc}); install it (e.g. pip install --no-index --no-deps "
                         "--target /tmp/site .whl/peft-*.whl .whl/accelerate-*.whl) and retry") from exc
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    cfg = model_config(args.shape == "tiny")
    watch = Stopwatch(device, clock)
    _free(device)

    report = done or (lambda phase, result: None)
    seqs, plens, roll = rollout(cfg, args, device, dtype, watch)
    report("rollout", roll)
    requests = [ScoreRequest(CELLS[i // args.per_cell], s, tuple(range(p, len(s))), str(i))
                for i, (s, p) in enumerate(zip(seqs, plens))]
    scoring, teacher = teacher_scoring(cfg, requests, args, device, dtype, watch)
    report("teacher_scoring", scoring)
    learn = learner_steps(cfg, requests, teacher, args, device, watch)
    report("learner", learn)

    mopd = learn["mopd_bf16" if device.type == "cuda" else "mopd"]  # the scoring forward distill.loop runs on this device
    phases = {"rollout": roll["seconds"], "teacher_prefill": scoring["lora"]["pass_s"],
              "student_scoring": mopd["score_s"], "training": mopd["advantages_s"] + mopd["train_s"]}
    total = sum(phases.values())
    rl_total = roll["seconds"] + learn["rl"]["step_s"]
    before = total - roll["seconds"] + roll["generate_seconds"]  # the same iteration with generate's rollout
    rl_before = roll["generate_seconds"] + learn["rl"]["step_s"]
    if "engine_1step_seconds" in roll:  # the same iteration with the one-step engine's rollout
        one = roll["engine_1step_seconds"]
        shares_1step = {"rollout_share_1step": one / (total - roll["seconds"] + one),
                        "rl_rollout_share_1step": one / (one + learn["rl"]["step_s"])}
    else:
        shares_1step = {}
    # the same iteration with another engine's rollout: every prompt computed, Engine(overlap=False), each copy
    # reading its prompt from its own slot
    for tag in ("unshared", "serial", "own_reads"):
        if f"{tag}_seconds" in roll:
            other = roll[f"{tag}_seconds"]
            shares_1step.update({f"rollout_share_{tag}": other / (total - roll["seconds"] + other),
                                 f"rl_rollout_share_{tag}": other / (other + learn["rl"]["step_s"])})
    iteration = {"phases_s": phases, "total_s": total, "share": {k: v / total for k, v in phases.items()}, **shares_1step,
                 "rollout_share_with_generate": roll["generate_seconds"] / before,
                 "rl_rollout_share": roll["seconds"] / rl_total, "rl_rollout_share_with_generate": roll["generate_seconds"] / rl_before,
                 "teacher_prefill_copies_s": scoring["copies"]["pass_s"], "rl_iteration_s": rl_total,
                 "vs_rl_iteration": total / rl_total}
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "shape": args.shape, "matmul_params": matmul_params(cfg), "peak_tflops": args.peak_tflops,
        "teacher_dtype": str(dtype).removeprefix("torch."), "compile": args.compile, "attn": args.attn,
        "torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__,
        "workload": {"cells": list(CELLS), "per_cell": args.per_cell, "group": args.group, "sequences": len(seqs),
                     "prompt_len_mean": sum(plens) / len(plens), "response_len": args.response_len,
                     "tokens": sum(len(s) for s in seqs), "scored_tokens": sum(len(r.positions) for r in requests),
                     "lengths": [len(s) for s in seqs]},
        "rollout": roll, "teacher_scoring": scoring, "learner": learn, "iteration": iteration,
    }


def tables(r: dict[str, Any]) -> list[Any]:
    """One ``rich`` table per measurement, each with its same-run baseline and the ratio to it."""
    from rich.table import Table

    def gib(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    def pct(x: float) -> str:  # tiny models on a CPU reach 1e-6 of a GPU's peak: show them anyway
        return f"{100 * x:.1f}%" if 100 * x >= 0.1 else f"{100 * x:.2g}%"

    w = r["workload"]
    head = (f"{r['shape']} on {r['device']}: {w['sequences']} samples = {len(w['cells'])} cells x {w['per_cell']}, "
            f"prompt ~{w['prompt_len_mean']:.0f} + {w['response_len']} sampled tokens")
    s = r["teacher_scoring"]
    t1 = Table(title=f"1. teacher scoring ({r['teacher_dtype']}, {s['tokens']} tokens, {s['scored_tokens']} scored "
                     f"a pass) -- {head}")
    for col in ("teachers", "tokens/s", "scored/s", "s/pass", "MFU", "weights GiB", "peak GiB", "tokens/s vs copies",
                "peak vs copies"):
        t1.add_column(col, justify="left" if col == "teachers" else "right")
    labels = {"copies": f"9 {r['teacher_dtype']} copies (baseline)",
              "lora": f"1 base + 9 LoRA r{s['lora_rank']}: merged per cell (LoRAScorer default)",
              "lora_peft": f"1 base + 9 LoRA r{s['lora_rank']}: peft forward, adapters {r['teacher_dtype']}",
              "lora_peft_fp32": f"1 base + 9 LoRA r{s['lora_rank']}: peft forward, adapters float32 (peft's load)"}
    for kind, label in ((k, v) for k, v in labels.items() if k in s):
        x = s[kind]
        base = s["copies"]
        mem = "-" if x["peak_mem_gib"] is None else f"{x['peak_mem_gib'] / base['peak_mem_gib']:.3f}x"
        t1.add_row(label, f"{x['tokens_per_s']:,.0f}", f"{x['scored_per_s']:,.0f}", f"{x['pass_s']:.3f}",
                   pct(x["mfu"]), gib(x["weights_gib"]), gib(x["peak_mem_gib"]),
                   f"{x['tokens_per_s'] / base['tokens_per_s']:.3f}x", mem)
    a = s["agreement"]
    t1.caption = (f"same teachers: |lora - copies| mean {a['lora_vs_copies_mean']:.2e} (max {a['lora_vs_copies_max']:.2e})"
                  f" vs two cells {a['between_cells_mean']:.2e}: {'ok' if a['ok'] else 'FAIL'}")

    learn = r["learner"]
    t2 = Table(title=f"2. learner step MFU ({learn['tokens']} tokens, {learn['loss_tokens']} trained; compile "
                     f"{'on' if r['compile'] else 'off'}, attn {r['attn']}; peak {r['peak_tflops']} TFLOP/s)")
    for col in ("step", "s/step", "score s", "adv s", "train s", "MFU fwd counted", "MFU fwd not counted", "MFU train only",
                "points vs rl (counted / not / train)", f"within {GOAL_POINTS:g}"):
        t2.add_column(col, justify="left" if col == "step" else "right")
    rl = learn["rl"]
    t2.add_row("rl: GRPO, per sequence (baseline)", f"{rl['step_s']:.3f}", "-", "-", f"{rl['step_s']:.3f}",
               pct(rl["mfu"]), pct(rl["mfu"]), pct(rl["mfu"]), "-", "-")
    for kind, label in (("mopd", "mopd: per token, student fwd as distill.loop (fp32)"),
                        ("mopd_bf16", "mopd: student fwd under bf16 autocast")):
        x = learn[kind]
        p = x["points_vs_rl"]
        t2.add_row(label, f"{x['step_s']:.3f}", f"{x['score_s']:.3f}", f"{x['advantages_s']:.3f}", f"{x['train_s']:.3f}",
                   pct(x["mfu_forward_counted"]), pct(x["mfu_forward_not_counted"]),
                   pct(x["mfu_train_only"]),
                   f"{p['forward_counted']:+.1f} / {p['forward_not_counted']:+.1f} / {p['train_only']:+.1f}",
                   "yes" if x["within_goal"] else "no")

    it = r["iteration"]
    roll = r["rollout"]
    t3 = Table(title=f"3. one MOPD iteration, GPU-seconds (rollout: {roll['engine']}, "
                     f"{roll['new_tokens_per_s']:,.0f} new tokens/s)")
    for col in ("phase", "MOPD s", "share", "RL iteration s (baseline)"):
        t3.add_column(col, justify="left" if col == "phase" else "right")
    rl_phase = {"rollout": roll["seconds"], "training": rl["step_s"]}
    for k, v in it["phases_s"].items():
        t3.add_row(k.replace("_", " "), f"{v:.3f}", f"{100 * it['share'][k]:.1f}%",
                   f"{rl_phase[k]:.3f}" if k in rl_phase else "-")
    t3.add_row("total", f"{it['total_s']:.3f}", "100%", f"{it['rl_iteration_s']:.3f}")
    t3.add_row("rollout share", "", f"{100 * it['share']['rollout']:.1f}%", f"{100 * it['rl_rollout_share']:.1f}%")
    if "rollout_share_1step" in it:
        t3.add_row(f"rollout share with the engine one step a look, unfused, SDPA ({roll['engine_1step_new_tokens_per_s']:,.0f} "
                   "tok/s)", "", f"{100 * it['rollout_share_1step']:.1f}%", f"{100 * it['rl_rollout_share_1step']:.1f}%")
    for tag, what in (("unshared", "every prompt computed, no shared prefill"),
                      ("serial", "each call started after the host took the last (no overlap)"),
                      ("own_reads", "each copy reading its prompt from its own slot")):
        if f"rollout_share_{tag}" in it:
            t3.add_row(f"rollout share with {what} ({roll[f'{tag}_new_tokens_per_s']:,.0f} tok/s)", "",
                       f"{100 * it[f'rollout_share_{tag}']:.1f}%", f"{100 * it[f'rl_rollout_share_{tag}']:.1f}%")
    t3.add_row(f"rollout share with {roll['baseline']} ({roll['generate_new_tokens_per_s']:,.0f} tok/s)", "",
               f"{100 * it['rollout_share_with_generate']:.1f}%", f"{100 * it['rl_rollout_share_with_generate']:.1f}%")
    t3.caption = (f"MOPD / RL iteration {it['vs_rl_iteration']:.2f}x; engine rollout {roll['engine_vs_generate']:.2f}x "
                  f"faster than generate; teacher prefill with the 9 copies instead: {it['teacher_prefill_copies_s']:.3f} s")
    return [t1, t2, t3]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benches.distill_gpu", description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--shape", choices=("qwen2-0.5b", "tiny"), default="qwen2-0.5b")
    p.add_argument("--tiny", action="store_true", help="--shape tiny and tiny sizes: runs on a CPU in seconds")
    p.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    p.add_argument("--per-cell", type=int, default=None, help="samples per cell (default 8; tiny 2)")
    p.add_argument("--prompt-len", type=int, default=None, help="mean prompt tokens, +-50%% (default 1024; tiny 24)")
    p.add_argument("--response-len", type=int, default=None, help="sampled tokens per sample (default 512; tiny 12)")
    p.add_argument("--batch-tokens", type=int, default=16384, help="padded tokens per scoring forward (the grid's default)")
    p.add_argument("--lora-rank", type=int, default=16)
    p.add_argument("--lora-std", type=float, default=0.03, help="std of the random LoRA A and B entries")
    p.add_argument("--score-reps", type=int, default=None, help="timed passes per teacher contender (default 3; tiny 2)")
    p.add_argument("--steps", type=int, default=None, help="timed learner steps of each kind (default 3; tiny 1)")
    p.add_argument("--warmup", type=int, default=None, help="untimed learner steps of each kind first (default 2; tiny 1)")
    p.add_argument("--attn", default=None, help=f"the learner's attention (default {VARLEN_ATTENTION} on CUDA, else sdpa)")
    p.add_argument("--seq-tokens", type=int, default=None, help="tokens per packed row (default 4096; tiny 128)")
    p.add_argument("--rows", type=int, default=None, help="packed rows per micro-batch (default 8; tiny 2)")
    p.add_argument("--logprob-chunk", type=int, default=None, help="0 = full logits (default 8192; tiny 64)")
    p.add_argument("--keep-logits", action=argparse.BooleanOptionalAction, default=None, help="default: on CUDA")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None, help="default: on CUDA")
    p.add_argument("--fused-adamw", action=argparse.BooleanOptionalAction, default=None, help="default: on CUDA")
    p.add_argument("--peak-tflops", type=float, default=H200_BF16_TFLOPS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--verbose", action="store_true", help="print every learner step's time")
    p.add_argument("--skip-generate", action="store_true",
                   help="skip the HF generate baseline of the rollout (~50 s on the H200; its shares read nan)")
    p.add_argument("--engine-1step", action="store_true",
                   help="also time the rollout with the engine one decode step per host look, unfused, SDPA (the old engine)")
    p.add_argument("--rope-in-attention", action="store_true",
                   help="the engine's split-K kernels apply the rotary embedding (Engine(rope_in_attention=True))")
    p.add_argument("--merge-in-split", action="store_true",
                   help="the engine's split kernel merges the chunks, no merge kernel (Engine(merge_in_split=True))")
    p.add_argument("--decode-steps", type=int, default=None, help="the engine's decode_steps (default: its own)")
    p.add_argument("--group", type=int, default=1,
                   help="samples a prompt, in a row (GRPO's group; default 1: every sample its own prompt); > 1 also "
                        "times the rollout with the engine's shared prefill off and, on CUDA, with each copy reading "
                        "its prompt from its own slot (shared_reads=False), same run")
    p.add_argument("--warm-waves", type=int, default=2, help="untimed rollout waves before the timed one (default 2)")
    p.add_argument("--serial", action="store_true",
                   help="also time the rollout with Engine(overlap=False) (no call started ahead of the host), same run")
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    args = p.parse_args(argv)
    if args.tiny:
        args.shape = "tiny"
    tiny = args.shape == "tiny"
    defaults = ({"per_cell": 2, "prompt_len": 24, "response_len": 12, "score_reps": 2, "steps": 1, "warmup": 1,
                 "seq_tokens": 128, "rows": 2, "logprob_chunk": 64} if tiny else
                {"per_cell": 8, "prompt_len": 1024, "response_len": 512, "score_reps": 3, "steps": 3, "warmup": 2,
                 "seq_tokens": 4096, "rows": 8, "logprob_chunk": 8192})
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    args.pad_to_multiple = args.seq_tokens  # one row shape, as benches.learner_gpu
    on_gpu = (args.device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")
    for k in ("keep_logits", "compile", "fused_adamw"):
        if getattr(args, k) is None:
            setattr(args, k, on_gpu)
    if args.attn is None:
        args.attn = VARLEN_ATTENTION if on_gpu else "sdpa"
    for k in ("per_cell", "prompt_len", "response_len", "score_reps", "steps", "batch_tokens", "lora_rank", "group"):
        if getattr(args, k) < 1:
            p.error(f"--{k.replace('_', '-')}: expected >= 1, got {getattr(args, k)}")
    return args


def main(argv: Sequence[str] | None = None, clock: Clock = time.perf_counter) -> int:
    args = parse_args(argv)
    partial: dict[str, Any] = {"partial": True}

    def done(phase: str, result: dict[str, Any]) -> None:
        """Each phase's numbers as soon as they exist: on the lent GPU a run cut off at its time limit keeps them."""
        partial[phase] = result
        print(f"{phase}: {json.dumps(result, default=str)}", flush=True)
        if args.json is not None:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(partial, indent=2, default=str))

    result = run(args, clock, done)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    try:
        from rich.console import Console
    except ImportError:  # the device may lack rich: the JSON, readable
        print(json.dumps(result, indent=2))
    else:
        console = Console(width=200)
        for t in tables(result):
            console.print(t)
    return 0 if result["teacher_scoring"]["agreement"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
