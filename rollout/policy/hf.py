"""``HFPolicy``: a local Hugging Face causal LM as a ``Policy`` (CPU or GPU).

Sampling is our own loop over the model with a KV cache (not ``generate``),
because three things must be exact and ``generate`` hides them: the reported
logprob, the thinking-budget insertion, and stop strings on token boundaries.

**The logprob.** For a sampled token ``y_t`` after context ``x_<t`` the
reported value is::

    logprob_t = log_softmax(float32(logits(x_<t)) / T)[y_t]      (T > 0)
    logprob_t = log_softmax(float32(logits(x_<t)))[y_t]          (T == 0, greedy)

over the *full* vocabulary: the temperature-scaled distribution *before* top-p
truncation. Top-p only decides which token is drawn (from the nucleus,
renormalised); the reported number is not the nucleus probability. The learner
recomputes exactly this quantity with one forward pass over prompt + completion
(logits cast to fp32, divided by the same T). Tokens the policy inserted (the
close tag a thinking budget forces) are not sampled: ``Generation.sampled_mask``
is 0 there and their logprob is 0.0.

**Stopping.** A turn ends at an end-of-turn token (kept as the last token: the
episode renderer expects it), at the first stop string in the decoded
completion (the token that completes it is kept, whole: tokens are never cut,
so ``text`` may run a few characters past the stop string), or at
``max_new_tokens``.

**Thinking budget.** The policy counts the tokens it samples while inside the
open thinking tag (the prompt may already have opened it). When
``max_thinking_tokens`` of them are spent and the thinking is still open, it
appends ``close_tag``'s tokens itself (mask 0), feeds them through the model
and keeps sampling, so the model must act.

**Seeds.** ``SamplingParams.seed`` set: each turn draws from its own
``torch.Generator`` seeded by ``turn_seed(seed, turn)``, so concurrent episodes
never share an RNG stream and a rerun samples the same tokens. ``None``: a
fresh nondeterministic seed per turn.

**Weights.** ``load_state_dict(state, version)`` copies new weights in place
under a writer lock; ``generate`` holds the reader side for its whole turn, so a
turn sees exactly one version, and ``Generation.policy_version`` names it.

**The engine (default).** For a supported model family (``rollout.engine_model.
supports``: Qwen2/3, Llama, Mistral) every turn goes to one ``rollout.engine.
Engine`` owned by the policy, so all the episodes in flight on a worker decode
together in one batch, on CPU too. The rules above hold unchanged (same
logprob, stops, budget, one version per turn: a weight load waits for the
turns in flight, ``Engine.update_weights(mode="wait")``); only the draw
differs: a turn's ``turn_seed`` seeds the uniforms of an inverse-CDF sampler
(``rollout.engine_sampling``), so a seeded turn samples the same tokens alone
or in any batch. ``engine=False`` (or an unsupported model) is the
one-sequence-per-turn loop below, ``torch.multinomial`` on the turn's generator.

>>> policy = HFPolicy("tiny")                                              # doctest: +SKIP
>>> gen = await policy.generate(Prompt(token_ids=ids), SamplingParams(seed=1, stop=("</tool_call>",)))
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Literal

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from rollout.engine import Engine, EngineError, EngineOutput, EngineRequest
from rollout.engine_model import supports
from rollout.policy.models import load_model, place
from rollout.policy.types import FinishReason, Generation, Policy, PolicyError, Prompt, SamplingParams, ThinkingBudget
from rollout.tokenizer import EOT


class _VersionLock:
    """Readers (turns) share; a writer (weight swap) waits for them and blocks new ones."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writing = False
        self._writers_waiting = 0

    @contextmanager
    def read(self) -> Iterator[None]:
        with self._cond:
            while self._writing or self._writers_waiting:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    @contextmanager
    def write(self) -> Iterator[None]:
        with self._cond:
            self._writers_waiting += 1
            try:
                while self._writing or self._readers:
                    self._cond.wait()
            finally:
                self._writers_waiting -= 1
            self._writing = True
        try:
            yield
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()


def pick_token(
    logits_V: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator
) -> tuple[int, float]:
    """Draw one token; return it with its reported logprob (untruncated, at temperature)."""
    logits_V = logits_V.float()
    if temperature <= 0:
        token = int(torch.argmax(logits_V))
        return token, float(torch.log_softmax(logits_V, dim=-1)[token])
    logp_V = torch.log_softmax(logits_V / temperature, dim=-1)
    probs_V = logp_V.exp()
    if top_p < 1.0:
        sorted_V, order_V = torch.sort(probs_V, descending=True, stable=True)
        before_V = torch.cumsum(sorted_V, dim=-1) - sorted_V
        keep_V = before_V < top_p  # the smallest prefix whose mass reaches top_p (first always kept)
        probs_V = torch.zeros_like(probs_V).scatter(0, order_V, sorted_V * keep_V)
    token = int(torch.multinomial(probs_V, 1, generator=generator))
    return token, float(logp_V[token])


def turn_seed(seed: int, turn: int) -> int:
    """The generator seed of one turn: a pure function of the episode's ``SamplingParams.seed`` and the turn.

    Each turn gets its own stream (not one stream continued across turns), so a
    turn's tokens depend only on (seed, turn, prompt, weights): never on which
    other episode sampled in between, nor on how many tokens an earlier turn
    drew. ``turn`` is the number of end-of-turn tokens in the prompt, which
    grows by at least one per turn of an episode.
    """
    digest = hashlib.sha256(f"turn:{seed}:{turn}".encode()).digest()
    return int.from_bytes(digest[:8], "big") & ((1 << 63) - 1)


def _check(sampling: SamplingParams) -> None:
    if sampling.temperature < 0:
        raise ValueError(f"SamplingParams.temperature must be >= 0, got {sampling.temperature}")
    if not 0 < sampling.top_p <= 1:
        raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {sampling.top_p}")
    if sampling.max_new_tokens < 0:
        raise ValueError(f"SamplingParams.max_new_tokens must be >= 0, got {sampling.max_new_tokens}")


class HFPolicy(Policy):
    """A local ``transformers`` causal LM behind the ``Policy`` protocol; see the module docstring.

    ``model_or_path`` is a loaded model, a local checkpoint directory, or
    ``"tiny"`` (a fresh seeded tiny model); ``tokenizer`` defaults to the
    checkpoint's. ``stop_token_ids`` defaults to the end-of-turn token (and the
    tokenizer's EOS).
    """

    def __init__(
        self,
        model_or_path: PreTrainedModel | str | os.PathLike[str],
        tokenizer: PreTrainedTokenizerBase | None = None,
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        version: int = 0,
        name: str | None = None,
        stop_token_ids: Sequence[int] | None = None,
        engine: bool | None = None,
        engine_options: Mapping[str, Any] | None = None,
    ) -> None:
        if isinstance(model_or_path, (str, os.PathLike)):
            model, loaded_tok = load_model(str(model_or_path), device=device, dtype=dtype)
            tokenizer = tokenizer if tokenizer is not None else loaded_tok
            self.name = name or f"hf:{model_or_path}"
        else:
            if tokenizer is None:
                raise ValueError("HFPolicy: a tokenizer is required when passing a model object")
            model = model_or_path
            self.name = name or f"hf:{type(model).__name__}"
        self.device = torch.device(device)
        self.model: PreTrainedModel = place(model, self.device, dtype)
        self.tokenizer: PreTrainedTokenizerBase = tokenizer
        self._version = int(version)
        self._lock = _VersionLock()
        self._tok_lock = threading.Lock()  # fast tokenizers may raise "Already borrowed" across threads
        eot = tokenizer.convert_tokens_to_ids(EOT)
        ids = {int(i) for i in (eot, tokenizer.eos_token_id) if isinstance(i, int) and i != tokenizer.unk_token_id}
        self.eot_id = int(eot) if isinstance(eot, int) else next(iter(ids), -1)
        self.stop_token_ids = frozenset(stop_token_ids) if stop_token_ids is not None else frozenset(ids)
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"  # renamed in transformers 5
        if engine and not supports(self.model):
            raise ValueError(f"{self.name}: engine=True but model_type {self.model.config.model_type!r} has no engine forward")
        self.use_engine = supports(self.model) if engine is None else bool(engine)
        self.engine_options = dict(engine_options or {})
        self._engine: Engine | None = None
        self._engine_lock = threading.Lock()

    @property
    def engine(self) -> Engine:
        """The batching engine every turn goes through (started on first use)."""
        if self._engine is None:
            with self._engine_lock:
                if self._engine is None:
                    self._engine = Engine(
                        self.model, self.tokenizer, version=self._version, name=self.name, tokenizer_lock=self._tok_lock,
                        eot_id=self.eot_id, **self.engine_options,
                    )
        return self._engine

    @property
    def in_flight(self) -> int:
        """Turns being generated now (waiting or running)."""
        if self.use_engine:
            return self.engine.running + self.engine.waiting
        return self._lock._readers

    def close(self) -> None:
        """Stop the engine thread (turns still in flight fail); the policy can start a new one later."""
        if self._engine is not None:
            self._engine.close()
            self._engine = None

    # ------------------------------------------------------------ weights

    @property
    def version(self) -> int:
        return self._version

    def load_state_dict(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        """Copy ``state`` into the model in place and set ``version``, between turns.

        Waits for in-flight turns to finish and holds new ones back meanwhile, so
        every ``Generation`` comes from one version only.
        """
        with self._lock.write():
            if self._engine is not None:  # keep-paused (a server's /pause?mode=keep): the frozen turns resume on these
                mode: Literal["wait", "keep"] = "keep" if self._engine.paused_mode == "keep" else "wait"
                self._engine.update_weights(state, int(version), mode=mode)
            else:
                with torch.no_grad():
                    self.model.load_state_dict(dict(state), strict=True)
            self._version = int(version)

    def set_weights(self, weights: Mapping[str, torch.Tensor] | torch.nn.Module, version: int) -> None:
        """``load_state_dict`` taking a module too (e.g. the learner's model object)."""
        state = weights.state_dict() if isinstance(weights, torch.nn.Module) else weights
        self.load_state_dict(state, version)

    # ------------------------------------------------------------ sampling

    async def generate(
        self, prompt: Prompt, sampling: SamplingParams, budget: ThinkingBudget | None = None
    ) -> Generation:
        """One turn; the torch work runs in the engine's thread (or a worker thread) so the event loop stays free."""
        if not self.use_engine:
            return await asyncio.to_thread(self.generate_sync, prompt, sampling, budget)
        start = time.monotonic()
        request, ids = self._request(prompt, sampling, budget)
        try:
            out = await self.engine.generate(request)
        except EngineError as exc:
            raise PolicyError(f"{self.name}: generation failed ({type(exc).__name__}: {exc})") from exc
        return _with_latency(self._generation(out, sampling), time.monotonic() - start)

    def _request(self, prompt: Prompt, sampling: SamplingParams, budget: ThinkingBudget | None) -> tuple[EngineRequest, list[int]]:
        _check(sampling)
        ids = self.prompt_ids(prompt)
        seed = None if sampling.seed is None else turn_seed(int(sampling.seed), sum(t == self.eot_id for t in ids))
        request = EngineRequest(
            prompt_ids=ids, max_new_tokens=sampling.max_new_tokens, temperature=sampling.temperature, top_p=sampling.top_p,
            stop_token_ids=frozenset(self.stop_token_ids), stop=tuple(s for s in sampling.stop if s), seed=seed, budget=budget,
        )
        return request, ids

    def _generation(self, out: EngineOutput, sampling: SamplingParams) -> Generation:
        versions = out.versions
        return Generation(
            text=self._decode(out.token_ids, skip_special=True),
            token_ids=out.token_ids,
            logprobs=out.logprobs,
            finish_reason=out.finish_reason,
            policy_version=min(versions) if versions else self.engine.version,
            thinking_tokens=out.thinking_tokens,
            sampled_mask=out.sampled_mask if 0 in out.sampled_mask else (),
            budget_closed=out.budget_closed,
            token_versions=versions if len(set(versions)) > 1 else (),
            extra={"prompt_tokens": out.prompt_tokens, "temperature": sampling.temperature},
        )

    def prompt_ids(self, prompt: Prompt) -> list[int]:
        """``Prompt.token_ids``, or the chat template's rendering of ``messages`` when none are given."""
        if prompt.token_ids:
            return [int(t) for t in prompt.token_ids]
        if not prompt.messages:
            raise PolicyError(f"{self.name}: the prompt has neither token_ids nor messages")
        with self._tok_lock:
            text = self.tokenizer.apply_chat_template(
                [dict(m) for m in prompt.messages],
                tools=[dict(t) for t in prompt.tools] or None,
                tokenize=False,
                add_generation_prompt=True,
            )
            return list(self.tokenizer.encode(str(text), add_special_tokens=False))

    def generate_sync(
        self, prompt: Prompt, sampling: SamplingParams, budget: ThinkingBudget | None = None
    ) -> Generation:
        """``generate`` without the thread hop (the server and tests call it directly)."""
        if self.use_engine:
            start = time.monotonic()
            request, _ = self._request(prompt, sampling, budget)
            try:
                out = self.engine.generate_sync(request)
            except EngineError as exc:
                raise PolicyError(f"{self.name}: generation failed ({type(exc).__name__}: {exc})") from exc
            return _with_latency(self._generation(out, sampling), time.monotonic() - start)
        _check(sampling)
        start = time.monotonic()
        ids = self.prompt_ids(prompt)
        gen = torch.Generator(device=self.device)
        if sampling.seed is not None:
            gen.manual_seed(turn_seed(int(sampling.seed), sum(t == self.eot_id for t in ids)))
        else:
            gen.seed()
        with self._lock.read():
            version = self._version
            try:
                with torch.inference_mode():
                    gen_out = self._sample(ids, sampling, budget, gen, version)
            except (RuntimeError, IndexError) as exc:  # bad token ids, device OOM, ...
                raise PolicyError(f"{self.name}: generation failed ({type(exc).__name__}: {exc})") from exc
        return _with_latency(gen_out, time.monotonic() - start)

    def _forward(self, ids: Sequence[int], cache: DynamicCache) -> torch.Tensor:
        """Feed ``ids`` after what ``cache`` holds; the next-token logits, shape [V]."""
        input_ids = torch.tensor([list(ids)], dtype=torch.long, device=self.device)
        out = self.model(input_ids=input_ids, use_cache=True, logits_to_keep=1, **{self._cache_kw: cache})
        return out.logits[0, -1]

    def _decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        with self._tok_lock:
            return str(self.tokenizer.decode(list(ids), skip_special_tokens=skip_special))

    def _turn_tail(self, prompt_ids: Sequence[int]) -> str:
        """Text of the prompt after its last end-of-turn token: the current turn so far."""
        last = max((i for i, t in enumerate(prompt_ids) if t == self.eot_id), default=-1)
        return self._decode(prompt_ids[last + 1 :])

    def _sample(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        budget: ThinkingBudget | None,
        gen: torch.Generator,
        version: int,
    ) -> Generation:
        stops = tuple(s for s in sampling.stop if s)
        longest = max((len(s) for s in stops), default=0)
        watch_text = bool(stops) or budget is not None
        tail = self._turn_tail(prompt_ids) if budget is not None else ""
        inside = budget is not None and _inside(tail, budget)
        close_ids: list[int] = []
        if budget is not None:
            with self._tok_lock:
                close_ids = list(self.tokenizer.encode(budget.close_tag, add_special_tokens=False))

        out: list[int] = []
        mask: list[int] = []
        logps: list[float] = []
        thinking = 0
        closed = False
        finish = FinishReason.LENGTH
        text = ""
        cache = DynamicCache(config=self.model.config)
        logits_V = self._forward(prompt_ids, cache) if sampling.max_new_tokens else None
        while len(out) < sampling.max_new_tokens and logits_V is not None:
            if budget is not None and inside and thinking >= budget.max_thinking_tokens:
                forced = close_ids[: sampling.max_new_tokens - len(out)]
                out += forced
                mask += [0] * len(forced)
                logps += [0.0] * len(forced)
                closed, inside = True, False
                if len(out) >= sampling.max_new_tokens:
                    finish = FinishReason.BUDGET
                    break
                logits_V = self._forward(forced, cache)
                text = self._decode(out)
                continue
            token, logp = pick_token(logits_V, sampling.temperature, sampling.top_p, gen)
            out.append(token)
            mask.append(1)
            logps.append(logp)
            thinking += int(inside)
            if token in self.stop_token_ids:
                finish = FinishReason.STOP
                break
            if watch_text:
                before = len(text)
                text = self._decode(out)
                window = text[max(0, before - longest) :]
                if any(s in window for s in stops):
                    finish = FinishReason.STOP
                    break
                if budget is not None:
                    inside = _inside(tail + text, budget)
            logits_V = self._forward([token], cache)
        return Generation(
            text=self._decode(out, skip_special=True),
            token_ids=tuple(out),
            logprobs=tuple(logps),
            finish_reason=finish,
            policy_version=version,
            thinking_tokens=thinking,
            sampled_mask=tuple(mask) if 0 in mask else (),
            budget_closed=closed,
            extra={"prompt_tokens": len(prompt_ids), "temperature": sampling.temperature},
        )


def _inside(text: str, budget: ThinkingBudget) -> bool:
    return text.rfind(budget.open_tag) > text.rfind(budget.close_tag)


def _with_latency(g: Generation, latency_s: float) -> Generation:
    return replace(g, latency_s=latency_s)


__all__ = ["HFPolicy", "pick_token", "turn_seed"]
