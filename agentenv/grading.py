"""Grade an episode in a clean sandbox forked from the agent's final state.

``grade_episode`` is the one way rewards are made:

1. snapshot the agent's sandbox (``FAST``: files only; the agent's processes,
   a background job rewriting files, do not come along);
2. restore that snapshot into a new grading sandbox;
   (or, with ``in_place=True`` where the sandbox can ``quiesce``: kill every
   process of the sandbox user but the in-container agent, empty the scratch
   mounts, refuse if a SysV IPC object exists, and grade in the agent's own
   sandbox: the same files a fork would get, no process, nothing in ``/tmp``;
   it saves a snapshot, a restore and a second reset per episode, which is
   what the rollout hot path uses. A refusal falls back to the fork; the
   result's ``extra["graded_in"]`` says which one ran;)
3. remove every path only grading may own (``task.hidden_paths()``), so a
   file the agent planted there (a fake test, a fake report) is gone;
4. copy the hidden tests and verifier files in only now (``task.hidden_files``);
   verifiers stage what they run into fresh unpredictable directories too;
5. run the task's verifiers with an oracle replay at hand (a fresh sandbox of
   the same variant with the oracle applied, made lazily and cached per
   task *content*, variant and image, for state-hash and oracle-file
   comparisons; only deterministic task failures are cached, never a lost
   container or a timeout);
6. after grading in place, remove the hidden files it copied in (best effort:
   the sandbox reset is the guarantee; verifiers remove their own staging
   dirs); close every sandbox it made and return the composite result.

An invalid result says whose fault it is (``VerifierResult.invalid_cause``),
and the grader's only with evidence the agent could not produce (no opting
out: an agent that made its own failing episode undecidable, a pytest usage
error, nothing collected, a garbled report, a database server it broke, would
otherwise be excluded from training with no penalty). Every invalid the
verifiers or the steps above call the grader's is checked (``_attribute``):

* **a host-side fault**, seen from outside the sandbox: the daemon says the
  sandbox is gone, or the step failed because the daemon could not be reached
  (``ConnectionError``: ``SandboxLost``, ``DaemonUnavailable``; never
  ``SandboxTampered``, a channel the episode itself broke); or
* **the oracle control**: the same grading (hidden files copied in, the task's
  verifiers, the oracle's final answer) of a fresh sandbox of the same variant
  with the oracle applied is invalid too, or cannot be made at all. Its
  *decided* verdict is cached per task content, variant and image (an invalid
  one never is: it may pass).

Either keeps ``invalid_cause="grader"`` and records ``extra["invalid_evidence"]``;
without one the invalid is the agent's (reward 0, trained on as a failure) and
``extra["invalid_evidence"]`` says the oracle's state grades decided.

It never raises for anything the agent did, nor for a verifier crash: those
are ``invalid`` results with a reason. Usage::

    result = grade_episode(backend, agent_sandbox, task, Episode(task.id, variant, final_answer="42"))
"""

from __future__ import annotations

import hashlib
import os
import shlex
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from agentenv.errors import OracleError
from agentenv.types import Episode, InvalidCause, Task, Variant, VerifierResult
from sandboxes.errors import SandboxError, SandboxTampered, SnapshotTooLarge
from sandboxes.types import Quiescable, Sandbox, SandboxBackend, SnapshotKind, SnapshotRef, runs_images

PristineFactory = Callable[[], "tuple[Sandbox, Callable[[], None]] | None"]
_CACHE_SIZE = 512
_cache: OrderedDict[tuple[str, str, int, str, str], tuple[bool, Any]] = OrderedDict()
_cache_lock = threading.Lock()
_tokens: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
_token_count = iter(range(1 << 62))


class OracleUnavailable(OracleError):
    """The oracle replay failed for a reason that may pass (a lost container, a timeout): never cached."""


def clear_oracle_cache() -> None:
    with _cache_lock:
        _cache.clear()


def task_fingerprint(task: Task) -> str:
    """What the oracle's answer depends on besides the variant: the task's content, not only its id.

    A folder task: its resolved folder and every file's relative path, size and
    mtime (two copies of a task with the same id, one broken, get two answers;
    an edited task gets a fresh one). Any other task: its class plus a token
    for the object itself (two instances never share an answer).
    """
    folder = task.folder
    if folder is not None and os.path.isdir(folder):
        digest = hashlib.sha256(os.path.realpath(folder).encode())
        for top, dirs, names in os.walk(folder):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(names):
                path = os.path.join(top, name)
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                digest.update(f"\0{os.path.relpath(path, folder)}\0{st.st_size}\0{st.st_mtime_ns}".encode())
        return "folder:" + digest.hexdigest()[:32]
    with _cache_lock:
        try:
            token = _tokens.get(task)
            if token is None:
                token = _tokens[task] = f"{type(task).__module__}.{type(task).__qualname__}#{next(_token_count)}"
        except TypeError:  # neither weak-referenceable nor hashable: no sharing at all
            return f"object:{id(task)}:{time.monotonic_ns()}"
    return "object:" + token


def _transient(exc: BaseException) -> bool:
    """A replay failure that says nothing about the task: the sandbox, the daemon or the clock failed."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OracleUnavailable | SandboxError | TimeoutError | ConnectionError):
            return True
        if "timed out" in str(seen):  # a setup or oracle script passing its deadline under load
            return True
        seen = seen.__cause__
    return False


class BackendOracleReplay:
    """``OracleReplay`` on a backend: one fresh sandbox of the variant, set up, oracle applied.

    Values are cached process-wide by (task id, task content, seed, image, key);
    so are deterministic oracle failures, so a broken task fails fast on every
    later episode. A transient failure (``_transient``: a lost container, a
    timeout) is raised as ``OracleUnavailable`` and not cached: the next
    episode tries again.
    """

    def __init__(
        self, backend: SandboxBackend, task: Task, variant: Variant, *, pristine: PristineFactory | None = None
    ) -> None:
        """``pristine``, when given, makes a sandbox already at the variant's set-up state and its disposer
        (the rollout's warm pools: no container start, no setup); else ``backend.create`` and setup."""
        self.backend, self.task, self.variant = backend, task, variant
        self._pristine = pristine
        self._dispose: Callable[[], None] | None = None
        self._sandbox: Sandbox | None = None
        self._answer: str | None = None
        self._build = runs_images(backend)
        self._image = task.sandbox_spec(build=self._build).image
        self._fingerprint = task_fingerprint(task)

    def compute(self, key: str, fn: Callable[[Sandbox, str | None], Any]) -> Any:
        cache_key = (self.task.id, self._fingerprint, self.variant.seed, self._image, key)
        with _cache_lock:
            hit = _cache.get(cache_key)
            if hit is not None:
                _cache.move_to_end(cache_key)
        if hit is None:
            try:
                sandbox = self._ensure()
                hit = (True, fn(sandbox, self._answer))
            except OracleError as exc:
                if _transient(exc):
                    raise OracleUnavailable(str(exc)) from exc
                hit = (False, str(exc))
            with _cache_lock:
                _cache[cache_key] = hit
                while len(_cache) > _CACHE_SIZE:
                    _cache.popitem(last=False)
        ok, value = hit
        if not ok:
            raise OracleError(value)
        return value

    def _ensure(self) -> Sandbox:
        if self._sandbox is None:
            made = self._pristine() if self._pristine is not None else None
            if made is not None:
                sandbox, self._dispose = made
            else:
                sandbox = self.backend.create(self.task.sandbox_spec(build=self._build))
            try:
                if made is None:
                    self.task.setup(sandbox, self.variant)
                self._answer = self.task.oracle(sandbox, self.variant)
            except OracleError:
                self._close(sandbox)
                raise
            except Exception as exc:  # setup of a fresh copy failing is the task's fault, unless the sandbox failed
                self._close(sandbox)
                kind = OracleUnavailable if _transient(exc) else OracleError
                raise kind(f"{self.task.id} seed {self.variant.seed}: replay failed: {type(exc).__name__}: {exc}") from exc
            self._sandbox = sandbox
        return self._sandbox

    def close(self) -> None:
        if self._sandbox is not None:
            self._close(self._sandbox)
            self._sandbox = None

    def _close(self, sandbox: Sandbox) -> None:
        dispose, self._dispose = self._dispose, None
        if dispose is not None:
            dispose()
        else:
            sandbox.close()


def _invalid(reason: str, started: float, cause: InvalidCause = "grader", **extra: Any) -> VerifierResult:
    return VerifierResult(0.0, False, True, reason, (), time.monotonic() - started, dict(extra), cause)


#: prepare_grading_sandbox's reason when a hidden path the agent wrote cannot be cleared (its doing).
_UNCLEARABLE = "could not clear hidden paths the agent may have written"


#: The oracle control's key in the replay cache (see ``_attribute``).
_CONTROL_KEY = "grading-control"


def _host_fault(sandbox: Sandbox | None, exc: BaseException | None = None) -> str | None:
    """Evidence from outside the sandbox that the host failed: the daemon unreachable, or the sandbox gone."""
    if isinstance(exc, ConnectionError) and not isinstance(exc, SandboxTampered):  # SandboxLost, DaemonUnavailable
        return f"host fault: {type(exc).__name__}: {exc}"  # (a tampered channel is the episode's doing, not the host's)
    if getattr(sandbox, "compromised", None):
        return None  # the episode broke its own channel: whatever the daemon says next is no host fault
    alive = getattr(sandbox, "alive", None)
    if sandbox is None or not callable(alive):
        return None
    try:
        if not alive():
            return "host fault: the daemon reports the sandbox gone"
    except Exception as err:  # noqa: BLE001 - the daemon itself failed to answer
        return f"host fault: the daemon did not answer: {type(err).__name__}: {err}"
    return None


def _oracle_control(backend: SandboxBackend, task: Task, episode: Episode, pristine: PristineFactory | None) -> str | None:
    """Grade the oracle's final state as the agent's was graded; None when it is decided, else why not.

    A fresh sandbox of the variant with the oracle applied, the hidden paths
    cleared and files copied in, the task's verifiers with the oracle's answer.
    Only a decided verdict is cached (``BackendOracleReplay``); an invalid one,
    or a control that cannot run, is returned as the reason and tried again next time.
    """
    control = BackendOracleReplay(backend, task, episode.variant, pristine=pristine)

    def grade_oracle(sandbox: Sandbox, answer: str | None) -> dict[str, Any]:
        problem = prepare_grading_sandbox(sandbox, task, episode.variant)
        if problem:
            raise OracleUnavailable(f"the oracle's state: {problem}")
        inner = BackendOracleReplay(backend, task, episode.variant, pristine=pristine)
        try:
            result = task.grade(sandbox, Episode(task.id, episode.variant, final_answer=answer, workdir=episode.workdir, oracle=inner))
        finally:
            inner.close()
        if result.invalid:
            raise OracleUnavailable(f"the oracle's state grades invalid too: {result.reason}")
        return {"reward": result.reward, "passed": result.passed}

    try:
        control.compute(_CONTROL_KEY, grade_oracle)
    except Exception as exc:  # noqa: BLE001 - any failure here is in a sandbox the agent never touched
        return f"oracle control: {type(exc).__name__}: {exc}"
    finally:
        try:
            control.close()
        except Exception:  # noqa: BLE001,S110 - closing is best effort
            pass
    return None


def _attribute(
    result: VerifierResult, backend: SandboxBackend, task: Task, episode: Episode, pristine: PristineFactory | None,
    *, sandbox: Sandbox | None, exc: BaseException | None = None,
) -> VerifierResult:
    """A grader-caused invalid stays the grader's only with evidence (see the module docstring)."""
    if not result.invalid or result.invalid_cause == "agent":
        return result
    evidence = _host_fault(sandbox, exc) or _oracle_control(backend, task, episode, pristine)
    if evidence is not None:
        return replace(result, extra={**dict(result.extra), "invalid_evidence": evidence})
    return replace(
        result, invalid_cause="agent", reason=f"{result.reason} (the oracle's final state grades decided: the agent's state is to blame)",
        extra={**dict(result.extra), "invalid_evidence": "the oracle's final state grades decided; no host fault"},
    )


def remove_hidden(sandbox: Sandbox, task: Task) -> None:
    """Best effort: delete the hidden paths grading copied in (after grading in place)."""
    hidden = [p for p in task.hidden_paths() if p.startswith("/") and p.rstrip("/")]
    if not hidden:
        return
    try:
        sandbox.exec(["bash", "-c", "rm -rf -- " + " ".join(shlex.quote(p) for p in hidden)], timeout=60)
    except Exception:  # noqa: BLE001,S110 - the reset is the guarantee; a failed cleanup is not a grade
        pass


def prepare_grading_sandbox(sandbox: Sandbox, task: Task, variant: Variant) -> str | None:
    """Clear hidden paths and copy hidden files in; return a reason when that fails."""
    hidden = [p for p in task.hidden_paths() if p.startswith("/") and p.rstrip("/")]
    if hidden:
        quoted = " ".join(shlex.quote(p) for p in hidden)
        still = sandbox.exec(  # one shell: remove, then list what survived
            ["bash", "-c", f"rm -rf -- {quoted} 2>/dev/null; for p in {quoted}; do [ -e \"$p\" ] && echo \"$p\"; done; true"],
            timeout=60,
        )
        if still.stdout.strip():
            return f"{_UNCLEARABLE}: {still.stdout.split()}"
    for path, data in sorted(task.hidden_files(variant).items()):
        sandbox.write_file(path, data)
    return None


def grade_episode(
    backend: SandboxBackend,
    agent_sandbox: Sandbox,
    task: Task,
    episode: Episode,
    *,
    restore: Callable[[SnapshotRef], Sandbox] | None = None,
    discard: Callable[[Sandbox], None] | None = None,
    in_place: bool = False,
    pristine: PristineFactory | None = None,
) -> VerifierResult:
    """Grade ``episode`` in a clean sandbox forked from ``agent_sandbox``; see the module docstring.

    ``restore`` / ``discard`` let a caller with warm pools make and dispose of the grading
    sandbox (the rollout hot path); by default it is ``backend.restore`` and ``close``.
    ``in_place`` grades in ``agent_sandbox`` itself once it is quiesced (the caller must
    reset or destroy it afterwards, as it would anyway); ``pristine`` makes the oracle
    replay's sandbox (see ``BackendOracleReplay``).
    """
    started = time.monotonic()
    timings: dict[str, float] = {}
    extra: dict[str, Any] = {"timings": timings, "graded_in": "fork"}
    grading: Sandbox | None = None
    if in_place:
        if isinstance(agent_sandbox, Quiescable):
            refused = agent_sandbox.quiesce()
        else:
            refused = f"{type(agent_sandbox).__name__} cannot quiesce"
        timings["quiesce_s"] = time.monotonic() - started
        if refused is None:
            grading, extra["graded_in"] = agent_sandbox, "place"
        else:
            extra["in_place_refused"] = refused
    if grading is None:
        t0 = time.monotonic()
        try:
            ref = agent_sandbox.snapshot(SnapshotKind.FAST)
        except Exception as exc:  # noqa: BLE001 - a lost sandbox is an episode that cannot be graded
            # A state too large to snapshot (a 20 GB sparse file) is the agent's doing; anything else the grader's.
            cause: InvalidCause = "agent" if isinstance(exc, SnapshotTooLarge) else "grader"
            failed = _invalid(f"cannot snapshot the agent's sandbox: {type(exc).__name__}: {exc}", started, cause, **extra)
            return _attribute(failed, backend, task, episode, pristine, sandbox=agent_sandbox, exc=exc)
        timings["snapshot_s"] = time.monotonic() - t0
        try:
            grading = (restore or backend.restore)(ref)
        except Exception as exc:  # noqa: BLE001
            failed = _invalid(f"cannot restore the agent's state for grading: {type(exc).__name__}: {exc}", started, **extra)
            return _attribute(failed, backend, task, episode, pristine, sandbox=agent_sandbox, exc=exc)
        timings["restore_s"] = time.monotonic() - t0 - timings["snapshot_s"]
    replay = BackendOracleReplay(backend, task, episode.variant, pristine=pristine)
    try:
        failure: BaseException | None = None
        try:
            problem = prepare_grading_sandbox(grading, task, episode.variant)
        except Exception as exc:  # noqa: BLE001
            problem, failure = f"cannot copy hidden files into the grading sandbox: {type(exc).__name__}: {exc}", exc
        if problem:
            failed = _invalid(problem, started, "agent" if problem.startswith(_UNCLEARABLE) else "grader", **extra)
            return _attribute(failed, backend, task, episode, pristine, sandbox=grading, exc=failure)
        verify_started = time.monotonic()
        try:
            result = task.grade(grading, replace(episode, oracle=replay))
        except Exception as exc:  # noqa: BLE001
            failed = _invalid(f"{task.id}: grading raised {type(exc).__name__}: {exc}", started, **extra)
            return _attribute(failed, backend, task, episode, pristine, sandbox=grading, exc=exc)
        timings["verify_s"] = time.monotonic() - verify_started
        if result.invalid and result.invalid_cause != "agent":
            replay.close()  # the control below may want a pristine copy from the same pool
            t0 = time.monotonic()
            result = _attribute(result, backend, task, episode, pristine, sandbox=grading)
            timings["attribute_s"] = time.monotonic() - t0
        return replace(result, duration_s=time.monotonic() - started, extra={**dict(result.extra), **extra})
    finally:
        closers: list[Callable[[], None]] = [replay.close]
        if grading is agent_sandbox:
            closers.insert(0, lambda: remove_hidden(agent_sandbox, task))
        elif grading is not None:
            fork = grading
            closers.insert(0, (lambda: discard(fork)) if discard is not None else fork.close)
        for closer in closers:
            try:
                closer()
            except Exception:  # noqa: BLE001,S110 - closing is best effort; the reaper finds leftovers
                pass


__all__ = [
    "BackendOracleReplay",
    "OracleUnavailable",
    "clear_oracle_cache",
    "grade_episode",
    "prepare_grading_sandbox",
    "remove_hidden",
    "task_fingerprint",
]
