"""Agent harnesses: the same task posed through different tool surfaces.

``get_harness(name)`` gives a fresh ``Harness`` (see ``agentenv.intents``);
``list_harnesses()`` names every one available: the built-ins below plus any
registered by other packages under the ``agentenv.harnesses`` entry-point
group. See docs/harnesses.md for the surfaces and for how to add one.

The native harnesses (``native:claude_code``, ...: the real agent programs, run in
the sandbox and recorded by the gateway) are not ``Harness`` objects; they are
profiled in ``rollout.harnesses.native``. ``is_native_harness(name)`` tells the two
kinds of name apart, and ``canonical_harness(name)`` reads the older prefix
``cli:`` as ``native:``.

>>> h = get_harness("bash")
>>> [t["function"]["name"] for t in h.render("list files").tools]
['bash', 'submit']
"""

from __future__ import annotations

import difflib
import importlib
import logging
from importlib.metadata import entry_points

from agentenv.intents import Harness

ENTRY_POINT_GROUP = "agentenv.harnesses"

log = logging.getLogger(__name__)

# Built-ins resolve without installed metadata (a source checkout, an old egg-info).
BUILTIN_HARNESSES: dict[str, str] = {
    "bash": "rollout.harnesses.bash:BashHarness",
    "claude_code": "rollout.harnesses.claude_code:ClaudeCodeHarness",
    "codex": "rollout.harnesses.codex:CodexHarness",
    "kimi_cli": "rollout.harnesses.kimi_cli:KimiCliHarness",
    "kimi_code": "rollout.harnesses.kimi_code:KimiCodeHarness",
}


#: The harness-name prefix of a native program, and the older alias read as it.
NATIVE_PREFIX = "native:"
LEGACY_PREFIX = "cli:"


def is_native_harness(name: str) -> bool:
    """Whether ``name`` names a native program (``native:...``, or its alias ``cli:...``) rather than an
    emulated harness: the one test of it (the runner's dispatch, the teachers' context)."""
    return name.startswith((NATIVE_PREFIX, LEGACY_PREFIX))


def canonical_harness(name: str) -> str:
    """``name`` with the alias ``cli:`` written ``native:``; every other name as it is."""
    return NATIVE_PREFIX + name[len(LEGACY_PREFIX):] if name.startswith(LEGACY_PREFIX) else name


class UnknownHarness(LookupError):
    """No harness of that name; the message lists the known ones."""


def _targets() -> dict[str, str]:
    found = dict(BUILTIN_HARNESSES)
    try:
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            found.setdefault(ep.name, ep.value)
    except Exception as exc:  # noqa: BLE001 - broken third-party metadata must not hide the built-ins
        log.warning("cannot read the %r entry points (broken package metadata); only the built-in harnesses are listed: %s: %s",
                    ENTRY_POINT_GROUP, type(exc).__name__, exc)
    return found


def list_harnesses() -> list[str]:
    """Names accepted by ``get_harness``, sorted."""
    return sorted(_targets())


def get_harness(name: str) -> Harness:
    """A new instance of the named harness (instances hold no episode state, but are cheap)."""
    # a built-in name wins over entry points anyway: no entry-point scan per episode
    targets = BUILTIN_HARNESSES if name in BUILTIN_HARNESSES else _targets()
    target = targets.get(name)
    if target is None:
        hint = difflib.get_close_matches(name, list(targets), n=1)
        raise UnknownHarness(
            f"unknown harness {name!r}{f'; did you mean {hint[0]!r}?' if hint else ''} (known: {', '.join(sorted(targets))})"
        )
    module, _, attr = target.partition(":")
    cls = getattr(importlib.import_module(module), attr)
    harness = cls()
    if not isinstance(harness, Harness):
        raise TypeError(f"{target} does not implement the Harness protocol (agentenv.intents.Harness)")
    return harness


__all__ = [
    "BUILTIN_HARNESSES", "ENTRY_POINT_GROUP", "LEGACY_PREFIX", "NATIVE_PREFIX", "UnknownHarness", "canonical_harness", "get_harness",
    "is_native_harness", "list_harnesses",
]
