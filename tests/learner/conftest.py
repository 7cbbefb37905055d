"""Tiny models and random training items for the learner tests (CPU, fp32, milliseconds per step)."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config

from learner.model import PolicyModel
from learner.types import TrainItem
from rollout.tokenizer import build_tokenizer


@pytest.fixture(scope="session")
def vocab_size() -> int:
    return len(build_tokenizer())


@pytest.fixture(scope="session")
def tiny_config(vocab_size: int) -> Qwen2Config:
    return Qwen2Config(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
        vocab_size=vocab_size, max_position_embeddings=512, tie_word_embeddings=True,
    )


@pytest.fixture
def tiny_model(tiny_config: Qwen2Config) -> PolicyModel:
    return PolicyModel.from_config(tiny_config, seed=0)


def random_items(
    n: int, vocab: int, *, seed: int = 0, min_len: int = 4, max_len: int = 40, prompt: int = 3
) -> list[TrainItem]:
    """``n`` samples of random lengths: ``prompt`` prompt tokens (mask 0), then a response with one
    tool-output stretch masked out; advantages +-1 alternating; rollout logprobs near -log(vocab)."""
    g = torch.Generator().manual_seed(seed)
    items = []
    for i in range(n):
        k = int(torch.randint(min_len, max_len + 1, (1,), generator=g))
        ids = torch.randint(0, vocab, (k,), generator=g).tolist()
        mask = [0 if (j < prompt or k // 2 <= j < k // 2 + 2) else 1 for j in range(k)]
        lps = [(-7.5 + 0.3 * float(torch.randn(1, generator=g))) * m for m in mask]
        adv = 1.0 if i % 2 == 0 else -1.0
        items.append(TrainItem(tuple(ids), tuple(lps), tuple(mask), adv, sample_id=f"s{i}", group_id=f"g{i // 4}",
                               tags={"harness": "codex" if i % 3 else "claude", "effort": "low", "domain": "coding"}))
    return items
