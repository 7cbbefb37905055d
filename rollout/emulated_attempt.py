"""The emulated attempt: our loop drives an emulated harness on a warm sandbox, into a ``Trajectory``.

One attempt of an episode over the contract of ``rollout.attempt`` (the other is
``rollout.native_attempt``)::

    sandbox at the variant's pristine state  (rollout.pristine: warm pool + cached setup snapshot)
    prompt = harness.render(instruction, effort)
    repeat under the task's limits (turns, wall time, per-command timeout, token budget):
        generation = await policy.generate(prompt)          # token ids when the policy is local
        turn = harness.parse(generation)                    # malformed calls become tool errors
        for each of harness.turn_intents(turn): IntentExecutor on the sandbox   # in a worker thread
        prompt += completion + harness-formatted results    # token-exact (EpisodeRenderer)
    grade_episode(...)                                      # in place once quiesced, or a clean fork
    Trajectory

Every way the attempt can end is a ``Status`` with a reason in ``error``, except a
lost sandbox (the container died or hung) or a lost inference server (``rollout.policy.served.ServerLost``),
which raise ``EpisodeLost`` for the runner to retry. ``policy_error`` is not graded; ``truncated`` (turns or tokens
spent) and ``timeout`` (wall time) are.

The policy binds to the attempt (``Policy.for_episode``) once its sandbox is
ready, and the attempt samples from what that returns.

Trees and resume (``rollout.branching``): at a turn boundary the attempt may
take a ``Checkpoint`` (a FAST snapshot plus its exact token, harness, message
and policy state). A root publishes the checkpoints of its branch points for
its leaves; a leaf starts from its point's checkpoint in a restored sandbox
instead of the pristine state (or, when that fails, from the pristine state,
the reason recorded); with ``resume_from_snapshots`` a lost sandbox continues
from the newest checkpoint in a new one (``MAX_RESUMES`` times) before it is
``EpisodeLost``.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from agentenv.env import NO_CALL_REMINDER
from agentenv.errors import SetupError
from agentenv.grading import grade_episode
from agentenv.intent_exec import EpisodeState, IntentExecutor
from agentenv.intents import Harness, ParsedTurn, ParseError
from agentenv.types import Episode, Task, Variant, VerifierResult
from rollout.attempt import AttemptHost, EpisodeContext, EpisodeLost, EpisodeRequest, SamplingParams, verifier_record
from rollout.branching import MAX_RESUMES, BranchPlan, Checkpoint, leaves_per_root
from rollout.harnesses import get_harness
from rollout.eval.types import policy_fault_is_infrastructure
from rollout.harnesses.rendering import EpisodeRenderer
from rollout.policy.types import Generation, Policy, PolicyError, Prompt, ThinkingBudget
from rollout.pristine import Lease
from rollout.types import Sample, Status, Timings, Trajectory, Turn
from sandboxes.errors import SandboxError, SandboxLost, SandboxTimeout
from sandboxes.types import Sandbox, SnapshotKind

log = logging.getLogger(__name__)

__all__ = ["Tally", "record", "run_emulated_attempt"]


@dataclass
class Tally:
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


async def run_emulated_attempt(
    host: AttemptHost, req: EpisodeRequest, task: Task, policy: Policy, sampling: SamplingParams, started: float
) -> Trajectory:
    """One attempt of ``req`` through the emulated harness it names; see the module docstring."""
    return await _Attempt(host, req, task, policy, sampling, started).run()


class _Attempt:
    """The state of one emulated attempt (the runner's services, what it was given, what it accumulates).

    The path state (messages, harness state, per-episode policy, deadline) lives on the attempt, so a
    turn boundary can be checkpointed (``rollout.branching.Checkpoint``) and a continuation (a branch
    leaf, or this attempt resumed in a new sandbox) can start from one.
    """

    def __init__(
        self, host: AttemptHost, req: EpisodeRequest, task: Task, policy: Policy, sampling: SamplingParams, started: float
    ) -> None:
        self.host, self.req, self.task, self.base, self.sampling_base, self.started = host, req, task, policy, sampling, started
        self.tally = Tally()
        self.role = req.branch
        self.plan: BranchPlan | None = self.role.plan() if self.role is not None else None
        self.start: Checkpoint | None = None  # where the next ``_play`` continues from (None: the pristine state)
        self.last: Checkpoint | None = None  # this path's newest checkpoint (resume)
        self.checkpoints: dict[int, Checkpoint] = {}  # a root's checkpoints at its plan's turns
        self.surprisal: dict[int, float] = {}  # turn -> mean -logprob of its sampled tokens
        self.leaf: dict[str, Any] = {}  # a leaf's branch record (turn, snapshot, prefix, failures)
        self.resumes: list[dict[str, Any]] = []
        self.messages: list[Mapping[str, Any]] = []
        self.state = EpisodeState()
        self.policy: Policy = policy
        self.deadline = 0.0
        self.tools: tuple[Mapping[str, Any], ...] = ()

    async def run(self) -> Trajectory:
        host, req, task, tally, role = self.host, self.req, self.task, self.tally, self.role
        variant = task.variant(req.seed)
        harness = get_harness(req.harness)
        if role is not None and role.is_root:
            host.trees.started(role.root)
        try:
            lease: Lease | None = await self._open_leaf(task) if role is not None and not role.is_root else None
            if lease is None:
                t0 = time.monotonic()
                try:
                    lease = await host.acquire(task, variant)  # a cancellation here leaks nothing
                except SetupError as exc:
                    return self._record(Status.INVALID, f"task setup failed: {exc}")
                except (SandboxError, OSError) as exc:
                    raise EpisodeLost(f"no sandbox: {type(exc).__name__}: {exc}") from exc
                tally.sandbox_s += time.monotonic() - t0
            return await self._play_resuming(variant, harness, lease)
        finally:
            if role is not None and role.is_root and self.plan is not None:
                host.trees.finish(role.root, self.plan.points, f"the root {role.root} ended before this point "
                                  f"(after {len(tally.turns)} turns)")

    async def _play_resuming(self, variant: Variant, harness: Harness, lease: Lease) -> Trajectory:
        """``_play`` on ``lease``; a lost sandbox continues from the newest checkpoint in a new one when asked."""
        host, req, task = self.host, self.req, self.task
        current: Lease | None = lease
        try:
            while True:
                assert current is not None  # noqa: S101 - set on every way into the loop
                try:
                    return await self._play(variant, harness, current)
                except (SandboxLost, SandboxTimeout) as exc:
                    why = f"{type(exc).__name__}: {exc}"
                    cp = self.last
                    if not req.resume_from_snapshots or cp is None or len(self.resumes) >= MAX_RESUMES:
                        raise EpisodeLost(why) from exc
                    await host.quiesce()
                    dead, current = current, None
                    await host.blocking(host.sandboxes.release, dead)
                    t0 = time.monotonic()
                    try:
                        current = await host.restore(task, cp.ref)
                    except (SandboxError, OSError) as exc2:
                        raise EpisodeLost(f"{why}; resume from snapshot {cp.ref.id} failed: {exc2}") from exc2
                    finally:
                        self.tally.sandbox_s += time.monotonic() - t0
                    self.resumes.append({"turn": cp.turn, "snapshot": cp.ref.id, "reason": why,
                                         "turns_saved": len(cp.turns)})
                    log.info("episode %s resumed after turn %d from snapshot %s (%s)", req.episode_id, cp.turn, cp.ref.id, why)
                    self.start = cp
                    # What the lost sandbox did after ``cp`` is gone: its later checkpoints and scores with it.
                    self.checkpoints = {t: c for t, c in self.checkpoints.items() if t <= cp.turn}
                    self.surprisal = {t: v for t, v in self.surprisal.items() if t <= cp.turn}
        finally:
            await host.quiesce()  # cancelled mid tool call: let the thread end before the reset inspects the sandbox
            if current is not None:
                await host.blocking(host.sandboxes.release, current)

    async def _open_leaf(self, task: Task) -> Lease | None:
        """A leaf's sandbox at its point's snapshot (and ``self.start`` set), or None to run from scratch
        because the point failed or its snapshot could not be restored (the reason is recorded)."""
        host, req, role = self.host, self.req, self.role
        assert role is not None and self.plan is not None  # noqa: S101 - only leaves come here
        self.leaf = {"turn": None, "snapshot": None, "prefix_turns": 0, "prefix_tokens": 0, "failed": []}
        got = await host.trees.wait(role.root, role.point, host.leaf_wait_s(req))
        if isinstance(got, str):
            self.leaf["failed"].append(got)
            return None
        if (got.harness, got.effort) != (req.harness, req.effort):
            self.leaf["failed"].append(f"the root ran {got.harness}/{got.effort}, this leaf asks {req.harness}/{req.effort}")
            return None
        t0 = time.monotonic()
        try:
            lease = await host.restore(task, got.ref)
        except (SandboxError, OSError) as exc:
            self.leaf["failed"].append(f"restore of snapshot {got.ref.id} (turn {got.turn}) failed: {type(exc).__name__}: {exc}")
            return None
        finally:
            self.tally.sandbox_s += time.monotonic() - t0
        self.start = got
        self.leaf.update(turn=got.turn, snapshot=got.ref.id, prefix_turns=len(got.turns), prefix_tokens=got.prefix_tokens)
        return lease

    async def _play(self, variant: Variant, harness: Harness, lease: Lease) -> Trajectory:
        req, task, tally, host = self.req, self.task, self.tally, self.host
        sandbox, limits = lease.sandbox, task.limits
        sampling_base = self.sampling_base
        first = 0
        cp, self.start = self.start, None
        if cp is None:
            self.policy = self.base.for_episode(EpisodeContext(req, task, variant, harness, sandbox))
            prompt = harness.render(variant.instruction, req.effort if req.show_effort else None)
            self.messages = [dict(m) for m in prompt.messages]
            self.state = EpisodeState()
            if host.tokenizer is not None:
                tally.renderer = EpisodeRenderer(host.tokenizer, self.messages, tuple(dict(t) for t in prompt.tools))
            self.deadline = time.monotonic() + limits.wall_time_s
            tools: tuple[Mapping[str, Any], ...] = tuple(dict(t) for t in prompt.tools)
        else:  # a continuation: the exact token prefix, harness state, messages and per-episode policy of ``cp``
            tally.renderer, self.messages, self.state, self.policy = cp.take()
            tally.turns, tally.tool_errors, tally.completion_tokens = list(cp.turns), cp.tool_errors, cp.completion_tokens
            self.deadline = time.monotonic() + cp.remaining_s
            tools = cp.tools
            first = cp.turn + 1
        self.tools = tools
        policy, messages, state = self.policy, self.messages, self.state
        budget = ThinkingBudget(req.thinking_budget) if req.thinking_budget is not None else None
        executor = IntentExecutor(sandbox, default_timeout_s=limits.command_timeout_s, state=state)
        status: Status | None = None
        policy_failure = ""  # the policy's own error when it ended the episode (graded as truncated)
        for index in range(first, limits.max_turns):
            remaining = self.deadline - time.monotonic()
            budget_left = limits.max_tokens - tally.completion_tokens
            if remaining <= 0:
                status = Status.TIMEOUT
                break
            if budget_left <= 0:
                status = Status.TRUNCATED
                break
            if host.gate is not None:  # held between turns while the learner trains: not charged to the episode
                self.deadline += await host.gate.wait()
            sampling = replace(sampling_base, max_new_tokens=min(sampling_base.max_new_tokens, budget_left))
            ask = Prompt(tuple(tally.renderer.prompt_ids()) if tally.renderer else (), tuple(messages), tools)
            t0 = time.monotonic()
            try:
                gen = await asyncio.wait_for(policy.generate(ask, sampling, budget), timeout=remaining)
            except TimeoutError as exc:
                tally.policy_s += time.monotonic() - t0
                if time.monotonic() < self.deadline:  # the policy's own timeout (an HTTP call), not the episode's
                    return self._record(Status.POLICY_ERROR, f"policy timed out: {exc}")
                status = Status.TIMEOUT
                break
            except EpisodeLost:  # the server under the turn went away (rollout.policy.served): rerun the episode
                raise
            except Exception as exc:  # noqa: BLE001 - PolicyError, or a policy bug: either way the model failed
                tally.policy_s += time.monotonic() - t0
                why = str(exc) if isinstance(exc, PolicyError) else f"{type(exc).__name__}: {exc}"
                if isinstance(exc, PolicyError) and not policy_fault_is_infrastructure(why):
                    # Not the endpoint's fault (a context flood: the prompt the agent's own tool output grew is
                    # over the model's context): the policy's budget is spent, so it is graded and trained on
                    # like a truncated episode, never excluded as infrastructure (no opting out).
                    status, policy_failure = Status.TRUNCATED, why
                    break
                return self._record(Status.POLICY_ERROR, why)
            policy_s = time.monotonic() - t0
            tally.policy_s += policy_s
            self.surprisal[index] = _surprisal(gen)
            parsed = harness.parse({"role": "assistant", "content": gen.text, "tool_calls": list(gen.tool_calls)} if gen.tool_calls else gen.text)
            assistant = _assistant_message(parsed)
            messages.append(assistant)
            n_tokens = self._add_completion(gen, assistant)
            tally.completion_tokens += n_tokens
            observations, turn_errors, n_calls, sandbox_s = await self._act(harness, parsed, executor, self.deadline, fixed=req.fixed_observations)
            tally.tool_errors += turn_errors
            tally.sandbox_s += sandbox_s
            tally.turns.append(Turn(index, gen.policy_version, policy_s, sandbox_s, len(ask.token_ids), n_tokens, n_calls, turn_errors))
            if state.submitted:
                status = Status.OK
                break
            messages.extend(observations)
            if tally.renderer is not None:
                tally.renderer.add_observations(observations)
            await self._boundary(index, sandbox)
        if status is None:
            status = Status.TIMEOUT if time.monotonic() >= self.deadline else Status.TRUNCATED
        self._close_points(status)
        return await self._grade(variant, sandbox, state, status, error=policy_failure)

    # ------------------------------------------------------------ branch and resume

    async def _boundary(self, turn: int, sandbox: Sandbox) -> None:
        """At the boundary after ``turn``: checkpoint when a branch point or resuming asks for it, and resolve the
        plan's points decided here. A snapshot that cannot be taken fails those points (recorded), never the
        episode; a lost sandbox still raises (``_play_resuming`` handles it)."""
        role, plan, host = self.role, self.plan, self.host
        branching = role is not None and role.is_root and plan is not None and plan.checkpoint_at(turn)
        if not (branching or self.req.resume_from_snapshots):
            return
        t0 = time.monotonic()
        try:
            ref = await host.blocking(sandbox.snapshot, SnapshotKind.FAST)
        except (SandboxLost, SandboxTimeout):
            raise
        except (SandboxError, OSError) as exc:
            if branching:
                assert role is not None and plan is not None  # noqa: S101 - branching implies both
                for p in plan.online(turn):
                    host.trees.fail(role.root, p, f"snapshot after turn {turn} failed: {type(exc).__name__}: {exc}")
            log.warning("episode %s: no snapshot after turn %d: %s", self.req.episode_id, turn, exc)
            return
        finally:
            self.tally.sandbox_s += time.monotonic() - t0
        renderer = self.tally.renderer
        cp = Checkpoint(
            turn=turn, ref=ref, harness=self.req.harness, effort=self.req.effort,
            renderer=renderer.fork() if renderer is not None else None, messages=tuple(dict(m) for m in self.messages),
            tools=self.tools, state=copy.deepcopy(self.state), policy=self.policy if self.policy is self.base else copy.copy(self.policy),
            policy_is_base=self.policy is self.base,
            turns=tuple(self.tally.turns), tool_errors=self.tally.tool_errors, completion_tokens=self.tally.completion_tokens,
            remaining_s=max(self.deadline - time.monotonic(), 0.0), surprisal=self.surprisal.get(turn, 0.0),
            prefix_tokens=sum(len(s.ids) for s in renderer.samples) if renderer is not None else 0,
        )
        if self.req.resume_from_snapshots:
            self.last = cp
        if branching:
            assert role is not None and plan is not None  # noqa: S101 - branching implies both
            self.checkpoints[turn] = cp
            for p in plan.online(turn):
                host.trees.resolve(role.root, p, cp)

    def _close_points(self, status: Status) -> None:
        """The root's loop ended: points decided at the end (entropy) are resolved, the rest fail."""
        role, plan = self.role, self.plan
        if role is None or not role.is_root or plan is None:
            return
        trees = self.host.trees
        chosen = plan.at_end({t: self.surprisal.get(t, 0.0) for t in self.checkpoints}, trees.open_points(role.root, plan.points))
        for p, t in chosen.items():
            trees.resolve(role.root, p, self.checkpoints[t])
        trees.finish(role.root, plan.points, f"the root ended ({status.value}) after {len(self.tally.turns)} turns, "
                                             "before this point")

    def _branch_record(self) -> dict[str, Any] | None:
        role, plan = self.role, self.plan
        if role is None or plan is None:
            return None
        record: dict[str, Any] = {"root": role.root, "leaves": leaves_per_root(plan)}
        if role.is_root:
            taken, failed = self.host.trees.summary(role.root)
            return record | {"parent": None, "path": "", "turn": None, "snapshot": None, "prefix_turns": 0,
                             "prefix_tokens": 0, "points": taken, "failed": failed}
        leaf = self.leaf or {"turn": None, "snapshot": None, "prefix_turns": 0, "prefix_tokens": 0, "failed": []}
        return record | {"parent": role.root, "path": self.req.episode_id[len(role.root) + 1:], "point": role.point,
                         "points": [], **leaf}

    async def _act(
        self, harness: Harness, parsed: ParsedTurn, executor: IntentExecutor, deadline: float, *, fixed: bool = False
    ) -> tuple[list[Mapping[str, Any]], int, int, float]:
        """Execute a turn's intents in order; returns (observations, tool errors, calls, sandbox seconds)."""
        observations: list[Mapping[str, Any]] = []
        errors = calls = 0
        spent = 0.0
        for item in harness.turn_intents(parsed):
            if isinstance(item, ParseError):
                errors += 1
                observations.append(harness.format_error(item))
                continue
            calls += 1
            # A command may ask for longer than the default, never past the episode's wall time.
            executor.max_timeout_s = max(deadline - time.monotonic(), 1.0)
            t0 = time.monotonic()
            result = await self.host.blocking(executor.execute, item)
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
        self, variant: Variant, sandbox: Sandbox, state: EpisodeState, status: Status, *, error: str = ""
    ) -> Trajectory:
        host, task = self.host, self.task
        episode = Episode(task.id, variant, final_answer=state.answer, workdir=sandbox.spec.workdir)
        t0 = time.monotonic()
        result: VerifierResult = await host.blocking(
            functools.partial(
                grade_episode, host.backend, sandbox, task, episode,
                restore=host.sandboxes.grading_restore, discard=host.sandboxes.grading_discard,
                in_place=host.grade_in_place, pristine=functools.partial(host.sandboxes.pristine_copy, task, variant),
            )
        )
        self.tally.verifier_s += time.monotonic() - t0
        if result.invalid:
            alive = getattr(sandbox, "alive", None)
            if callable(alive) and not await host.blocking(alive):
                raise EpisodeLost(f"sandbox died before grading ({result.reason})")
            if result.invalid_cause != "agent":  # the grader's or the task's failure: says nothing of the policy
                return self._record(Status.INVALID, result.reason, result)
            # The agent's final state made grading impossible (a hang, os._exit, SkipTest, a FIFO where a
            # file is graded): a failure with reward 0 under the episode's own status, flagged, never dropped.
        return self._record(status, error, result)

    # ------------------------------------------------------------ helpers

    def _add_completion(self, gen: Generation, assistant: Mapping[str, Any]) -> int:
        """Append the turn's tokens to the renderer; returns the completion's token count.

        A policy without token ids (a server's text, the scripted policy) gets
        its text encoded, with logprob 0.0 and mask 1: the text *is* its action,
        which is what warm-start SFT trains on. Tokens the policy inserted
        (``Generation.sampled_mask`` 0, a forced ``</think>``) get mask 0.
        """
        renderer = self.tally.renderer
        if renderer is None:
            return len(gen.token_ids) or max(len(gen.text) // 4, 1)  # no tokenizer: a rough budget count
        if gen.token_ids:
            ids, lps, mask = list(gen.token_ids), list(gen.logprobs), list(gen.loss_mask)
        else:
            ids = list(self.host.tokenizer.encode(gen.text, add_special_tokens=False)) + [renderer.eot_id]
            lps, mask = [0.0] * len(ids), [1] * len(ids)
        sample = renderer.current
        at = len(sample.ids)
        renderer.add_completion(ids, assistant, lps)
        for i, m in enumerate(mask):
            if not m:
                sample.mask[at + i], sample.logprobs[at + i] = 0, 0.0
        return len(ids)

    def _record(self, status: Status, error: str, result: VerifierResult | None = None) -> Trajectory:
        traj = record(self.req, self.task, status, error, self.tally, self.started, result, policy_version=int(self.base.version))
        extra: dict[str, Any] = {}
        branch = self._branch_record()
        if branch is not None:
            extra["branch"] = branch
        if self.resumes:
            extra["resumes"] = list(self.resumes)
        return replace(traj, verifier={**dict(traj.verifier), **extra}) if extra else traj


def _surprisal(gen: Generation) -> float:
    """The mean ``-logprob`` of the turn's sampled tokens (0.0 without logprobs): an entropy estimate."""
    values = [-lp for lp, m in zip(gen.logprobs, gen.loss_mask, strict=False) if m]
    return sum(values) / len(values) if values else 0.0


def record(
    req: EpisodeRequest, task: Task | None, status: Status, error: str, tally: Tally, started: float,
    result: VerifierResult | None = None, *, policy_version: int,
) -> Trajectory:
    """The attempt's ``Trajectory``; ``policy_version`` counts when no turn was sampled (the oldest turn's otherwise)."""
    versions = [t.policy_version for t in tally.turns]
    verifier: dict[str, Any] = {"attempt": req.attempt, "group_id": req.group_id}
    if result is not None:
        verifier.update(verifier_record(result))
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
        policy_version=min(versions) if versions else policy_version,
        status=status,
        reward=float(result.reward) if result is not None and status is not Status.INVALID and not result.invalid else 0.0,
        error=error,
        verifier=verifier,
        samples=tally.samples(),
        turns=tuple(tally.turns),
        tool_errors=tally.tool_errors,
        timings=Timings(tally.policy_s, tally.sandbox_s, tally.verifier_s, time.monotonic() - started),
    )


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


