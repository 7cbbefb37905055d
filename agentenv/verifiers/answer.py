"""The agent's final answer against the expected one: exact, numeric with tolerance, or normalised.

The answer is the one given with the submit intent (``Episode.final_answer``);
a task may also name a ``file`` the answer is read from when none was
submitted (tiny models learn "write N to answer.txt" before they learn tool
protocols). ``expected`` is a Jinja template over the variant's parameters and
may use ``{{ oracle_answer }}``: the oracle's answer on a fresh copy of the
variant, for data-dependent questions.
"""

from __future__ import annotations

import jinja2
import jinja2.meta

from agentenv.types import AnswerVerifierSpec, Episode, VerifierResult
from agentenv.verifiers.common import ORACLE_ANSWER, BaseVerifier, VerifierContext, VerifierError, check, read_graded_file, score
from agentenv.verifiers.compare import close, normalize_text, parse_number
from sandboxes.types import Sandbox


class AnswerVerifier(BaseVerifier):
    kind = "answer"

    def __init__(self, spec: AnswerVerifierSpec, ctx: VerifierContext) -> None:
        super().__init__(spec.name, ctx)
        self.spec = spec
        self.uses_oracle = ORACLE_ANSWER in jinja2.meta.find_undeclared_variables(jinja2.Environment().parse(spec.expected))

    def _verify(self, sandbox: Sandbox, episode: Episode, started: float) -> VerifierResult:
        expected = self._expected(episode)
        given = episode.final_answer
        source = "submitted"
        if given is None and self.spec.file:
            path = self.ctx.render(self.spec.file, f"{self.name}.file")
            data = read_graded_file(sandbox, path, cap=1 << 20, workdir=episode.workdir)
            given, source = (None, source) if data is None else (data.decode("utf-8", errors="replace"), path)
        if given is None:
            return score([check("answer", False, "no answer was given")], partial_credit=False, started=started)
        ok, detail = self._compare(given.strip(), expected.strip())
        return score([check(f"answer ({self.spec.mode})", ok, f"{source}: {detail}")], partial_credit=False, started=started)

    def _expected(self, episode: Episode) -> str:
        extra: dict[str, str] = {}
        if self.uses_oracle:
            if episode.oracle is None:
                raise VerifierError("expected uses oracle_answer but no oracle replay is available")
            answer = episode.oracle.compute("answer", lambda _sb, ans: ans)
            if answer is None:
                raise VerifierError("the oracle gave no final answer")
            extra[ORACLE_ANSWER] = answer
        return self.ctx.render(self.spec.expected, f"{self.name}.expected", **extra)

    def _compare(self, given: str, expected: str) -> tuple[bool, str]:
        shown = f"got {given[:60]!r}, expected {expected!r}"
        if self.spec.mode == "exact":
            return given == expected, shown
        if self.spec.mode == "normalized":
            return normalize_text(given) == normalize_text(expected), shown
        want = parse_number(expected)
        if want is None:
            raise VerifierError(f"expected answer {expected!r} is not a number (mode numeric)")
        got = parse_number(given)
        return got is not None and close(got, want, self.spec.tolerance), shown


__all__ = ["AnswerVerifier"]
