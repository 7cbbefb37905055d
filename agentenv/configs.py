"""The one config loader: YAML in, a validated pydantic model out, or one error naming file and field.

Every config of the project (rollout run, training run, eval sweep, teacher
grid, teachers recipe, distill run, budgets file) is read through here, so a
mistake reads the same everywhere::

    examples/eval.yaml: policies[1].url: Input should be a valid string, got 3
    runs/train.yaml: rl.loss.temperature: 0.7 conflicts with rollout.sampling.temperature: 1.0; ...

One line per problem, ``FILE: FIELD.PATH: WHY``: what the field expected and
what arrived (pydantic's own message plus ``got <value>``, or the message of
the config's own validator, which names its fields). Each package raises its
own subclass of ``agentenv.errors.ConfigError`` (``error=``).

Usage::

    cfg = load_yaml_config(RolloutConfig, "examples/rollout.yaml", error=rollout.errors.ConfigError)
    cfg = validate_config(TeacherGridConfig, data, source="grid.yaml", error=TeacherConfigError)
    format_loc(("policies", 1, "url"))  # 'policies[1].url'
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from agentenv.errors import ConfigError

__all__ = [
    "ConfigError", "explain_error", "format_loc", "load_yaml_config", "raise_invalid", "read_yaml", "validate_config",
    "validation_problems",
]

M = TypeVar("M", bound=BaseModel)

# pydantic error kinds whose message already says it all, or whose input is not the field's value
_NO_GOT = {"missing", "extra_forbidden"}


def format_loc(loc: tuple[int | str, ...] | list[int | str], prefix: str = "") -> str:
    """A field path as a user writes it: ``policies[1].sampling.temperature``; ``(top level)`` when empty.

    ``prefix`` is the path of the section the location is relative to (``base``, ``teachers``).
    """
    out = prefix
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def explain_error(err: Mapping[str, Any]) -> str:
    """What one pydantic error says: a config validator's own message as it was written (it names its
    fields), else pydantic's message and the value that arrived (``..., got 0``)."""
    own = (err.get("ctx") or {}).get("error")
    if own is not None:
        return str(own)
    msg = str(err["msg"])
    if err.get("type") in _NO_GOT or "input" not in err or isinstance(err["input"], (dict, BaseModel)):
        return msg
    return f"{msg}, got {_short(err['input'])}"


def validation_problems(exc: ValidationError, *, source: str, prefix: str = "") -> list[str]:
    """One line per error: ``source: field.path: why`` (no path for a whole-config validator's own message)."""
    lines = []
    for err in exc.errors():
        why = explain_error(err)
        if not err["loc"] and not prefix and (err.get("ctx") or {}).get("error") is not None:
            lines.append(f"{source}: {why}")
        else:
            lines.append(f"{source}: {format_loc(err['loc'], prefix)}: {why}")
    return lines


def raise_invalid(problems: list[str], error: type[Exception] = ConfigError) -> None:
    """Raise ``error`` with the first problem on the first line and any others indented below it."""
    raise error("\n  ".join(problems))


def read_yaml(path: str | Path, *, error: type[Exception] = ConfigError, what: str = "config file") -> Any:
    """The parsed YAML of ``path``; a missing, unreadable or malformed file is ``error`` naming it."""
    where = Path(path)
    try:
        text = where.read_text(encoding="utf-8")
    except OSError as exc:
        why = "no such file" if isinstance(exc, FileNotFoundError) else (exc.strerror or str(exc))
        raise error(f"{where}: cannot read the {what} ({why}); expected a readable YAML file") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise error(f"{where}: not valid YAML: {exc}") from None


def validate_config(
    model: type[M], data: Any, *, source: str, error: type[Exception] = ConfigError, prefix: str = "",
    what: str = "config fields",
) -> M:
    """``model`` validated from the mapping ``data``; every problem becomes one line of one ``error``.

    ``source`` names where ``data`` came from (a file, or ``file: section``); ``prefix`` is the
    field path of ``data`` inside that source. A ``ConfigError`` a validator raised outside
    pydantic's wrapping gets the source too.
    """
    if not isinstance(data, Mapping):
        raise error(f"{source}: {prefix + ': ' if prefix else ''}expected a mapping of {what}, got {type(data).__name__}")
    try:
        return model.model_validate(dict(data))
    except ValidationError as exc:
        raise_invalid(validation_problems(exc, source=source, prefix=prefix), error)
    except ConfigError as exc:
        text = str(exc)
        raise error(text if text.startswith(f"{source}:") else f"{source}: {text}") from None
    raise AssertionError("unreachable")  # pragma: no cover


def load_yaml_config(
    model: type[M], path: str | Path, *, error: type[Exception] = ConfigError, overrides: Mapping[str, Any] | None = None,
    what: str = "config file",
) -> M:
    """Read ``path`` and validate it as ``model``; ``overrides`` replace top-level fields when not None (CLI flags)."""
    data = read_yaml(path, error=error, what=what)
    if isinstance(data, dict) and overrides:
        data = {**data, **{k: v for k, v in overrides.items() if v is not None}}
    return validate_config(model, data, source=str(path), error=error)
