"""Tiny causal LMs built from a config, and local checkpoints.

Why: tests, demos and small runs need a real ``transformers`` model that
samples, takes a KV cache and trains, without downloading anything. A
Qwen2-shaped config (hidden 64, 2 layers, vocabulary = the project
tokenizer's) random-initialised under a seed is ~0.2M parameters: a forward
pass of a few hundred tokens is a millisecond on one CPU core. It does not
write sensible text; it only has to behave like a model.

A checkpoint is a plain ``save_pretrained`` directory holding the model and
the tokenizer together, so ``agentenv serve PATH`` and the learner load the
same thing. Loading passes ``local_files_only=True``: a path that is not a
local checkpoint fails instead of reaching for a hub.

>>> model, tok = tiny_model(seed=0)                          # doctest: +SKIP
>>> save_checkpoint(model, tok, "runs/ckpt/tiny")
>>> model2, tok2 = load_checkpoint("runs/ckpt/tiny")
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, cast

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase, Qwen2Config, Qwen2ForCausalLM
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from rollout.tokenizer import EOT, build_tokenizer

TINY = "tiny"  # the model name meaning "a fresh tiny model" wherever a MODEL argument is taken


def token_id(tokenizer: PreTrainedTokenizerBase, token: str) -> int:
    """The id of one whole token; ``KeyError`` naming it when the vocabulary lacks it."""
    found = tokenizer.convert_tokens_to_ids(token)
    if not isinstance(found, int) or found == tokenizer.unk_token_id:
        raise KeyError(f"token {token!r} is not in the tokenizer's vocabulary")
    return found


def place(
    model: PreTrainedModel, device: str | torch.device | None = None, dtype: torch.dtype | None = None
) -> PreTrainedModel:
    """Move / cast ``model`` and put it in eval mode (``generate``-free sampling needs no train mode)."""
    # transformers wraps ``to`` in a decorator mypy cannot see through; the module API is the same.
    moved = torch.nn.Module.to(model, device=device, dtype=dtype) if (device or dtype) else model
    return cast(PreTrainedModel, moved).eval()


def tiny_config(
    tokenizer: PreTrainedTokenizerBase,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    max_positions: int = 4096,
    init_std: float = 0.1,
    sliding_window: int | None = None,
    full_attention_layers: int | None = None,
) -> Qwen2Config:
    """A Qwen2-shaped config sized to ``tokenizer``; EOS is the end-of-turn token.

    ``init_std`` is above the usual 0.02 on purpose: at 0.02 the next-token
    distribution of an untrained tiny model is almost uniform, so two different
    weight sets sample the same tokens under one seed and top-p changes nothing.
    Much larger (>= 0.25) and fp32 noise between the KV-cache path and a full
    forward pass grows past 1e-5 in logprob, the tolerance the tests hold.

    ``sliding_window``: the layers after the first ``full_attention_layers``
    (default 1) see only the last ``sliding_window`` tokens, the hybrid
    local/global layout of Mistral, Gemma 2 and Qwen2's own
    ``max_window_layers``; ``full_attention_layers=0`` makes every layer local.
    Why a tiny model may want it: with 1-2k-token harness prompts, a
    full-attention head that should read one token of the instruction starts
    out spreading its weight over the whole prompt. Measured on
    general/write_word's demonstrations (hidden 128, 2 layers, SFT at lr 3e-3,
    176 examples): with full attention, or one full and one local layer, the
    word was still at chance after 1000 steps; with both layers local
    (window 48 or 64) it was read right on every held-out prompt after
    300-500 steps (dev/LOG.md).
    """
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"sliding_window must be >= 1 or None, got {sliding_window}")
    full = num_layers if sliding_window is None else (1 if full_attention_layers is None else full_attention_layers)
    if not 0 <= full <= num_layers:
        raise ValueError(f"full_attention_layers must be in 0..{num_layers}, got {full_attention_layers}")
    eot = token_id(tokenizer, EOT)
    pad = tokenizer.pad_token_id
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        eos_token_id=eot,
        pad_token_id=pad if pad is not None else eot,
        bos_token_id=None,
        initializer_range=init_std,
        use_sliding_window=sliding_window is not None,
        sliding_window=sliding_window,
        max_window_layers=full,
    )


def tiny_model(
    seed: int = 0,
    tokenizer: PreTrainedTokenizerBase | None = None,
    *,
    dtype: torch.dtype = torch.float32,
    **config: Any,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A random-initialised tiny causal LM and its tokenizer, identical for equal seeds.

    The global torch RNG is forked, so building a model never changes what
    other code samples afterwards.
    """
    tok = tokenizer if tokenizer is not None else build_tokenizer()
    cfg = tiny_config(tok, **config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = place(Qwen2ForCausalLM(cfg), dtype=dtype)
    model.generation_config.eos_token_id = cfg.eos_token_id
    model.generation_config.pad_token_id = cfg.pad_token_id
    return model, tok


def save_checkpoint(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: str | os.PathLike[str]) -> Path:
    """Write model and tokenizer into one directory (``from_pretrained`` layout)."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


def load_checkpoint(
    path: str | os.PathLike[str],
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a local checkpoint directory; never downloads.

    Raises ``FileNotFoundError`` naming the path when it is not a checkpoint
    directory (a hub id would otherwise be tried as a download).
    """
    where = Path(path)
    if not (where / "config.json").is_file():
        raise FileNotFoundError(
            f"model checkpoint {str(where)!r}: expected a local directory with config.json "
            f"(save one with rollout.policy.models.save_checkpoint, or use {TINY!r} for a fresh tiny model)"
        )
    kwargs: dict[str, Any] = {"local_files_only": True}
    if dtype is not None:
        kwargs["dtype"] = dtype
    model = place(AutoModelForCausalLM.from_pretrained(str(where), **kwargs), device)
    # The saved tokenizer.json is the tokenizer, exactly: AutoTokenizer maps a qwen2 config to Qwen2Tokenizer,
    # which rebuilds its own pre-tokenizer (digits one by one, NFC) and so tokenizes the project tokenizer's
    # checkpoints differently from the model that was trained (prompts the model has never seen).
    if (where / "tokenizer.json").is_file():
        tok = PreTrainedTokenizerFast.from_pretrained(str(where), local_files_only=True)
    else:
        tok = AutoTokenizer.from_pretrained(str(where), local_files_only=True)
    return model, tok


def load_model(
    spec: str, *, device: str | torch.device = "cpu", dtype: torch.dtype | None = None, seed: int = 0
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """``"tiny"`` -> a fresh tiny model (seeded); anything else -> a local checkpoint path."""
    if spec == TINY:
        model, tok = tiny_model(seed=seed, dtype=dtype or torch.float32)
        return place(model, device), tok
    return load_checkpoint(spec, device=device, dtype=dtype)


__all__ = ["TINY", "place", "token_id", "load_checkpoint", "load_model", "save_checkpoint", "tiny_config", "tiny_model"]
