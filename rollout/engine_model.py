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
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

SUPPORTED = ("qwen2", "qwen3", "llama", "mistral")


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


class SlotModel:
    """``model``'s forward over a preallocated slot cache; see the module docstring.

    ``prefill(slots, prompts)`` writes each prompt's keys and values into its slot
    and returns the next-token logits of each (fp32, ``[n, V]``);
    ``decode(tokens_B, pos_B, length)`` feeds one token per slot ``0..B-1`` at
    position ``pos_B`` and returns ``[B, V]`` logits. ``graphs=True`` (CUDA only)
    replays the decode step from CUDA graphs captured per (batch, length) bucket;
    weights copied in place (``copy_``) stay valid for captured graphs.
    """

    def __init__(self, model: Any, *, slots: int, length: int, graphs: bool = False) -> None:
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
        self.slots = 0
        self.length = 0
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self._captured: dict[tuple[int, int], tuple[Any, torch.Tensor]] = {}
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
        self._tokens = torch.zeros(slots, dtype=torch.long, device=self.device)
        self._pos = torch.zeros(slots, dtype=torch.long, device=self.device)
        self._rows = torch.arange(slots, device=self.device)
        self._captured.clear()
        self._pool = None  # the old graphs' pool dies with them: capturing into its handle again trips the allocator

    def release(self) -> None:
        """Free the cache and the captured graphs (``Engine.sleep``); ``ensure`` allocates again."""
        self.k, self.v = [], []
        self.slots = self.length = 0
        self._captured.clear()
        self._pool = None

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

    def _logits(self, h_ND: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(h_ND)).float()

    # ------------------------------------------------------------ prefill

    @torch.inference_mode()
    def prefill(self, slots: list[int], prompts: list[list[int]]) -> torch.Tensor:
        """Write ``prompts`` (right-padded into one batch) into ``slots``; the logits after each prompt, ``[n, V]``."""
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
        for li, layer in enumerate(self.layers):
            residual = h
            q, k, v = self._qkv(layer.self_attn, layer.input_layernorm(h), cos, sin)
            self.k[li][slot_N, :, :t] = k
            self.v[li][slot_N, :, :t] = v
            w = self.windows[li]
            o = F.scaled_dot_product_attention(
                q, k, v, attn_mask=masks[w] if w is not None else None, is_causal=w is None, scale=self.scale,
                enable_gqa=self.groups > 1,
            )
            h = self._finish_layer(layer, residual, o.transpose(1, 2).reshape(n, t, -1))
        return self._logits(h[torch.arange(n, device=self.device), last_N])

    # ------------------------------------------------------------ decode

    def _decode_body(self, b: int, length: int) -> torch.Tensor:
        tokens, pos = self._tokens[:b], self._pos[:b]
        rows = self._rows[:b]
        h = self.embed(tokens[:, None])
        cos, sin = self.rotary(h, pos[:, None])
        j_L = torch.arange(length, device=self.device)
        full_BL = j_L[None, :] <= pos[:, None]
        masks = {w: (full_BL & (j_L[None, :] > pos[:, None] - w))[:, None, None, :] for w in {w for w in self.windows if w}}
        full = full_BL[:, None, None, :]
        for li, layer in enumerate(self.layers):
            residual = h
            q, k, v = self._qkv(layer.self_attn, layer.input_layernorm(h), cos, sin)
            self.k[li][rows, :, pos] = k[:, :, 0]
            self.v[li][rows, :, pos] = v[:, :, 0]
            w = self.windows[li]
            # grouped-query attention without repeating K/V: a kv head's G query heads become G query rows
            o = F.scaled_dot_product_attention(
                q.reshape(b, self.kv_heads, self.groups, self.head_dim),
                self.k[li][:b, :, :length], self.v[li][:b, :, :length],
                attn_mask=masks[w] if w else full, scale=self.scale,
            )
            h = self._finish_layer(layer, residual, o.reshape(b, 1, self.heads * self.head_dim))
        return self._logits(h[:, 0])

    @torch.inference_mode()
    def decode(self, tokens: list[int], pos: list[int], batch: int, length: int) -> torch.Tensor:
        """One token for slots ``0..batch-1`` (``tokens``/``pos`` per slot; rows past them are idle): ``[batch, V]``."""
        n = len(tokens)
        tok = torch.zeros(batch, dtype=torch.long)
        at = torch.zeros(batch, dtype=torch.long)
        tok[:n] = torch.tensor(tokens, dtype=torch.long)
        at[:n] = torch.tensor(pos, dtype=torch.long)
        self._tokens[:batch].copy_(tok, non_blocking=True)
        self._pos[:batch].copy_(at, non_blocking=True)
        if not self.graphs:
            return self._decode_body(batch, length)
        key = (batch, length)
        if key not in self._captured:
            # Warm-up runs write the same keys/values the replay writes (same inputs): idempotent.
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    self._decode_body(batch, length)
            torch.cuda.current_stream().wait_stream(stream)
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                out = self._decode_body(batch, length)
            self._captured[key] = (graph, out)
        graph, out = self._captured[key]
        graph.replay()
        return out


__all__ = ["SUPPORTED", "SlotModel", "supports"]
