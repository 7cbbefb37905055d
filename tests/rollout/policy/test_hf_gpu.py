"""HFPolicy on an accelerator (marker ``gpu``; never in CI). Self-contained: runs with ``--noconftest``
on a machine that has torch + transformers but none of the project's services."""

from __future__ import annotations

import pytest
import torch

from rollout.policy.hf import HFPolicy
from rollout.policy.models import tiny_model
from rollout.policy.types import Prompt, SamplingParams, ThinkingBudget

pytestmark = pytest.mark.gpu


def _recompute(model: torch.nn.Module, prompt: list[int], completion: tuple[int, ...], temperature: float) -> list[float]:
    ids = torch.tensor([prompt + list(completion)], device="cuda")
    with torch.no_grad():
        logp_TV = torch.log_softmax(model(input_ids=ids).logits[0].float() / temperature, dim=-1)
    return [float(logp_TV[len(prompt) - 1 + i, t]) for i, t in enumerate(completion)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_sampling_is_seeded_exact_and_budgeted(dtype: torch.dtype) -> None:
    model, tok = tiny_model(seed=0)
    policy = HFPolicy(model, tok, device="cuda", dtype=dtype)
    ids = policy.prompt_ids(Prompt(messages=[{"role": "user", "content": "List the files."}]))
    sampling = SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=48, seed=3)
    a = policy.generate_sync(Prompt(token_ids=ids), sampling)
    b = policy.generate_sync(Prompt(token_ids=ids), sampling)
    assert a.token_ids == b.token_ids and len(a.token_ids) == 48
    expected = _recompute(policy.model, ids, a.token_ids, 0.8)
    worst = max(abs(x - y) for x, y in zip(a.logprobs, expected))
    # fp32: KV-cache vs full-forward noise only. bf16: the kernels differ by shape, so only close.
    assert worst < (1e-4 if dtype == torch.float32 else 0.1), worst
    think = ids + tok.encode("<think>", add_special_tokens=False)
    g = policy.generate_sync(Prompt(token_ids=think), SamplingParams(max_new_tokens=8, seed=1), ThinkingBudget(3))
    assert g.token_ids[3] == tok.convert_tokens_to_ids("</think>") and g.loss_mask[3] == 0
    other, _ = tiny_model(seed=1, tokenizer=tok)
    policy.set_weights(other, version=5)
    assert policy.generate_sync(Prompt(token_ids=ids), sampling).policy_version == 5
