"""Load a task folder's ``task.yaml`` into a ``TaskSpec``, or say exactly what is wrong.

A broken task must be caught by its author, not by a training run, so every
problem is reported at once, each as ``file: field.path: what was expected,
what arrived`` with a "did you mean" hint for near-miss keys and tags::

    tasks/foo/task.yaml: verifiers.0.type: expected one of unit_tests|db_state|files|answer|exit_code|calls, got 'unittest' (did you mean 'unit_tests'?)

Besides the schema (``agentenv.types.TaskSpec``) the folder itself is checked:
the files the spec names exist, and templates only use declared parameters.

Usage::

    spec = load_spec(Path("tasks/foo"))      # raises TaskSpecError listing every problem
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from agentenv.configs import fields_at
from agentenv.errors import TaskSpecError, did_you_mean
from agentenv.types import CallsVerifierSpec, TaskSpec, UnitTestsVerifierSpec

SPEC_FILE = "task.yaml"


def load_spec(folder: Path | str) -> TaskSpec:
    """Parse and validate ``folder/task.yaml`` and the files it names.

    ``id`` may be left out: it defaults to the folder's name, so a copied
    folder does not silently keep its original's id unless the author wrote it.
    """
    folder = Path(folder)
    path = folder / SPEC_FILE
    shown = _shown(path)
    if not folder.is_dir():
        raise TaskSpecError(f"{folder}: not a task folder (expected a directory with {SPEC_FILE})")
    if not path.is_file():
        raise TaskSpecError(f"{shown}: missing (a task folder needs a {SPEC_FILE})")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise TaskSpecError(f"{shown}: {where}invalid YAML: {problem}") from exc
    if not isinstance(raw, dict):
        raise TaskSpecError(f"{shown}: expected a mapping of fields at the top level, got {type(raw).__name__}")
    raw.setdefault("id", folder.resolve().name.lower())
    try:
        spec = TaskSpec.model_validate(raw)
    except ValidationError as exc:
        problems = [f"{shown}: {line}" for line in explain_validation_error(exc, TaskSpec)]
        raise TaskSpecError(_joined(shown, problems), problems) from exc
    problems = check_folder(folder, spec)
    if problems:
        raise TaskSpecError(_joined(shown, problems), problems)
    return spec


def check_folder(folder: Path, spec: TaskSpec) -> list[str]:
    """Problems with the files a valid spec names (empty when the folder is sound).

    Each line starts with the file it is about: ``task.yaml`` for a field, the
    template file for an undeclared variable in it.
    """
    from agentenv.variants import undeclared_variables

    shown = _shown(folder / SPEC_FILE)
    problems: list[str] = []
    field_problems: list[str] = []
    declared = set(spec.params)
    instruction = folder / spec.instruction
    if not instruction.is_file():
        field_problems.append(f"instruction: file {spec.instruction!r} not found in {folder}")
    else:
        problems += [f"{_shown(instruction)}: {p}" for p in undeclared_variables(instruction.read_text(), declared)]
    solution = folder / spec.solution
    if not solution.is_file():
        field_problems.append(f"solution: file {spec.solution!r} not found in {folder} (every task needs an oracle)")
    else:
        problems += [f"{_shown(solution)}: {p}" for p in undeclared_variables(solution.read_text(), declared)]
    setup_file = setup_path(folder, spec)
    if setup_file is not None:
        problems += [f"{_shown(setup_file)}: {p}" for p in undeclared_variables(setup_file.read_text(), declared)]
    elif spec.setup and _looks_like_path(spec.setup):
        field_problems.append(f"setup: file {spec.setup!r} not found in {folder} (write a path to a script, or an inline script)")
    elif spec.setup:
        field_problems += [f"setup: {p}" for p in undeclared_variables(spec.setup, declared)]
    if any(isinstance(v, UnitTestsVerifierSpec) for v in spec.verifiers) and not (folder / spec.tests).is_dir():
        field_problems.append(f"tests: folder {spec.tests!r} not found in {folder} (a unit_tests verifier runs the hidden tests there)")
    for i, verifier in enumerate(spec.verifiers):
        if isinstance(verifier, CallsVerifierSpec):
            checks_file = folder / verifier.file
            if not checks_file.is_file():
                field_problems.append(f"verifiers.{i}.file: checks file {verifier.file!r} not found in {folder}")
            else:
                problems += [f"{_shown(checks_file)}: {p}" for p in undeclared_variables(checks_file.read_text(), declared)]
    env = spec.environment
    if env.image and env.dockerfile:
        field_problems.append("environment: give either image or dockerfile, not both")
    if env.dockerfile and not (folder / env.dockerfile / "Dockerfile").is_file():
        field_problems.append(f"environment.dockerfile: no Dockerfile in {env.dockerfile!r}")
    for name, param in spec.params.items():
        low, high = getattr(param, "low", None), getattr(param, "high", None)
        if low is not None and high is not None and low > high:
            field_problems.append(f"params.{name}: expected low <= high, got low={low} high={high}")
    return [f"{shown}: {p}" for p in field_problems] + problems


def setup_path(folder: Path, spec: TaskSpec) -> Path | None:
    """The setup script file, when ``setup`` names one; ``None`` for an inline script or none.

    ``setup`` is a path when it is one line naming an existing file in the
    folder; anything else is the script itself. A one-liner that looks like a
    path (``setup.sh``) but is missing is reported by ``check_folder``.
    """
    if not spec.setup or "\n" in spec.setup.strip():
        return None
    candidate = folder / spec.setup.strip()
    return candidate if candidate.is_file() else None


def _looks_like_path(text: str) -> bool:
    text = text.strip()
    return " " not in text and "\n" not in text and (text.endswith((".sh", ".py", ".bash")) or "/" in text)


# ---------------------------------------------------------------- pydantic errors -> readable lines


def explain_validation_error(exc: ValidationError, model: type[BaseModel]) -> list[str]:
    """One ``field.path: message`` line per error, with discriminator tags hidden from the path."""
    return [_explain(err, model) for err in exc.errors()]


def _explain(err: Any, model: type[BaseModel]) -> str:
    line = _explain_body(err, model)
    return line[2:] if line.startswith(": ") else line


def _explain_body(err: Any, model: type[BaseModel]) -> str:
    loc: tuple[Any, ...] = tuple(err["loc"])
    kind: str = err["type"]
    ctx: dict[str, Any] = err.get("ctx") or {}
    shown, fields = fields_at(model, loc)
    path = ".".join(shown)
    got = err.get("input")
    if kind == "extra_forbidden":
        key = str(loc[-1])
        hint = did_you_mean(key, fields or ())
        expected = f"; expected one of {', '.join(sorted(fields))}" if fields else ""
        return f"{path}: unknown key {key!r}{hint}{expected}"
    if kind == "union_tag_invalid":
        tags = _split_expected(ctx.get("expected_tags", ""))
        tag = ctx.get("tag")
        return f"{path}.type: expected one of {'|'.join(tags)}, got {tag!r}{did_you_mean(str(tag), tags)}"
    if kind == "union_tag_not_found":
        return f"{path}: missing key 'type' (it says which kind this entry is)"
    if kind in {"enum", "literal_error"}:
        options = _split_expected(ctx.get("expected", ""))
        return f"{path}: expected one of {'|'.join(options)}, got {got!r}{did_you_mean(str(got), options)}"
    if kind == "missing":
        return f"{path}: required field is missing"
    if kind == "string_pattern_mismatch":
        return f"{path}: expected text matching {ctx.get('pattern')}, got {got!r}"
    return f"{path}: {err['msg'][0].lower() + err['msg'][1:]}, got {_short(got)}"


def _split_expected(text: str) -> list[str]:
    parts = text.replace(" or ", ", ").split(",")
    return [p.strip().strip("'\"") for p in parts if p.strip()]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _shown(path: Path) -> str:
    """A path as the author would type it: relative to the cwd when it is below it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _joined(shown: str, problems: list[str]) -> str:
    if len(problems) == 1:
        return problems[0]
    return f"{shown}: {len(problems)} problems\n" + "\n".join(f"  {p}" for p in problems)


__all__ = ["SPEC_FILE", "check_folder", "explain_validation_error", "load_spec", "setup_path"]
