"""``agentenv serve`` closes thinking at the budget, server side: ``thinking_budget`` per request, or the server's
budget for the request's ``reasoning_effort`` (``--effort-budget``); the same tokens as ``HFPolicy`` in-process."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from transformers import PreTrainedTokenizerBase

from rollout.policy.hf import HFPolicy
from rollout.policy.models import tiny_model
from rollout.policy.types import Prompt, SamplingParams, ThinkingBudget
from rollout.serve import create_app, serve_in_thread

pytestmark = pytest.mark.unit


def test_serve_closes_thinking_at_the_requests_or_the_levels_budget(tok: PreTrainedTokenizerBase) -> None:
    policy = HFPolicy(tiny_model(seed=2, tokenizer=tok)[0], tok)
    ids = list(tok.encode("<|im_start|>assistant\n<think>", add_special_tokens=False))
    close_id = tok.convert_tokens_to_ids("</think>")
    local = policy.generate_sync(Prompt(token_ids=ids), SamplingParams(max_new_tokens=8, seed=9), ThinkingBudget(3))
    assert local.token_ids[3] == close_id and local.loss_mask[3] == 0
    with serve_in_thread(create_app(policy, "m", effort_budgets={"low": 3, "max": 100})) as base:
        client = openai.OpenAI(base_url=base, api_key="EMPTY", max_retries=0, timeout=30)

        def ask(**extra: Any) -> Any:
            r = client.completions.create(model="m", prompt=ids, max_tokens=8, seed=9, extra_body=extra)
            return r.choices[0].model_extra, r.model_extra["agentenv"]  # type: ignore[index]

        for extra in ({"thinking_budget": 3}, {"reasoning_effort": "low"}, {"reasoning_effort": "max", "thinking_budget": 3}):
            choice, ext = ask(**extra)
            assert tuple(choice["token_ids"]) == local.token_ids, extra
            assert ext["budget_closed"] and ext["thinking_tokens"] == 3 and ext["sampled_mask"][3] == 0
        _, free = ask(reasoning_effort="max")
        assert not free["budget_closed"]
        with pytest.raises(openai.BadRequestError, match=r"reasoning_effort: this server has thinking budgets for low, max, got 'high'"):
            ask(reasoning_effort="high")
