"""The engine's model side: a Llama-family forward over a slot KV cache, prefill and one-token decode.

Why our own forward rather than ``model(...)`` with a transformers cache: the
decode step must be one fixed-shape computation over every in-flight request
(so a CUDA graph can replay it), with per-slot positions and lengths, written
into a cache allocated once. The layers' own modules (norms, projections, MLP,
rotary embedding) do the arithmetic, so the numbers are the model's; only the
attention over the cache is ours (scaled dot-product over the slot's valid
positions, with the sliding window of ``sliding_attention`` layers).

Cache: per layer ``K``/``V`` of shape ``[slots, kv_heads, length, head_dim]``
in the model's dtype. A request owns one slot; its prompt is written at
positions ``0..P-1`` by ``prefill`` and each decode step writes one position.
Positions past a slot's length hold stale values and are masked out.

Supported: ``model_type`` in ``SUPPORTED`` (Qwen2, Qwen3, Llama, Mistral: RMSNorm,
rotary, grouped-query attention, optional q/k norms). ``supports(model)`` says
whether a model is; others fall back to ``HFPolicy``'s one-sequence path.

**Multi-step decode** (``decode_sample``): ``steps`` decode steps in one call
(one CUDA-graph replay on CUDA), each sampling its next token on the device
(``rollout.engine_sampling.sample_static``, from per-row pre-drawn uniforms)
and feeding it to the next, so the host syncs once per ``steps`` tokens
instead of once per token. The engine applies stops and budgets afterwards.

**Fused pointwise** (``fuse``; on by default on CUDA): a decode step of a
0.5B model at 72 rows is ~1,000 small kernels, and their count, not the bytes
they move, sets its time. With ``fuse`` the RMSNorms (with the residual add
before them), the rotary embedding of q and k, and SiLU-times-up run as one
kernel each (``torch.compile`` of the same formulas on CUDA; the plain
formulas elsewhere), about 15 kernels a layer instead of ~40. The projections
stay the model's modules, so weights copied in place still reach every graph.
Prefill runs the same kernels.

**Packed projections** (``pack``; on by default with ``fuse`` on CUDA): each
layer's q/k/v projections run as one GEMM and gate/up as another (two and one
kernels fewer a layer; at 72 rows a step's time is set by its kernel count).
No weight is copied: the layer's ``q_proj``/``k_proj``/``v_proj`` (and
``gate_proj``/``up_proj``) weights and biases become views of one tensor each,
so ``load_state_dict``, ``state_dict`` and in-place copies work as before and
captured graphs see every update. What changes for the model's owner: its
parameters in those modules are new ``Parameter`` objects (an optimizer built
on the old ones would not reach the engine; the engine's model is the rollout
side's own copy), ``deepcopy`` gives unshared copies, and a raw
``safetensors.torch.save_file`` refuses views of one storage (``save_pretrained``
and ``torch.save`` take them). Moving the model
(``.to``, as ``Engine.sleep`` does) breaks the views; the next call packs again.

**Decode attention** (``attention``; ``"triton"`` by default on CUDA for 16-bit
models): the split-K kernels of ``rollout.engine_attention`` read only each
row's own positions and write the step's key and value themselves; ``"sdpa"``
attends over the whole length bucket with a mask (and a scatter writes k/v).
``rope_in_attention`` (off by default) has the kernel apply the rotary
embedding to q and the new key as well (one kernel a layer fewer; tested on
CPU through Triton's interpreter, but on an H200 it was measured only together
with other changes, in a run 1.85x slower than without them, so it stays
opt-in until it is timed alone: dev/LOG.md). ``merge_in_split`` (off by
default) merges a row's chunks inside the split kernel (the last chunk to
finish, found with an atomic count, merges them): one kernel a layer fewer.
``shared_reads`` (on with the split-K kernels): a slot whose prompt was copied
from another (``copy_prefix``, the engine's shared prefill) reads that prefix
from the slot it was copied from, so a group's rows read one copy (from L2)
rather than eight (from HBM). Every slot still holds its own copy, so when the
source slot's request ends (``vacate``, called by the engine) its readers read
from one of themselves; the SDPA path always reads each slot's own copy.

**Sampling** (``sampler``; ``"triton"`` by default on CUDA): multi-step decode
samples with ``rollout.engine_sampling.sample_fused`` (two kernels reading the
logits once, in the model's dtype) when no row has ``top_p < 1``, else with
``sample_static``; ``"torch"`` always takes ``sample_static``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from rollout import engine_attention
from rollout import engine_sampling
from rollout.engine_sampling import sample_fused, sample_static

SUPPORTED = ("qwen2", "qwen3", "llama", "mistral")
MAX_STEPS = 32  # the most decode steps one ``decode_sample`` call runs


def supports(model: Any) -> bool:
    """Whether ``SlotModel`` can run ``model`` (a ``*ForCausalLM`` of a supported family)."""
    cfg = getattr(model, "config", None)
    inner = getattr(model, "model", None)
    return (
        getattr(cfg, "model_type", None) in SUPPORTED
        and inner is not None
        and all(hasattr(inner, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb"))
        and hasattr(model, "lm_head")
    )


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


# The fused path's formulas: HF's RMSNorm (fp32 statistics, cast, times the weight), rotary and SwiGLU.
def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _add_rms(h: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    h = h + delta
    return h, _rms(h, weight, eps)


def _rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``q`` / ``k``: ``[b, t, heads, d]``; returned as ``[b, heads, t, d]`` with the rotary applied."""
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


def _adjacent(tensors: list[torch.Tensor]) -> torch.Tensor | None:
    """``torch.cat(tensors)`` without a copy when they already lie back to back in one storage, else None."""
    first = tensors[0]
    offset = first.storage_offset()
    for t in tensors:
        if (not t.is_contiguous() or t.dtype != first.dtype or t.shape[1:] != first.shape[1:]
                or t.untyped_storage().data_ptr() != first.untyped_storage().data_ptr() or t.storage_offset() != offset):
            return None
        offset += t.numel()
    rows = sum(t.shape[0] for t in tensors)
    return first.detach().as_strided((rows, *first.shape[1:]), first.stride())


def _fusable(model: Any) -> bool:
    """Whether the fused formulas are this model's: RMSNorms with ``variance_epsilon``, a SiLU gated MLP."""
    layer = model.model.layers[0]
    norms = (layer.input_layernorm, layer.post_attention_layernorm, model.model.norm)
    mlp = layer.mlp
    return (
        all(hasattr(n, "variance_epsilon") and hasattr(n, "weight") for n in norms)
        and all(hasattr(mlp, a) for a in ("gate_proj", "up_proj", "down_proj"))
        and getattr(model.config, "hidden_act", None) == "silu"
    )


class SlotModel:
    """``model``'s forward over a preallocated slot cache; see the module docstring.

    ``prefill(slots, prompts)`` writes each prompt's keys and values into its slot
    and returns the next-token logits of each (fp32, ``[n, V]``);
    ``decode(tokens_B, pos_B, length)`` feeds one token per slot ``0..B-1`` at
    position ``pos_B`` and returns ``[B, V]`` logits. ``graphs=True`` (CUDA only)
    replays the decode step from CUDA graphs captured per (batch, length) bucket;
    weights copied in place (``copy_``) stay valid for captured graphs.
    """

    def __init__(
        self, model: Any, *, slots: int, length: int, graphs: bool = False, fuse: bool | None = None,
        attention: str | None = None, sampler: str | None = None, pack: bool | None = None,
        rope_in_attention: bool = False, merge_in_split: bool = False, shared_reads: bool | None = None,
    ) -> None:
        if not supports(model):
            raise ValueError(f"SlotModel: model_type {getattr(model.config, 'model_type', None)!r} is not one of {SUPPORTED}")
        self.model = model
        inner = model.model
        cfg = model.config
        self.embed, self.layers, self.norm, self.rotary = inner.embed_tokens, inner.layers, inner.norm, inner.rotary_emb
        self.lm_head = model.lm_head
        self.heads = int(cfg.num_attention_heads)
        self.kv_heads = int(getattr(cfg, "num_key_value_heads", None) or self.heads)
        self.groups = self.heads // self.kv_heads
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads)
        self.scale = float(getattr(self.layers[0].self_attn, "scaling", self.head_dim**-0.5))
        types = getattr(cfg, "layer_types", None) or ["full_attention"] * len(self.layers)
        window = getattr(cfg, "sliding_window", None)
        self.windows: list[int | None] = [int(window) if t == "sliding_attention" and window else None for t in types]
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.vocab = int(self.lm_head.weight.shape[0])
        self.graphs = bool(graphs) and self.device.type == "cuda"
        self.fuse = (self.device.type == "cuda" if fuse is None else bool(fuse)) and _fusable(model)
        self.eps = float(getattr(self.layers[0].input_layernorm, "variance_epsilon", 1e-6))
        fns: tuple[Any, ...] = (_rms, _add_rms, _rope, _swiglu)
        if self.fuse and self.device.type == "cuda":
            # Not fullgraph: dynamo keeps one cache per formula for the whole process (every SlotModel, dtype and
            # tensor rank adds a variant); past its recompile limit (8) a formula then runs eagerly instead of
            # raising FailOnRecompileLimitHit mid-decode (a second model in one process did).
            fns = tuple(torch.compile(f, dynamic=True) for f in fns)
        self._rms, self._add_rms, self._rope, self._swiglu = fns
        # opt-in: the split-K kernels apply the rotary embedding themselves (module docstring: not measured alone)
        self.rope_in_attention = bool(rope_in_attention)
        # opt-in: the split-K kernel's last chunk of a (row, kv head) merges the chunks (no merge kernel)
        self.merge_in_split = bool(merge_in_split)
        # packed q/k/v and gate/up GEMMs (module docstring); only on the fused path, whose layer loop uses them
        self.pack = self.fuse and (self.device.type == "cuda" if pack is None else bool(pack))
        self._packed: list[tuple[Any, ...]] = []  # per layer: q/k/v weight, bias; gate/up weight, bias
        self._qkv_sizes = [self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim]
        self._views: list[tuple[Any, str, torch.nn.Parameter, int]] = []  # (module, name, parameter, its data_ptr)
        if attention not in (None, "sdpa", "triton"):
            raise ValueError(f"SlotModel: attention must be 'sdpa' or 'triton', got {attention!r}")
        # decode attention: the split-K kernels (``rollout.engine_attention``) by default where they run, else SDPA
        self.attention = attention or (
            "triton" if engine_attention.available(self.device, self.dtype, self.head_dim) else "sdpa")
        if self.attention == "triton" and not engine_attention.shape_ok(self.head_dim):
            raise ValueError(f"SlotModel: attention='triton' takes head_dim a power of two in [16, 256], got {self.head_dim}")
        # the split-K kernels read a copied prefix from the slot it was copied from (``copy_prefix``, ``vacate``)
        self.shared_reads = self.attention == "triton" and (True if shared_reads is None else bool(shared_reads))
        self._reads: dict[int, tuple[int, int]] = {}  # slot -> (the slot its prefix is read from, the prefix's length)
        self._reads_dirty = True  # the device's copy (``_src`` / ``_plen``) is behind ``_reads``
        if sampler not in (None, "torch", "triton"):
            raise ValueError(f"SlotModel: sampler must be 'torch' or 'triton', got {sampler!r}")
        # multi-step decode's sampler: the fused kernels of ``engine_sampling`` by default where they run
        self.sampler = sampler or ("triton" if engine_sampling.fused_available(self.device) else "torch")
        self.slots = 0
        self.length = 0
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self._captured: dict[tuple[int, int], tuple[Any, torch.Tensor]] = {}
        self._nucleus = False  # the latest ``decode_sample``'s (``decode_sample_next`` replays its graph)
        self._warmed_splits = False  # the split-K kernels compiled for every chunk count (``ensure``)
        self.captures = 0  # CUDA graphs captured (benches: a capture inside a timed wave is a warm-up it missed)
        self._pool: Any = None
        self.ensure(slots, length)

    # ------------------------------------------------------------ cache

    def ensure(self, slots: int, length: int) -> None:
        """Grow the cache to at least ``slots`` x ``length`` (keeping what it holds). Captured graphs are dropped."""
        if slots <= self.slots and length <= self.length:
            return
        slots, length = max(slots, self.slots), max(length, self.length)
        shape = (slots, self.kv_heads, length, self.head_dim)
        new_k = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.layers]
        new_v = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.layers]
        for old, new in zip(self.k + self.v, new_k + new_v):
            new[: old.shape[0], :, : old.shape[2]].copy_(old)
        self.k, self.v = new_k, new_v
        self.slots, self.length = slots, length
        if self.attention == "triton" and self.device.type == "cuda" and not self._warmed_splits:
            # every chunk count compiled now, not inside a wave (engine_attention.warm_splits)
            engine_attention.warm_splits(self.kv_heads, self.groups, self.head_dim, self.dtype, self.device, self.scale,
                                         set(self.windows), self.fuse and self.rope_in_attention, self.merge_in_split,
                                         prefix=self.shared_reads)
            self._warmed_splits = True
        self._tokens = torch.zeros(slots, dtype=torch.long, device=self.device)
        self._pos = torch.zeros(slots, dtype=torch.long, device=self.device)
        self._temp = torch.zeros(slots, dtype=torch.float32, device=self.device)
        self._top_p = torch.ones(slots, dtype=torch.float32, device=self.device)
        self._u = torch.zeros((MAX_STEPS, slots), dtype=torch.float64, device=self.device)
        self._rows = torch.arange(slots, device=self.device)
        self._counts = torch.zeros(slots * self.kv_heads, dtype=torch.int32, device=self.device)  # merge_in_split's
        self._src = torch.arange(slots, device=self.device)  # shared_reads': where row i's prefix is read from
        self._plen = torch.zeros(slots, dtype=torch.long, device=self.device)  # and how long that prefix is
        self._reads_dirty = True
        self._captured.clear()
        self._pool = None  # the old graphs' pool dies with them: capturing into its handle again trips the allocator
        self._check_packed()

    def release(self) -> None:
        """Free the cache and the captured graphs (``Engine.sleep``); ``ensure`` allocates again."""
        self.k, self.v = [], []
        self.slots = self.length = 0
        self._reads.clear()
        self._captured.clear()
        self._pool = None

    # ------------------------------------------------------------ packed projections

    def _check_packed(self) -> None:
        """Pack (again) when the modules' weights are no longer the views packed here (first call; after ``.to``
        or another ``SlotModel`` on the same model rebound them). Captured graphs read the old tensors, so they are
        dropped with them."""
        if not self.pack or (self._views and all(getattr(m, n) is p and p.data_ptr() == ptr
                                                  for m, n, p, ptr in self._views)):
            return
        groups = [([ly.self_attn.q_proj, ly.self_attn.k_proj, ly.self_attn.v_proj], [ly.mlp.gate_proj, ly.mlp.up_proj])
                  for ly in self.layers]  # per layer: the q/k/v modules, the gate/up modules
        # a group whose biases are mixed (some, not all) is left unpacked
        if any(len({getattr(m, "bias", None) is None for m in ms}) != 1 for pair in groups for ms in pair):
            self.pack = False
            return
        self._captured.clear()
        self._pool = None
        self._packed, self._views = [], []
        # Outside inference mode (a call may pack inside one): inference tensors as parameters would refuse the
        # in-place copy of the next weight update.
        with torch.inference_mode(False), torch.no_grad():
            for qkv, gate_up in groups:
                self._packed.append((self._bind(qkv, "weight"), self._bind(qkv, "bias"),
                                     self._bind(gate_up, "weight"), self._bind(gate_up, "bias")))

    def _bind(self, modules: list[Any], name: str) -> torch.Tensor | None:
        """One tensor holding ``modules``' ``name`` (weight or bias) along dim 0, each module's a view of it. Weights
        that already lie back to back in one storage (packed by another ``SlotModel``) are taken as they are."""
        olds = [getattr(m, name) for m in modules]
        if olds[0] is None:
            return None
        packed = _adjacent(olds)
        if packed is None:
            packed = torch.cat([o.detach() for o in olds], 0)
            for m, old, view in zip(modules, olds, packed.split([o.shape[0] for o in olds], 0), strict=True):
                setattr(m, name, torch.nn.Parameter(view, requires_grad=old.requires_grad))
        self._views += [(m, name, getattr(m, name), getattr(m, name).data_ptr()) for m in modules]
        return packed

    # ------------------------------------------------------------ pieces

    def _qkv(self, attn: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        b, t = x.shape[:2]
        q = attn.q_proj(x).view(b, t, self.heads, self.head_dim)
        k = attn.k_proj(x).view(b, t, self.kv_heads, self.head_dim)
        v = attn.v_proj(x).view(b, t, self.kv_heads, self.head_dim)
        if getattr(attn, "q_norm", None) is not None:  # Qwen3
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin, v

    def _finish_layer(self, layer: Any, residual: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        h = residual + layer.self_attn.o_proj(attn_out)
        return h + layer.mlp(layer.post_attention_layernorm(h))

    def _logits(self, h_ND: torch.Tensor, upcast: bool = True) -> torch.Tensor:
        out: torch.Tensor = self.lm_head(self.norm(h_ND))
        return out.float() if upcast else out

    # ------------------------------------------------------------ prefill

    @torch.inference_mode()
    def copy_prefix(self, src: int, dsts: list[int], length: int) -> None:
        """Copy the first ``length`` cache positions of slot ``src`` into every slot of ``dsts`` (every layer's keys
        and values): a prompt prefilled once serves requests with the same prompt (``Engine``'s shared prefill)."""
        if not dsts:
            return
        if src in dsts:
            raise ValueError(f"SlotModel.copy_prefix: source slot {src} is also among the destinations {dsts}")
        if not 0 < length <= self.length or not 0 <= src < self.slots or any(not 0 <= d < self.slots for d in dsts):
            raise ValueError(f"SlotModel.copy_prefix: slots {src} -> {dsts}, length {length} outside the cache "
                             f"({self.slots} slots x {self.length})")
        for slot in dsts:  # their old contents go: whoever read from them reads elsewhere now
            self.vacate(slot)
        dst_N = torch.tensor(dsts, dtype=torch.long, device=self.device)
        for cache in self.k + self.v:
            cache[dst_N, :, :length] = cache[src, :, :length].clone().unsqueeze(0)  # a copy: torch refuses a view
        if self.shared_reads:  # and each copy's decode steps read the prefix from ``src``, not from the copy
            self._reads.pop(src, None)  # (``src`` reads its own: a chain could run past its source's prefix)
            for slot in dsts:
                self._reads[slot] = (src, length)
            self._reads_dirty = True

    def vacate(self, slot: int) -> None:
        """Slot ``slot`` is free (its request ended) or about to be overwritten: it stops reading another slot's
        prefix, and the slots reading their prefix from it read it from one of themselves instead (every copy holds
        the prefix: ``copy_prefix``). A free slot's cache is not kept: an idle row of a decode step writes its
        position 0.. (``decode_sample``), and a new request's prefill writes over it."""
        changed = self._reads.pop(slot, None) is not None
        readers = sorted(d for d, (s, _) in self._reads.items() if s == slot)
        if readers:
            heir, (_, heir_len) = readers[0], self._reads.pop(readers[0])
            for d in readers[1:]:
                self._reads[d] = (heir, min(self._reads[d][1], heir_len))
            changed = True
        self._reads_dirty |= changed

    @torch.inference_mode()
    def prefill(self, slots: list[int], prompts: list[list[int]]) -> torch.Tensor:
        """Write ``prompts`` (right-padded into one batch) into ``slots``; the logits after each prompt, ``[n, V]``."""
        self._check_packed()
        for slot in slots:
            self.vacate(slot)
        n, t = len(prompts), max(len(p) for p in prompts)
        ids_NT = torch.zeros((n, t), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids_NT[i, : len(p)] = torch.tensor(p, dtype=torch.long)
        ids_NT = ids_NT.to(self.device)
        slot_N = torch.tensor(slots, dtype=torch.long, device=self.device)
        last_N = torch.tensor([len(p) - 1 for p in prompts], dtype=torch.long, device=self.device)
        pos_NT = torch.arange(t, device=self.device).expand(n, t)
        h = self.embed(ids_NT)
        cos, sin = self.rotary(h, pos_NT)
        i_T = torch.arange(t, device=self.device)
        masks: dict[int, torch.Tensor] = {}
        for win in {w for w in self.windows if w is not None}:  # right padding: causal alone never sees a pad
            masks[win] = (i_T[None, :] <= i_T[:, None]) & (i_T[None, :] > i_T[:, None] - win)

        def attend(li: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            self.k[li][slot_N, :, :t] = k
            self.v[li][slot_N, :, :t] = v
            w = self.windows[li]
            o = F.scaled_dot_product_attention(
                q, k, v, attn_mask=masks[w] if w is not None else None, is_causal=w is None, scale=self.scale,
                enable_gqa=self.groups > 1,
            )
            return o.transpose(1, 2).reshape(n, t, -1)

        if self.fuse:
            return self._fused_logits(self._fused_layers(h, cos, sin, attend)[torch.arange(n, device=self.device), last_N])
        for li, layer in enumerate(self.layers):
            residual = h
            q, k, v = self._qkv(layer.self_attn, layer.input_layernorm(h), cos, sin)
            h = self._finish_layer(layer, residual, attend(li, q, k, v))
        return self._logits(h[torch.arange(n, device=self.device), last_N])

    def _fused_layers(
        self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Any, rope_in_attend: bool = False,
    ) -> torch.Tensor:
        """The layers with the fused pointwise kernels: the last hidden states ``[b, t, hidden]`` (before the norm).
        ``attend(li, q, k, v)`` (q/k/v ``[b, heads, t, d]``, rotary applied) stores k/v and returns ``[b, t, heads*d]``;
        with ``rope_in_attend`` it gets them as ``[b, t, heads, d]``, unrotated (the split-K kernel rotates them)."""
        b, t = h.shape[:2]
        delta: torch.Tensor | None = None
        for li, layer in enumerate(self.layers):
            norm = layer.input_layernorm
            if delta is None:
                x = self._rms(h, norm.weight, norm.variance_epsilon)
            else:  # the previous layer's MLP output joins the residual inside this layer's norm kernel
                h, x = self._add_rms(h, delta, norm.weight, norm.variance_epsilon)
            attn = layer.self_attn
            if self._packed:
                q, k, v = F.linear(x, self._packed[li][0], self._packed[li][1]).split(self._qkv_sizes, -1)
                q = q.view(b, t, self.heads, self.head_dim)
                k = k.view(b, t, self.kv_heads, self.head_dim)
                v = v.view(b, t, self.kv_heads, self.head_dim)
            else:
                q = attn.q_proj(x).view(b, t, self.heads, self.head_dim)
                k = attn.k_proj(x).view(b, t, self.kv_heads, self.head_dim)
                v = attn.v_proj(x).view(b, t, self.kv_heads, self.head_dim)
            if getattr(attn, "q_norm", None) is not None:  # Qwen3
                q = self._rms(q, attn.q_norm.weight, attn.q_norm.variance_epsilon)
                k = self._rms(k, attn.k_norm.weight, attn.k_norm.variance_epsilon)
            if rope_in_attend:
                o = attn.o_proj(attend(li, q, k, v))
            else:
                q, k = self._rope(q, k, cos, sin)
                o = attn.o_proj(attend(li, q, k, v.transpose(1, 2)))
            post = layer.post_attention_layernorm
            h, x = self._add_rms(h, o, post.weight, post.variance_epsilon)
            mlp = layer.mlp
            if self._packed:
                gate, up = F.linear(x, self._packed[li][2], self._packed[li][3]).chunk(2, -1)
                delta = mlp.down_proj(self._swiglu(gate, up))
            else:
                delta = mlp.down_proj(self._swiglu(mlp.gate_proj(x), mlp.up_proj(x)))
        assert delta is not None
        return h + delta

    def _fused_logits(self, h_ND: torch.Tensor, upcast: bool = True) -> torch.Tensor:
        out: torch.Tensor = self.lm_head(self._rms(h_ND, self.norm.weight, self.norm.variance_epsilon))
        return out.float() if upcast else out

    # ------------------------------------------------------------ decode

    def _attend(self, li: int, q: torch.Tensor, b: int, length: int, mask: torch.Tensor | None) -> torch.Tensor:
        # grouped-query attention without repeating K/V: a kv head's G query heads become G query rows
        o = F.scaled_dot_product_attention(
            q.reshape(b, self.kv_heads, self.groups, self.head_dim),
            self.k[li][:b, :, :length], self.v[li][:b, :, :length], attn_mask=mask, scale=self.scale,
        )
        return o.reshape(b, 1, self.heads * self.head_dim)

    def _step(self, tokens_B: torch.Tensor, pos_B: torch.Tensor, b: int, length: int, upcast: bool = True) -> torch.Tensor:
        """One decode step: feed ``tokens_B`` at ``pos_B`` (rows ``0..b-1``), attend over ``length``; logits ``[b, V]``
        (fp32, or the model's dtype with ``upcast=False``)."""
        rows = self._rows[:b]
        h = self.embed(tokens_B[:, None])
        cos, sin = self.rotary(h, pos_B[:, None])
        masks: dict[int | None, torch.Tensor | None] = {None: None}
        if self.attention == "sdpa":  # the kernels of ``engine_attention`` read positions and windows themselves
            j_L = torch.arange(length, device=self.device)
            full_BL = j_L[None, :] <= pos_B[:, None]
            masks = {w: (full_BL & (j_L[None, :] > pos_B[:, None] - w))[:, None, None, :] for w in set(self.windows) if w}
            masks[None] = full_BL[:, None, None, :]

        # with ``rope_in_attention`` the kernel rotates q and k (``[b, 1, heads, d]`` in) instead of ``_rope``
        rope_in_attend = self.fuse and self.attention == "triton" and self.rope_in_attention

        def attend(li: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            if self.attention == "triton":  # reads only each row's own positions, writes this step's k/v itself
                # the step's key/value: ``[b, 1, kv, d]`` unrotated (rope_in_attend) or ``[b, kv, 1, d]``
                new_k, new_v = (k[:, 0], v[:, 0]) if rope_in_attend else (k[:, :, 0], v[:, :, 0])
                rotary = {"cos_BD": cos[:, 0], "sin_BD": sin[:, 0]} if rope_in_attend else {}
                o = engine_attention.decode_attention(
                    q.reshape(b, self.kv_heads, self.groups, self.head_dim), self.k[li], self.v[li], pos_B, length,
                    self.scale, self.windows[li], k_new=new_k, v_new=new_v, **rotary,
                    counters=self._counts if self.merge_in_split else None,
                    src_B=self._src[:b] if self.shared_reads else None,
                    plen_B=self._plen[:b] if self.shared_reads else None,
                )
                return o.reshape(b, 1, self.heads * self.head_dim)
            self.k[li][rows, :, pos_B] = k[:, :, 0]
            self.v[li][rows, :, pos_B] = v[:, :, 0]
            return self._attend(li, q, b, length, masks.get(self.windows[li]))

        if self.fuse:
            return self._fused_logits(self._fused_layers(h, cos, sin, attend, rope_in_attend)[:, 0], upcast)
        for li, layer in enumerate(self.layers):
            residual = h
            q, k, v = self._qkv(layer.self_attn, layer.input_layernorm(h), cos, sin)
            h = self._finish_layer(layer, residual, attend(li, q, k, v))
        return self._logits(h[:, 0], upcast)

    def _decode_body(self, b: int, length: int) -> torch.Tensor:
        return self._step(self._tokens[:b], self._pos[:b], b, length)

    def _sample_body(self, b: int, length: int, steps: int, nucleus: bool) -> tuple[torch.Tensor, torch.Tensor]:
        tok, pos = self._tokens[:b], self._pos[:b]
        temp, top_p = self._temp[:b], self._top_p[:b]
        tokens, logps = [], []
        fused = self.sampler == "triton" and not nucleus
        for i in range(steps):
            if fused:  # the logits in the model's dtype, read once by the kernels
                tok, logp = sample_fused(self._step(tok, pos + i, b, length, upcast=False), temp, self._u[i, :b])
            else:
                tok, logp = sample_static(self._step(tok, pos + i, b, length), temp, top_p, self._u[i, :b], nucleus)
            tokens.append(tok)
            logps.append(logp)
        return torch.stack(tokens), torch.stack(logps)

    def _load(self, tokens: list[int], pos: list[int], batch: int) -> None:
        n = len(tokens)
        tok = torch.zeros(batch, dtype=torch.long)
        at = torch.zeros(batch, dtype=torch.long)
        tok[:n] = torch.tensor(tokens, dtype=torch.long)
        at[:n] = torch.tensor(pos, dtype=torch.long)
        self._tokens[:batch].copy_(tok, non_blocking=True)
        self._pos[:batch].copy_(at, non_blocking=True)
        self._upload_reads()

    def _upload_reads(self) -> None:
        if self.shared_reads and self._reads_dirty:
            src, plen = torch.arange(self.slots), torch.zeros(self.slots, dtype=torch.long)
            for slot, (root, length) in self._reads.items():
                src[slot], plen[slot] = root, length
            self._src.copy_(src, non_blocking=True)
            self._plen.copy_(plen, non_blocking=True)
            self._reads_dirty = False

    def _replay(self, key: tuple[Any, ...], body: Any) -> Any:
        if key not in self._captured:
            # Warm-up runs write the same keys/values the replay writes (same inputs): idempotent.
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    body()
            torch.cuda.current_stream().wait_stream(stream)
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                out = body()
            self._captured[key] = (graph, out)
            self.captures += 1
        graph, out = self._captured[key]
        graph.replay()
        return out

    @torch.inference_mode()
    def decode(self, tokens: list[int], pos: list[int], batch: int, length: int) -> torch.Tensor:
        """One token for slots ``0..batch-1`` (``tokens``/``pos`` per slot; rows past them are idle): ``[batch, V]``."""
        self._check_packed()
        self._load(tokens, pos, batch)
        if not self.graphs:
            return self._decode_body(batch, length)
        out: torch.Tensor = self._replay((batch, length), lambda: self._decode_body(batch, length))
        return out

    @torch.inference_mode()
    def decode_sample(
        self, tokens: list[int], pos: list[int], batch: int, length: int, steps: int,
        temperature: list[float], top_p: list[float], u_KN: list[list[float]],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``steps`` decode steps sampling on the device: row ``i`` feeds ``tokens[i]`` at ``pos[i]``, then each
        sampled token at the next position (``length`` must cover ``max(pos) + steps``). ``u_KN[j][i]``: row
        ``i``'s uniform for step ``j``. Returns the sampled tokens and their logprobs, ``[steps, batch]`` each
        (device tensors; rows past ``len(tokens)`` are idle, greedy at position 0.. of their slots)."""
        if not 1 <= steps <= MAX_STEPS:
            raise ValueError(f"SlotModel.decode_sample: steps must be in [1, {MAX_STEPS}], got {steps}")
        self._check_packed()
        self._load(tokens, pos, batch)
        n = len(tokens)
        temp = torch.zeros(batch, dtype=torch.float32)
        tp = torch.ones(batch, dtype=torch.float32)
        temp[:n] = torch.tensor(temperature, dtype=torch.float32)
        tp[:n] = torch.tensor(top_p, dtype=torch.float32)
        self._temp[:batch].copy_(temp, non_blocking=True)
        self._top_p[:batch].copy_(tp, non_blocking=True)
        self._load_uniforms(u_KN, steps, batch)
        self._nucleus = bool((tp < 1).any())  # for ``decode_sample_next`` too
        return self._sample_call(batch, length, steps)

    @torch.inference_mode()
    def decode_sample_next(
        self, batch: int, length: int, steps: int, u_KN: list[list[float]], last_B: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``steps`` steps after a ``decode_sample(.., batch, length, steps, ..)`` call, started without the
        host: row ``i`` feeds ``last_B[i]`` (that call's last sampled token, on the device) at its position +
        ``steps``, with the same temperatures and top-p and the new uniforms ``u_KN``. The same graph replays, into
        the output tensors the previous call returned: take that call's tokens first."""
        if not 1 <= steps <= MAX_STEPS:
            raise ValueError(f"SlotModel.decode_sample_next: steps must be in [1, {MAX_STEPS}], got {steps}")
        self._tokens[:batch].copy_(last_B)
        self._pos[:batch] += steps
        self._load_uniforms(u_KN, steps, batch)
        self._upload_reads()
        return self._sample_call(batch, length, steps)

    def _load_uniforms(self, u_KN: list[list[float]], steps: int, batch: int) -> None:
        """``u_KN`` (``steps`` lists of one uniform a row; rows past them idle, 0) into the graphs' input."""
        u = torch.zeros((steps, batch), dtype=torch.float64)
        n = len(u_KN[0]) if u_KN else 0
        u[:, :n] = torch.tensor(u_KN, dtype=torch.float64)
        self._u[:steps, :batch].copy_(u, non_blocking=True)

    def _sample_call(self, batch: int, length: int, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``_sample_body`` over the loaded inputs: eagerly, or as the CUDA graph of its shapes."""
        nucleus = self._nucleus

        def body() -> tuple[torch.Tensor, torch.Tensor]:
            return self._sample_body(batch, length, steps, nucleus)

        if not self.graphs:
            return body()
        out: tuple[torch.Tensor, torch.Tensor] = self._replay((batch, length, steps, nucleus), body)
        return out


__all__ = ["SUPPORTED", "SlotModel", "supports"]
