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

import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from agentenv.errors import ConfigError, did_you_mean

__all__ = [
    "ConfigError", "explain_error", "fields_at", "format_loc", "load_yaml_config", "raise_invalid", "read_yaml", "validate_config",
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


def explain_error(err: Mapping[str, Any], model: type[BaseModel] | None = None) -> str:
    """What one pydantic error says: a config validator's own message as it was written (it names its
    fields), else pydantic's message and the value that arrived (``..., got 0``); an unknown key gets
    the nearest known one and the list of known ones when ``model`` (the validated model) is given."""
    own = (err.get("ctx") or {}).get("error")
    if own is not None:
        return str(own)
    msg = str(err["msg"])
    if err.get("type") == "extra_forbidden" and model is not None and err["loc"]:
        _, known = fields_at(model, tuple(err["loc"]))
        if known:
            return f"{msg}{did_you_mean(str(err['loc'][-1]), known)}; expected one of {', '.join(sorted(known))}"
    if err.get("type") in _NO_GOT or "input" not in err or isinstance(err["input"], (dict, BaseModel)):
        return msg
    return f"{msg}, got {_short(err['input'])}"


def validation_problems(
    exc: ValidationError, *, source: str, prefix: str = "", model: type[BaseModel] | None = None,
) -> list[str]:
    """One line per error: ``source: field.path: why`` (no path for a whole-config validator's own message).

    ``model``: the model that was validated, for "did you mean" on unknown keys.
    """
    lines = []
    for err in exc.errors():
        why = explain_error(err, model)
        if not err["loc"] and not prefix and (err.get("ctx") or {}).get("error") is not None:
            lines.append(f"{source}: {why}")
        else:
            lines.append(f"{source}: {format_loc(err['loc'], prefix)}: {why}")
    return lines


def fields_at(model: type[BaseModel], loc: tuple[Any, ...] | list[Any]) -> tuple[list[str], set[str] | None]:
    """Follow ``loc`` through the model's annotations.

    Returns the path to show (tags of discriminated unions dropped, since the
    author never wrote them) and the field names of the last model reached
    (for "did you mean" on unknown keys).
    """
    shown: list[str] = []
    ann: Any = model
    fields: set[str] | None = None
    for i, part in enumerate(loc):
        ann = _unwrap(ann, part)
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            fields = set(ann.model_fields)
            shown.append(str(part))
            ann = ann.model_fields[part].annotation if part in ann.model_fields else None
            if i == len(loc) - 1 and part not in (fields or set()):
                shown.pop()  # the unknown key itself is named in the message
            continue
        origin = typing.get_origin(ann)
        if origin in (list, tuple) and isinstance(part, int):
            shown.append(str(part))
            ann = typing.get_args(ann)[0]
        elif origin is dict:
            shown.append(str(part))
            ann = typing.get_args(ann)[1]
        elif _union_members(ann) and isinstance(part, str):
            ann = _tagged_member(ann, part)  # a discriminator tag: not shown
        else:
            shown.append(str(part))
            ann = None
    return shown, fields


def _unwrap(ann: Any, part: Any) -> Any:
    """Strip ``Annotated`` and ``X | None`` so the walk sees the real container or model."""
    while True:
        if typing.get_origin(ann) is typing.Annotated:
            ann = typing.get_args(ann)[0]
            continue
        members = _union_members(ann)
        non_none = [m for m in members if m is not type(None)]
        if members and len(non_none) == 1:
            ann = non_none[0]
            continue
        return ann


def _union_members(ann: Any) -> tuple[Any, ...]:
    if typing.get_origin(ann) in (typing.Union, types.UnionType):
        return typing.get_args(ann)
    return ()


def _tagged_member(ann: Any, tag: str) -> Any:
    """The member of a discriminated union whose tag field (``type:``, ``kind:`` ...) is ``tag``."""
    for member in _union_members(ann):
        if isinstance(member, type) and issubclass(member, BaseModel):
            for field in member.model_fields.values():
                if field.default == tag or tag in (typing.get_args(field.annotation) if
                                                   typing.get_origin(field.annotation) is typing.Literal else ()):
                    return member
    return None


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
        raise_invalid(validation_problems(exc, source=source, prefix=prefix, model=model), error)
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
