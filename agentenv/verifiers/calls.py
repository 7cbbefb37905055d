"""Grading through a process boundary: the agent's functions are called elsewhere, only plain data comes back.

The ``unit_tests`` verifier imports the agent's code into the pytest process
that records the verdict, so that code shares memory, frames, files and file
descriptors with the grader; no scanner or run-time check can close that in
principle. ``calls`` keeps the verdict in a process that never imports the
agent's code:

* **The checks stay on the host.** A task's checks live in a file of its folder
  (``grading/calls.yaml`` by default, a Jinja template over the variant's
  parameters) that is read and rendered on the host and never copied into any
  sandbox: not with the hidden tests, not into the grading sandbox. What
  enters the sandbox for a check is its steps (targets and arguments); the
  expected return values, exceptions and outputs never do, so code that reads
  the disk, ``/proc`` or its caller at grading time finds nothing to copy.
* **One fresh process per check** (``call_probe``: ``python3 -I -B``, the
  sandbox user, the check's deadline (``timeout_s``) within one for all checks (``budget_s``), the workdir first on ``sys.path``,
  source-only imports with no bytecode cache read or written). It imports the
  agent's module, runs the check's steps and prints one line of type-tagged
  JSON: ``None``, ``bool``, ``int``, ``float``, ``str``, ``list``, ``tuple`` and
  ``dict`` by *exact* type; anything else (an ``int`` subclass whose ``__eq__``
  is always true, a proxy, a lazy object) is ``unencodable``, a failed check.
* **The host decodes strictly and compares.** The line is parsed under a size
  cap, a depth cap and a node cap into fresh built-in values, and compared with
  the expected ones here, where no object of the agent's exists. Exceptions
  come back as the qualified names of their classes; a class that only *calls*
  itself ``ValueError`` is named ``calc.ValueError`` (or ``<impostor>.ValueError``
  when it claims the ``builtins`` module) and does not match.
* **Anything else is the check's failure, never ``invalid``.** A process that
  times out, exits early (``os._exit`` at import), exits non-zero, writes no
  line, two lines, garbage or a result for the wrong steps fails that check
  (score 0): the oracle's state passes every check (``agentenv check``), so no
  such outcome can be the grader's. That holds for a ``python3`` that will not
  start too (exit 126/127): the agent can bring that about (a ``python3`` of its
  own earlier on ``PATH``, a broken interpreter file it could write), so it is
  no way to opt an episode out; an image without ``python3`` fails the oracle
  in ``agentenv check`` instead.

What the agent's code *can* do inside its check's process is choose the bytes
of that one result line: the same power as returning a value from the
function, which it has anyway. It cannot see the expected values, other
checks' arguments, or anything of the grader. What this does not protect is
said in ``docs/sandboxes.md`` ("What grading does not protect").

The file's format (``CallsFile``)::

    checks:
      - name: add                       # optional; default check<i>
        call: calc:add                  # module:attribute.path; one step, or ``steps:``
        args: [{{ a }}, {{ b }}]
        returns: {{ a + b }}
      - name: cart
        steps:
          - {call: "shop.cart:Cart", as: cart}       # bind a value for later steps
          - {call: cart.add, args: [a, 100.0]}       # a step with no expectation must not raise
          - {call: cart.total, kwargs: {discount_pct: 50}, returns: 60.0, tolerance: 1.0e-9}
      - {get: "shop.pricing:compute_total", raises: AttributeError}    # attribute access, no call
      - {call: "shop.cli:main", args: [["10"]], returns: 0, stdout: "12.00"}  # stdout: what it printed (trailing space ignored)
"""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agentenv.types import CallsVerifierSpec, CheckResult, Episode, VerifierResult
from agentenv.verifiers.common import BaseVerifier, VerifierContext, VerifierError, check, invalid, score
from sandboxes.types import Sandbox

PROBE_SOURCE = (Path(__file__).parent / "call_probe.py").read_text()
#: Largest result line the host parses; a longer stdout fails the check.
MAX_RESULT_BYTES = 1 << 20
MAX_DEPTH = 64
MAX_NODES = 100_000
_INT = re.compile(r"-?[0-9]{1,5000}")
_FLOAT_HEX = re.compile(r"-?(0x[0-9a-f](\.[0-9a-f]*)?p[+-][0-9]+|inf|nan)")
_TARGET = re.compile(r"^[A-Za-z_][\w.]*(:[A-Za-z_][\w.]*)?$")


class GarbledResult(ValueError):
    """The line a check's process wrote is not a well-formed result (that check fails)."""


# ---------------------------------------------------------------- the checks file (host only)


class CallStep(BaseModel):
    """One call (or attribute read) of a check, and what it must give."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    call: str | None = Field(default=None, description="module:attr.path (or bound.attr) to call")
    get: str | None = Field(default=None, description="module:attr.path (or bound.attr) to read, not call")
    args: list[Any] = Field(default_factory=list)
    kwargs: dict[str, Any] = Field(default_factory=dict)
    bind: str | None = Field(default=None, alias="as", pattern=r"^[A-Za-z_]\w*$", description="name for later steps")
    returns: Any = None
    raises: str | None = Field(default=None, description="exception class: a built-in name or module.Qualified")
    stdout: str | None = Field(default=None, description="what the step prints, trailing whitespace ignored")
    tolerance: float = Field(default=0.0, ge=0, description="relative and absolute, for numbers")

    @model_validator(mode="after")
    def _one_target(self) -> CallStep:
        if (self.call is None) == (self.get is None):
            raise ValueError("give exactly one of call or get")
        target = self.call or self.get or ""
        if not _TARGET.match(target):
            raise ValueError(f"target {target!r}: expected module.path:attr.path or bound_name.attr")
        if "returns" in self.model_fields_set and self.raises is not None:
            raise ValueError("give returns or raises, not both")
        return self

    @property
    def expects(self) -> bool:
        return "returns" in self.model_fields_set or self.raises is not None or self.stdout is not None


class CallCheck(BaseModel):
    """One check: its steps run in one fresh process; it passes when every expectation holds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str | None = None
    steps: list[CallStep] = Field(min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _one_step_shorthand(cls, data: Any) -> Any:
        if isinstance(data, dict) and "steps" not in data:
            name = data.get("name")
            step = {k: v for k, v in data.items() if k != "name"}
            return {"name": name, "steps": [step]}
        return data

    @model_validator(mode="after")
    def _checked(self) -> CallCheck:
        if not any(s.expects for s in self.steps):
            raise ValueError("no step has returns, raises or stdout: the check would check nothing")
        bound: set[str] = set()
        for step in self.steps:
            target = step.call or step.get or ""
            if ":" not in target and target.split(".")[0] not in bound:
                raise ValueError(f"target {target!r} names no module (module:attr) and no value bound by an earlier step")
            if step.bind:
                bound.add(step.bind)
        return self


class CallsFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    checks: list[CallCheck] = Field(min_length=1)


def load_checks(text: str, where: str) -> list[CallCheck]:
    """Parse a rendered checks file; ``VerifierError`` names the file and field."""
    try:
        raw = yaml.safe_load(text)
        return list(CallsFile.model_validate(raw).checks)
    except yaml.YAMLError as exc:
        raise VerifierError(f"{where}: invalid YAML after rendering: {exc}") from exc
    except ValidationError as exc:
        lines = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:5])
        raise VerifierError(f"{where}: {lines}") from exc


def request_of(check_: CallCheck) -> dict[str, Any]:
    """What goes into the sandbox for a check: targets and arguments, never an expectation."""
    return {
        "steps": [
            {"index": i, "target": s.call or s.get, "call": s.call is not None, "args": s.args, "kwargs": s.kwargs,
             "as": s.bind, "report": s.expects, "stdout": s.stdout is not None}
            for i, s in enumerate(check_.steps)
        ]
    }


# ---------------------------------------------------------------- decoding (strict, bounded)


def parse_result(stdout: str) -> list[dict[str, Any]]:
    """The one result line of a check's process, or ``GarbledResult``."""
    if len(stdout) > MAX_RESULT_BYTES:
        raise GarbledResult(f"{len(stdout)} bytes on the result channel, over the {MAX_RESULT_BYTES}-byte cap")
    if not stdout.endswith("\n") or stdout.count("\n") != 1:
        raise GarbledResult(f"expected exactly one result line, got {stdout.count(chr(10))} line(s)"
                            + ("" if stdout.endswith("\n") else " and an unterminated one"))
    try:
        raw = json.loads(stdout, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise GarbledResult(f"not JSON: {exc}") from exc
    if not isinstance(raw, dict) or set(raw) != {"results"} or not isinstance(raw["results"], list):
        raise GarbledResult("expected {\"results\": [...]}")
    return raw["results"]


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


def decode(tagged: Any) -> Any:
    """Type-tagged JSON -> fresh built-in values; anything off-format is ``GarbledResult``."""
    budget = [MAX_NODES]
    return _decode(tagged, 0, budget)


def _decode(node: Any, depth: int, budget: list[int]) -> Any:
    budget[0] -= 1
    if budget[0] < 0 or depth > MAX_DEPTH:
        raise GarbledResult("value too large or too deeply nested")
    if not isinstance(node, list) or not node or not isinstance(node[0], str):
        raise GarbledResult(f"not a tagged value: {str(node)[:60]}")
    tag, rest = node[0], node[1:]
    if tag == "none" and not rest:
        return None
    if len(rest) != 1:
        raise GarbledResult(f"tag {tag!r} with {len(rest)} fields")
    body = rest[0]
    if tag == "bool" and type(body) is bool:
        return body
    if tag == "int" and type(body) is str and _INT.fullmatch(body):
        return int(body)
    if tag == "float" and type(body) is str and _FLOAT_HEX.fullmatch(body):
        return float.fromhex(body) if "x" in body else float(body)
    if tag == "str" and type(body) is str:
        return body
    if tag in ("list", "tuple") and type(body) is list:
        items = [_decode(v, depth + 1, budget) for v in body]
        return items if tag == "list" else tuple(items)
    if tag == "dict" and type(body) is list:
        out: dict[Any, Any] = {}
        for pair in body:
            if type(pair) is not list or len(pair) != 2:
                raise GarbledResult("a dict entry is not a [key, value] pair")
            key = _decode(pair[0], depth + 1, budget)
            try:
                hash(key)
            except TypeError as exc:
                raise GarbledResult("an unhashable dict key") from exc
            out[key] = _decode(pair[1], depth + 1, budget)
        return out
    raise GarbledResult(f"unknown or malformed tag {tag!r}")


# ---------------------------------------------------------------- comparison (host values only)


def same(got: Any, want: Any, tolerance: float = 0.0) -> bool:
    """Equality of plain data by type family: bool only equals bool; int and float are numbers
    (within ``tolerance``, relative and absolute); a YAML list matches a list or a tuple."""
    if want is None:
        return got is None
    if type(want) is bool or type(got) is bool:
        return type(got) is bool and type(want) is bool and got == want
    if type(want) in (int, float):
        if type(got) not in (int, float):
            return False
        if isinstance(want, float) and math.isnan(want):
            return isinstance(got, float) and math.isnan(got)
        if tolerance:
            return math.isclose(got, want, rel_tol=tolerance, abs_tol=tolerance)
        return bool(got == want)
    if type(want) is str:
        return type(got) is str and got == want
    if type(want) in (list, tuple):
        return (type(got) in (list, tuple) and len(got) == len(want)
                and all(same(g, w, tolerance) for g, w in zip(got, want, strict=True)))
    if type(want) is dict:
        if type(got) is not dict or len(got) != len(want):
            return False
        return all(k in got and same(got[k], v, tolerance) for k, v in want.items())
    return False  # an expected value YAML cannot produce: never equal


def judge_step(step: CallStep, entry: dict[str, Any]) -> tuple[bool, str]:
    """Does one reported step meet its expectations? (ok, detail)."""
    detail: list[str] = []
    ok = True
    if "unencodable" in entry:
        return False, f"returned a value that is not plain data ({str(entry['unencodable'])[:80]})"
    raised = entry.get("raised")
    if raised is not None:
        if type(raised) is not list or not all(type(n) is str for n in raised):
            raise GarbledResult("raised is not a list of names")
        if step.raises is None:
            return False, f"raised {raised[0] if raised else '?'}"
        wanted = step.raises if "." in step.raises else f"builtins.{step.raises}"
        if wanted not in raised:
            return False, f"raised {raised[0] if raised else '?'}, expected {step.raises}"
    elif step.raises is not None:
        return False, f"raised nothing, expected {step.raises}"
    elif "value" in entry:
        got = decode(entry["value"])
        if "returns" in step.model_fields_set and not same(got, step.returns, step.tolerance):
            ok = False
            detail.append(f"returned {_short(got)}, expected another value")  # the expected value stays unsaid
    else:
        raise GarbledResult("a reported step with neither value nor raised")
    if step.stdout is not None:
        out = entry.get("stdout")
        if type(out) is not str:
            raise GarbledResult("stdout was asked for and not given")
        if entry.get("stdout_truncated") or out.rstrip() != step.stdout.rstrip():
            ok = False
            detail.append(f"printed {_short(out.rstrip())}, expected other output")
    return ok, "; ".join(detail) or "ok"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# ---------------------------------------------------------------- the verifier


class CallsVerifier(BaseVerifier):
    """Calls the agent's functions in a fresh sandbox process per check; compares plain data on the host."""

    kind = "calls"

    def __init__(self, spec: CallsVerifierSpec, ctx: VerifierContext) -> None:
        super().__init__(spec.name, ctx)
        self.spec = spec

    def checks(self) -> list[CallCheck]:
        if self.ctx.task_dir is None:
            raise VerifierError(f"{self.name}: a calls verifier reads its checks from the task folder, and there is none")
        path = self.ctx.task_dir / self.spec.file
        if not path.is_file():
            raise VerifierError(f"{path}: the checks file is missing")
        text = self.ctx.render(path.read_text(), str(path))
        return load_checks(text, str(path))

    def _verify(self, sandbox: Sandbox, episode: Episode, started: float) -> VerifierResult:
        checks = self.checks()
        results: list[CheckResult] = []
        for i, check_ in enumerate(checks):
            name = check_.name or f"check{i}"
            left = self.spec.budget_s - (time.monotonic() - started)
            if left < 1.0:  # a hang in every check costs the budget once, not timeout_s per check
                results.append(check(name, False, f"not run: the {self.spec.budget_s:g}s budget of all checks is spent"))
                continue
            ok, detail = self._run_check(sandbox, episode, check_, min(self.spec.timeout_s, left))
            results.append(check(name, ok, detail))
        return score(results, partial_credit=self.spec.partial_credit, started=started)

    def _run_check(self, sandbox: Sandbox, episode: Episode, check_: CallCheck, timeout: float) -> tuple[bool, str]:
        """(passed, detail)."""
        request = json.dumps(request_of(check_)).encode()
        result = sandbox.exec(
            ["python3", "-I", "-B", "-c", PROBE_SOURCE, episode.workdir],
            timeout=timeout,
            cwd=episode.workdir,
            env={"PYTHONDONTWRITEBYTECODE": "1"},
            stdin=request,
        )
        tail = result.stderr.strip()[-200:]
        if result.timed_out:
            return False, f"timed out after {timeout:g}s"
        if result.exit_code != 0:
            return False, f"the check's process exited {result.exit_code} before a result; {tail}"
        try:
            entries = parse_result(result.stdout)
            reported = [(i, s) for i, s in enumerate(check_.steps) if s.expects]
            if entries and isinstance(entries[-1], dict) and entries[-1].get("unreported"):
                step = entries[-1].get("step")
                return False, f"step {step} raised {(entries[-1].get('raised') or ['?'])[0]}"
            if len(entries) != len(reported):
                raise GarbledResult(f"{len(entries)} results for {len(reported)} reported steps")
            for (index, step), entry in zip(reported, entries, strict=True):
                if not isinstance(entry, dict) or entry.get("step") != index:
                    raise GarbledResult(f"a result for the wrong step (expected step {index})")
                ok, detail = judge_step(step, entry)
                if not ok:
                    return False, f"step {index} ({step.call or step.get}): {detail}"
        except GarbledResult as exc:
            return False, f"garbled result: {exc}"
        return True, "ok"


__all__ = ["CallCheck", "CallStep", "CallsFile", "CallsVerifier", "GarbledResult", "decode", "load_checks",
           "parse_result", "request_of", "same"]
