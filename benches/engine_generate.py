"""Generation throughput at 72 and 256 concurrent turns: today's episode path vs plain ``generate`` vs the engine.

    python -m benches.engine_generate                      # CPU, tiny model, CI-sized (about a minute on 2 cores)
    python -m benches.engine_generate --h200 --json runs/bench_engine_generate.json   # Qwen2-0.5B shape, bf16, CUDA

Three contenders on the same model and the same random prompts, in one run:

- ``episode``: ``HFPolicy(engine=False).generate``, what every episode called before the engine: one
  sequence per turn, turns of concurrent episodes in ``asyncio.to_thread`` threads (they do not batch, so
  its tokens/s does not grow with concurrency: it is measured on ``--legacy-turns`` of the turns with
  ``--legacy-new`` new tokens each, to keep the run short).
- ``generate``: plain batched ``model.generate`` (left padding, DynamicCache, sampling at temperature 1,
  EOS off), all turns in one batch, ``--baseline-new`` new tokens (fewer than ``--new`` on the H200, which
  flatters it: its step time grows with the context).
- ``engine``: ``rollout.engine.Engine``, the turns submitted at once as requests (``submit_many``; temperature 1, own seeds,
  no stop tokens), ``--new`` new tokens each; prefill included, warm-up (``--warm-waves`` full waves of the same turns,
  2 by default: CUDA graph capture, compiles) excluded; the phase table shows how the timed wave was admitted and
  what it still captured or compiled. ``--decode-steps`` / ``--fuse`` / ``--attention`` / ``--pack`` /
  ``--rope-in-attention`` / ``--merge-in-split`` set its options (default: the engine's).
- ``engine_unshared`` (``--group G`` > 1: the turns come ``G`` to a prompt, as a GRPO group's first turns do): the
  same engine with its shared prefill off (``share_prompts=False``: every turn's prompt computed), same run; the
  phase table shows the prefill seconds and the copies (``shared``) of each.
- ``engine_own_reads`` (``--group G`` > 1 with the split-K attention): the engine with its shared prefill but each
  copy's decode steps reading the prompt from its own slot (``shared_reads=False``), same run: what reading a
  group's prompt from one slot saves.
- ``engine_serial`` (``--serial``): the same engine without overlap, each multi-step call started only after the
  host took the last one's tokens (``Engine(overlap=False)``; the engine overlaps them by default on CUDA), same run.
- ``engine_1step`` (``--compare``): the same engine one decode step per host look, without the fused
  kernels, with SDPA attention and the torch sampler (``decode_steps=1, fuse=False, attention="sdpa",
  sampler="torch"``: the engine as it was before multi-step decoding), same run.

``--parts`` (CUDA) times the pieces of a step at every concurrency with CUDA events: a graph replay of one
decode step, ``sample_rows`` and ``sample_fused`` on its logits, one step of an 8-step ``decode_sample``
replay, for the modules with SDPA, the fused kernels with SDPA, the fused kernels with the split-K attention
(these three with the torch sampler) and all of it with the fused sampler (``fused_all``; ``fused_all_shared``:
the same with the rows in groups of ``--group`` reading a prompt-long prefix from the group's first slot), and
counts the kernels of one eager step (``torch.profiler``).

Tokens/s counts new tokens only. ``roofline`` (CUDA): the decode roofline of bf16 weights + each
step's KV read once at ``--hbm-tbs`` TB/s, averaged over the wave, and the engine's share of it.
The ratios are the result (the machines are noisy); dev/LOG.md has the readings.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import time
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table
from transformers import AutoModelForCausalLM, Qwen2Config

from benches.learner_gpu import compile_stats
from rollout.engine import Engine, EngineRequest
from rollout.policy.hf import HFPolicy
from rollout.policy.models import tiny_config
from rollout.policy.types import Prompt, SamplingParams
from rollout.tokenizer import build_tokenizer

console = Console(width=150)
GOALS = {"episode_72": 250.0, "generate_72": 7.0, "tokens_256": 10_000.0}  # issue 27, on the H200


def model_config(h200: bool, tok: Any) -> Qwen2Config:
    if not h200:
        return tiny_config(tok, hidden_size=64, num_layers=2)
    return Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                       num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768,
                       rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0}, tie_word_embeddings=True)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def prompts(n: int, lo: int, hi: int, vocab: int, seed: int, group: int = 1) -> list[list[int]]:
    """``n`` random prompts; with ``group`` > 1, ``ceil(n / group)`` of them, each ``group`` times in a row."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi + 1, (-(-n // group),), generator=g).tolist()
    return [p for p in (torch.randint(0, vocab, (k,), generator=g).tolist() for k in lens) for _ in range(group)][:n]


def run_episode_path(policy: HFPolicy, ps: list[list[int]], new: int, device: torch.device) -> dict[str, Any]:
    async def main() -> list[Any]:
        s = SamplingParams(temperature=1.0, max_new_tokens=new)
        return await asyncio.gather(*(policy.generate(Prompt(token_ids=p), SamplingParams(**{**s.__dict__, "seed": i}))
                                      for i, p in enumerate(ps)))

    t0 = time.perf_counter()
    out = asyncio.run(main())
    _sync(device)
    seconds = time.perf_counter() - t0
    tokens = sum(len(g.token_ids) for g in out)
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds, "turns": len(ps), "new": new}


def run_generate(model: Any, ps: list[list[int]], new: int, device: torch.device) -> dict[str, Any]:
    width = max(len(p) for p in ps)
    ids = torch.zeros((len(ps), width), dtype=torch.long)
    attn = torch.zeros_like(ids)
    for i, p in enumerate(ps):
        ids[i, width - len(p):] = torch.tensor(p)
        attn[i, width - len(p):] = 1
    ids, attn = ids.to(device), attn.to(device)

    def go(k: int) -> torch.Tensor:
        with torch.inference_mode():
            return model.generate(input_ids=ids, attention_mask=attn, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                  max_new_tokens=k, min_new_tokens=k, pad_token_id=0)

    go(2)  # warm-up
    _sync(device)
    t0 = time.perf_counter()
    out = go(new)
    _sync(device)
    seconds = time.perf_counter() - t0
    tokens = (out.shape[1] - width) * len(ps)
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds, "turns": len(ps), "new": new}


def _sizes(sizes: list[int]) -> str:
    """A wave's admission sizes, short: ``72`` or ``1+71`` (``+…`` past six)."""
    return "+".join(map(str, sizes[:6])) + ("+…" if len(sizes) > 6 else "") if sizes else "-"


def run_engine(engine: Engine, ps: list[list[int]], new: int, device: torch.device, warm_waves: int = 2) -> dict[str, Any]:
    def wave(seed: int) -> tuple[float, int, int, dict[str, float], int, int]:
        steps0, phases0, prefills0, shared0 = engine.steps, dict(engine.phase_s), engine.prefills, engine.shared_prefills
        t0 = time.perf_counter()
        futs = engine.submit_many([EngineRequest(prompt_ids=p, max_new_tokens=new, temperature=1.0, seed=seed + i)
                                   for i, p in enumerate(ps)])  # one burst: admitted together
        outs = [f.result() for f in futs]
        _sync(device)
        phases = {k: v - phases0[k] for k, v in engine.phase_s.items()}
        return (time.perf_counter() - t0, sum(len(o.token_ids) for o in outs), engine.steps - steps0, phases,
                engine.prefills - prefills0, engine.shared_prefills - shared0)

    # graph capture for every (batch, length) bucket the waves meet; a burst's admissions can split differently from
    # one wave to the next, so more than one wave
    warm_s = sum(wave(10_000 + 1_000 * w)[0] for w in range(warm_waves))
    captures0, graphs0 = engine.slots.captures, compile_stats()["unique_graphs"]
    engine.admissions.clear()
    seconds, tokens, steps, phases, calls, shared = wave(0)
    # where the engine thread's wall went in the timed wave: prefill, waiting on decode calls, host work (and idle)
    phases["idle"] = max(seconds - sum(phases.values()), 0.0)
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds, "turns": len(ps), "new": new,
            "steps": steps, "ms_per_step": 1000 * seconds / max(steps, 1), "warmup_s": warm_s, "phases_s": phases,
            "prefill_calls": calls, "shared_prefills": shared,
            # paid inside the timed wave: graph captures, torch.compile graphs, and how the burst was admitted
            "captures": engine.slots.captures - captures0, "compiled_graphs": compile_stats()["unique_graphs"] - graphs0,
            "admissions": list(engine.admissions)}


def step_parts(model: Any, n: int, length: int, device: torch.device, repeats: int = 20, group: int = 1,
               new: int = 512) -> dict[str, Any]:
    """Milliseconds of the pieces of one decode step at ``n`` rows attending over ``length`` (CUDA events)."""
    from rollout.engine_model import SlotModel
    from rollout.engine_sampling import fused_available, sample_fused, sample_rows

    def timed(fn: Any) -> float:
        fn()
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            fn()
        end.record()
        torch.cuda.synchronize(device)
        return float(start.elapsed_time(end)) / repeats

    out: dict[str, Any] = {"rows": n, "length": length}
    tokens, pos = [1] * n, [length - 16 - (i % 64) for i in range(n)]
    temp, top_p = [1.0] * n, [1.0] * n
    variants = [("modules", False, "sdpa", "torch"), ("fused", True, "sdpa", "torch"),
                ("fused_triton", True, "triton", "torch")]
    if fused_available(device):
        variants.append(("fused_all", True, "triton", "triton"))
        if group > 1:
            variants.append(("fused_all_shared", True, "triton", "triton"))
    for tag, fuse, attention, sampler in variants:
        sm = SlotModel(model, slots=n, length=length, graphs=True, fuse=fuse, attention=attention, sampler=sampler)
        if tag.endswith("_shared"):  # each group's rows read their first ``length - new - 80`` positions from one slot
            for first in range(0, n, group):
                sm.copy_prefix(first, list(range(first + 1, min(first + group, n))), length - new - 80)
        logits = sm.decode(tokens, pos, n, length)
        out[f"decode_graph_ms_{tag}"] = timed(lambda: sm.decode(tokens, pos, n, length))
        one = torch.ones(n, device=device)
        u = torch.rand(n, dtype=torch.float64, device=device)
        out[f"sample_rows_ms_{tag}"] = timed(lambda: sample_rows(logits, one, one, u))
        if sampler == "triton":
            raw = logits.to(model.dtype)  # what the step hands the kernels: the model's dtype
            out[f"sample_fused_ms_{tag}"] = timed(lambda: sample_fused(raw, one, u))
        u_KN = [[0.5] * n for _ in range(8)]
        out[f"decode_sample8_ms_per_step_{tag}"] = timed(
            lambda: sm.decode_sample(tokens, [p - 8 for p in pos], n, length, 8, temp, top_p, u_KN)) / 8
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            with torch.inference_mode():
                sm._decode_body(n, length)
            torch.cuda.synchronize(device)
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        out[f"kernels_per_step_{tag}"] = len(kernels)
        out[f"kernel_ms_{tag}"] = sum(e.time_range.elapsed_us() for e in kernels) / 1000
        top: dict[str, float] = {}
        for e in kernels:
            top[e.name[:60]] = top.get(e.name[:60], 0.0) + e.time_range.elapsed_us() / 1000
        out[f"top_kernels_{tag}"] = sorted(top.items(), key=lambda kv: -kv[1])[:8]
        sm.release()
        del sm
        torch.cuda.empty_cache()
    return out


def weight_sync(engine: Engine, model: Any, device: torch.device, repeats: int = 3) -> dict[str, float]:
    """Seconds for an in-process weight update (``copy_`` of a full state dict already on the device), both modes."""
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    out: dict[str, float] = {}
    for mode in ("wait", "keep"):
        times = []
        for _ in range(repeats):
            _sync(device)
            t0 = time.perf_counter()
            engine.update_weights(state, engine.version + 1, mode=mode)  # type: ignore[arg-type]
            _sync(device)
            times.append(time.perf_counter() - t0)
        out[mode] = sorted(times)[len(times) // 2]
    out["bytes"] = float(sum(v.numel() * v.element_size() for v in state.values()))
    return out


def roofline(cfg: Qwen2Config, ps: list[list[int]], new: int, dtype_bytes: int, tbs: float) -> float:
    """New tokens/s if every decode step only read the weights and the live KV once at ``tbs`` TB/s."""
    hidden, heads, kv_heads, layers, inter, vocab = (int(x or 0) for x in (
        cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.num_hidden_layers, cfg.intermediate_size,
        cfg.vocab_size))
    head_dim = hidden // heads
    params = vocab * hidden + layers * (hidden * head_dim * (heads + kv_heads) * 2 + 3 * hidden * inter)
    kv_per_token = layers * 2 * kv_heads * head_dim * dtype_bytes
    total_s = 0.0
    for t in range(new):
        kv = sum(len(p) + t for p in ps) * kv_per_token
        total_s += (params * dtype_bytes + kv) / (tbs * 1e12)
    return len(ps) * new / total_s


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--h200", action="store_true", help="Qwen2-0.5B shape, bf16, CUDA; prompts 512-1536, 512 new tokens")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[72, 256])
    ap.add_argument("--prompt-min", type=int)
    ap.add_argument("--prompt-max", type=int)
    ap.add_argument("--new", type=int)
    ap.add_argument("--baseline-new", type=int, help="new tokens for the generate contender (default: --new; H200: 128)")
    ap.add_argument("--legacy-turns", type=int, help="turns the episode path is measured on (default 24; H200: 8)")
    ap.add_argument("--legacy-new", type=int, help="new tokens per episode-path turn (default: --new; H200: 32)")
    ap.add_argument("--skip", nargs="*", default=[], choices=["episode", "generate"])
    ap.add_argument("--decode-steps", type=int, help="the engine's decode_steps (default: its own, 8 on CUDA)")
    ap.add_argument("--fuse", action=argparse.BooleanOptionalAction, default=None, help="the engine's fuse (default: on CUDA)")
    ap.add_argument("--attention", choices=["sdpa", "triton"], help="the engine's decode attention (default: its own)")
    ap.add_argument("--sampler", choices=["torch", "triton"], help="the engine's multi-step sampler (default: its own)")
    ap.add_argument("--rope-in-attention", action="store_true",
                    help="the split-K kernels apply the rotary embedding (Engine(rope_in_attention=True); off by default)")
    ap.add_argument("--merge-in-split", action="store_true",
                    help="the split kernel's last chunk merges the chunks (Engine(merge_in_split=True); off by default)")
    ap.add_argument("--pack", action=argparse.BooleanOptionalAction, default=None,
                    help="the engine's packed q/k/v and gate/up GEMMs (default: on CUDA)")
    ap.add_argument("--group", type=int, default=1,
                    help="turns per prompt (a GRPO group's first turns): the engine against itself with its shared "
                         "prefill off (engine_unshared), same run")
    ap.add_argument("--warm-waves", type=int, default=2, help="untimed waves before the timed one (default 2)")
    ap.add_argument("--compare", action="store_true", help="also the engine one step at a time, unfused (engine_1step)")
    ap.add_argument("--serial", action="store_true",
                    help="also the engine with Engine(overlap=False) (engine_serial), same run")
    ap.add_argument("--parts", action="store_true", help="CUDA: time the pieces of a step (see the module docstring)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads on CPU")
    ap.add_argument("--hbm-tbs", type=float, default=4.8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    h200 = args.h200
    lo = args.prompt_min or (512 if h200 else 16)
    hi = args.prompt_max or (1536 if h200 else 48)
    new = args.new or (512 if h200 else 24)
    base_new = args.baseline_new or (128 if h200 else new)
    legacy_turns = args.legacy_turns or (8 if h200 else 24)
    legacy_new = args.legacy_new or (32 if h200 else new)
    device = torch.device("cuda" if h200 else "cpu")
    dtype = torch.bfloat16 if h200 else torch.float32
    if not h200:
        torch.set_num_threads(args.threads)
    tok = build_tokenizer()
    cfg = model_config(h200, tok)
    torch.manual_seed(args.seed)
    with torch.device("cpu"):
        model: Any = AutoModelForCausalLM.from_config(cfg)
    model = model.to(device=device, dtype=dtype).eval()
    legacy = HFPolicy(model, tok, device=device, engine=False, stop_token_ids=(), name="episode-path")
    if args.group < 1:
        ap.error(f"--group must be >= 1, got {args.group}")
    # --group on CPU: a 50 ms admission window for both engines (CPU has none), so a wave's turns are admitted together
    window = 0.05 if args.group > 1 and device.type == "cpu" else None

    def contender(**options: Any) -> Engine:
        """The engine with the command line's options (and ``options`` over them), its cache reserved."""
        made = Engine(model, **{"max_slots": max(args.concurrency), "max_len": hi + new, "decode_steps": args.decode_steps,
                                "fuse": args.fuse, "admission_window_s": window, "attention": args.attention,
                                "sampler": args.sampler, "pack": args.pack, "rope_in_attention": args.rope_in_attention,
                                "merge_in_split": args.merge_in_split,
                                # on CPU too when the turns share prompts
                                "share_prompts": True if args.group > 1 else None, **options})
        made.reserve(max(args.concurrency), hi + new)
        return made

    engine = contender()
    unshared = contender(share_prompts=False, name="engine-unshared") if args.group > 1 else None
    own_reads = (contender(shared_reads=False, name="engine-own-reads")
                 if args.group > 1 and engine.slots.shared_reads else None)
    serial = contender(overlap=False, name="engine-serial") if args.serial else None
    old = None
    if args.compare:
        old = Engine(model, max_slots=max(args.concurrency), max_len=hi + new, decode_steps=1, fuse=False, attention="sdpa",
                     sampler="torch", name="engine-1step")
        old.reserve(max(args.concurrency), hi + new)
    rows: list[dict[str, Any]] = []
    for n in args.concurrency:
        ps = prompts(n, lo, hi, cfg.vocab_size, args.seed + n, args.group)
        row: dict[str, Any] = {"concurrency": n}
        if "episode" not in args.skip:
            try:
                row["episode"] = run_episode_path(legacy, ps[:legacy_turns], legacy_new, device)
            except Exception as exc:  # noqa: BLE001 - today's path is the baseline; its failure is a reading too
                row["episode_error"] = f"{type(exc).__name__}: {exc}"[:300]
                console.print(f"[red]episode path failed at {n} turns: {row['episode_error']}[/red]")
        if "generate" not in args.skip:
            row["generate"] = run_generate(model, ps, base_new, device)
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        if old is not None:
            row["engine_1step"] = run_engine(old, ps, new, device, args.warm_waves)
        if unshared is not None:
            row["engine_unshared"] = run_engine(unshared, ps, new, device, args.warm_waves)
        if own_reads is not None:
            row["engine_own_reads"] = run_engine(own_reads, ps, new, device, args.warm_waves)
        if serial is not None:
            row["engine_serial"] = run_engine(serial, ps, new, device, args.warm_waves)
        row["engine"] = run_engine(engine, ps, new, device, args.warm_waves)
        if h200:
            row["roofline_tokens_per_s"] = roofline(cfg, ps, new, 2, args.hbm_tbs)
        rows.append(row)
        console.print(f"[dim]{n} turns: " + ", ".join(f"{k} {v['tokens_per_s']:.0f} tok/s" for k, v in row.items()
                                                      if isinstance(v, dict)) + "[/dim]")
        console.print(f"[dim]{json.dumps(row)}[/dim]")
    sync = weight_sync(engine, model, device)
    engine.close()
    for other in (old, unshared, own_reads, serial):
        if other is not None:
            other.close()
    del old, unshared, own_reads, serial
    parts: dict[Any, Any] | None = None
    if args.parts and device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()
        try:
            parts = {n: step_parts(model, n, -(-(hi + new) // 256) * 256, device, group=args.group, new=new)
                     for n in args.concurrency}
        except Exception as exc:  # noqa: BLE001 - a diagnostic: its failure must not lose the run's numbers
            parts = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        console.print(f"[dim]parts: {json.dumps(parts)}[/dim]")
    where = f"{torch.cuda.get_device_name()}, Qwen2-0.5B shape, bf16" if h200 else "CPU, tiny model, fp32"
    table = Table(title=f"generation tokens/s ({where}; "
                        f"prompts {lo}-{hi}, {new} new tokens" + (f", {args.group} turns a prompt" if args.group > 1 else "")
                        + ")")
    for col in ("turns", "episode path", "generate", "engine 1-step", "engine", "engine / episode", "engine / generate",
                "engine / 1-step", "ms / step (1-step)", "roofline share"):
        table.add_column(col, justify="right")
    for row in rows:
        e = row["engine"]["tokens_per_s"]
        ep = row.get("episode", {}).get("tokens_per_s")
        ge = row.get("generate", {}).get("tokens_per_s")
        roof = row.get("roofline_tokens_per_s")
        o = row.get("engine_1step", {})
        oe = o.get("tokens_per_s")
        table.add_row(str(row["concurrency"]), f"{ep:,.0f}" if ep else "-", f"{ge:,.0f}" if ge else "-",
                      f"{oe:,.0f}" if oe else "-", f"{e:,.0f}",
                      f"{e / ep:,.1f}x" if ep else "-", f"{e / ge:,.2f}x" if ge else "-", f"{e / oe:,.2f}x" if oe else "-",
                      f"{row['engine']['ms_per_step']:.2f}" + (f" ({o['ms_per_step']:.2f})" if oe else ""),
                      f"{100 * e / roof:.1f}%" if roof else "-")
    console.print(table)
    phase_table = Table(title="the engine thread's wall in the timed wave, seconds (decode: waiting on decode calls)")
    for col in ("turns", "contender", "wall", "prefill", "decode", "host", "idle", "decode ms / step", "prefills",
                "shared", "admissions", "captures / compiles", "wall / engine's"):
        phase_table.add_column(col, justify="right")
    for row in rows:
        for name in ("engine_1step", "engine_unshared", "engine_own_reads", "engine_serial", "engine"):
            if name in row:
                r, ph = row[name], row[name]["phases_s"]
                phase_table.add_row(str(row["concurrency"]), name, f"{r['seconds']:.3f}",
                                    *(f"{ph[k]:.3f}" for k in ("prefill", "decode", "host", "idle")),
                                    f"{1000 * ph['decode'] / max(r['steps'], 1):.2f}", str(r.get("prefill_calls", "-")),
                                    str(r.get("shared_prefills", "-")), _sizes(r["admissions"]),
                                    f"{r['captures']} / {r['compiled_graphs']}",
                                    f"{r['seconds'] / row['engine']['seconds']:.2f}x")
    console.print(phase_table)
    console.print(f"in-process weight update ({sync['bytes'] / 2**20:,.0f} MiB, copy_ into the engine's model): "
                  f"wait {sync['wait']:.4f} s, keep {sync['keep']:.4f} s (median of 3)")
    if h200:
        by_n = {r["concurrency"]: r for r in rows}
        for n, key, goal, value in (
            (72, "episode_72", GOALS["episode_72"], lambda r: r["engine"]["tokens_per_s"] / r["episode"]["tokens_per_s"]),
            (72, "generate_72", GOALS["generate_72"], lambda r: r["engine"]["tokens_per_s"] / r["generate"]["tokens_per_s"]),
            (256, "tokens_256", GOALS["tokens_256"], lambda r: r["engine"]["tokens_per_s"]),
        ):
            if n in by_n:
                try:
                    v = value(by_n[n])
                    console.print(f"goal {key}: {v:,.1f} (>= {goal:,.0f}) {'met' if v >= goal else 'NOT met'}")
                except KeyError:
                    pass
    result = {"h200": h200, "prompt_min": lo, "prompt_max": hi, "new": new, "baseline_new": base_new,
              "legacy_turns": legacy_turns, "legacy_new": legacy_new, "rows": rows, "weight_sync_s": sync,
              "group": args.group, "decode_steps": args.decode_steps, "fuse": args.fuse, "sampler": args.sampler, "parts": parts,
              "torch": torch.__version__, "device": torch.cuda.get_device_name() if h200 else "cpu"}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
