"""Token-exact, append-only rendering of a multi-turn episode for a local model.

The rule: the tokens the model sampled are never re-tokenized. The prompt of
turn k+1 is exactly turn k's prompt, plus turn k's sampled completion, plus
the tokens of the observations (tool results) that followed it. Only those
observations are rendered through the chat template, and only as a *delta*:
the text the template adds after the assistant message. So the loss mask is 1
on exactly the sampled tokens, and the logprobs the sampler reported line up
with the ids the learner sees.

Why not just re-render the whole conversation each turn: the model may have
written a tool call differently from how the template would print it (spacing,
key order), and byte-level BPE may merge across the boundary differently.
Either way the learner would train on tokens the model never produced.

Some templates are not append-only -- e.g. they drop the thinking of earlier
assistant turns. ``EpisodeRenderer`` checks, at each observation, that the
template renders the history as a prefix of the history plus the new turn; when
it does not, it closes the current training sample and starts a new one whose
prompt is the template's fresh rendering (mask 0), and counts a ``break``.
Nothing is silently re-tokenized inside a sample.

>>> r = EpisodeRenderer(tokenizer, prompt.messages, prompt.tools)   # doctest: +SKIP
>>> ids = r.prompt_ids()                       # feed to the policy
>>> r.add_completion(sampled_ids, assistant_message, logprobs)
>>> r.add_observations([harness.format_result(res) for res in results])
>>> r.samples                                  # [TokenSample(ids, mask, logprobs)]
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from rollout.tokenizer import EOT


class ChatTokenizer(Protocol):
    """The slice of a ``transformers`` tokenizer this module uses."""

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def encode(self, text: str, **kwargs: Any) -> list[int]: ...

    def convert_tokens_to_ids(self, token: str) -> Any: ...


@dataclass
class TokenSample:
    """One training sample: ``mask[i] == 1`` iff ``ids[i]`` was sampled by the policy."""

    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    prompt_len: int = 0  # tokens of the opening prompt (always mask 0)

    def extend(self, ids: Sequence[int], sampled: bool, logprobs: Sequence[float] | None = None) -> None:
        self.ids.extend(ids)
        self.mask.extend([1 if sampled else 0] * len(ids))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))


class EpisodeRenderer:
    """Accumulates the token sequence(s) of one episode; see the module docstring."""

    def __init__(
        self,
        tokenizer: ChatTokenizer,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        eot: str = EOT,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self.tok = tokenizer
        self.tools = list(tools) if tools else None
        self.kwargs = dict(template_kwargs or {})
        self.eot = eot
        self.eot_id = int(tokenizer.convert_tokens_to_ids(eot))
        self.history: list[dict[str, Any]] = [dict(m) for m in messages]
        self.samples: list[TokenSample] = []
        self.breaks = 0
        self.closed_by_env = 0  # completions cut off before EOT, closed with an unsampled EOT
        self._awaiting_completion = True
        self._new_sample(self._render(self.history, True))

    # ------------------------------------------------------------ template

    def _render(self, messages: Sequence[Mapping[str, Any]], generation_prompt: bool) -> str:
        text = self.tok.apply_chat_template(
            list(messages), tools=self.tools, tokenize=False, add_generation_prompt=generation_prompt, **self.kwargs
        )
        return str(text)

    def _encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def _new_sample(self, prompt_text: str) -> None:
        sample = TokenSample()
        sample.extend(self._encode(prompt_text), sampled=False)
        sample.prompt_len = len(sample.ids)
        self.samples.append(sample)

    # ------------------------------------------------------------ turns

    @property
    def current(self) -> TokenSample:
        return self.samples[-1]

    def prompt_ids(self) -> list[int]:
        """The ids to send to the policy for the next completion."""
        return list(self.current.ids)

    def add_completion(
        self, token_ids: Sequence[int], message: Mapping[str, Any], logprobs: Sequence[float] | None = None
    ) -> None:
        """Append what the policy sampled (mask 1) and remember the parsed assistant message.

        ``message`` is the structured form (``content``, ``reasoning_content``,
        ``tool_calls``) used only to render *later* deltas and to check that the
        template stays append-only; the sampled ids are kept as they are.
        """
        if not self._awaiting_completion:
            raise RuntimeError("add_completion called twice without add_observations in between")
        if logprobs is not None and len(logprobs) != len(token_ids):
            raise ValueError(f"logprobs has {len(logprobs)} entries for {len(token_ids)} sampled tokens")
        self.current.extend(token_ids, sampled=True, logprobs=logprobs)
        if not token_ids or token_ids[-1] != self.eot_id:
            # Cut off (length limit): close the turn so the next observation is well-formed.
            self.current.extend([self.eot_id], sampled=False)
            self.closed_by_env += 1
        self.history.append({"role": "assistant", **dict(message)})
        self._awaiting_completion = False

    def add_observations(self, messages: Sequence[Mapping[str, Any]]) -> None:
        """Append tool results (and any other env messages) plus the next generation prompt."""
        if self._awaiting_completion:
            raise RuntimeError("add_observations called before the turn's completion was added")
        before = self.history[:-1]
        with_turn = self.history
        after = self.history + [dict(m) for m in messages]
        prompt_text = self._render(before, True)
        turn_text = self._render(with_turn, False)
        next_text = self._render(after, True)
        self.history = after
        self._awaiting_completion = True
        if turn_text.startswith(prompt_text) and next_text.startswith(turn_text):
            cut = turn_text.rfind(self.eot)
            glue = turn_text[cut + len(self.eot) :] if cut >= len(prompt_text) else ""
            self.current.extend(self._encode(glue + next_text[len(turn_text) :]), sampled=False)
        else:
            self.breaks += 1
            self._new_sample(next_text)

    def fork(self) -> EpisodeRenderer:
        """An independent copy at this exact point (same tokens, history and counters; the tokenizer shared):
        what a branched or resumed episode continues from (``rollout.branching``)."""
        twin = copy.copy(self)
        twin.history = copy.deepcopy(self.history)
        twin.samples = [TokenSample(list(s.ids), list(s.mask), list(s.logprobs), s.prompt_len) for s in self.samples]
        twin.tools = copy.deepcopy(self.tools)
        twin.kwargs = dict(self.kwargs)
        return twin

    @property
    def sampled_tokens(self) -> int:
        return sum(sum(s.mask) for s in self.samples)


__all__ = ["ChatTokenizer", "EpisodeRenderer", "TokenSample"]
