"""The native attempt: a real agent program (``native:claude_code``, ``native:codex``, ``native:kimi_cli``) drives the episode, recorded by the gateway.

One attempt of an episode over the contract of ``rollout.attempt`` (the other is
``rollout.emulated_attempt``, whose loop belongs to the program here)::

    sandbox of the task's image + the pinned CLI   (sandboxes.native_images; network off)
    task setup                                      (as for any episode)
    a gateway Session + server on a Unix socket     (rollout.gateway) in a folder mounted only into this sandbox
    the CLI, started with the instruction, the turn budget and the effort level, under the task's wall time
        its model calls -> forwarder on 127.0.0.1 -> socket -> gateway -> the policy; each call recorded token-exact
        under the episode's budgets, as in the emulated loop: the task's ``max_tokens`` over all calls (each
        call capped at what is left), the effort level's thinking cap (``EpisodeRequest.thinking_budget``),
        the run's sampling; the first call refused (a token or turn budget spent) ends the CLI
    the CLI exits (or a budget runs out)            -> graded in place, as usual; the CLI's last message is the answer
    Trajectory: the gateway's samples, one Turn per model call

A failed episode is a record, like any other: a CLI that cannot start is
``error`` with its output, a policy failure mid-episode shows up as the CLI
giving up (graded), a turn or token budget spent is ``truncated``, the wall
time ``timeout``.
"""

from __future__ import annotations

import asyncio
import functools
import os
import secrets
import shlex
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import docker

from agentenv.errors import SetupError
from agentenv.grading import grade_episode
from agentenv.types import Episode, Task
from rollout.attempt import AttemptHost, EpisodeContext, EpisodeLost, EpisodeRequest, SamplingParams, verifier_record
from rollout.gateway import GatewayServer, Session
from rollout.harnesses import get_harness
from rollout.harnesses.native import NativeProfile, NativeUnavailable, native_profile
from rollout.policy.types import Policy
from rollout.types import Sample, Status, Timings, Trajectory, Turn
from sandboxes.errors import SandboxError
from sandboxes.native_images import FORWARD_PORT, GATEWAY_SOCKET, INSTALL_DIR, ensure_native_image
from sandboxes.types import GATEWAY_MOUNT

__all__ = ["NATIVE_GRACE_S", "run_native_attempt"]

NATIVE_GRACE_S = 30.0  # the program's own start-up and exit, on top of the task's wall time
STOP_FILE = "stop"  # dropped in the episode's gateway folder by the host: the CLI is ended


def _native_command(profile: NativeProfile, instruction: str, effort: str | None, max_turns: int, workdir: str) -> str:
    """The CLI under a wrapper: the forwarder, then the CLI in its own process group (``setsid``, where the image
    has it), which a watcher kills (with every command it started) once the host drops ``STOP_FILE`` in the
    gateway folder (a budget spent)."""
    fwd = f"{INSTALL_DIR}/bin/agentenv-gw-forward"
    wait = f"for i in $(seq 200); do (exec 3<>/dev/tcp/127.0.0.1/{FORWARD_PORT}) 2>/dev/null && break; sleep 0.02; done"
    stop = f"{GATEWAY_MOUNT}/{STOP_FILE}"
    watch = f"(while [ ! -e {stop} ]; do kill -0 $CLI 2>/dev/null || exit 0; sleep 0.1; done; kill -KILL -- -$CLI 2>/dev/null || kill -KILL $CLI) & W=$!"
    body = (
        f"{fwd} {FORWARD_PORT} >/dev/null 2>&1 & FWD=$!; {wait}; cd {workdir}; "
        f"$(command -v setsid) {profile.command(instruction, effort, max_turns)} </dev/null & CLI=$!; {watch}; "
        "wait $CLI; rc=$?; kill $FWD $W 2>/dev/null; exit $rc"
    )
    return "bash -c " + shlex.quote(body)


async def _stop_when_spent(session: Session, gw_dir: str) -> None:
    """Once the gateway refuses a call (the episode's token or turn budget is spent), end the CLI, as the
    emulated loop ends its episode: the file appears in the sandbox's read-only gateway mount."""
    await session.spent.wait()
    with open(os.path.join(gw_dir, STOP_FILE), "w"):
        pass


async def run_native_attempt(
    host: AttemptHost, req: EpisodeRequest, task: Task, policy: Policy, sampling: SamplingParams, started: float
) -> Trajectory:
    """One attempt of a ``native:`` episode; the runner's retry, store and error handling wrap it."""
    variant = task.variant(req.seed)
    try:
        profile = native_profile(req.harness)
    except NativeUnavailable as exc:
        return _trajectory(req, task, Status.ERROR, str(exc), None, {}, started, 0.0, 0.0, 0.0)
    tokenizer = host.tokenizer
    if tokenizer is None:
        from rollout.tokenizer import build_tokenizer  # lazily: it loads transformers

        tokenizer = build_tokenizer()
    base_spec = await host.blocking(task.sandbox_spec)
    # built once per program and base image, then cached by content hash: the host's set-up, not the episode's time
    image = await host.blocking(ensure_native_image, docker.from_env(timeout=600), profile.program, base_spec.image)
    t0 = time.monotonic()
    gw_dir = tempfile.mkdtemp(prefix="agentenv-gw-")
    os.chmod(gw_dir, 0o755)
    spec = base_spec.model_copy(update={"image": image, "gateway_dir": gw_dir})
    server: GatewayServer | None = None
    sandbox = None
    try:
        try:
            sandbox = await host.blocking(host.backend.create, spec)
        except (SandboxError, OSError) as exc:
            raise EpisodeLost(f"no sandbox: {type(exc).__name__}: {exc}") from exc
        try:
            await host.blocking(task.setup, sandbox, variant)
        except SetupError as exc:
            return _trajectory(req, task, Status.INVALID, f"task setup failed: {exc}", None, {}, started, 0.0, time.monotonic() - t0, 0.0)
        bound = policy.for_episode(EpisodeContext(req, task, variant, get_harness(profile.emulated), sandbox))
        # the task's turn and token budgets and the effort level's thinking cap, on every call (as the emulated loop)
        session = Session(
            req.episode_id, bound, tokenizer, sampling=sampling, max_calls=task.limits.max_turns,
            max_tokens=task.limits.max_tokens, thinking_budget=req.thinking_budget,
        )
        token = secrets.token_hex(16)
        owner = getattr(sandbox, "user_ids", None)  # the socket and its folder: the sandbox user's alone
        server = GatewayServer(session, uds=os.path.join(gw_dir, GATEWAY_SOCKET), token=token, owner=owner)
        await server.start()
        for path, text in profile.setup_files(token).items():
            await host.blocking(sandbox.write_file, path, text.encode())
        cmd = _native_command(profile, variant.instruction, req.effort, task.limits.max_turns, spec.workdir)
        sandbox_s = time.monotonic() - t0
        t1 = time.monotonic()
        stopper = asyncio.ensure_future(_stop_when_spent(session, gw_dir))
        try:
            result = await host.blocking(
                lambda: sandbox.exec(cmd, timeout=float(task.limits.wall_time_s) + NATIVE_GRACE_S, env=profile.env(token))
            )
        finally:
            stopper.cancel()
        cli_s = time.monotonic() - t1
        await server.stop()
        server = None
        answer = profile.final_message(result.stdout)
        if result.timed_out:
            status, error = Status.TIMEOUT, ""
        elif session.refused or session.completion_tokens >= task.limits.max_tokens:
            status, error = Status.TRUNCATED, ""  # a budget spent (the emulated loop's truncated)
        elif not session.calls:
            status = Status.ERROR
            error = f"the CLI made no model call (exit {result.exit_code}): {(result.stdout + result.stderr)[-1500:]}"
            return _trajectory(req, task, status, error, session, {"cli_exit": result.exit_code}, started, 0.0, sandbox_s + cli_s, 0.0)
        else:
            status, error = Status.OK, ""
        episode = Episode(task.id, variant, final_answer=answer, workdir=spec.workdir)
        t2 = time.monotonic()
        pristine = functools.partial(host.sandboxes.pristine_copy, task, variant)  # the oracle's state, from warm pools
        graded = await host.blocking(lambda: grade_episode(host.backend, sandbox, task, episode, in_place=True, pristine=pristine))
        verifier_s = time.monotonic() - t2
        # the record's keys keep their "cli_" names: stored trajectories and their readers use them
        info: dict[str, Any] = {**verifier_record(graded), "cli_exit": result.exit_code, "cli_s": cli_s, "start_s": sandbox_s}
        if graded.invalid and graded.invalid_cause != "agent":
            status, error = Status.INVALID, graded.reason
        traj = _trajectory(req, task, status, error, session, info, started, sandbox_s, cli_s, verifier_s)
        if status is Status.INVALID or graded.invalid:
            return traj
        return replace(traj, reward=float(graded.reward))
    finally:
        if server is not None:
            await server.stop()
        if sandbox is not None:
            await host.blocking(sandbox.close)
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
