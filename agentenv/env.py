"""The single-env API: one task, one harness, one sandbox, as a ``gymnasium.Env``.

Actions are the model's raw output text; observations are text. Why text both
ways: the harness owns the format (tool-call syntax in, tool-result style
out), so the env stays the same whichever harness a model is trained through.

* ``reset(seed=)`` picks the variant (same seed, same variant), creates a fresh
  sandbox, runs the task's setup and returns the prompt rendered by the
  harness (its system prompt, then the instruction). ``info["prompt"]`` holds
  the structured messages and tool schemas for chat-format policies.
* ``step(action)`` parses the output through the harness and executes each
  call as a canonical intent. Malformed output -- including the random text
  ``gymnasium.utils.env_checker.check_env`` sends -- is data: it comes back as
  the harness's tool-error message, never as an exception. A turn is read as
  the rollout's episode runner reads it, through the harness's ``turn_intents``
  (``Harness`` has a default): on a harness whose episodes end with a turn of plain text
  (Claude Code, Codex, Kimi) that turn submits its text as the answer. Elsewhere
  a turn with no tool call gets a short reminder and does not end the episode.
* Reward is 0 until the episode ends. It ends *terminated* when the agent
  submits, *truncated* when it runs out of turns or wall time (Gymnasium's
  distinction: truncation is a limit of the experiment, not an outcome of the
  task). Either way the verifiers then grade a sandbox forked from the final
  state, and ``info["verifier"]`` carries their result.
* A sandbox lost mid-episode ends it (truncated, reward 0, ``info["error"]``):
  a failed episode is a record, not a crash.

Usage::

    env = agentenv.make("general/sum_csv", harness="bash", backend="local")
    obs, info = env.reset(seed=3)
    obs, reward, terminated, truncated, info = env.step(model_output)
    env.close()
"""

from __future__ import annotations

import importlib.metadata
import json
import string
import time
from collections.abc import Mapping
from typing import Any

import gymnasium
from gymnasium.spaces import Text

from agentenv.errors import BackendNotFound, EpisodeStateError, HarnessNotFound, did_you_mean
from agentenv.intent_exec import EpisodeState, IntentExecutor
from agentenv.intents import Harness, Intent, IntentResult, ParsedTurn, ParseError, RenderedPrompt
from agentenv.types import Episode, Task, Variant, VerifierResult
from sandboxes.errors import SandboxError
from sandboxes.types import Sandbox, SandboxBackend, runs_images

HARNESS_GROUP = "agentenv.harnesses"
MAX_ACTION_CHARS = 4096
MAX_OBSERVATION_CHARS = 1_000_000
NO_CALL_REMINDER = "No tool call found in your reply. Call a tool to act, or submit when you are done."


class OpenText(Text):
    """A ``Text`` space that contains any string up to ``max_length`` characters.

    Model output and tool results hold any Unicode character, which no finite
    charset covers; sampling still draws from printable ASCII, which is what a
    random agent (and the env checker) should send.
    """

    def __init__(self, max_length: int, *, min_length: int = 0) -> None:
        super().__init__(max_length, min_length=min_length, charset=string.printable)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length


def resolve_harness(harness: str | Harness) -> Harness:
    """A harness object, or the one registered under this name in ``agentenv.harnesses``.

    Resolved by entry point, not by import, because ``agentenv`` may not import
    ``rollout`` (where the harnesses live).
    """
    if not isinstance(harness, str):
        return harness
    eps = {ep.name: ep for ep in importlib.metadata.entry_points(group=HARNESS_GROUP)}
    ep = eps.get(harness)
    if ep is None:
        raise HarnessNotFound(f"harness {harness!r} is not registered{did_you_mean(harness, eps)}; known: {', '.join(sorted(eps))}")
    try:
        obj = ep.load()
    except (ImportError, AttributeError) as exc:
        raise HarnessNotFound(f"harness {harness!r} ({ep.value}) cannot be loaded: {exc}") from exc
    return obj() if isinstance(obj, type) else obj


def resolve_backend(backend: str | SandboxBackend) -> tuple[SandboxBackend, bool]:
    """The backend object and whether the caller now owns it (and must close it)."""
    if not isinstance(backend, str):
        return backend, False
    from sandboxes.backends import make_backend
    from sandboxes.errors import UnknownBackend

    try:
        return make_backend(backend), True
    except UnknownBackend as exc:
        raise BackendNotFound(str(exc)) from None


def message_text(message: Mapping[str, Any]) -> str:
    """The text of a chat message whose content is a string or a list of parts."""
    content = message.get("content", "")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text", "") if isinstance(p, Mapping) else str(p) for p in content]
        return "\n".join(p for p in parts if p)
    return json.dumps(content, default=str)


def prompt_text(prompt: RenderedPrompt) -> str:
    """The rendered prompt as one text: each message under its role."""
    return "\n\n".join(f"[{m.get('role', 'user')}]\n{message_text(m)}" for m in prompt.messages)


class TaskEnv(gymnasium.Env[str, str]):
    """One task through one harness on one backend; see the module docstring."""

    metadata = {"render_modes": ["ansi"]}

    def __init__(
        self,
        task: Task,
        harness: Harness,
        backend: SandboxBackend,
        *,
        seed: int | None = None,
        effort: str | None = None,
        owns_backend: bool = False,
        render_mode: str | None = None,
    ) -> None:
        self.task = task
        self.harness = harness
        self.backend = backend
        self.effort = effort
        self.default_seed = seed
        self.render_mode = render_mode
        self.action_space = OpenText(MAX_ACTION_CHARS)
        self.observation_space = OpenText(MAX_OBSERVATION_CHARS)
        self._owns_backend = owns_backend
        self._build = runs_images(backend)
        self.sandbox: Sandbox | None = None
        self.variant: Variant | None = None
        self._executor: IntentExecutor | None = None
        self._state = EpisodeState()
        self._turns = 0
        self._started = 0.0
        self._done = True
        self._last_obs = ""

    # ---------------------------------------------------------------- gymnasium API

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode on variant ``seed`` (else the env's seed, else one drawn from ``np_random``)."""
        super().reset(seed=seed)
        if seed is None:
            seed = self.default_seed if self.default_seed is not None else int(self.np_random.integers(0, 2**31 - 1))
        self._close_sandbox()
        self.variant = self.task.variant(int(seed))
        self.sandbox = self.backend.create(self.task.sandbox_spec(build=self._build))
        self.task.setup(self.sandbox, self.variant)
        limits = self.task.limits
        self._state = EpisodeState()
        self._executor = IntentExecutor(
            self.sandbox,
            default_timeout_s=limits.command_timeout_s,
            max_timeout_s=max(limits.command_timeout_s, limits.wall_time_s),
            state=self._state,
        )
        self._turns = 0
        self._started = time.monotonic()
        self._done = False
        prompt = self.harness.render(self.variant.instruction, self.effort)
        self._last_obs = self._clip(prompt_text(prompt))
        info = {
            "task_id": self.task.id,
            "seed": self.variant.seed,
            "params": dict(self.variant.params),
            "prompt": {"messages": [dict(m) for m in prompt.messages], "tools": [dict(t) for t in prompt.tools]},
        }
        return self._last_obs, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._done or self._executor is None:
            raise EpisodeStateError("step() called without an episode in progress: call reset() first")
        self._turns += 1
        info: dict[str, Any] = {"turn": self._turns}
        try:
            texts = self._act(action)
        except SandboxError as exc:  # the infrastructure failed, not the model
            self._done = True
            info.update(error=f"{type(exc).__name__}: {exc}", status="sandbox_error")
            self._last_obs = self._clip(f"The environment failed: {exc}")
            return self._last_obs, 0.0, False, True, info
        terminated = self._state.submitted
        truncated = not terminated and (
            self._turns >= self.task.limits.max_turns or time.monotonic() - self._started >= self.task.limits.wall_time_s
        )
        reward = 0.0
        if terminated or truncated:
            self._done = True
            result = self._grade()
            reward = float(result.reward)
            info.update(status="submitted" if terminated else "truncated", verifier=_result_dict(result))
        self._last_obs = self._clip("\n\n".join(texts))
        return self._last_obs, reward, terminated, truncated, info

    def render(self) -> str | None:
        return self._last_obs if self.render_mode == "ansi" else None

    def close(self) -> None:
        """Destroy the sandbox (and the backend, when ``make`` created it)."""
        self._close_sandbox()
        if self._owns_backend:
            self.backend.close()
            self._owns_backend = False
        super().close()

    # ---------------------------------------------------------------- helpers

    def _act(self, action: str | Mapping[str, Any]) -> list[str]:
        assert self._executor is not None
        turn = self.harness.parse(action if isinstance(action, (str, Mapping)) else str(action))
        texts: list[str] = []
        for item in self._intents(turn):
            if isinstance(item, ParseError):
                texts.append(message_text(self.harness.format_error(item)))
                continue
            texts.append(message_text(self.harness.format_result(self._execute(item))))
            if self._state.submitted:
                break  # nothing after a submit runs: the episode is over
        if not texts:
            texts.append(NO_CALL_REMINDER)
        return texts

    def _intents(self, turn: ParsedTurn) -> list[Intent | ParseError]:
        """The turn's intents then its errors, as the rollout's attempts take them (``Harness.turn_intents``:
        on a harness that ends with a text turn, that turn is its ``submit``)."""
        return list(self.harness.turn_intents(turn))

    def _execute(self, intent: Intent) -> IntentResult:
        assert self._executor is not None
        return self._executor.execute(intent)

    def _grade(self) -> VerifierResult:
        from agentenv.grading import grade_episode  # owned by the verifiers package

        assert self.sandbox is not None and self.variant is not None
        episode = Episode(
            task_id=self.task.id,
            variant=self.variant,
            final_answer=self._state.answer,
            workdir=self.sandbox.spec.workdir,
        )
        return grade_episode(self.backend, self.sandbox, self.task, episode)

    def _close_sandbox(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()
            self.sandbox = None
        self._executor = None

    @staticmethod
    def _clip(text: str) -> str:
        if len(text) <= MAX_OBSERVATION_CHARS:
            return text
        return text[: MAX_OBSERVATION_CHARS - 40] + "\n[... observation truncated ...]"


def _result_dict(result: VerifierResult) -> dict[str, Any]:
    return {
        "reward": result.reward,
        "passed": result.passed,
        "invalid": result.invalid,
        # "agent": the agent's final state made grading impossible: a failure (reward 0), never a pass;
        # "grader": the task's or the infrastructure's fault, which says nothing of the policy
        "invalid_cause": result.invalid_cause,
        "reason": result.reason,
        "details": [
            {"name": d.name, "passed": d.passed, "score": d.score, "detail": d.detail} for d in result.details
        ],
        "duration_s": result.duration_s,
    }


def make(
    task_id: str | Task,
    harness: str | Harness = "bash",
    backend: str | SandboxBackend = "docker",
    seed: int | None = None,
    *,
    effort: str | None = None,
    render_mode: str | None = None,
) -> TaskEnv:
    """A ``gymnasium.Env`` for one task (an id, a path to a task folder, or a ``Task``).

    ``backend`` is ``"docker"``, ``"local"`` or a backend object (which the
    env then uses but does not close). ``seed`` is the variant used when
    ``reset`` is called without one.
    """
    from agentenv.registry import get_task

    task = get_task(task_id) if isinstance(task_id, str) else task_id
    resolved_harness = resolve_harness(harness)
    resolved_backend, owns = resolve_backend(backend)
    return TaskEnv(
        task, resolved_harness, resolved_backend, seed=seed, effort=effort, owns_backend=owns, render_mode=render_mode
    )


__all__ = ["OpenText", "TaskEnv", "make", "message_text", "prompt_text", "resolve_backend", "resolve_harness"]
