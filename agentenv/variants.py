"""Variants: a task's parameters drawn from a seed, and its templates rendered with them.

Determinism is the whole point: a training run, a regression and a bug report
must all name the same variant by ``(task id, seed)``. So parameters are drawn
by one ``random.Random(seed)`` in the order they are declared in ``task.yaml``
(YAML mappings keep their order), one draw per parameter, and nothing else
touches that generator. Adding a parameter at the end keeps earlier ones the
same for every seed; reordering them changes every variant.

Templates are Jinja2 with ``StrictUndefined``: a misspelt ``{{ nmae }}`` is an
error naming the file, never an empty string in a prompt. The context is the
parameters plus ``seed``. (Shell scripts: ``${#x}`` opens a Jinja comment; wrap
such lines in ``{% raw %}...{% endraw %}``.)

Usage::

    params = draw_params(spec.params, seed=7)
    text = render("Sum {{ n }} numbers", {**params, "seed": 7}, where="instruction.md")
"""

from __future__ import annotations

import functools

import random
import string
from collections.abc import Mapping
from typing import Any

import jinja2
import jinja2.meta

from agentenv.errors import TemplateError, did_you_mean
from agentenv.types import ChoiceParam, FloatParam, IntParam, ParamSpec, Variant, WordParam

_ENV = jinja2.Environment(
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
    autoescape=False,  # prompts and shell scripts, not HTML
)

#: Names every template may use besides the task's parameters.
BUILTIN_NAMES = frozenset({"seed"})


def draw_params(params: Mapping[str, ParamSpec], seed: int) -> dict[str, Any]:
    """The parameter values of variant ``seed``, in declared order."""
    rng = random.Random(int(seed))
    values: dict[str, Any] = {}
    for name, param in params.items():
        values[name] = _draw(param, rng)
    return values


def _draw(param: ParamSpec, rng: random.Random) -> Any:
    if isinstance(param, ChoiceParam):
        return param.choices[rng.randrange(len(param.choices))]
    if isinstance(param, IntParam):
        return rng.randint(param.low, param.high)
    if isinstance(param, FloatParam):
        return round(rng.uniform(param.low, param.high), param.digits)
    if isinstance(param, WordParam):
        return "".join(rng.choice(string.ascii_lowercase) for _ in range(param.length))
    raise TypeError(f"unknown parameter kind {type(param).__name__}")


def context(params: Mapping[str, Any], seed: int) -> dict[str, Any]:
    """What a template sees: the parameters and the seed."""
    return {**params, "seed": int(seed)}


@functools.lru_cache(maxsize=512)
def _compiled(template: str) -> jinja2.Template:
    """Compiled once per source: a rollout renders the same few templates for every episode."""
    return _ENV.from_string(template)


def render(template: str, values: Mapping[str, Any], *, where: str) -> str:
    """Render ``template`` strictly; ``where`` (a file or field) names it in errors."""
    try:
        return _compiled(template).render(**values)
    except jinja2.UndefinedError as exc:
        raise TemplateError(f"{where}: {exc.message}; defined: {', '.join(sorted(values)) or 'nothing'}") from exc
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(f"{where}: line {exc.lineno}: template syntax error: {exc.message}") from exc
    except Exception as exc:  # a filter or expression failing on a drawn value
        raise TemplateError(f"{where}: rendering failed: {type(exc).__name__}: {exc}") from exc


def undeclared_variables(template: str, declared: set[str]) -> list[str]:
    """Problems (as message lines) for names a template uses but no parameter declares.

    Checked when a task is loaded, so a typo fails before any sandbox starts.
    """
    try:
        used = jinja2.meta.find_undeclared_variables(_ENV.parse(template))
    except jinja2.TemplateSyntaxError as exc:
        return [f"line {exc.lineno}: template syntax error: {exc.message}"]
    known = declared | BUILTIN_NAMES
    return [
        f"uses {{{{ {name} }}}} but no parameter {name!r} is declared{did_you_mean(name, known)}"
        for name in sorted(used - known)
    ]


def make_variant(task_id: str, seed: int, params: Mapping[str, ParamSpec], instruction: str, *, where: str) -> Variant:
    """Draw the parameters of ``seed`` and render the instruction with them."""
    values = draw_params(params, seed)
    text = render(instruction, context(values, seed), where=where)
    return Variant(task_id=task_id, seed=int(seed), params=values, instruction=text)


__all__ = ["BUILTIN_NAMES", "context", "draw_params", "make_variant", "render", "undeclared_variables"]
