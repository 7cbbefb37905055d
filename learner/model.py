"""The learner's view of a causal LM: per-token logprobs (fp32, at a temperature) and entropy.

Wraps any Hugging Face ``AutoModelForCausalLM``: a local checkpoint directory
(``from_pretrained``, always ``local_files_only``: nothing is ever downloaded)
or a config for a fresh random model under a seed (tests, demos, benchmarks).

Why fp32 and the temperature: the importance weights compare the trainer's
logprobs with the ones the rollout engine reported for the *sampled*
distribution, ``softmax(z / T)``. Computing them in bf16, or at T = 1 for
tokens sampled at T = 0.7, makes ``pi_train / mu`` wrong by far more than the
real mismatch. So logits are cast to fp32 and divided by T before the
log-softmax, whatever the autocast dtype of the forward pass.

Packed rows: ``position_ids`` restarting at 0 per sample and *no* attention
mask. ``transformers`` (>= 4.53) reads the restarts as sample boundaries: the
sdpa / eager / flex paths build a block-diagonal causal mask from them, and the
flash-attention path runs its varlen kernel with the matching cu_seqlens.
``block_causal_mask`` builds that mask explicitly (a 4D additive float mask,
fine on CPU) for models or versions without the detection; the packing test
checks both against unpacked per-sample logprobs.

Opt-in speed paths for the GPU (the defaults are the plain ones above):

- ``attn_implementation="packed_varlen"`` (``VARLEN_ATTENTION``): packed rows go
  to PyTorch's own FlashAttention-2 varlen kernel with ``cu_seqlens`` taken from
  the position restarts -- no ``T x T`` mask, no FLOPs across samples, and no
  ``flash-attn`` package needed. On CPU (tests) the same function loops over
  the samples with SDPA.
- ``logprobs(..., chunk_tokens=C)``: the LM head and the fp32 log-softmax run
  ``C`` tokens at a time inside one autograd function that keeps the hidden
  states and the log-normaliser for backward (and the logits in bf16 with
  ``keep_logits``, else they are recomputed there), instead of materialising
  ``[B, T, V]`` fp32 logits (151936 x 4 bytes a token for Qwen2).
- ``compile_layers()``: ``torch.compile`` each decoder layer (one graph, reused
  by all of them) and the chunk kernels, which fuses the norms, rotary, SiLU
  and the softmax passes.
"""

from __future__ import annotations

import copy
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from learner.errors import CheckpointNotFound, LearnerConfigError, UnsupportedModel

__all__ = [
    "VARLEN_ATTENTION",
    "PolicyModel",
    "block_causal_mask",
    "cu_seqlens_from_positions",
    "linear_token_logprobs",
    "token_logprobs",
    "varlen_attention",
]

VARLEN_ATTENTION = "packed_varlen"


def block_causal_mask(seg_BT: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``[B, 1, T, T]`` additive mask: 0 where query ``i`` may see key ``j`` (same sample, ``j <= i``), else -inf-ish.

    Padding (seg -1) sees only itself, which keeps its softmax finite.
    """
    t = seg_BT.shape[-1]
    same_BTT = seg_BT[:, :, None] == seg_BT[:, None, :]
    causal_TT = torch.ones(t, t, dtype=torch.bool, device=seg_BT.device).tril()
    eye_TT = torch.eye(t, dtype=torch.bool, device=seg_BT.device)
    allowed_BTT = (same_BTT & causal_TT) | eye_TT
    mask_BTT = torch.zeros(allowed_BTT.shape, dtype=dtype, device=seg_BT.device)
    mask_BTT = mask_BTT.masked_fill(~allowed_BTT, torch.finfo(dtype).min)
    return mask_BTT[:, None]


def token_logprobs(
    logits_BTV: torch.Tensor, input_ids_BT: torch.Tensor, temperature: float = 1.0, *, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``logp_BT[:, t] = log softmax(z_{t-1} / T)[y_t]`` in fp32; ``logp_BT[:, 0] = 0`` (no prediction).

    ``entropy_BT`` (no grad; a metric) is the entropy of the distribution at
    the same position. Uses ``z[y] - logsumexp(z)`` rather than a full
    log-softmax so no second ``[B, T, V]`` fp32 tensor is kept for backward.
    """
    z_BTV = logits_BTV[:, :-1].float() / temperature
    target_BT = input_ids_BT[:, 1:]
    lse_BT = torch.logsumexp(z_BTV, dim=-1)
    picked_BT = z_BTV.gather(-1, target_BT.unsqueeze(-1)).squeeze(-1)
    logp_BT = torch.nn.functional.pad(picked_BT - lse_BT, (1, 0))
    entropy_BT = None
    if with_entropy:
        with torch.no_grad():
            p_BTV = torch.softmax(z_BTV, dim=-1)
            ent_BT = lse_BT - (p_BTV * z_BTV).sum(-1)
            entropy_BT = torch.nn.functional.pad(ent_BT, (1, 0))
    return logp_BT, entropy_BT


def _selected_logprobs(
    hidden_BTd: torch.Tensor, weight_Vd: torch.Tensor, input_ids_BT: torch.Tensor, sel_BT: torch.Tensor,
    temperature: float, with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``token_logprobs`` at the positions ``sel_BT`` only (0 elsewhere): token ``t`` is predicted from ``h[t-1]``."""
    sel_BT = sel_BT.clone()
    sel_BT[:, 0] = False
    b_N, t_N = sel_BT.nonzero(as_tuple=True)
    logits_NV = hidden_BTd[b_N, t_N - 1] @ weight_Vd.T
    logp_N, _, ent_N = _chunk_stats(logits_NV, input_ids_BT[b_N, t_N], temperature, with_entropy)
    logp_BT = torch.zeros(sel_BT.shape, dtype=torch.float32, device=hidden_BTd.device).index_put((b_N, t_N), logp_N)
    entropy_BT = torch.zeros_like(logp_BT).index_put((b_N, t_N), ent_N.detach()) if with_entropy else None
    return logp_BT, entropy_BT


# ---------------------------------------------------------------- chunked LM head + logprobs


def _chunk_stats(
    logits_CV: torch.Tensor, target_C: torch.Tensor, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(logp_C, lse_C, entropy_C)`` of ``softmax(fp32(logits) / T)`` at the targets (entropy 0 if not asked)."""
    z_CV = logits_CV.float() / temperature
    lse_C = torch.logsumexp(z_CV, dim=-1)
    picked_C = z_CV.gather(-1, target_C[:, None]).squeeze(-1)
    if with_entropy:
        ent_C = lse_C - (torch.exp(z_CV - lse_C[:, None]) * z_CV).sum(-1)
    else:
        ent_C = torch.zeros_like(lse_C)
    return picked_C - lse_C, lse_C, ent_C


def _chunk_grad(
    logits_CV: torch.Tensor, target_C: torch.Tensor, lse_C: torch.Tensor, g_C: torch.Tensor, temperature: float
) -> torch.Tensor:
    """``d sum_c g_c logp_c / d logits`` = ``g (onehot(y) - softmax(z / T)) / T``, in the logits' dtype."""
    z_CV = logits_CV.float() / temperature
    p_CV = torch.exp(z_CV - lse_C[:, None])
    vocab_V = torch.arange(logits_CV.shape[-1], device=logits_CV.device)
    onehot_CV = (vocab_V[None, :] == target_C[:, None]).to(torch.float32)
    return ((onehot_CV - p_CV) * (g_C[:, None] / temperature)).to(logits_CV.dtype)


_COMPILED_CHUNK_FNS: tuple[Callable[..., Any], Callable[..., Any]] | None = None


def _chunk_fns(compiled: bool) -> tuple[Callable[..., Any], Callable[..., Any]]:
    global _COMPILED_CHUNK_FNS
    if not compiled:
        return _chunk_stats, _chunk_grad
    if _COMPILED_CHUNK_FNS is None:
        _COMPILED_CHUNK_FNS = (
            torch.compile(_chunk_stats, dynamic=False, fullgraph=True),
            torch.compile(_chunk_grad, dynamic=False, fullgraph=True),
        )
    return _COMPILED_CHUNK_FNS


class _LinearLogprob(torch.autograd.Function):
    """``logp_N = log softmax(h_N W^T / T)[y_N]`` chunk by chunk; keeps ``h``, ``W``, ``y``, ``lse`` for backward,
    and the logits themselves only if asked (``keep_logits``), else recomputes them there."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, h_Nd: torch.Tensor, w_Vd: torch.Tensor, target_N: torch.Tensor, temperature: float,
        chunk: int, dtype: torch.dtype, with_entropy: bool, compiled: bool, keep_logits: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        stats, _ = _chunk_fns(compiled)
        n = h_Nd.shape[0]
        logp_N = torch.empty(n, dtype=torch.float32, device=h_Nd.device)
        lse_N = torch.empty_like(logp_N)
        ent_N = torch.empty_like(logp_N)
        kept_NV = torch.empty((n, w_Vd.shape[0]), dtype=dtype, device=h_Nd.device) if keep_logits else None
        with torch.autocast(h_Nd.device.type, enabled=False):
            w_cast = w_Vd.to(dtype)
            for at in range(0, n, chunk):
                h_Cd = h_Nd[at:at + chunk].to(dtype)
                if kept_NV is None:
                    logits_CV = h_Cd @ w_cast.T
                else:
                    logits_CV = torch.matmul(h_Cd, w_cast.T, out=kept_NV[at:at + chunk])
                logp_N[at:at + chunk], lse_N[at:at + chunk], ent_N[at:at + chunk] = stats(
                    logits_CV, target_N[at:at + chunk], temperature, with_entropy)
        if kept_NV is None:
            ctx.save_for_backward(h_Nd, w_Vd, target_N, lse_N)
        else:
            ctx.save_for_backward(h_Nd, w_Vd, target_N, lse_N, kept_NV)
        ctx.args = (temperature, chunk, dtype, compiled)
        ctx.mark_non_differentiable(ent_N)
        return logp_N, ent_N

    @staticmethod
    def backward(ctx: Any, g_N: torch.Tensor, _g_ent: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        h_Nd, w_Vd, target_N, lse_N, *kept = ctx.saved_tensors
        temperature, chunk, dtype, compiled = ctx.args
        _, grad = _chunk_fns(compiled)
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dh_Nd = torch.empty_like(h_Nd) if need_h else None
        dw_Vd = torch.zeros_like(w_Vd) if need_w else None
        g_N = g_N.contiguous()
        with torch.autocast(h_Nd.device.type, enabled=False):
            w_cast = w_Vd.to(dtype)
            for at in range(0, h_Nd.shape[0], chunk):
                h_Cd = h_Nd[at:at + chunk].to(dtype)
                logits_CV = kept[0][at:at + chunk] if kept else h_Cd @ w_cast.T
                d_CV = grad(logits_CV, target_N[at:at + chunk], lse_N[at:at + chunk], g_N[at:at + chunk], temperature)
                if dh_Nd is not None:
                    dh_Nd[at:at + chunk] = d_CV @ w_cast
                if dw_Vd is not None:
                    dw_Vd += d_CV.T @ h_Cd  # a chunk's product in the compute dtype, summed in the weight's
        return dh_Nd, dw_Vd, None, None, None, None, None, None, None


def linear_token_logprobs(
    hidden_BTd: torch.Tensor,
    weight_Vd: torch.Tensor,
    input_ids_BT: torch.Tensor,
    temperature: float = 1.0,
    *,
    chunk_tokens: int = 4096,
    with_entropy: bool = False,
    compiled: bool = False,
    keep_logits: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``token_logprobs(hidden @ weight.T, ...)`` without fp32 ``[N, V]`` tensors, ``chunk_tokens`` rows at a time.

    The LM-head matmul runs in the autocast dtype when autocast is on (bf16
    on the GPU, like ``nn.Linear`` would), the softmax always in fp32. By
    default backward recomputes each chunk's logits: one extra LM-head forward
    (~9% more FLOPs for Qwen2-0.5B) for holding no ``N x V`` values at all.
    ``keep_logits`` stores them in the compute dtype instead (2 bytes x V a
    token in bf16: half of what the full-logits path keeps, in fp32). Assumes
    logits are exactly ``h W^T`` (no bias, scale or soft-cap), which
    ``PolicyModel`` checks.
    """
    if chunk_tokens < 1:
        raise LearnerConfigError(f"linear_token_logprobs: chunk_tokens must be >= 1, got {chunk_tokens}")
    b, t, d = hidden_BTd.shape
    dev = hidden_BTd.device.type
    dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else weight_Vd.dtype
    # Position t predicts token t + 1; each row's last position gets a dummy target and is dropped below.
    target_BT = torch.nn.functional.pad(input_ids_BT[:, 1:], (0, 1))
    logp_N, ent_N = _LinearLogprob.apply(
        hidden_BTd.reshape(b * t, d), weight_Vd, target_BT.reshape(-1), temperature, chunk_tokens, dtype,
        with_entropy, compiled, keep_logits,
    )
    logp_BT = torch.nn.functional.pad(logp_N.view(b, t)[:, :-1], (1, 0))
    ent_BT = torch.nn.functional.pad(ent_N.view(b, t)[:, :-1], (1, 0)) if with_entropy else None
    return logp_BT, ent_BT


# ---------------------------------------------------------------- varlen attention for packed rows


def cu_seqlens_from_positions(position_ids_BT: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Sample boundaries of packed rows, flattened: ``(cu_seqlens int32 [S + 1], longest sample)``.

    A sample starts wherever the position does not continue the previous one
    (``transformers``' own rule) and at every row start; padding continues the
    last sample's positions (``learner.packing``), so it joins that sample.
    """
    b, t = position_ids_BT.shape
    step_BT = torch.diff(position_ids_BT, dim=-1, prepend=position_ids_BT[:, :1] - 1)
    start_BT = step_BT != 1
    start_BT[:, 0] = True
    starts_S = start_BT.reshape(-1).nonzero().flatten()
    end = torch.tensor([b * t], device=starts_S.device, dtype=starts_S.dtype)
    cu = torch.cat([starts_S, end]).to(torch.int32)
    return cu, int((cu[1:] - cu[:-1]).max())


_PACKING = threading.local()


@contextmanager
def _packed_rows(cu_seqlens: torch.Tensor, max_len: int) -> Iterator[None]:
    # A side channel rather than forward kwargs: compiled decoder layers never see the per-batch
    # sample count or longest length, so they are not recompiled for each new value.
    _PACKING.current = (cu_seqlens, max_len)
    try:
        yield
    finally:
        _PACKING.current = None


class _FlashVarlen(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, max_len: int, scale: float
    ) -> torch.Tensor:
        out, lse, rng, unused, _ = torch.ops.aten._flash_attention_forward(
            q, k, v, cu, cu, max_len, max_len, 0.0, True, False, scale=scale)
        ctx.save_for_backward(q, k, v, out, lse, cu, rng, unused)
        ctx.args = (max_len, scale)
        return out

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, out, lse, cu, rng, unused = ctx.saved_tensors
        max_len, scale = ctx.args
        dq, dk, dv = torch.ops.aten._flash_attention_backward(
            g.contiguous(), q, k, v, out, lse, cu, cu, max_len, max_len, 0.0, True, rng, unused, scale=scale)
        return dq, dk, dv, None, None, None


def _varlen_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, scale: float
) -> torch.Tensor:
    """The same result one sample at a time with SDPA (CPU, or dtypes the flash kernel does not take)."""
    groups = q.shape[1] // k.shape[1]
    out = torch.empty_like(q)
    bounds = cu.tolist()
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        qs, ks, vs = (x[lo:hi].transpose(0, 1) for x in (q, k, v))  # [H, n, D]
        ks, vs = ks.repeat_interleave(groups, 0), vs.repeat_interleave(groups, 0)
        o = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale)
        out[lo:hi] = o.transpose(0, 1)
    return out


@torch.compiler.disable
def varlen_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """A ``transformers`` attention function (``[B, H, T, D]`` in, ``[B, T, H, D]`` out) for packed rows.

    Sample boundaries come from ``PolicyModel`` (``cu_seqlens_from_positions``)
    or, called outside it, from the ``position_ids`` transformers passes along.
    """
    if attention_mask is not None:
        raise LearnerConfigError(f"{VARLEN_ATTENTION}: attention_mask: packed rows take none (boundaries come from "
                         f"position_ids); got a mask of shape {tuple(attention_mask.shape)} -- use sdpa for "
                         "padded batches")
    if dropout or kwargs.get("sliding_window"):
        raise UnsupportedModel(f"{VARLEN_ATTENTION}: no attention dropout or sliding window "
                         f"(got dropout={dropout}, sliding_window={kwargs.get('sliding_window')})")
    b, h, t, d = query.shape
    current = getattr(_PACKING, "current", None)
    if current is None:
        if kwargs.get("position_ids") is None:
            raise LearnerConfigError(f"{VARLEN_ATTENTION}: position_ids: expected them to find the packed samples, got None")
        current = cu_seqlens_from_positions(kwargs["position_ids"].expand(b, t))
    cu, max_len = current
    scale = float(scaling) if scaling is not None else d ** -0.5
    dev = query.device.type
    dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else query.dtype
    q, k, v = (x.transpose(1, 2).reshape(b * t, x.shape[1], d).to(dtype) for x in (query, key, value))
    if q.is_cuda and dtype in (torch.float16, torch.bfloat16):
        out = _FlashVarlen.apply(q, k, v, cu, max_len, scale)
    else:
        out = _varlen_reference(q, k, v, cu, scale)
    return out.view(b, t, h, d), None


def _register_varlen_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(VARLEN_ATTENTION, varlen_attention)


class PolicyModel(torch.nn.Module):
    """A causal LM the trainer differentiates through.

    >>> from transformers import Qwen2Config
    >>> m = PolicyModel.from_config(Qwen2Config(hidden_size=64, num_hidden_layers=2,
    ...     num_attention_heads=4, num_key_value_heads=2, intermediate_size=128, vocab_size=256), seed=0)
    >>> ids = torch.tensor([[1, 2, 3, 0, 1, 2]]); pos = torch.tensor([[0, 1, 2, 0, 1, 2]])
    >>> m.logprobs(ids, pos)[0].shape  # two packed samples of three tokens
    torch.Size([1, 6])
    """

    def __init__(self, lm: PreTrainedModel) -> None:
        super().__init__()
        self.lm = lm
        self.compiled = False

    @classmethod
    def from_pretrained(
        cls, path: str | os.PathLike[str], *, dtype: torch.dtype = torch.float32, **kwargs: Any
    ) -> PolicyModel:
        """Load a local checkpoint directory; a missing one raises instead of reaching for a hub."""
        where = Path(path)
        if not (where / "config.json").is_file():
            raise CheckpointNotFound(
                f"PolicyModel.from_pretrained: {str(where)!r} is not a local checkpoint directory "
                "(expected config.json in it); the learner never downloads models"
            )
        if kwargs.get("attn_implementation") == VARLEN_ATTENTION:
            _register_varlen_attention()
        lm = AutoModelForCausalLM.from_pretrained(str(where), dtype=dtype, local_files_only=True, **kwargs)
        return cls(lm)

    @classmethod
    def from_config(
        cls, config: PretrainedConfig, *, seed: int = 0, dtype: torch.dtype = torch.float32, **kwargs: Any
    ) -> PolicyModel:
        """A fresh random model, identical for equal seeds; the global RNG and ``config`` are left as they were.

        (``transformers`` writes ``attn_implementation`` into the config it is
        given, which would leak into the next model built from it.)
        """
        if kwargs.get("attn_implementation") == VARLEN_ATTENTION:
            _register_varlen_attention()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            lm = AutoModelForCausalLM.from_config(copy.deepcopy(config), dtype=dtype, **kwargs)
        return cls(lm)

    @property
    def config(self) -> PretrainedConfig:
        return self.lm.config

    @property
    def device(self) -> torch.device:
        return next(self.lm.parameters()).device

    def compile_layers(self, **compile_kwargs: Any) -> None:
        """``torch.compile`` every decoder layer in place (state-dict keys unchanged) and the chunked-logprob kernels.

        All layers share one compiled graph (same code, parameters as inputs);
        the varlen attention stays outside it (``torch.compiler.disable``).
        ``dynamic=True`` by default: a step's last micro-batch usually has fewer
        rows, and one shape-generic graph beats a second compile.
        """
        layers = getattr(self.lm.base_model, "layers", None)
        if layers is None:
            base = type(self.lm.base_model).__name__
            raise UnsupportedModel(f"PolicyModel.compile_layers: expected a base model with .layers, got {base} without")
        for layer in layers:
            layer.compile(**{"dynamic": True, **compile_kwargs})
        self.compiled = True

    def _packing(self, position_ids_BT: torch.Tensor, attention_mask: torch.Tensor | None) -> Any:
        if getattr(self.lm.config, "_attn_implementation", None) != VARLEN_ATTENTION:
            return nullcontext()
        if attention_mask is not None:
            raise LearnerConfigError(f"PolicyModel: attn_implementation={VARLEN_ATTENTION!r} is for packed rows and takes "
                             f"no attention_mask, got one of shape {tuple(attention_mask.shape)}; load the model with "
                             "'sdpa' for padded batches")
        return _packed_rows(*cu_seqlens_from_positions(position_ids_BT))

    def logits(
        self, input_ids_BT: torch.Tensor, position_ids_BT: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        with self._packing(position_ids_BT, attention_mask):
            out = self.lm(
                input_ids=input_ids_BT, position_ids=position_ids_BT, attention_mask=attention_mask, use_cache=False
            )
        return out.logits

    def hidden_states(
        self, input_ids_BT: torch.Tensor, position_ids_BT: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The last layer's (normed) hidden states, ``[B, T, d]``: what the LM head multiplies."""
        with self._packing(position_ids_BT, attention_mask):
            out = self.lm.base_model(
                input_ids=input_ids_BT, position_ids=position_ids_BT, attention_mask=attention_mask, use_cache=False
            )
        return out.last_hidden_state

    def _lm_head_weight(self) -> torch.Tensor:
        head = self.lm.get_output_embeddings()
        softcap = getattr(self.lm.config, "final_logit_softcapping", None)
        if not isinstance(head, torch.nn.Linear) or head.bias is not None or softcap:
            raise UnsupportedModel(f"PolicyModel: chunked logprobs need logits = h @ W^T; {type(self.lm).__name__}'s head "
                             f"is {type(head).__name__} (bias={getattr(head, 'bias', None) is not None}, "
                             f"softcap={softcap})")
        return head.weight

    def logprobs(
        self,
        input_ids_BT: torch.Tensor,
        position_ids_BT: torch.Tensor,
        *,
        temperature: float = 1.0,
        attention_mask: torch.Tensor | None = None,
        with_entropy: bool = False,
        chunk_tokens: int | None = None,
        keep_logits: bool = False,
        only_BT: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-token fp32 logprobs (and entropy) of ``input_ids_BT``; see ``token_logprobs``.

        A sample's first token (``position_ids == 0``) gets 0: on a packed row its
        "prediction" would come from the previous sample. ``chunk_tokens``: run
        the LM head that many tokens at a time (``linear_token_logprobs``, which
        says what ``keep_logits`` does); ``None`` = full logits. ``only_BT``
        (bool): run the LM head only where it is true (the loss mask) and return
        0 elsewhere -- exact for a loss that reads only those positions, and on
        agent episodes (a 1-2k-token prompt, tens of sampled tokens) it skips
        almost all of the LM head's work, the larger part of a small model's.
        """
        if only_BT is not None:
            hidden_BTd = self.hidden_states(input_ids_BT, position_ids_BT, attention_mask)
            return _selected_logprobs(hidden_BTd, self._lm_head_weight(), input_ids_BT,
                                      only_BT & (position_ids_BT != 0), temperature, with_entropy)
        if chunk_tokens is None:
            logits_BTV = self.logits(input_ids_BT, position_ids_BT, attention_mask)
            logp_BT, ent_BT = token_logprobs(logits_BTV, input_ids_BT, temperature, with_entropy=with_entropy)
        else:
            hidden_BTd = self.hidden_states(input_ids_BT, position_ids_BT, attention_mask)
            logp_BT, ent_BT = linear_token_logprobs(
                hidden_BTd, self._lm_head_weight(), input_ids_BT, temperature, chunk_tokens=chunk_tokens,
                with_entropy=with_entropy, compiled=self.compiled, keep_logits=keep_logits,
            )
        first_BT = position_ids_BT == 0
        logp_BT = logp_BT.masked_fill(first_BT, 0.0)
        if ent_BT is not None:
            ent_BT = ent_BT.masked_fill(first_BT, 0.0)
        return logp_BT, ent_BT

    def logprobs_at(
        self,
        input_ids_BT: torch.Tensor,
        position_ids_BT: torch.Tensor,
        pred_BT: torch.Tensor,
        allowed_BTT: torch.Tensor,
        *,
        temperature: float = 1.0,
        with_entropy: bool = False,
        only_BT: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-token fp32 logprobs under a custom attention pattern (prefix-shared trees, ``learner.tree``).

        ``allowed_BTT`` (bool): query ``i`` sees key ``j``; ``position_ids_BT``
        are given as they are (a tree's branches continue their parent's
        positions); token ``t`` is predicted from the hidden state at
        ``pred_BT[t]`` (its path's previous token, not the row's), 0 where
        ``pred_BT < 0``. ``only_BT``: as in ``logprobs``. The mask goes to the
        model as a 4D mask, which ``transformers`` passes through untouched to
        sdpa (bool) and eager (additive) attention; packed-varlen and flash
        kernels take no such mask, so they are refused.
        """
        impl = getattr(self.lm.config, "_attn_implementation", None)
        if impl not in ("sdpa", "eager"):
            raise UnsupportedModel(f"PolicyModel.logprobs_at: trainer.prefix_sharing needs sdpa or eager attention "
                                   f"(a tree-shaped 4D mask), the model runs {impl!r}; load it with "
                                   "attn_implementation='sdpa' or turn prefix_sharing off")
        if allowed_BTT.shape != (*input_ids_BT.shape, input_ids_BT.shape[-1]):
            raise LearnerConfigError(f"PolicyModel.logprobs_at: allowed_BTT: expected shape "
                                     f"{(*input_ids_BT.shape, input_ids_BT.shape[-1])}, got {tuple(allowed_BTT.shape)}")
        allowed_B1TT = allowed_BTT[:, None]
        if impl == "sdpa":
            mask: torch.Tensor = allowed_B1TT
        else:
            dtype = next(self.lm.parameters()).dtype
            mask = torch.zeros(allowed_B1TT.shape, dtype=dtype, device=allowed_B1TT.device)
            mask = mask.masked_fill(~allowed_B1TT, torch.finfo(dtype).min)
        hidden_BTd = self.hidden_states(input_ids_BT, position_ids_BT, mask)
        sel_BT = pred_BT >= 0
        if only_BT is not None:
            sel_BT = sel_BT & only_BT
        b_N, t_N = sel_BT.nonzero(as_tuple=True)
        logits_NV = hidden_BTd[b_N, pred_BT[b_N, t_N]] @ self._lm_head_weight().T
        logp_N, _, ent_N = _chunk_stats(logits_NV, input_ids_BT[b_N, t_N], temperature, with_entropy)
        logp_BT = torch.zeros(sel_BT.shape, dtype=torch.float32, device=hidden_BTd.device).index_put((b_N, t_N), logp_N)
        ent_BT = torch.zeros_like(logp_BT).index_put((b_N, t_N), ent_N.detach()) if with_entropy else None
        return logp_BT, ent_BT

    def save(self, path: str | os.PathLike[str]) -> Path:
        """``save_pretrained`` layout (safetensors), loadable by ``from_pretrained`` and by inference servers."""
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        self.lm.save_pretrained(str(out))
        return out
