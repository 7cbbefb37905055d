"""The single-sandbox debugger behind ``agentenv debug``: try a task by hand, as the agent would.

One sandbox at the task's setup state; each line is a shell command, or a
``:`` command (``:help`` lists them). ``:diff`` compares the workdir with the
pristine state taken right after setup, so an author sees exactly what an
oracle or a manual fix changed.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.markup import escape

from agentenv.errors import AgentEnvError
from agentenv.intent_exec import EpisodeState, IntentExecutor
from agentenv.intents import INTENT_NAMES, Intent
from agentenv.types import Episode, Task, Variant
from sandboxes.errors import SandboxError
from sandboxes.types import Sandbox, SandboxBackend, SnapshotRef, runs_images

PROMPT = "agentenv> "
HELP = """\
  <shell command>        run it in the sandbox (cwd = workdir)
  :tool NAME {json}      execute a canonical intent (exec_shell, read_file, write_file, edit_replace, ...)
  :verify                grade the current state (as if the agent submitted now)
  :oracle                run the oracle solution here
  :snapshot              snapshot the sandbox; prints an id for :restore
  :restore ID            go back to a snapshot
  :diff                  files changed in the workdir since setup
  :reset                 back to the pristine state after setup
  :instruction           show the instruction again
  :quit                  close the sandbox and leave"""


class DebugSession:
    """State of one debugging session; ``handle(line)`` runs one line and says whether to go on."""

    def __init__(self, task: Task, backend: SandboxBackend, seed: int, console: Console | None = None) -> None:
        self.task = task
        self.backend = backend
        self.console = console or Console(highlight=False)
        self.variant: Variant = task.variant(seed)
        spec = task.sandbox_spec(build=runs_images(backend))
        self.sandbox: Sandbox = backend.create(spec)
        self.task.setup(self.sandbox, self.variant)
        self.state = EpisodeState()
        self.pristine_files = self._fingerprint()
        self.snapshots: dict[str, SnapshotRef] = {}
        self.pristine: SnapshotRef | None = None

    # ---------------------------------------------------------------- loop

    def handle(self, line: str) -> bool:
        line = line.strip()
        if not line:
            return True
        if not line.startswith(":"):
            self._shell(line)
            return True
        name, _, rest = line[1:].partition(" ")
        commands: dict[str, Callable[[str], Any]] = {
            "help": lambda _: self.console.print(HELP, markup=False),
            "tool": self._tool,
            "verify": lambda _: self._verify(),
            "oracle": lambda _: self._oracle(),
            "snapshot": lambda _: self._snapshot(),
            "restore": self._restore,
            "diff": lambda _: self._diff(),
            "reset": lambda _: self._reset(),
            "instruction": lambda _: self.show_instruction(),
        }
        if name in ("quit", "q", "exit"):
            return False
        command = commands.get(name)
        if command is None:
            self._error(f"unknown command :{name}; :help lists them")
            return True
        try:
            command(rest.strip())
        except (AgentEnvError, SandboxError, ValueError) as exc:
            self._error(f"{type(exc).__name__}: {exc}")
        return True

    def show_instruction(self) -> None:
        self.console.rule(f"{self.task.id} (seed {self.variant.seed})")
        self.console.print(self.variant.instruction, markup=False)
        self.console.rule()

    def close(self) -> None:
        self.sandbox.close()

    # ---------------------------------------------------------------- commands

    def _shell(self, command: str) -> None:
        result = self.sandbox.exec(command, timeout=self.task.limits.command_timeout_s)
        if result.stdout:
            self.console.print(result.stdout.rstrip("\n"), markup=False)
        if result.stderr:
            self.console.print(escape(result.stderr.rstrip("\n")), style="yellow")
        status = "timed out" if result.timed_out else f"exit {result.exit_code}"
        self.console.print(f"[{status}]", style="dim", markup=False)

    def _tool(self, rest: str) -> None:
        name, _, raw = rest.partition(" ")
        if name not in INTENT_NAMES:
            raise ValueError(f":tool {name!r}: expected one of {', '.join(INTENT_NAMES)}")
        try:
            args = json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError as exc:
            raise ValueError(f":tool {name}: arguments must be a JSON object ({exc.msg})") from exc
        if not isinstance(args, dict):
            raise ValueError(f":tool {name}: arguments must be a JSON object, got {type(args).__name__}")
        executor = IntentExecutor(self.sandbox, default_timeout_s=self.task.limits.command_timeout_s, state=self.state)
        result = executor.execute(Intent(name, args))  # type: ignore[arg-type]
        if result.output:
            self.console.print(result.output.rstrip("\n"), markup=False)
        if result.error:
            self._error(result.error)
        self.console.print(f"[{'ok' if result.ok else 'failed'}]", style="dim", markup=False)

    def _verify(self) -> None:
        from agentenv.grading import grade_episode

        episode = Episode(self.task.id, self.variant, self.state.answer, self.sandbox.spec.workdir)
        result = grade_episode(self.backend, self.sandbox, self.task, episode)
        verdict = "INVALID" if result.invalid else ("PASS" if result.passed else "FAIL")
        self.console.print(f"reward {result.reward:g} {verdict}" + (f" ({result.reason})" if result.reason else ""), markup=False)
        for d in result.details:
            self.console.print(f"  {'ok ' if d.passed else 'bad'} {d.name}: {d.detail}", markup=False)

    def _oracle(self) -> None:
        answer = self.task.oracle(self.sandbox, self.variant)
        if answer is not None:
            self.state.answer = answer
        self.console.print("oracle done" + (f"; answer: {answer}" if answer is not None else ""), markup=False)

    def _snapshot(self) -> None:
        ref = self.sandbox.snapshot()
        sid = f"s{len(self.snapshots) + 1}"
        self.snapshots[sid] = ref
        self.console.print(f"snapshot {sid}", markup=False)

    def _restore(self, sid: str) -> None:
        ref = self.snapshots.get(sid)
        if ref is None:
            raise ValueError(f":restore {sid!r}: no such snapshot; have {', '.join(self.snapshots) or 'none'}")
        self._replace(self.backend.restore(ref))
        self.console.print(f"restored {sid}", markup=False)

    def _reset(self) -> None:
        fresh = self.backend.create(self.sandbox.spec)
        try:
            self.task.setup(fresh, self.variant)
        except BaseException:
            fresh.close()
            raise
        self._replace(fresh)
        self.state = EpisodeState()
        self.console.print("reset to the state after setup", markup=False)

    def _diff(self) -> None:
        now = self._fingerprint()
        lines = [f"+ {p}" for p in sorted(now.keys() - self.pristine_files.keys())]
        lines += [f"- {p}" for p in sorted(self.pristine_files.keys() - now.keys())]
        lines += [f"M {p}" for p in sorted(now.keys() & self.pristine_files.keys()) if now[p] != self.pristine_files[p]]
        self.console.print("\n".join(lines) if lines else "no changes since setup", markup=False)

    # ---------------------------------------------------------------- helpers

    def _replace(self, sandbox: Sandbox) -> None:
        old, self.sandbox = self.sandbox, sandbox
        old.close()

    def _fingerprint(self) -> dict[str, str]:
        """Path -> content hash of every file under the workdir (one exec, any backend)."""
        workdir = self.sandbox.spec.workdir
        script = (
            f"cd {shlex.quote(workdir)} && find . -type f -not -path '*/__pycache__/*' -print0 "
            "| xargs -0 -r sha256sum"
        )
        result = self.sandbox.exec(["sh", "-c", script], timeout=60)
        out: dict[str, str] = {}
        for line in result.stdout.splitlines():
            digest, _, path = line.partition("  ")
            if path:
                out[path.removeprefix("./")] = digest
        return out

    def _error(self, message: str) -> None:
        self.console.print(message, style="red", markup=False)


def run_repl(session: DebugSession, read: Callable[[str], str] = input) -> None:
    """Read lines until ``:quit`` or end of input; the sandbox is closed on every exit path."""
    session.show_instruction()
    session.console.print("Type shell commands or :help.", style="dim")
    try:
        while True:
            try:
                line = read(PROMPT)
            except EOFError:
                break
            except KeyboardInterrupt:
                session.console.print("(use :quit to leave)", style="dim")
                continue
            if not session.handle(line):
                break
    finally:
        session.close()
        session.console.print("sandbox closed", style="dim")


__all__ = ["DebugSession", "PROMPT", "run_repl"]
