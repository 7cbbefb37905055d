"""The episode's budgets on the native path: the task's ``max_tokens`` over all calls, the effort level's thinking
cap, the run's sampling -- applied to every policy call the gateway makes, as the emulated loop applies them.

The policy here is a model that would talk forever: it thinks until something closes its thinking (what a
thinking budget does in ``HFPolicy`` / ``OpenAIPolicy``: the close tag inserted by the policy, loss mask 0),
then calls the program's shell tool, every call; with no cap it thinks until ``max_new_tokens`` runs out. It
honours ``max_new_tokens`` as a sampler does, and nothing else stops it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import openai
import pytest

from agentenv.registry import get_task
from rollout.attempt import EpisodeRequest
from rollout.episode import EpisodeRunner
from rollout.gateway import Session, ThreadedGateway
from rollout.harnesses.native import NATIVE_HARNESSES
from rollout.policy.types import FinishReason, Generation, Policy, Prompt, SamplingParams, ThinkingBudget
from rollout.tokenizer import EOT, build_tokenizer
from rollout.types import Status

SHELL_TOOLS = {p.shell_tool[0]: p.shell_tool[1] for p in NATIVE_HARNESSES.values()}
TASK = "general/write_word"  # max_tokens 256: the task of the report (3,685 tokens against 256)


class TalksForever(Policy):
    """Thinks until its thinking is closed, then calls the shell tool (see the module docstring)."""

    name = "talks-forever"
    version = 0

    def __init__(self, tok: Any) -> None:
        self.tok = tok
        self.seen: list[tuple[SamplingParams, ThinkingBudget | None]] = []
        self.inserted = 0  # close tags the thinking budget inserted (as a real policy does)
        self.inserted_tokens = 0  # their tokens (mask 0)

    def _ids(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    async def generate(self, prompt: Prompt, sampling: SamplingParams, budget: ThinkingBudget | None = None) -> Generation:
        self.seen.append((sampling, budget))
        limit = sampling.max_new_tokens
        filler = self._ids(" hmm")[:1]
        ids = self._ids("<think>")
        mask = [1] * len(ids)
        thought = 0
        while len(ids) < limit and (budget is None or thought < budget.max_thinking_tokens):
            ids += filler
            mask.append(1)
            thought += 1
        closed = budget is not None and thought >= budget.max_thinking_tokens and len(ids) < limit
        if closed:
            close = self._ids(budget.close_tag)
            ids += close
            mask += [0] * len(close)
            tools = [t.get("function", {}).get("name") for t in prompt.tools]
            name = next((n for n in tools if n in SHELL_TOOLS), None)
            act = self._ids(f"<tool_call>\n{json.dumps({'name': name, 'arguments': {SHELL_TOOLS[name]: 'echo hmm'}})}\n</tool_call>"
                            if name else "hmm")
            act.append(self.tok.convert_tokens_to_ids(EOT))
            ids += act
            mask += [1] * len(act)
        finish = FinishReason.LENGTH if len(ids) > limit or not closed else FinishReason.STOP
        ids, mask = ids[:limit], mask[:limit]
        self.inserted += int(closed and 0 in mask)
        self.inserted_tokens += mask.count(0)
        text = self.tok.decode([i for i in ids if i != self.tok.convert_tokens_to_ids(EOT)])
        return Generation(text, tuple(ids), tuple(0.0 if m == 0 else -1.0 for m in mask), finish, 0,
                          sampled_mask=tuple(mask), budget_closed=closed)


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.mark.unit
def test_the_session_caps_every_call_at_the_budget_left_inserts_the_thinking_cap_and_refuses_when_spent(tok) -> None:
    policy = TalksForever(tok)
    session = Session("ep-budget", policy, tok, sampling=SamplingParams(max_new_tokens=64, temperature=0.7),
                      max_tokens=100, thinking_budget=10)
    tools = [{"type": "function", "function": {"name": "Shell", "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    with ThreadedGateway(session, port=0) as gw:
        client = openai.OpenAI(base_url=gw.base_url + "/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.RateLimitError):
            for _ in range(50):  # the CLI never stops by itself either: only the budget ends it
                r = client.chat.completions.create(model="m", messages=messages, tools=tools, max_tokens=4096, temperature=0.1)
                msg = r.choices[0].message
                calls = [tc.model_dump() for tc in msg.tool_calls or []]
                messages.append({"role": "assistant", "content": msg.content or "", "tool_calls": calls} if calls
                                else {"role": "assistant", "content": msg.content or ""})
                messages.extend({"role": "tool", "tool_call_id": c["id"], "content": "hmm"} for c in calls)
                if not calls:
                    messages.append({"role": "user", "content": "go on"})
    spent = [len(c.completion_ids) for c in session.calls]
    assert sum(spent) <= 100 and session.completion_tokens == sum(spent), spent
    assert session.refused == 1 and session.spent.is_set()
    left = 100
    for (sampling, budget), n in zip(policy.seen, spent):
        assert sampling.max_new_tokens == min(64, left), (sampling.max_new_tokens, left)  # the run's cap, then what is left
        assert sampling.temperature == 0.7  # the episode's temperature, not the one the CLI asked for
        assert budget == ThinkingBudget(10)
        left -= n
    assert policy.inserted >= 1
    assert sum(m == 0 for c in session.calls for m in c.mask) == policy.inserted_tokens > 0  # recorded with mask 0


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("harness", sorted(NATIVE_HARNESSES))
def test_a_native_episode_that_would_talk_forever_stays_within_the_tasks_max_tokens(docker_client, base_image, tok, harness: str) -> None:
    from sandboxes.docker_backend import DockerBackend

    policy = TalksForever(tok)
    task = get_task(TASK)
    runner = EpisodeRunner(policy, backend=DockerBackend(docker_client), tokenizer=tok)
    req = EpisodeRequest(f"budget-{harness}", "test-native-budget", TASK, 1, harness, effort="low", thinking_budget=100)
    try:
        traj = asyncio.run(runner.run(req))
    finally:
        runner.close()
    spent = sum(t.completion_tokens for t in traj.turns)
    assert traj.status is Status.TRUNCATED, (traj.status, traj.error[-500:])
    assert 0 < spent <= task.limits.max_tokens, spent
    assert policy.seen and all(b == ThinkingBudget(100) for _, b in policy.seen)  # the effort level's cap, on every call
    assert policy.inserted >= 1  # ... and the model's thinking was closed by it
    assert sum(sum(s.loss_mask) for s in traj.samples) == spent - policy.inserted_tokens  # the inserted tags: mask 0
    assert traj.verifier["cli_s"] < task.limits.wall_time_s  # the CLI ended by the budget, not by the wall time
