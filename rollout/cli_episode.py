"""One episode through a real harness CLI (``cli:claude_code``, ``cli:codex``, ``cli:kimi_cli``), recorded by the gateway.

The loop of ``rollout.episode`` belongs to the CLI here::

    sandbox of the task's image + the pinned CLI   (sandboxes.cli_images; network off)
    task setup                                      (as for any episode)
    a gateway Session + server on a Unix socket     (rollout.gateway) in a folder mounted only into this sandbox
    the CLI, started with the instruction, the turn budget and the effort level, under the task's wall time
        its model calls -> forwarder on 127.0.0.1 -> socket -> gateway -> the policy; each call recorded token-exact
    the CLI exits (or a budget runs out)            -> graded in place, as usual; the CLI's last message is the answer
    Trajectory: the gateway's samples, one Turn per model call

A failed episode is a record, like any other: a CLI that cannot start is
``error`` with its output, a policy failure mid-episode shows up as the CLI
giving up (graded), a turn budget spent is ``truncated``, the wall time
``timeout``.
"""

from __future__ import annotations

import functools
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from agentenv.errors import SetupError
from agentenv.grading import grade_episode
from agentenv.types import Episode, Task, Variant
from rollout.gateway import GatewayServer, Session
from rollout.harnesses import get_harness
from rollout.harnesses.cli import CliProfile, CliUnavailable, cli_profile
from rollout.policy.scripted import ORACLE_TIMEOUT_S, _text, answer_from_observation, oracle_command
from rollout.policy.types import FinishReason, Generation, Policy, PolicyError, Prompt, SamplingParams, ThinkingBudget
from rollout.types import Sample, Status, Timings, Trajectory, Turn
from sandboxes.cli_images import FORWARD_PORT, GATEWAY_SOCKET, INSTALL_DIR, ensure_cli_image
from sandboxes.errors import SandboxError

if TYPE_CHECKING:
    from rollout.episode import EpisodeRequest, EpisodeRunner

CLI_GRACE_S = 30.0  # the CLI's own start-up and exit, on top of the task's wall time


def _cli_command(profile: CliProfile, instruction: str, effort: str | None, max_turns: int, workdir: str) -> str:
    fwd = f"{INSTALL_DIR}/bin/agentenv-gw-forward"
    wait = f"for i in $(seq 200); do (exec 3<>/dev/tcp/127.0.0.1/{FORWARD_PORT}) 2>/dev/null && break; sleep 0.02; done"
    body = (
        f"{fwd} {FORWARD_PORT} >/dev/null 2>&1 & FWD=$!; {wait}; cd {workdir}; "
        f"{profile.command(instruction, effort, max_turns)} </dev/null; rc=$?; kill $FWD 2>/dev/null; exit $rc"
    )
    return "bash -c " + _quote(body)


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


async def run_cli_attempt(runner: EpisodeRunner, req: EpisodeRequest, started: float) -> Trajectory:
    """One attempt of a ``cli:`` episode; the runner's retry, store and error handling wrap it."""
    from rollout.episode import EpisodeContext

    task = runner._task(req.task_id)
    variant = task.variant(req.seed)
    try:
        profile = cli_profile(req.harness)
    except CliUnavailable as exc:
        return _trajectory(req, task, Status.ERROR, str(exc), None, {}, started, 0.0, 0.0, 0.0)
    tokenizer = runner.tokenizer
    if tokenizer is None:
        from rollout.tokenizer import build_tokenizer

        tokenizer = build_tokenizer()
    t0 = time.monotonic()
    base_spec = await runner._blocking(task.sandbox_spec)
    import docker

    image = await runner._blocking(ensure_cli_image, docker.from_env(timeout=600), profile.cli, base_spec.image)
    gw_dir = tempfile.mkdtemp(prefix="agentenv-gw-")
    os.chmod(gw_dir, 0o755)
    spec = base_spec.model_copy(update={"image": image, "gateway_dir": gw_dir})
    server: GatewayServer | None = None
    sandbox = None
    try:
        try:
            sandbox = await runner._blocking(runner.backend.create, spec)
        except (SandboxError, OSError) as exc:
            from rollout.episode import _Lost

            raise _Lost(f"no sandbox: {type(exc).__name__}: {exc}") from exc
        try:
            await runner._blocking(task.setup, sandbox, variant)
        except SetupError as exc:
            return _trajectory(req, task, Status.INVALID, f"task setup failed: {exc}", None, {}, started, 0.0, time.monotonic() - t0, 0.0)
        base = runner.policy_for(req)
        bind = getattr(base, "for_episode", None)
        ctx = EpisodeContext(req, task, variant, get_harness(profile.emulated), sandbox)
        policy: Policy = bind(ctx) if callable(bind) else base
        session = Session(req.episode_id, policy, tokenizer, sampling=req.sampling or runner.sampling, max_calls=task.limits.max_turns)
        token = secrets.token_hex(16)
        owner = getattr(sandbox, "user_ids", None)  # the socket and its folder: the sandbox user's alone
        server = GatewayServer(session, uds=os.path.join(gw_dir, GATEWAY_SOCKET), token=token, owner=owner)
        await server.start()
        for path, text in profile.setup_files(token).items():
            await runner._blocking(sandbox.write_file, path, text.encode())
        cmd = _cli_command(profile, variant.instruction, req.effort, task.limits.max_turns, spec.workdir)
        sandbox_s = time.monotonic() - t0
        t1 = time.monotonic()
        result = await runner._blocking(
            lambda: sandbox.exec(cmd, timeout=float(task.limits.wall_time_s) + CLI_GRACE_S, env=profile.env(token))
        )
        cli_s = time.monotonic() - t1
        await server.stop()
        server = None
        answer = profile.final_message(result.stdout)
        if result.timed_out:
            status, error = Status.TIMEOUT, ""
        elif session.refused:
            status, error = Status.TRUNCATED, ""
        elif not session.calls:
            status = Status.ERROR
            error = f"the CLI made no model call (exit {result.exit_code}): {(result.stdout + result.stderr)[-1500:]}"
            return _trajectory(req, task, status, error, session, {"cli_exit": result.exit_code}, started, 0.0, sandbox_s + cli_s, 0.0)
        else:
            status, error = Status.OK, ""
        episode = Episode(task.id, variant, final_answer=answer, workdir=spec.workdir)
        t2 = time.monotonic()
        pristine = functools.partial(runner.sandboxes.pristine_copy, task, variant)  # the oracle's state, from warm pools
        graded = await runner._blocking(lambda: grade_episode(runner.backend, sandbox, task, episode, in_place=True, pristine=pristine))
        verifier_s = time.monotonic() - t2
        from rollout.episode import _result_dict

        info: dict[str, Any] = {**_result_dict(graded), "cli_exit": result.exit_code, "cli_s": cli_s, "start_s": sandbox_s}
        if graded.invalid and graded.invalid_cause != "agent":
            status, error = Status.INVALID, graded.reason
        traj = _trajectory(req, task, status, error, session, info, started, sandbox_s, cli_s, verifier_s)
        if status is Status.INVALID or graded.invalid:
            return traj
        from dataclasses import replace

        return replace(traj, reward=float(graded.reward))
    finally:
        if server is not None:
            await server.stop()
        if sandbox is not None:
            await runner._blocking(sandbox.close)
        shutil.rmtree(gw_dir, ignore_errors=True)


def _trajectory(
    req: EpisodeRequest, task: Task, status: Status, error: str, session: Session | None, info: Mapping[str, Any],
    started: float, sandbox_s: float, cli_s: float, verifier_s: float,
) -> Trajectory:
    calls = session.calls if session is not None else []
    policy_s = sum(c.latency_s for c in calls)
    verifier: dict[str, Any] = {"attempt": req.attempt, "group_id": req.group_id, **info}
    if session is not None:
        verifier.update(
            gateway_breaks=[{"call": b.call_index, "cause": b.cause.value, "detail": b.detail} for b in session.breaks],
            gateway_threads=len(session.threads), append_only=session.append_only(),
            gateway_s=sum(float(c.extra.get("gateway_s", c.latency_s)) for c in calls),
            malformed_calls=sum(1 for c in calls if c.malformed), cli_tools=[t["function"]["name"] for t in (session.tool_lists[-1] if session.tool_lists else [])],
        )
    samples = tuple(Sample(tuple(s.ids), tuple(s.logprobs), tuple(s.mask)) for s in (session.samples() if session else []))
    turns = tuple(
        Turn(c.index, c.policy_version, c.latency_s, 0.0, len(c.prompt_ids), len(c.completion_ids), 0, len(c.malformed)) for c in calls
    )
    return Trajectory(
        episode_id=req.episode_id, run_id=req.run_id, task_id=req.task_id, domain=task.domain.value, seed=req.seed,
        harness=req.harness, effort=req.effort or "", policy_version=min((c.policy_version for c in calls), default=0),
        status=status, reward=0.0, error=error, verifier=verifier, samples=samples, turns=turns,
        tool_errors=sum(len(c.malformed) for c in calls),
        timings=Timings(policy_s, sandbox_s + max(cli_s - policy_s, 0.0), verifier_s, time.monotonic() - started),
    )


# ---------------------------------------------------------------- scripted policies for CLI episodes


class CliOraclePolicy:
    """Replays each task's oracle as the CLI's own shell tool call, then answers in text.

    Turn 1: the CLI's shell tool (``Bash{command}``, ``exec_command{cmd}``, ``Shell{command}``) running the
    variant's oracle script; turn 2: a text turn -- the CLI ends its run -- whose text is
    the last line the oracle printed where the task is graded on an answer.
    """

    name = "cli-oracle"

    def __init__(self, *, version: int = 0, explore: int = 0) -> None:
        self._version = version
        self.explore = explore  # shell calls (``ls -la``) before the oracle: longer episodes for the exactness benchmark

    @property
    def version(self) -> int:
        return self._version

    def for_episode(self, ctx: Any) -> Policy:
        return _CliOracleReplay(self, ctx)

    async def generate(self, prompt: Prompt, sampling: SamplingParams, budget: ThinkingBudget | None = None) -> Generation:
        raise PolicyError("CliOraclePolicy needs its episode: run it through EpisodeRunner with a cli: harness")


class _CliOracleReplay:
    def __init__(self, parent: CliOraclePolicy, ctx: Any) -> None:
        self.name, self._parent, self._ctx, self._turn = parent.name, parent, ctx, 0

    @property
    def version(self) -> int:
        return self._parent.version

    async def generate(self, prompt: Prompt, sampling: SamplingParams, budget: ThinkingBudget | None = None) -> Generation:
        import json

        ctx = self._ctx
        profile = cli_profile(ctx.request.harness)
        tools = {t.get("function", {}).get("name") for t in prompt.tools}
        if profile.shell_tool[0] not in tools:  # a side call (title, summary) without tools: answer briefly
            return Generation("Task", (), (), FinishReason.STOP, self.version)
        explore = min(self._parent.explore, max(ctx.task.limits.max_turns - 2, 0))  # the oracle and the answer still fit
        if self._turn < explore:
            name, arg = profile.shell_tool
            text = f"<tool_call>\n{json.dumps({'name': name, 'arguments': {arg: f'ls -la # look {self._turn}'}})}\n</tool_call>"
        elif self._turn == explore:
            script = ctx.task.oracle_script(ctx.variant)
            if script is None:
                raise PolicyError(f"task {ctx.task.id!r} has no oracle script to replay")
            name, arg = profile.shell_tool
            args: dict[str, Any] = {arg: oracle_command(script)}
            timeout = min(float(ctx.task.limits.wall_time_s), ORACLE_TIMEOUT_S)
            if profile.cli == "claude":
                args["timeout"] = int(timeout * 1000)
            elif profile.cli == "kimi":
                args["timeout"] = max(1, min(int(timeout), 300))  # seconds; kimi refuses > 300 in the foreground
            else:
                args["yield_time_ms"] = int(timeout * 1000)
            text = f"<tool_call>\n{json.dumps({'name': name, 'arguments': args}, ensure_ascii=False)}\n</tool_call>"
        else:
            answer = None
            if ctx.task.oracle_answers():
                results = [m for m in prompt.messages if m.get("role") == "tool"]
                answer = answer_from_observation(_strip_codex(_text(results[-1]))) if results else None
            text = answer or "Done."
        self._turn += 1
        return Generation(text, (), (), FinishReason.STOP, self.version)


def _strip_codex(text: str) -> str:
    """Codex wraps exec_command output in a header ending with 'Output:'; keep what follows."""
    marker = "\nOutput:\n"
    return text.split(marker, 1)[1] if marker in text else text


class DoNothingPolicy:
    """Answers every call with a text turn and calls no tool: the CLI ends at once; the task earns 0."""

    name = "do-nothing"
    version = 0

    async def generate(self, prompt: Prompt, sampling: SamplingParams, budget: ThinkingBudget | None = None) -> Generation:
        return Generation("I will not do anything.", (), (), FinishReason.STOP, 0)


__all__ = ["CliOraclePolicy", "DoNothingPolicy", "run_cli_attempt"]
