"""Agent harnesses: the same task posed through different tool surfaces.

``get_harness(name)`` gives a fresh ``Harness`` (see ``agentenv.intents``);
``list_harnesses()`` names every one available: the built-ins below plus any
registered by other packages under the ``agentenv.harnesses`` entry-point
group. See docs/harnesses.md for the surfaces and for how to add one.

The native harnesses (``native:claude_code``, ...: the real agent programs, run in
the sandbox and recorded by the gateway) are not ``Harness`` objects; they are
named and profiled in ``rollout.harnesses.native``.

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


__all__ = ["BUILTIN_HARNESSES", "ENTRY_POINT_GROUP", "UnknownHarness", "get_harness", "list_harnesses"]
