"""The gateway through the official ``anthropic`` and ``openai`` clients, streaming and not.

The policy is a fake (what is under test is the gateway, not a model): it
returns scripted texts in the project template's tool-call markup, so the
gateway's parsing, id hand-out, splicing and record are exercised for real.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence

import anthropic
import openai
import pytest

from rollout.gateway import BreakCause, Session, ThreadedGateway
from rollout.policy.types import FinishReason, Generation, PolicyError, Prompt, SamplingParams, ThinkingBudget
from rollout.tokenizer import build_tokenizer

pytestmark = pytest.mark.unit


class TextPolicy:
    """Returns ``texts`` in order as sampled token ids (with fake logprobs); remembers every prompt."""

    name = "text"

    def __init__(self, tok, texts: Sequence[str], version: int = 7) -> None:
        self.tok, self.texts, self._version = tok, list(texts), version
        self.prompts: list[tuple[int, ...]] = []
        self.fail = False

    @property
    def version(self) -> int:
        return self._version

    async def generate(self, prompt: Prompt, sampling: SamplingParams, budget: ThinkingBudget | None = None) -> Generation:
        if self.fail:
            raise PolicyError("the model server is down")
        self.prompts.append(tuple(prompt.token_ids))
        text = self.texts.pop(0) if self.texts else "done"
        ids = tuple(self.tok.encode(text, add_special_tokens=False)) + (self.tok.convert_tokens_to_ids("<|im_end|>"),)
        return Generation(text, ids, tuple(-0.5 for _ in ids), FinishReason.STOP, self._version)


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def call(name: str, **args) -> str:
    # deliberately odd spacing: the exact sampled text must survive the CLI's re-serialisation
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}, indent=1) + "\n</tool_call>"


@pytest.fixture
def gateway(tok) -> Iterator[tuple[Session, TextPolicy, ThreadedGateway]]:
    policy = TextPolicy(tok, [])
    session = Session("ep-1", policy, tok, sampling=SamplingParams(max_new_tokens=256))
    with ThreadedGateway(session, port=0) as gw:
        yield session, policy, gw


def _check_append_only(session: Session, policy: TextPolicy) -> None:
    assert session.append_only(), session.breaks
    calls = session.calls
    for a, b in zip(calls, calls[1:]):
        assert b.prompt_ids[: len(a.prompt_ids) + len(a.completion_ids)] == a.prompt_ids + a.completion_ids
    (sample,) = session.samples()
    assert sum(sample.mask) == sum(len(c.completion_ids) for c in calls)
    assert [tuple(p) for p in policy.prompts] == [c.prompt_ids for c in calls]
    assert all(c.policy_version == 7 for c in calls)


@pytest.mark.parametrize("stream", [True, False])
def test_anthropic_tool_loop_is_token_exact(gateway, stream: bool) -> None:
    session, policy, gw = gateway
    policy.texts = [
        "<think>look first</think>" + call("Bash", command="ls  -la"),
        call("Read", file_path="/workspace/a.txt") + call("Bash", command="echo hi"),
        "All done.",
    ]
    client = anthropic.Anthropic(base_url=gw.base_url, api_key="x", max_retries=0)
    tools = [{"name": "Bash", "description": "run", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}},
             {"name": "Read", "description": "read", "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}}}]
    messages: list[dict] = [{"role": "user", "content": [{"type": "text", "text": "fix it", "cache_control": {"type": "ephemeral"}}]}]
    system = [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332"}, {"type": "text", "text": "You are an agent."}]
    for turn in range(3):
        kwargs = dict(model="claude-x", max_tokens=32000 if stream else 4096, system=system, messages=messages, tools=tools)
        if stream:
            with client.messages.stream(**kwargs) as s:
                msg = s.get_final_message()
        else:
            msg = client.messages.create(**kwargs)
        content = [b.model_dump(exclude_none=True) for b in msg.content]
        messages.append({"role": "assistant", "content": content})
        uses = [b for b in msg.content if b.type == "tool_use"]
        if turn == 0:
            assert msg.content[0].type == "thinking" and msg.content[0].signature
            assert uses[0].input == {"command": "ls  -la"} and uses[0].id.startswith("toolu_")
        if not uses:
            assert msg.stop_reason == "end_turn" and msg.content[-1].text == "All done."
            break
        assert msg.stop_reason == "tool_use"
        results = [{"type": "tool_result", "tool_use_id": u.id, "content": f"out {u.id[-4:]}"} for u in uses]
        # Claude Code's shape: results, then a reminder; a mid-conversation system message too
        messages.append({"role": "user", "content": [*results, {"type": "text", "text": "<system-reminder>keep going</system-reminder>"}]})
    assert len(session.calls) == 3
    _check_append_only(session, policy)


@pytest.mark.parametrize("stream", [True, False])
def test_responses_function_calls_and_reasoning(gateway, stream: bool) -> None:
    session, policy, gw = gateway
    policy.texts = ["<think>plan</think>" + call("exec_command", cmd="ls"), call("apply_patch", input="*** Begin Patch\n*** End Patch"), "finished"]
    client = openai.OpenAI(base_url=gw.base_url + "/v1", api_key="x", max_retries=0)
    tools = [{"type": "function", "name": "exec_command", "description": "run", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}},
             {"type": "custom", "name": "apply_patch", "description": "patch", "format": {"type": "text"}}]
    items: list[dict] = [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "be careful"}]},
                         {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "do it"}]}]
    for _ in range(3):
        kwargs = dict(model="gpt-5.5", input=items, tools=tools, reasoning={"effort": "high"}, store=False)
        if stream:
            with client.responses.stream(**kwargs) as s:
                resp = s.get_final_response()
        else:
            resp = client.responses.create(**kwargs)
        out = [o.model_dump(exclude_none=True) for o in resp.output]
        items.extend(out)
        calls = [o for o in resp.output if o.type in ("function_call", "custom_tool_call")]
        if not calls:
            assert resp.output_text == "finished"
            break
        for c in calls:
            kind = "function_call_output" if c.type == "function_call" else "custom_tool_call_output"
            items.append({"type": kind, "call_id": c.call_id, "output": "ok"})
    assert session.calls[0].effort == "high"
    assert any(o.get("type") == "custom_tool_call" for o in items)
    _check_append_only(session, policy)


@pytest.mark.parametrize("stream", [True, False])
def test_chat_completions_tool_calls(gateway, stream: bool) -> None:
    session, policy, gw = gateway
    policy.texts = ["<think>hm</think>" + call("Shell", command="pwd"), "the answer is 4"]
    client = openai.OpenAI(base_url=gw.base_url + "/v1", api_key="x", max_retries=0)
    tools = [{"type": "function", "function": {"name": "Shell", "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}]
    messages: list[dict] = [{"role": "system", "content": "sys"}, {"role": "user", "content": "q"}]
    for _ in range(2):
        if stream:
            chunks = list(client.chat.completions.create(model="m", messages=messages, tools=tools, stream=True, stream_options={"include_usage": True}))
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            reasoning = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices)
            tcs = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
            calls = [{"id": t.id, "type": "function", "function": {"name": t.function.name, "arguments": t.function.arguments}} for t in tcs]
            assert chunks[-1].usage is not None
        else:
            msg = client.chat.completions.create(model="m", messages=messages, tools=tools).choices[0].message
            text, reasoning = msg.content or "", getattr(msg, "reasoning_content", None) or ""
            calls = [tc.model_dump() for tc in msg.tool_calls or []]
        assistant = {"role": "assistant", "content": text, "reasoning_content": reasoning}
        if calls:
            assistant["tool_calls"] = calls
        messages.append(assistant)
        if not calls:
            assert text == "the answer is 4"
            break
        messages.extend({"role": "tool", "tool_call_id": c["id"], "content": "/workspace"} for c in calls)
    _check_append_only(session, policy)


def test_malformed_output_is_text_and_bad_requests_are_400(gateway) -> None:
    session, policy, gw = gateway
    policy.texts = ["<tool_call>{not json</tool_call>", call("Bash", command="ls")]
    client = anthropic.Anthropic(base_url=gw.base_url, api_key="x", max_retries=0)
    msg = client.messages.create(model="m", max_tokens=100, messages=[{"role": "user", "content": "hi"}])
    assert msg.content[0].type == "text" and "{not json" in msg.content[0].text and msg.stop_reason == "end_turn"
    assert session.calls[0].malformed
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model="m", max_tokens=100, messages=[])
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model="m", max_tokens=100, messages=[{"role": "robot", "content": "x"}])
    oai = openai.OpenAI(base_url=gw.base_url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError):
        oai.responses.create(model="m", input=[{"type": "hologram"}])
    import httpx

    r = httpx.post(gw.base_url + "/v1/chat/completions", content=b"{broken", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "error" in r.json()
    policy.fail = True
    with pytest.raises(anthropic.InternalServerError):
        client.messages.create(model="m", max_tokens=100, messages=[{"role": "user", "content": "hi"}])
    policy.fail = False
    assert client.messages.create(model="m", max_tokens=100, messages=[{"role": "user", "content": "again"}]).content
    assert len(session.calls) == 2  # the failed call recorded nothing, the server still answers


def test_history_breaks_are_flagged_with_their_cause(gateway) -> None:
    session, policy, gw = gateway
    policy.texts = ["<think>secret plan</think>" + call("Bash", command="ls"), "x", "y", "z"]
    client = anthropic.Anthropic(base_url=gw.base_url, api_key="x", max_retries=0)
    first = client.messages.create(model="m", max_tokens=100, messages=[{"role": "user", "content": "go"}])
    thinking, use = first.content[0], first.content[1]
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "a b"}]}
    # 1. the CLI edits the command it was given
    edited = {"role": "assistant", "content": [thinking.model_dump(), {"type": "tool_use", "id": use.id, "name": "Bash", "input": {"command": "rm -rf /"}}]}
    client.messages.create(model="m", max_tokens=100, messages=[{"role": "user", "content": "go"}, edited, result])
    # 2. an assistant turn the gateway never sampled
    forged = {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_forged", "name": "Bash", "input": {"command": "ls"}}]}
    client.messages.create(model="m", max_tokens=100, messages=[{"role": "user", "content": "go"}, forged, result])
    # 3. thinking dropped (Claude Code's clear_thinking context edit)
    dropped = {"role": "assistant", "content": [use.model_dump()]}
    client.messages.create(model="m", max_tokens=100, messages=[{"role": "user", "content": "go"}, dropped, result])
    causes = [b.cause for b in session.breaks]
    assert causes == [BreakCause.ASSISTANT_TURN_EDITED, BreakCause.UNKNOWN_ASSISTANT_TURN, BreakCause.THINKING_DROPPED]
    assert not session.append_only()


@pytest.mark.slow
def test_the_tiny_hf_policy_behind_the_gateway(tok) -> None:
    """A real (tiny, random) model: the record's ids are what it sampled, with its own logprobs."""
    from rollout.policy.hf import HFPolicy
    from rollout.policy.models import tiny_model

    policy = HFPolicy(tiny_model(seed=0, tokenizer=tok)[0], tok)
    session = Session("hf", policy, tok, sampling=SamplingParams(max_new_tokens=24, seed=1))
    with ThreadedGateway(session, port=0) as gw:
        client = anthropic.Anthropic(base_url=gw.base_url, api_key="x", max_retries=0)
        messages: list[dict] = [{"role": "user", "content": "list the files"}]
        for _ in range(2):
            with client.messages.stream(model="m", max_tokens=24, messages=messages) as s:
                msg = s.get_final_message()
            messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in msg.content]},
                         {"role": "user", "content": "go on"}]
    assert len(session.calls) == 2
    for c in session.calls:
        assert c.completion_ids and len(c.logprobs) == len(c.completion_ids) and all(lp <= 0.0 for lp in c.logprobs)
        assert any(lp < 0.0 for lp in c.logprobs)  # real sampling logprobs, not the 0.0 of a text policy
    # the second prompt is the first prompt + what was sampled (+ the EOT the gateway closes a cut-off turn with)
    a, b = session.calls
    assert b.prompt_ids[: len(a.prompt_ids) + len(a.completion_ids)] == a.prompt_ids + a.completion_ids
    assert session.append_only(), session.breaks
