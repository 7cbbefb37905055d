"""Random training items for the learner tests."""

from __future__ import annotations

import torch

from learner.types import TrainItem


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
