"""Tiny models and random training items for the learner tests (CPU, fp32, milliseconds per step)."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config

from learner.model import PolicyModel
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
