"""Shared fixtures of the distill tests: the project tokenizer, one thread."""

from __future__ import annotations

import pytest
import torch
from transformers import PreTrainedTokenizerBase

from rollout.tokenizer import build_tokenizer

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tok() -> PreTrainedTokenizerBase:
    return build_tokenizer()
