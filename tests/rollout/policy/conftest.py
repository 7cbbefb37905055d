"""Fixtures for the policy tests: one tiny seeded model per module, nothing downloaded."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from rollout.policy.hf import HFPolicy
from rollout.policy.models import tiny_model


@pytest.fixture(scope="module")
def tiny() -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    return tiny_model(seed=0)


@pytest.fixture()
def policy(tiny: tuple[PreTrainedModel, PreTrainedTokenizerBase]) -> HFPolicy:
    model, tok = tiny
    fresh, _ = tiny_model(seed=0, tokenizer=tok)  # tests that swap weights must not leak into others
    assert model is not fresh
    return HFPolicy(fresh, tok, name="tiny-test")


def recompute_logprobs(
    model: torch.nn.Module, prompt: Sequence[int], completion: Sequence[int], temperature: float
) -> list[float]:
    """What the learner computes: one full forward pass, fp32 log-softmax at temperature."""
    ids = torch.tensor([list(prompt) + list(completion)])
    with torch.no_grad():
        logits_TV = model(input_ids=ids).logits[0].float()
    scaled_TV = logits_TV / temperature if temperature > 0 else logits_TV
    logp_TV = torch.log_softmax(scaled_TV, dim=-1)
    start = len(prompt) - 1
    return [float(logp_TV[start + i, t]) for i, t in enumerate(completion)]


@pytest.fixture()
def recompute() -> Callable[[torch.nn.Module, Sequence[int], Sequence[int], float], list[float]]:
    return recompute_logprobs
