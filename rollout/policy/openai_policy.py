"""``OpenAIPolicy``: any OpenAI-compatible server (vLLM / SGLang in production) as a ``Policy``.

Two request shapes, picked per prompt (``mode="auto"``):

* **completions** (``Prompt.token_ids`` given; what training uses): ``POST
  /v1/completions`` with ``prompt`` = the token ids, so the server never
  re-renders or re-tokenizes the episode. Fields sent: ``model, prompt,
  max_tokens, temperature, top_p, seed, stop, logprobs=1``, and in the body as
  vLLM extensions ``return_token_ids=true`` (choice ``token_ids``),
  ``return_tokens_as_token_ids=true`` (logprob tokens as ``"token_id:N"``, a
  fallback source of ids), ``include_stop_str_in_output=true`` (the harness
  needs the end-of-call marker to parse the call).
* **chat** (only ``messages`` given): ``POST /v1/chat/completions`` with
  ``messages, tools, max_tokens, temperature, top_p, seed, stop,
  logprobs=true`` plus the same three extensions; ``tool_calls`` and
  ``reasoning_content`` come back parsed by the server.

Ids come from the choice's ``token_ids`` or else the ``"token_id:N"`` logprob
tokens; with neither, the turn is a ``PolicyError`` (``require_token_ids``),
because a turn without ids cannot be trained on.

**Logprobs** are what the server reports for the sampled token. ``agentenv
serve`` reports ``HFPolicy``'s definition (fp32 log-softmax at temperature,
before top-p). vLLM reports raw (temperature-1) logprobs unless started with
``--logprobs-mode processed_logprobs``; sample at temperature 1, top-p 1 for
training, or configure the server, so the learner recomputes the same quantity.

**Thinking budget** (completions mode, needs ``tokenizer``): enforced on the
client in phases: sample up to the open tag; inside the thinking sample at most
the remaining budget with the close tag as a stop; if the budget ran out,
append the close tag's ids (``sampled_mask`` 0) and continue from prompt +
everything so far. Phase k uses seed ``seed + k``. Chat mode cannot insert
tokens, so it does not enforce a budget.

**Versions**: every turn's ``Generation.policy_version`` is the version the
server reports for it (``agentenv serve``: the response's
``agentenv.policy_version``, the weights that sampled that request), or, from a
server that reports none (vLLM, SGLang's OpenAI routes), the version the caller
last set (``set_version`` after a reload). ``extra["version_source"]`` says
which (``"server"`` or ``"policy"``). A budgeted turn made of several requests
takes the oldest version among them and lists them all in
``extra["policy_versions"]`` when they differ (weights changed mid-turn).

**Failures**: each attempt has a hard deadline (``timeout_s``); connection
errors, timeouts, 408/409/429 and 5xx are retried ``max_retries`` times with
exponential backoff and jitter; anything else, or the last failure, raises
``PolicyError`` naming the URL and the cause. Nothing waits without a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import weakref
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import replace
from typing import Any, Literal

import openai
from transformers import PreTrainedTokenizerBase

from rollout.policy.types import FinishReason, Generation, Policy, PolicyError, Prompt, SamplingParams, ThinkingBudget
from rollout.tokenizer import EOT

log = logging.getLogger(__name__)

_RETRY_STATUS = frozenset({408, 409, 429})
_EXTENSIONS = {"return_token_ids": True, "return_tokens_as_token_ids": True, "include_stop_str_in_output": True}



async def _close_with_loop(client: openai.AsyncOpenAI) -> AsyncGenerator[None, None]:
    """Yields once; closing it (``aclose``, or the loop's shutdown of its async generators) closes ``client``."""
    try:
        yield
    finally:
        if not client.is_closed():
            try:
                await client.close()
            except Exception as exc:  # noqa: BLE001 - a close that fails leaves nothing to do
                log.debug("closing an OpenAI client failed: %s: %s", type(exc).__name__, exc)


async def _aclose(closer: AsyncGenerator[None, None]) -> None:
    await closer.aclose()


class OpenAIPolicy(Policy):
    """A ``Policy`` backed by an OpenAI-compatible endpoint; see the module docstring.

    ``version`` is what the caller says is loaded on the server
    (``set_version`` after pushing weights); a response that names its own
    version (``agentenv serve``'s ``agentenv.policy_version``) wins, and the
    last one seen is ``last_server_version`` (``None`` until a server reports one).

    >>> policy = OpenAIPolicy("http://127.0.0.1:8000/v1", "tiny", timeout_s=30)   # doctest: +SKIP
    >>> gen = await policy.generate(Prompt(token_ids=ids), SamplingParams(seed=0))
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str = "EMPTY",
        timeout_s: float = 120.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 10.0,
        mode: Literal["auto", "completions", "chat"] = "auto",
        tokenizer: PreTrainedTokenizerBase | None = None,
        require_token_ids: bool = True,
        extra_body: Mapping[str, Any] | None = None,
        version: int = 0,
        name: str | None = None,
    ) -> None:
        if timeout_s <= 0 or max_retries < 0 or backoff_s < 0:
            raise ValueError(
                f"OpenAIPolicy: timeout_s must be > 0, max_retries and backoff_s >= 0; "
                f"got {timeout_s}, {max_retries}, {backoff_s}"
            )
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = api_key
        self.timeout_s = float(timeout_s)
        self.max_retries = int(max_retries)
        self.backoff_s = float(backoff_s)
        self.max_backoff_s = float(max_backoff_s)
        self.mode = mode
        self.tokenizer = tokenizer
        self.require_token_ids = require_token_ids
        self.extra_body = dict(extra_body or {})
        self.name = name or f"openai:{model}@{self.base_url}"
        self._version = int(version)
        # The client of the loop that last asked, that loop (weakly: an id can be reused by a new
        # loop), and the async generator that closes the client when that loop shuts down.
        self._client_now: openai.AsyncOpenAI | None = None
        self._client_loop: weakref.ref[asyncio.AbstractEventLoop] | None = None
        self._client_closer: AsyncGenerator[None, None] | None = None
        self._rng = random.Random()
        self.attempts = 0  # requests sent, retries included (for metrics and tests)
        self.last_server_version: int | None = None

    @property
    def version(self) -> int:
        return self._version

    def set_version(self, version: int) -> None:
        """Record that the server now holds weights of ``version`` (after a push)."""
        self._version = int(version)

    def _client(self) -> openai.AsyncOpenAI:
        """The client of the running loop. An httpx pool belongs to the loop that opened it, so a new
        loop gets a new client, and every client is closed in its own loop: the one replaced at once
        (it is closed when that loop runs next, or as it shuts down), the current one when its loop
        shuts down (``asyncio.run`` closes async generators first) or on ``aclose``."""
        loop = asyncio.get_running_loop()
        if self._client_now is not None and self._client_loop is not None and self._client_loop() is loop:
            return self._client_now
        self._retire()
        client = openai.AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, timeout=self.timeout_s, max_retries=0)
        closer = _close_with_loop(client)
        step = closer.__anext__()  # registers the generator with this loop (its shutdown will close it)
        with contextlib.suppress(StopIteration):
            step.send(None)  # type: ignore[attr-defined]  # runs it to its ``yield``: nothing before it awaits
        self._client_now, self._client_loop, self._client_closer = client, weakref.ref(loop), closer
        return client

    def _retire(self) -> None:
        """Close the current client in its own loop (which is not the running one, or is shutting down)."""
        client, ref, closer = self._client_now, self._client_loop, self._client_closer
        self._client_now = self._client_loop = self._client_closer = None
        if client is None or client.is_closed():
            return
        loop = ref() if ref is not None else None
        if loop is None or loop.is_closed():
            # Closed without shutting down its async generators: its sockets can no longer be closed
            # through it; they go with the garbage collector.
            log.debug("%s: the event loop of a replaced client is gone; its connections close with it", self.name)
            return
        assert closer is not None
        asyncio.run_coroutine_threadsafe(_aclose(closer), loop)

    def __getstate__(self) -> dict[str, Any]:
        # Sent to Ray workers: the client (sockets, its loop) stays behind; each process opens its own.
        state = dict(self.__dict__)
        state.update(_client_now=None, _client_loop=None, _client_closer=None)
        return state

    async def aclose(self) -> None:
        """Close the client (call it from the loop that uses the policy); a later call opens a new one."""
        loop = asyncio.get_running_loop()
        ref, closer = self._client_loop, self._client_closer
        if closer is not None and ref is not None and ref() is loop:
            self._client_now = self._client_loop = self._client_closer = None
            await _aclose(closer)
        else:
            self._retire()

    # ------------------------------------------------------------ transport

    async def _request(self, kind: Literal["completions", "chat"], body: dict[str, Any]) -> dict[str, Any]:
        """One logical request with deadlines and retries; the response as a plain dict."""
        known = {k: body.pop(k) for k in list(body) if k in _KNOWN[kind]}
        extra = {**_EXTENSIONS, **self.extra_body, **body}
        last, tries = "no attempt made", 0
        for attempt in range(self.max_retries + 1):
            tries = attempt + 1
            if attempt:
                delay = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))
                await asyncio.sleep(delay * (0.5 + self._rng.random() / 2))
            self.attempts += 1
            try:
                async with asyncio.timeout(self.timeout_s):
                    endpoint = self._client().completions if kind == "completions" else self._client().chat.completions
                    resp = await endpoint.create(model=self.model, extra_body=extra, **known)
                return resp.model_dump()
            except (TimeoutError, openai.APITimeoutError):
                last = f"no response within {self.timeout_s}s"
            except openai.APIConnectionError as exc:
                last = f"connection failed ({exc.__cause__ or exc})"
            except openai.APIStatusError as exc:
                last = f"HTTP {exc.status_code}: {exc.message}"
                if exc.status_code < 500 and exc.status_code not in _RETRY_STATUS:
                    break
        raise PolicyError(f"{self.name}: {kind} request failed after {tries} attempt(s): {last}")

    # ------------------------------------------------------------ generate

    async def generate(
        self, prompt: Prompt, sampling: SamplingParams, budget: ThinkingBudget | None = None
    ) -> Generation:
        start = time.monotonic()
        mode = self.mode if self.mode != "auto" else ("completions" if prompt.token_ids else "chat")
        if mode == "completions":
            if not prompt.token_ids:
                raise PolicyError(f"{self.name}: completions mode needs Prompt.token_ids")
            g = await self._completions(list(prompt.token_ids), sampling, budget)
        else:
            if not prompt.messages:
                raise PolicyError(f"{self.name}: chat mode needs Prompt.messages")
            g = await self._chat(prompt, sampling)
            if budget is not None:  # said, not silently dropped: chat mode cannot insert the close tag
                g = _replace(g, extra={**g.extra, "budget_enforced": False})
        return _replace(g, latency_s=time.monotonic() - start)

    def _base(self, sampling: SamplingParams, max_tokens: int, stop: Sequence[str], seed: int | None) -> dict[str, Any]:
        body: dict[str, Any] = {"max_tokens": max_tokens, "temperature": sampling.temperature, "top_p": sampling.top_p}
        if stop:
            body["stop"] = list(stop)
        if seed is not None:
            body["seed"] = seed
        return body

    def _choice(self, resp: dict[str, Any]) -> tuple[dict[str, Any], list[int], list[float]]:
        """The single choice, its sampled ids and logprobs, from whichever fields the server filled."""
        choices = resp.get("choices") or []
        if len(choices) != 1:
            raise PolicyError(f"{self.name}: expected one choice, got {len(choices)}")
        choice = choices[0]
        lp = choice.get("logprobs") or {}
        if "content" in lp:  # chat shape
            entries = lp.get("content") or []
            tokens = [e.get("token") for e in entries]
            logps = [float(e.get("logprob", 0.0)) for e in entries]
        else:
            tokens = list(lp.get("tokens") or [])
            logps = [float(x) if x is not None else 0.0 for x in lp.get("token_logprobs") or []]
        ids = choice.get("token_ids")
        if ids is None and tokens and all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
            ids = [int(t.split(":", 1)[1]) for t in tokens]
        if ids is None:
            if self.require_token_ids:
                raise PolicyError(f"{self.name}: the server returned no token ids (needs vLLM's return_token_ids)")
            ids = []
        ids = [int(t) for t in ids]
        if len(logps) != len(ids):
            if self.require_token_ids or logps:
                raise PolicyError(f"{self.name}: {len(ids)} token ids but {len(logps)} logprobs in the response")
            logps = [0.0] * len(ids)
        return choice, ids, logps

    def _resp_version(self, resp: dict[str, Any]) -> tuple[int, str]:
        """``(version, source)``: the server's ``agentenv.policy_version``, else this policy's own version."""
        ext = resp.get("agentenv")
        if not isinstance(ext, Mapping) or ext.get("policy_version") is None:
            return self._version, "policy"
        raw = ext["policy_version"]
        if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
            raise PolicyError(f"{self.name}: the response's agentenv.policy_version must be an int >= 0, got {raw!r}")
        self.last_server_version = raw
        return raw, "server"

    async def _chat(self, prompt: Prompt, sampling: SamplingParams) -> Generation:
        body = self._base(sampling, sampling.max_new_tokens, sampling.stop, sampling.seed)
        body.update(messages=[dict(m) for m in prompt.messages], logprobs=True)
        if prompt.tools:
            body["tools"] = [dict(t) for t in prompt.tools]
        resp = await self._request("chat", body)
        choice, ids, logps = self._choice(resp)
        message = choice.get("message") or {}
        calls = tuple(message.get("tool_calls") or ())
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        version, source = self._resp_version(resp)
        return Generation(
            text=message.get("content") or "",
            token_ids=tuple(ids),
            logprobs=tuple(logps),
            finish_reason=FinishReason.LENGTH if choice.get("finish_reason") == "length" else FinishReason.STOP,
            policy_version=version,
            tool_calls=calls,
            extra={"reasoning_content": reasoning, "prompt_token_ids": resp.get("prompt_token_ids"), "version_source": source},
        )

    async def _completions(self, prompt_ids: list[int], sampling: SamplingParams, budget: ThinkingBudget | None) -> Generation:
        if budget is not None and self.tokenizer is None:
            raise PolicyError(f"{self.name}: a thinking budget in completions mode needs OpenAIPolicy(tokenizer=...)")
        inside, close_ids = False, []
        if budget is not None and self.tokenizer is not None:
            inside = _inside(_turn_tail(self.tokenizer, prompt_ids), budget)
            close_ids = list(self.tokenizer.encode(budget.close_tag, add_special_tokens=False))
        out: list[int] = []
        logps: list[float] = []
        mask: list[int] = []
        text = ""
        thinking, phase, closed = 0, 0, False
        finish = FinishReason.LENGTH
        versions: list[int] = []
        source = "policy"
        while len(out) < sampling.max_new_tokens:
            room = sampling.max_new_tokens - len(out)
            stops = list(sampling.stop)
            if budget is not None:
                left = budget.max_thinking_tokens - thinking
                if inside and left <= 0:
                    forced = close_ids[:room]
                    out += forced
                    logps += [0.0] * len(forced)
                    mask += [0] * len(forced)
                    text += budget.close_tag if len(forced) == len(close_ids) else ""
                    inside, closed = False, True
                    if len(out) >= sampling.max_new_tokens:
                        finish = FinishReason.BUDGET
                    continue
                room = min(room, left) if inside else room
                stops.append(budget.close_tag if inside else budget.open_tag)
            seed = None if sampling.seed is None else sampling.seed + phase
            body = self._base(sampling, room, stops, seed)
            body.update(prompt=prompt_ids + out, logprobs=1)
            resp = await self._request("completions", body)
            choice, ids, lps = self._choice(resp)
            version, source = self._resp_version(resp)
            versions.append(version)
            piece = str(choice.get("text") or "")
            out += ids
            logps += lps
            mask += [1] * len(ids)
            text += piece
            thinking += len(ids) if inside else 0
            phase += 1
            reason = choice.get("finish_reason")
            if budget is not None and reason == "stop" and not any(piece.endswith(s) for s in sampling.stop if s):
                if inside and piece.endswith(budget.close_tag):
                    inside = False
                    continue
                if not inside and piece.endswith(budget.open_tag):
                    inside = True
                    continue
            if reason == "length" and budget is not None and inside and thinking >= budget.max_thinking_tokens:
                continue  # the budget, not max_new_tokens, cut this phase: close and go on
            finish = FinishReason.LENGTH if reason == "length" else FinishReason.STOP
            break
        return Generation(
            text=text,
            token_ids=tuple(out),
            logprobs=tuple(logps),
            finish_reason=finish,
            policy_version=min(versions) if versions else self._version,
            thinking_tokens=thinking if budget is not None else 0,
            sampled_mask=tuple(mask) if 0 in mask else (),
            budget_closed=closed,
            extra={"requests": phase, "version_source": source,
                   **({"policy_versions": versions} if len(set(versions)) > 1 else {})},
        )


_KNOWN: dict[str, frozenset[str]] = {
    "completions": frozenset({"prompt", "max_tokens", "temperature", "top_p", "stop", "seed", "logprobs"}),
    "chat": frozenset({"messages", "tools", "max_tokens", "temperature", "top_p", "stop", "seed", "logprobs"}),
}


def _inside(text: str, budget: ThinkingBudget) -> bool:
    return text.rfind(budget.open_tag) > text.rfind(budget.close_tag)


def _turn_tail(tokenizer: PreTrainedTokenizerBase, ids: Sequence[int]) -> str:
    eot = tokenizer.convert_tokens_to_ids(EOT)
    last = max((i for i, t in enumerate(ids) if t == eot), default=-1)
    return str(tokenizer.decode(list(ids[last + 1 :]), skip_special_tokens=False))


def _replace(g: Generation, **changes: Any) -> Generation:
    return replace(g, **changes)


__all__ = ["OpenAIPolicy"]
