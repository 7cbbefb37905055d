"""One async episode: a task variant, through one harness, on a warm sandbox, into a ``Trajectory``.

The loop (``EpisodeRunner.run``)::

    sandbox at the variant's pristine state  (rollout.pristine: warm pool + cached setup snapshot)
    prompt = harness.render(instruction, effort)
    repeat under the task's limits (turns, wall time, per-command timeout, token budget):
        generation = await policy.generate(prompt)          # token ids when the policy is local
        turn = harness.parse(generation)                    # malformed calls become tool errors
        for each intent: IntentExecutor on the sandbox      # in a worker thread
        prompt += completion + harness-formatted results    # token-exact (EpisodeRenderer)
    grade_episode(...)                                      # in place once quiesced, or a clean fork
    Trajectory -> store (idempotent by episode id)

A failed episode is a record, never an exception: every way an episode can end
is a ``Status`` with a reason in ``error``. ``sandbox_lost`` (the container died
or hung) is retried ``sandbox_retries`` times from scratch on a fresh sandbox
before it is recorded; ``policy_error`` and ``sandbox_lost`` are not graded;
``truncated`` (turns or tokens spent) and ``timeout`` (wall time) are.

Blocking sandbox and grading calls run in the runner's own thread pool
(``loop.run_in_executor``, like ``asyncio.to_thread`` but sized for many
episodes: the default executor has ``cpu_count + 4`` threads), so many episodes
share one event loop.

A policy may take the episode's context: if it has ``for_episode(ctx)``, the
runner calls it once per attempt and samples from what it returns (the
scripted oracle policy uses this to know its task and harness).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from agentenv.env import NO_CALL_REMINDER
from agentenv.errors import SetupError
from agentenv.grading import grade_episode
from agentenv.intent_exec import EpisodeState, IntentExecutor
from agentenv.intents import Harness, Intent, ParsedTurn, ParseError
from agentenv.types import Episode, Task, Variant, VerifierResult
from rollout.eval.types import policy_fault_is_infrastructure
from rollout.gate import TurnGate
from rollout.harnesses import get_harness
from rollout.harnesses.rendering import EpisodeRenderer
from rollout.policy.types import Generation, Policy, PolicyError, Prompt, SamplingParams, ThinkingBudget
from rollout.pristine import Lease, PristineSandboxes
from rollout.store import TrajectoryStore
from rollout.types import Sample, Status, Timings, Trajectory, Turn
from sandboxes.errors import SandboxError, SandboxLost, SandboxTimeout
from sandboxes.types import Sandbox, SandboxBackend

log = logging.getLogger(__name__)
T = TypeVar("T")
MAX_THREADS = 64
_TASK_CACHE = 256
# The sandbox calls of the current attempt still running in a thread: a cancelled episode (a staleness abort)
# waits for them before its sandbox is released, so no tool call writes after the reset has checked the sandbox.
_IN_THREADS: contextvars.ContextVar[set[Future[Any]] | None] = contextvars.ContextVar("episode_threads", default=None)


@dataclass(frozen=True)
class EpisodeRequest:
    """What to run. ``attempt`` counts reruns of the same ``episode_id`` (a retry after a lost sandbox).

    ``policy`` names which of the runner's policies acts (``""``: its default), and
    ``sampling`` overrides the runner's sampling for this episode: so one runner (a
    Ray worker) serves the oracle warm start, training rollouts and greedy
    evaluations without being rebuilt, and a request says everything that decides
    its result.
    """

    episode_id: str
    run_id: str
    task_id: str
    seed: int
    harness: str
    effort: str | None = None
    group_id: str = ""
    attempt: int = 0
    policy: str = ""
    sampling: SamplingParams | None = None
    # Observations carry no measured quantity (a command's wall time renders as 0.0): what a run with
    # ``trainer.deterministic`` asks for, since a measured duration in a prompt makes the same seed
    # tokenize differently on every run.
    fixed_observations: bool = False
    # The effort level's generation-time cap: thinking is closed after this many tokens in a turn
    # (``ThinkingBudget``; the inserted close tag gets loss mask 0). None: uncapped.
    thinking_budget: int | None = None
    # False: the prompt carries no effort message although ``effort`` is set (an expert of one effort
    # cell is trained, and scores, without it; the effort still selects its budget, style and metrics).
    show_effort: bool = True


@dataclass(frozen=True)
class EpisodeContext:
    """What a policy with ``for_episode`` learns about the episode it is about to play.

    ``sandbox`` is there for tests and debugging hooks (killing it, say); a
    policy that acts on it bypasses the harness and is not a policy any more.
    """

    request: EpisodeRequest
    task: Task
    variant: Variant
    harness: Harness
    sandbox: Sandbox = field(repr=False)


class _Lost(Exception):
    """The sandbox died or hung mid-episode: retried on a fresh one, else ``sandbox_lost``."""


@dataclass
class _Tally:
    """What one attempt accumulates; becomes the Trajectory."""

    turns: list[Turn] = field(default_factory=list)
    tool_errors: int = 0
    completion_tokens: int = 0
    policy_s: float = 0.0
    sandbox_s: float = 0.0
    verifier_s: float = 0.0
    renderer: EpisodeRenderer | None = None

    def samples(self) -> tuple[Sample, ...]:
        if self.renderer is None:
            return ()
        return tuple(Sample(tuple(s.ids), tuple(s.logprobs), tuple(s.mask)) for s in self.renderer.samples)


class EpisodeRunner:
    """Runs episodes of any task through any harness with one policy; see the module docstring.

    Usage::

        runner = EpisodeRunner(ScriptedPolicy(), backend=DockerBackend(), store=TrajectoryStore())
        traj = await runner.run(EpisodeRequest("ep-1", "run-1", "general/answer_number", seed=3, harness="codex"))
        runner.close()
    """

    def __init__(
        self,
        policy: Policy,
        *,
        backend: SandboxBackend,
        tokenizer: Any = None,
        sampling: SamplingParams = SamplingParams(),
        pool_size: int = 2,
        store: TrajectoryStore | None = None,
        sandbox_retries: int = 1,
        grade_in_place: bool = True,
        policies: Mapping[str, Policy] | None = None,
        gate: TurnGate | None = None,
    ) -> None:
        self.policy = policy
        self.policies: dict[str, Policy] = dict(policies or {})
        self.gate = gate
        self.backend = backend
        self.tokenizer = tokenizer
        self.sampling = sampling
        self.store = store
        self.sandbox_retries = sandbox_retries
        self.grade_in_place = grade_in_place
        self.sandboxes = PristineSandboxes(backend, pool_size=pool_size)
        self._threads = ThreadPoolExecutor(max_workers=MAX_THREADS, thread_name_prefix="episode")
        self._tasks: dict[str, Task] = {}

    async def run(self, req: EpisodeRequest) -> Trajectory:
        """Run ``req`` to a ``Trajectory`` (stored if the runner has a store). Never raises for a failed episode."""
        started = time.monotonic()
        attempt, lost = req.attempt, []
        traj: Trajectory
        while True:
            try:
                traj = await self._attempt(replace(req, attempt=attempt), started)
            except _Lost as exc:
                lost.append(f"attempt {attempt}: {exc}")
                if attempt - req.attempt < self.sandbox_retries:
                    attempt += 1
                    continue
                traj = self._record(req, None, Status.SANDBOX_LOST, "; ".join(lost), _Tally(), started)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a bug or a broken task must not kill the worker
                log.exception("episode %s failed outside the loop", req.episode_id)
                traj = self._record(req, None, Status.ERROR, f"runner error: {type(exc).__name__}: {exc}", _Tally(), started)
            break
        if lost and traj.status is not Status.SANDBOX_LOST:
            traj = replace(traj, verifier={**dict(traj.verifier), "retries": lost})
        if self.store is not None:
            try:
                await self._blocking(self.store.put, traj)
            except Exception:  # noqa: BLE001 - the trajectory is still returned; the caller may put it again
                log.exception("could not store episode %s", req.episode_id)
        return traj

    def warm(self, task_ids: list[str], per_image: int) -> int:
        """Load ``task_ids`` and start ``per_image`` sandboxes of each of their images (blocking); returns
        the number of images. Bad task ids raise here, before any episode."""
        return self.sandboxes.warm([self._task(t) for t in task_ids], per_image)

    def close(self) -> None:
        """Destroy every warm sandbox and stop the threads."""
        self.sandboxes.close()
        self._threads.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------ one attempt

    def policy_for(self, req: EpisodeRequest) -> Policy:
        """The policy named by ``req.policy`` (the runner's own when empty); an unknown name is a bug of the caller."""
        if not req.policy:
            return self.policy
        try:
            return self.policies[req.policy]
        except KeyError:
            raise KeyError(
                f"EpisodeRequest.policy: expected one of {sorted(self.policies)} (or '' for the default), got {req.policy!r}"
            ) from None

    async def _attempt(self, req: EpisodeRequest, started: float) -> Trajectory:
        _IN_THREADS.set(set())
        if req.harness.startswith("cli:"):  # a real CLI drives the loop; the gateway records it (rollout.cli_episode)
            from rollout.cli_episode import run_cli_attempt

            return await run_cli_attempt(self, req, started)
        task = self._task(req.task_id)
        variant = task.variant(req.seed)
        harness = get_harness(req.harness)
        tally = _Tally()
        t0 = time.monotonic()
        try:
            lease = await self.sandboxes.acquire_from(self._threads, task, variant)  # a cancellation here leaks nothing
        except SetupError as exc:
            return self._record(req, task, Status.INVALID, f"task setup failed: {exc}", tally, started)
        except (SandboxError, OSError) as exc:
            raise _Lost(f"no sandbox: {type(exc).__name__}: {exc}") from exc
        tally.sandbox_s += time.monotonic() - t0
        try:
            return await self._play(req, task, variant, harness, lease, tally, started)
        except (SandboxLost, SandboxTimeout) as exc:
            raise _Lost(f"{type(exc).__name__}: {exc}") from exc
        finally:
            # Cancelled mid tool call: the thread still runs; let it end before the reset inspects the sandbox.
            running = [f for f in (_IN_THREADS.get() or ()) if not f.done()]
            if running:
                await asyncio.shield(asyncio.gather(*(asyncio.wrap_future(f) for f in running), return_exceptions=True))
            await self._blocking(self.sandboxes.release, lease)

    async def _play(
        self, req: EpisodeRequest, task: Task, variant: Variant, harness: Harness, lease: Lease, tally: _Tally, started: float
    ) -> Trajectory:
        sandbox, limits = lease.sandbox, task.limits
        base = self.policy_for(req)
        bind = getattr(base, "for_episode", None)
        policy: Policy = bind(EpisodeContext(req, task, variant, harness, sandbox)) if callable(bind) else base
        sampling_base = req.sampling or self.sampling
        prompt = harness.render(variant.instruction, req.effort if req.show_effort else None)
        budget = ThinkingBudget(req.thinking_budget) if req.thinking_budget is not None else None
        messages: list[Mapping[str, Any]] = [dict(m) for m in prompt.messages]
        tools = tuple(dict(t) for t in prompt.tools)
        if self.tokenizer is not None:
            tally.renderer = EpisodeRenderer(self.tokenizer, messages, tools)
        state = EpisodeState()
        executor = IntentExecutor(sandbox, default_timeout_s=limits.command_timeout_s, state=state)
        deadline = time.monotonic() + limits.wall_time_s
        status: Status | None = None
        policy_failure = ""  # the policy's own error when it ended the episode (graded as truncated)
        for index in range(limits.max_turns):
            remaining = deadline - time.monotonic()
            budget_left = limits.max_tokens - tally.completion_tokens
            if remaining <= 0:
                status = Status.TIMEOUT
                break
            if budget_left <= 0:
                status = Status.TRUNCATED
                break
            if self.gate is not None:  # held between turns while the learner trains: not charged to the episode
                deadline += await self.gate.wait()
            sampling = replace(sampling_base, max_new_tokens=min(sampling_base.max_new_tokens, budget_left))
            ask = Prompt(tuple(tally.renderer.prompt_ids()) if tally.renderer else (), tuple(messages), tools)
            t0 = time.monotonic()
            try:
                gen = await asyncio.wait_for(policy.generate(ask, sampling, budget), timeout=remaining)
            except TimeoutError as exc:
                tally.policy_s += time.monotonic() - t0
                if time.monotonic() < deadline:  # the policy's own timeout (an HTTP call), not the episode's
                    return self._record(req, task, Status.POLICY_ERROR, f"policy timed out: {exc}", tally, started)
                status = Status.TIMEOUT
                break
            except Exception as exc:  # noqa: BLE001 - PolicyError, or a policy bug: either way the model failed
                tally.policy_s += time.monotonic() - t0
                why = str(exc) if isinstance(exc, PolicyError) else f"{type(exc).__name__}: {exc}"
                if isinstance(exc, PolicyError) and not policy_fault_is_infrastructure(why):
                    # Not the endpoint's fault (a context flood: the prompt the agent's own tool output grew is
                    # over the model's context): the policy's budget is spent, so it is graded and trained on
                    # like a truncated episode, never excluded as infrastructure (no opting out).
                    status, policy_failure = Status.TRUNCATED, why
                    break
                return self._record(req, task, Status.POLICY_ERROR, why, tally, started)
            policy_s = time.monotonic() - t0
            tally.policy_s += policy_s
            parsed = harness.parse({"role": "assistant", "content": gen.text, "tool_calls": list(gen.tool_calls)} if gen.tool_calls else gen.text)
            assistant = _assistant_message(parsed)
            messages.append(assistant)
            n_tokens = self._add_completion(tally, gen, assistant)
            tally.completion_tokens += n_tokens
            observations, turn_errors, n_calls, sandbox_s = await self._act(harness, parsed, executor, deadline, fixed=req.fixed_observations)
            tally.tool_errors += turn_errors
            tally.sandbox_s += sandbox_s
            tally.turns.append(Turn(index, gen.policy_version, policy_s, sandbox_s, len(ask.token_ids), n_tokens, n_calls, turn_errors))
            if state.submitted:
                status = Status.OK
                break
            messages.extend(observations)
            if tally.renderer is not None:
                tally.renderer.add_observations(observations)
        if status is None:
            status = Status.TIMEOUT if time.monotonic() >= deadline else Status.TRUNCATED
        return await self._grade(req, task, variant, sandbox, state, status, tally, started, error=policy_failure)

    async def _act(
        self, harness: Harness, parsed: ParsedTurn, executor: IntentExecutor, deadline: float, *, fixed: bool = False
    ) -> tuple[list[Mapping[str, Any]], int, int, float]:
        """Execute a turn's intents in order; returns (observations, tool errors, calls, sandbox seconds)."""
        observations: list[Mapping[str, Any]] = []
        errors = calls = 0
        spent = 0.0
        for item in _intents(harness, parsed):
            if isinstance(item, ParseError):
                errors += 1
                observations.append(harness.format_error(item))
                continue
            calls += 1
            # A command may ask for longer than the default, never past the episode's wall time.
            executor.max_timeout_s = max(deadline - time.monotonic(), 1.0)
            t0 = time.monotonic()
            result = await self._blocking(executor.execute, item)
            spent += time.monotonic() - t0
            if not result.ok and result.error and result.exit_code is None:
                errors += 1  # the call itself failed (bad path, bad edit); a failing command is not an error
            if fixed and "duration_s" in result.data:
                result = replace(result, data={**result.data, "duration_s": 0.0})
            observations.append(harness.format_result(result))
            if executor.state.submitted:
                break  # nothing after a submit runs
        if not observations:
            observations.append({"role": "user", "content": NO_CALL_REMINDER})
        return observations, errors, calls, spent

    async def _grade(
        self, req: EpisodeRequest, task: Task, variant: Variant, sandbox: Sandbox, state: EpisodeState,
        status: Status, tally: _Tally, started: float, *, error: str = "",
    ) -> Trajectory:
        episode = Episode(task.id, variant, final_answer=state.answer, workdir=sandbox.spec.workdir)
        t0 = time.monotonic()
        result: VerifierResult = await self._blocking(
            functools.partial(
                grade_episode, self.backend, sandbox, task, episode,
                restore=self.sandboxes.grading_restore, discard=self.sandboxes.grading_discard,
                in_place=self.grade_in_place, pristine=functools.partial(self.sandboxes.pristine_copy, task, variant),
            )
        )
        tally.verifier_s += time.monotonic() - t0
        if result.invalid:
            alive = getattr(sandbox, "alive", None)
            if callable(alive) and not await self._blocking(alive):
                raise _Lost(f"sandbox died before grading ({result.reason})")
            if result.invalid_cause != "agent":  # the grader's or the task's failure: says nothing of the policy
                return self._record(req, task, Status.INVALID, result.reason, tally, started, result)
            # The agent's final state made grading impossible (a hang, os._exit, SkipTest, a FIFO where a
            # file is graded): a failure with reward 0 under the episode's own status, flagged, never dropped.
        return self._record(req, task, status, error, tally, started, result)

    # ------------------------------------------------------------ helpers

    def _add_completion(self, tally: _Tally, gen: Generation, assistant: Mapping[str, Any]) -> int:
        """Append the turn's tokens to the renderer; returns the completion's token count.

        A policy without token ids (a server's text, the scripted policy) gets
        its text encoded, with logprob 0.0 and mask 1: the text *is* its action,
        which is what warm-start SFT trains on. Tokens the policy inserted
        (``Generation.sampled_mask`` 0, a forced ``</think>``) get mask 0.
        """
        renderer = tally.renderer
        if renderer is None:
            return len(gen.token_ids) or max(len(gen.text) // 4, 1)  # no tokenizer: a rough budget count
        if gen.token_ids:
            ids, lps, mask = list(gen.token_ids), list(gen.logprobs), list(gen.loss_mask)
        else:
            ids = list(self.tokenizer.encode(gen.text, add_special_tokens=False)) + [renderer.eot_id]
            lps, mask = [0.0] * len(ids), [1] * len(ids)
        sample = renderer.current
        at = len(sample.ids)
        renderer.add_completion(ids, assistant, lps)
        for i, m in enumerate(mask):
            if not m:
                sample.mask[at + i], sample.logprobs[at + i] = 0, 0.0
        return len(ids)

    def _record(
        self, req: EpisodeRequest, task: Task | None, status: Status, error: str, tally: _Tally, started: float,
        result: VerifierResult | None = None,
    ) -> Trajectory:
        versions = [t.policy_version for t in tally.turns]
        verifier: dict[str, Any] = {"attempt": req.attempt, "group_id": req.group_id}
        if result is not None:
            verifier.update(_result_dict(result))
        if tally.renderer is not None:
            verifier.update(template_breaks=tally.renderer.breaks, closed_by_env=tally.renderer.closed_by_env)
        return Trajectory(
            episode_id=req.episode_id,
            run_id=req.run_id,
            task_id=req.task_id,
            domain=task.domain.value if task is not None else "",
            seed=req.seed,
            harness=req.harness,
            effort=req.effort or "",
            policy_version=min(versions) if versions else int(self._version_of(req)),
            status=status,
            reward=float(result.reward) if result is not None and status is not Status.INVALID and not result.invalid else 0.0,
            error=error,
            verifier=verifier,
            samples=tally.samples(),
            turns=tuple(tally.turns),
            tool_errors=tally.tool_errors,
            timings=Timings(tally.policy_s, tally.sandbox_s, tally.verifier_s, time.monotonic() - started),
        )

    def _task(self, task_id: str) -> Task:
        task = self._tasks.get(task_id)
        if task is None:
            from agentenv.registry import get_task

            task = get_task(task_id)
            if len(self._tasks) >= _TASK_CACHE:
                self._tasks.pop(next(iter(self._tasks)))
            self._tasks[task_id] = task
        return task

    def _version_of(self, req: EpisodeRequest) -> int:
        try:
            return int(self.policy_for(req).version)
        except KeyError:
            return int(self.policy.version)

    async def _blocking(self, fn: Callable[..., T], *args: Any) -> T:
        future = self._threads.submit(functools.partial(fn, *args))
        running = _IN_THREADS.get()
        if running is not None:
            running.add(future)
            future.add_done_callback(running.discard)
        return await asyncio.wrap_future(future)


def _intents(harness: Harness, parsed: ParsedTurn) -> list[Intent | ParseError]:
    """The turn's intents then its errors (a text turn is a submit where the harness says so)."""
    turn_intents = getattr(harness, "turn_intents", None)
    if callable(turn_intents):
        return list(turn_intents(parsed))
    return [harness.to_intent(c) for c in parsed.calls] + list(parsed.errors)


def _assistant_message(parsed: ParsedTurn) -> dict[str, Any]:
    """The chat form of the model's turn, for chat-format policies and the template's later deltas."""
    message: dict[str, Any] = {"role": "assistant", "content": parsed.text}
    if parsed.reasoning:
        message["reasoning_content"] = parsed.reasoning
    if parsed.calls:
        message["tool_calls"] = [
            {"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": json.dumps(dict(c.arguments), ensure_ascii=False)}}
            for c in parsed.calls
        ]
    return message


def _result_dict(result: VerifierResult) -> dict[str, Any]:
    return {
        "reward": result.reward,
        "passed": result.passed,
        "invalid": result.invalid,
        "invalid_cause": result.invalid_cause,  # "agent": counted as a failure; "grader": status invalid, excluded
        "agent_invalid": result.invalid and result.invalid_cause == "agent",
        "invalid_evidence": result.extra.get("invalid_evidence"),  # why an invalid is the grader's (or not): agentenv.grading
        **{k: result.extra[k] for k in ("tampering", "neutralised") if k in result.extra},
        "reason": result.reason,
        "details": [{"name": d.name, "passed": d.passed, "score": d.score, "detail": d.detail} for d in result.details],
        "duration_s": result.duration_s,
        "graded_in": result.extra.get("graded_in"),  # "place" (quiesced agent sandbox) or "fork"
    }


__all__ = ["EpisodeContext", "EpisodeRequest", "EpisodeRunner"]
