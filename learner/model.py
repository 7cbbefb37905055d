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
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

__all__ = ["PolicyModel", "block_causal_mask", "token_logprobs"]


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

    @classmethod
    def from_pretrained(
        cls, path: str | os.PathLike[str], *, dtype: torch.dtype = torch.float32, **kwargs: Any
    ) -> PolicyModel:
        """Load a local checkpoint directory; a missing one raises instead of reaching for a hub."""
        where = Path(path)
        if not (where / "config.json").is_file():
            raise FileNotFoundError(
                f"PolicyModel.from_pretrained: {str(where)!r} is not a local checkpoint directory "
                "(expected config.json in it); the learner never downloads models"
            )
        lm = AutoModelForCausalLM.from_pretrained(str(where), dtype=dtype, local_files_only=True, **kwargs)
        return cls(lm)

    @classmethod
    def from_config(
        cls, config: PretrainedConfig, *, seed: int = 0, dtype: torch.dtype = torch.float32, **kwargs: Any
    ) -> PolicyModel:
        """A fresh random model, identical for equal seeds; the global RNG is left as it was."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            lm = AutoModelForCausalLM.from_config(config, dtype=dtype, **kwargs)
        return cls(lm)

    @property
    def config(self) -> PretrainedConfig:
        return self.lm.config

    @property
    def device(self) -> torch.device:
        return next(self.lm.parameters()).device

    def logits(
        self, input_ids_BT: torch.Tensor, position_ids_BT: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        out = self.lm(
            input_ids=input_ids_BT, position_ids=position_ids_BT, attention_mask=attention_mask, use_cache=False
        )
        return out.logits

    def logprobs(
        self,
        input_ids_BT: torch.Tensor,
        position_ids_BT: torch.Tensor,
        *,
        temperature: float = 1.0,
        attention_mask: torch.Tensor | None = None,
        with_entropy: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-token fp32 logprobs (and entropy) of ``input_ids_BT``; see ``token_logprobs``.

        A sample's first token (``position_ids == 0``) gets 0: on a packed row its
        "prediction" would come from the previous sample.
        """
        logits_BTV = self.logits(input_ids_BT, position_ids_BT, attention_mask)
        logp_BT, ent_BT = token_logprobs(logits_BTV, input_ids_BT, temperature, with_entropy=with_entropy)
        first_BT = position_ids_BT == 0
        logp_BT = logp_BT.masked_fill(first_BT, 0.0)
        if ent_BT is not None:
            ent_BT = ent_BT.masked_fill(first_BT, 0.0)
        return logp_BT, ent_BT

    def save(self, path: str | os.PathLike[str]) -> Path:
        """``save_pretrained`` layout (safetensors), loadable by ``from_pretrained`` and by inference servers."""
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        self.lm.save_pretrained(str(out))
        return out
