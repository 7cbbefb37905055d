"""One episode's conversation threads, token-exact, keyed by the ids the gateway handed out.

A *thread* is one growing token sequence (an ``EpisodeRenderer``). A request
continues a thread when its history is the thread's history so far, where each
past assistant turn is recognised by the ids the gateway handed out for it
(tool-use ids, thinking signatures, Responses item ids and encrypted content,
call ids) and its content. Then the prompt is the thread's exact tokens --
including every sampled token of the past turns, never re-tokenized -- plus the
template delta of the new tool results / user messages. Claude Code re-sends
``tool_use.input`` as a parsed object, so its whitespace is gone; this does not
matter, as the tokens come from the record, not from the request.

A request that does not continue any thread:

* has no assistant turn: a new thread (a CLI's side call, e.g. a title), not a break;
* has one: a break, with its cause (``BreakCause``); it starts a new thread
  rendered fresh by the template, whose past turns are prompt (mask 0).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from rollout.gateway.types import BreakCause, CallRecord, HistoryBreak
from rollout.gateway.wire import Conversation
from rollout.harnesses.parsing import extract_text
from rollout.harnesses.rendering import EpisodeRenderer, TokenSample
from rollout.policy.types import Generation, Policy, Prompt, SamplingParams, ThinkingBudget

MAX_CALLS_PER_TURN = 32
_REASONING_IDS = ("sig_", "rs_", "enc_")  # prefixes of the ids handed out for thinking / reasoning


@dataclass(frozen=True)
class ToolCall:
    call_id: str  # toolu_* / call_*
    item_id: str  # Responses fc_* / ctc_* (empty elsewhere)
    name: str
    arguments: str  # JSON text
    custom: bool = False  # Responses freeform tool: the input is arguments["input"]


@dataclass(frozen=True)
class Reply:
    """The model's turn in wire-neutral form; ``replies`` writes it in each API's shape."""

    message_id: str
    text: str
    reasoning: str
    reasoning_id: str  # thinking signature / rs_* id
    encrypted: str  # Responses encrypted_content
    calls: tuple[ToolCall, ...]
    finish: str  # "stop" | "length" | "tool_calls"
    prompt_tokens: int
    completion_tokens: int

    def ids(self) -> frozenset[str]:
        out = {self.reasoning_id, self.encrypted} if self.reasoning else set()
        for c in self.calls:
            out |= {c.call_id, c.item_id}
        return frozenset(i for i in out if i)


@dataclass
class _Thread:
    index: int
    renderer: EpisodeRenderer
    history: list[dict[str, Any]]  # canonical messages, the last one an assistant turn we handed out
    tools_key: str
    turn_ids: dict[int, frozenset[str]] = field(default_factory=dict)
    last_prompt: list[dict[str, Any]] = field(default_factory=list)


def _new_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"


def _args(text: str) -> Any:
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text


def _same_turn(incoming: Mapping[str, Any], mine: Mapping[str, Any]) -> bool:
    if (incoming.get("content") or "").strip() != (mine.get("content") or "").strip():
        return False
    a, b = incoming.get("tool_calls") or [], mine.get("tool_calls") or []
    if len(a) != len(b):
        return False
    return all(
        x["function"]["name"] == y["function"]["name"] and _args(x["function"]["arguments"]) == _args(y["function"]["arguments"])
        for x, y in zip(a, b)
    )


MAX_PROMPT_TOKENS = 1 << 19  # a prompt past this is refused before any sampling (a context flood, not a turn)


class Session:
    """The record of one episode behind the gateway. ``samples()`` and ``calls`` make its trajectory."""

    def __init__(
        self,
        session_id: str,
        policy: Policy,
        tokenizer: Any,
        *,
        sampling: SamplingParams = SamplingParams(),
        effort_budgets: Mapping[str, int] | None = None,
        max_calls: int | None = None,
        max_tokens: int | None = None,
        thinking_budget: int | None = None,
        max_prompt_tokens: int = MAX_PROMPT_TOKENS,
    ) -> None:
        self.id = session_id
        self.max_prompt_tokens = max_prompt_tokens
        self.policy = policy
        self.tok = tokenizer
        self.sampling = sampling
        self.effort_budgets = dict(effort_budgets or {})
        self.max_calls = max_calls
        # The episode's budgets, applied to every call as the emulated loop applies them: ``max_tokens`` completion
        # tokens over all calls (each call capped at what is left; none sampled once spent), ``thinking_budget``
        # the effort level's cap on thinking per call (it wins over ``effort_budgets``, read from the CLI's request).
        self.max_tokens = max_tokens
        self.thinking_budget = thinking_budget
        self.completion_tokens = 0
        self.spent = asyncio.Event()  # set at the first refused call: the episode's budget is spent, the CLI may be ended
        self.threads: list[_Thread] = []
        self.calls: list[CallRecord] = []
        self.breaks: list[HistoryBreak] = []
        self.tool_lists: list[list[dict[str, Any]]] = []  # each call's tools, canonical (the drift guard reads them)
        self.refused = 0  # calls past max_calls (answered with an error, never sampled)
        self._known: dict[str, int] = {}  # handed-out id -> thread index
        self._lock = asyncio.Lock()

    # ------------------------------------------------------------ the record

    def samples(self) -> list[TokenSample]:
        return [s for t in self.threads for s in t.renderer.samples]

    @property
    def main_thread(self) -> _Thread | None:
        """The thread with the most calls: the agent's conversation (side calls are short)."""
        if not self.threads:
            return None
        counts = {t.index: 0 for t in self.threads}
        for c in self.calls:
            counts[c.thread] += 1
        return max(self.threads, key=lambda t: counts[t.index])

    def append_only(self) -> bool:
        """True when the agent's conversation is one token sequence, each call extending the last."""
        main = self.main_thread
        return main is not None and len(main.renderer.samples) == 1 and not self.breaks

    # ------------------------------------------------------------ one call

    async def call(self, conv: Conversation) -> tuple[Reply, CallRecord]:
        async with self._lock:
            self.tool_lists.append(conv.tools)
            if self.max_calls is not None and len(self.calls) >= self.max_calls:
                self.refused += 1
                self.spent.set()
                raise BudgetSpent(f"session {self.id}: the turn budget of {self.max_calls} model calls is spent")
            if self.max_tokens is not None and self.completion_tokens >= self.max_tokens:
                self.refused += 1
                self.spent.set()
                raise BudgetSpent(f"session {self.id}: the token budget of {self.max_tokens} completion tokens is spent")
            # Seconds for a huge prompt: in a worker thread, off the event loop every session shares (encoding
            # only reads the tokenizer; nothing here changes its truncation or padding state).
            thread = await asyncio.to_thread(self._thread_for, conv)
            n = len(thread.renderer.prompt_ids())
            if n > self.max_prompt_tokens:
                raise PromptTooLong(
                    f"session {self.id}: a prompt of {n} tokens is over the gateway's limit of {self.max_prompt_tokens} (max_prompt_tokens)"
                )
            return await self._sample(conv, thread)

    def _thread_for(self, conv: Conversation) -> _Thread:
        msgs, tools_key = conv.messages, json.dumps(conv.tools, sort_keys=True)
        has_assistant = any(m["role"] == "assistant" for m in msgs)
        best: tuple[int, BreakCause, str] | None = None
        for thread in reversed(self.threads):
            cause = self._continues(thread, conv, tools_key)
            if cause is None:
                suffix = msgs[len(thread.history) :]
                thread.history = [dict(m) for m in msgs]
                before = thread.renderer.breaks
                thread.renderer.add_observations(suffix)
                if thread.renderer.breaks > before:
                    self.breaks.append(HistoryBreak(len(self.calls), BreakCause.TEMPLATE, f"thread {thread.index}: the template re-rendered the past"))
                return thread
            # the deepest match wins; at equal depth, a thread that knows the turn's ids names the better cause
            if best is None or (cause[0], cause[1] is not BreakCause.UNKNOWN_ASSISTANT_TURN) > (best[0], best[1] is not BreakCause.UNKNOWN_ASSISTANT_TURN):
                best = cause
        if has_assistant:
            if best is None:
                best = (0, BreakCause.UNKNOWN_ASSISTANT_TURN, "no recorded thread")
            self.breaks.append(HistoryBreak(len(self.calls), best[1], best[2]))
        renderer = EpisodeRenderer(self.tok, msgs, conv.tools or None)
        thread = _Thread(len(self.threads), renderer, [dict(m) for m in msgs], tools_key)
        self.threads.append(thread)
        return thread

    def _continues(self, thread: _Thread, conv: Conversation, tools_key: str) -> tuple[int, BreakCause, str] | None:
        """None when ``conv`` extends ``thread``; else (how far it matched, cause, detail)."""
        msgs, hist = conv.messages, thread.history
        if thread.renderer._awaiting_completion:  # a thread whose last call failed: never continued
            return (0, BreakCause.RETRY, f"thread {thread.index}: its last call has no completion")
        if msgs == thread.last_prompt:
            return (len(msgs), BreakCause.RETRY, f"thread {thread.index}: the same prompt was sent again")
        for i, mine in enumerate(hist):
            if i >= len(msgs):
                return (i, BreakCause.HISTORY_REWRITTEN, f"thread {thread.index}: history cut to {len(msgs)} messages of {len(hist)}")
            theirs = msgs[i]
            if mine["role"] == "assistant":
                ids = conv.turn_ids.get(i, frozenset())
                handed = thread.turn_ids.get(i, frozenset())
                if theirs["role"] != "assistant":
                    return (i, BreakCause.HISTORY_REWRITTEN, f"thread {thread.index}: message {i} is {theirs['role']}, was assistant")
                unknown = ids - handed
                if unknown:
                    return (i, BreakCause.UNKNOWN_ASSISTANT_TURN, f"thread {thread.index}: message {i} carries ids never handed out: {sorted(unknown)[:3]}")
                if not _same_turn(theirs, mine):
                    return (i, BreakCause.ASSISTANT_TURN_EDITED, f"thread {thread.index}: message {i} differs from what was sampled")
                if mine.get("reasoning_content") and not theirs.get("reasoning_content") and not any(i.startswith(_REASONING_IDS) for i in ids):
                    return (i, BreakCause.THINKING_DROPPED, f"thread {thread.index}: message {i} lost its thinking")
            elif theirs != mine:
                cause = BreakCause.SYSTEM_CHANGED if mine["role"] == "system" and i == 0 else BreakCause.HISTORY_REWRITTEN
                return (i, cause, f"thread {thread.index}: message {i} ({mine['role']}) changed")
        if tools_key != thread.tools_key:
            return (len(hist), BreakCause.TOOLS_CHANGED, f"thread {thread.index}: the tool list changed")
        suffix = msgs[len(hist) :]
        if not suffix:
            return (len(hist), BreakCause.RETRY, f"thread {thread.index}: nothing new after the last turn")
        if any(m["role"] == "assistant" for m in suffix):
            return (len(hist), BreakCause.UNKNOWN_ASSISTANT_TURN, f"thread {thread.index}: an assistant turn the gateway did not sample")
        return None

    async def _sample(self, conv: Conversation, thread: _Thread) -> tuple[Reply, CallRecord]:
        renderer = thread.renderer
        prompt_ids = renderer.prompt_ids()
        s = self.sampling
        # The episode's sampling, as the emulated loop's: the CLI may lower the cap and add stop strings, never
        # change the temperature or top_p the logprobs are taken at (the learner trains at the episode's own).
        cap = min(s.max_new_tokens, conv.max_tokens or s.max_new_tokens)
        if self.max_tokens is not None:
            cap = min(cap, self.max_tokens - self.completion_tokens)
        sampling = replace(s, max_new_tokens=cap, stop=tuple(s.stop) + conv.stop)
        if self.thinking_budget is not None:
            budget: ThinkingBudget | None = ThinkingBudget(self.thinking_budget)
        else:
            budget = ThinkingBudget(self.effort_budgets[conv.effort]) if conv.effort in self.effort_budgets else None
        t0 = time.monotonic()
        thread.last_prompt = [dict(m) for m in conv.messages]
        gen: Generation = await self.policy.generate(Prompt(tuple(prompt_ids), tuple(conv.messages), tuple(conv.tools)), sampling, budget)
        latency = time.monotonic() - t0
        if gen.token_ids:
            ids, lps, mask = list(gen.token_ids), list(gen.logprobs), list(gen.loss_mask)
        else:  # a text policy (scripted, a server without ids): its text is its action
            ids = list(self.tok.encode(gen.text, add_special_tokens=False)) + [renderer.eot_id]
            lps, mask = [0.0] * len(ids), [1] * len(ids)
        self.completion_tokens += len(ids)
        reply, assistant, malformed = self._reply(conv, gen, len(prompt_ids), len(ids))
        sample, at = renderer.current, len(renderer.current.ids)
        renderer.add_completion(ids, assistant, lps)
        for i, m in enumerate(mask):
            if not m:
                sample.mask[at + i], sample.logprobs[at + i] = 0, 0.0
        turn_index = len(thread.history)
        thread.history.append(assistant)
        thread.turn_ids[turn_index] = reply.ids()
        for call_id in reply.ids():
            self._known[call_id] = thread.index
        record = CallRecord(
            index=len(self.calls), api=conv.api, thread=thread.index, prompt_ids=tuple(prompt_ids),
            completion_ids=tuple(ids), logprobs=tuple(lps), mask=tuple(mask), policy_version=gen.policy_version,
            finish_reason=reply.finish, ids_handed_out=tuple(sorted(reply.ids())), effort=conv.effort,
            malformed=tuple(malformed), latency_s=latency,
        )
        self.calls.append(record)
        return reply, record

    def _reply(self, conv: Conversation, gen: Generation, n_prompt: int, n_completion: int) -> tuple[Reply, dict[str, Any], list[str]]:
        """The model's text as an API turn. Broken tool calls go back as the text the model wrote, as a real
        API does when its tool parser finds no call; the record keeps the parse errors."""
        if gen.tool_calls:  # a server that parsed the calls itself
            ex_calls = [(str(tc.get("function", {}).get("name", "")), tc.get("function", {}).get("arguments", "{}")) for tc in gen.tool_calls]
            extracted = extract_text(gen.text, "call", MAX_CALLS_PER_TURN)
            text, reasoning, errors = extracted.text, extracted.reasoning, []
            parsed = [(n, a if isinstance(a, str) else json.dumps(a)) for n, a in ex_calls]
        else:
            extracted = extract_text(gen.text, "call", MAX_CALLS_PER_TURN)
            text, reasoning = extracted.text, extracted.reasoning
            errors = [e.message for e in extracted.errors]
            parsed = [(c.name, json.dumps(dict(c.arguments), ensure_ascii=False)) for c in extracted.calls]
            if errors and not parsed:
                text = gen.text.split("</think>", 1)[-1].strip() if "</think>" in gen.text else gen.text.strip()
        prefix = {"anthropic_messages": "toolu_", "openai_responses": "call_", "chat_completions": "call_"}[conv.api.value]
        calls = []
        for name, arguments in parsed:
            custom = name in conv.custom_tools
            calls.append(ToolCall(_new_id(prefix), _new_id("ctc_" if custom else "fc_") if conv.api.value == "openai_responses" else "", name, arguments, custom))
        finish = "tool_calls" if calls else ("length" if gen.finish_reason.value in ("length", "budget") else "stop")
        reasoning_id = _new_id("sig_" if conv.api.value == "anthropic_messages" else "rs_") if reasoning else ""
        encrypted = _new_id("enc_") if reasoning and conv.api.value == "openai_responses" else ""
        reply = Reply(_new_id("msg_"), text, reasoning, reasoning_id, encrypted, tuple(calls), finish, n_prompt, n_completion)
        assistant: dict[str, Any] = {"role": "assistant", "content": text}
        if reasoning:
            assistant["reasoning_content"] = reasoning
        if calls:
            assistant["tool_calls"] = [{"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls]
        return reply, assistant, errors


class PromptTooLong(ValueError):
    """A request whose rendered prompt is over ``Session.max_prompt_tokens``: a 400, never sampled."""


class BudgetSpent(RuntimeError):
    """The session's turn budget is spent: the gateway answers with an error and samples nothing."""


__all__ = ["MAX_PROMPT_TOKENS", "BudgetSpent", "PromptTooLong", "Reply", "Session", "ToolCall"]
