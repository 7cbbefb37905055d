"""File checks: exists (or must not), contains, excludes, equals, JSON / CSV equality with tolerance.

Expected strings are Jinja templates over the variant's parameters (and
``seed``), so one ``task.yaml`` serves every variant. ``match_oracle`` compares
with the file the oracle writes on a fresh copy of the variant (replayed once
and cached by grading), for reports whose content is data-dependent.

A missing file is the agent's failure (reward 0, decided). What is at a graded
path is looked at before it is read (``read_graded_file``): a directory, a
symlink or a file over ``MAX_READ_BYTES`` is an agent-caused ``invalid``
(reward 0, counted as a failure), and a FIFO reads as empty without being
opened: never a hang or an out-of-memory grader. A failed oracle replay is ``invalid`` for the grader.
"""

from __future__ import annotations

import json
from typing import Any

from agentenv.types import CheckResult, Episode, FileCheck, FilesVerifierSpec, VerifierResult
from agentenv.verifiers.common import AgentCaused, BaseVerifier, VerifierContext, VerifierError, check, read_graded_file, score
from agentenv.verifiers.compare import csv_equal, json_equal, load_json, parse_csv
from sandboxes.types import Sandbox


class FilesVerifier(BaseVerifier):
    kind = "files"

    def __init__(self, spec: FilesVerifierSpec, ctx: VerifierContext) -> None:
        super().__init__(spec.name, ctx)
        self.spec = spec

    def _verify(self, sandbox: Sandbox, episode: Episode, started: float) -> VerifierResult:
        checks: list[CheckResult] = []
        for i, file_check in enumerate(self.spec.checks):
            checks.extend(self._one(sandbox, episode, file_check, f"{self.name}.checks[{i}]"))
        return score(checks, partial_credit=self.spec.partial_credit, started=started)

    def _one(self, sandbox: Sandbox, episode: Episode, fc: FileCheck, where: str) -> list[CheckResult]:
        path = self.ctx.render(fc.path, f"{where}.path")
        data = read_graded_file(sandbox, path, workdir=episode.workdir)
        if not fc.exists:
            return [check(f"{path} absent", data is None, "" if data is None else "file exists")]
        if data is None:
            return [check(f"{path} exists", False, "missing or unreadable")]
        text = data.decode("utf-8", errors="replace")
        out = [check(f"{path} exists", True)]
        for needle in fc.contains:
            wanted = self.ctx.render(needle, f"{where}.contains")
            out.append(check(f"{path} contains {wanted!r}", wanted in text))
        for needle in fc.excludes:
            unwanted = self.ctx.render(needle, f"{where}.excludes")
            out.append(check(f"{path} excludes {unwanted!r}", unwanted not in text))
        if fc.equals is not None:
            wanted = self.ctx.render(fc.equals, f"{where}.equals")
            out.append(check(f"{path} equals", text.strip() == wanted.strip(), f"got {text[:80]!r}"))
        if fc.json_equals is not None:
            out.append(self._json(path, text, self._render_tree(fc.json_equals, where), fc.tolerance))
        if fc.csv_equals is not None:
            expected = [[self.ctx.render(str(cell), f"{where}.csv_equals") for cell in row] for row in fc.csv_equals]
            ok, why = csv_equal(parse_csv(text), expected, fc.tolerance)
            out.append(check(f"{path} csv", ok, why))
        if fc.match_oracle is not None:
            out.append(self._oracle(episode, path, text, fc))
        return out

    def _render_tree(self, value: Any, where: str) -> Any:
        """Render string leaves; a string that renders to JSON text is parsed (``"{{ n }}"`` -> 7)."""
        if isinstance(value, str):
            rendered = self.ctx.render(value, f"{where}.json_equals")
            try:
                return json.loads(rendered)
            except json.JSONDecodeError:
                return rendered
        if isinstance(value, list):
            return [self._render_tree(v, where) for v in value]
        if isinstance(value, dict):
            return {k: self._render_tree(v, where) for k, v in value.items()}
        return value

    @staticmethod
    def _json(path: str, text: str, expected: Any, tolerance: float) -> CheckResult:
        actual, err = load_json(text)
        if err:
            return check(f"{path} json", False, err)
        ok, why = json_equal(actual, expected, tolerance)
        return check(f"{path} json", ok, why)

    def _oracle(self, episode: Episode, path: str, text: str, fc: FileCheck) -> CheckResult:
        if episode.oracle is None:
            raise VerifierError("match_oracle needs an oracle replay (grade through agentenv.grading.grade_episode)")

        def read(oracle_sandbox: Sandbox, _answer: str | None) -> str | None:
            try:
                data = read_graded_file(oracle_sandbox, path, workdir=episode.workdir)
            except AgentCaused as exc:  # on the oracle's side it is the task's fault, not the agent's
                raise VerifierError(f"the oracle's {exc}") from exc
            return None if data is None else data.decode("utf-8", errors="replace")

        expected = episode.oracle.compute(f"file:{path}", read)
        if expected is None:
            raise VerifierError(f"the oracle did not write {path}")
        name = f"{path} matches oracle ({fc.match_oracle})"
        if fc.match_oracle == "json":
            want, err = load_json(expected)
            if err:
                raise VerifierError(f"the oracle's {path} is {err}")
            return self._json(path, text, want, fc.tolerance)
        if fc.match_oracle == "csv":
            ok, why = csv_equal(parse_csv(text), parse_csv(expected), fc.tolerance)
            return check(name, ok, why)
        return check(name, text.strip() == expected.strip(), f"got {text[:80]!r}")


__all__ = ["FilesVerifier"]
