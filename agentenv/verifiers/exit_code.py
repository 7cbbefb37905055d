"""A command's exit code in the grading sandbox, e.g. ``python3 /tests/check.py`` or ``make test``.

The command is a Jinja template over the variant's parameters; it runs in the
workdir with ``AGENTENV_TESTS_DIR`` pointing at the hidden files, which are
staged into a fresh directory just before it runs. A timeout is ``invalid``
(the check could not finish), a different exit code is a decided failure.
"""

from __future__ import annotations

from agentenv.types import Episode, ExitCodeVerifierSpec, VerifierResult
from agentenv.verifiers.common import BaseVerifier, VerifierContext, check, invalid, remove_dirs, score, stage
from sandboxes.types import Sandbox


class ExitCodeVerifier(BaseVerifier):
    kind = "exit_code"

    def __init__(self, spec: ExitCodeVerifierSpec, ctx: VerifierContext) -> None:
        super().__init__(spec.name, ctx)
        self.spec = spec

    def _verify(self, sandbox: Sandbox, episode: Episode, started: float) -> VerifierResult:
        tests_dir = stage(sandbox, self.ctx.hidden, "check") if self.ctx.hidden else ""
        command = self.ctx.render(self.spec.command, f"{self.name}.command", tests_dir=tests_dir)
        try:
            result = sandbox.exec(
                ["bash", "-c", command],
                timeout=self.spec.timeout_s,
                cwd=episode.workdir,
                env={"AGENTENV_TESTS_DIR": tests_dir},
            )
        finally:
            remove_dirs(sandbox, [tests_dir])
        if result.timed_out:  # the check runs against the agent's state: a hang there is the agent's
            return invalid(f"command timed out after {self.spec.timeout_s:g}s", started=started, cause="agent")
        tail = (result.stdout + result.stderr).strip()[-300:]
        ok = result.exit_code == self.spec.expect
        return score(
            [check(f"exit code {self.spec.expect}", ok, f"got {result.exit_code}; {tail}")],
            partial_credit=False,
            started=started,
        )


__all__ = ["ExitCodeVerifier"]
