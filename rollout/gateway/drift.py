"""Drift guard: each pinned CLI's tool list (names and argument schemas), snapshotted in the repository.

A CLI upgrade changes what the policy is trained on: Claude Code 2.1.x dropped
Glob, Grep, TodoWrite, MultiEdit and LS; an unknown Codex model slug loses
``apply_patch``. The snapshot is what the pinned CLI sent to the gateway
(``Session.tool_lists``), with descriptions left out (prose, not surface).
``diff_tools`` compares a live list with it; ``emulated_drift`` compares the
emulated harness of the same name with it. Each snapshot lists the drift of
the emulated surface that is known and accepted (``emulated_known_drift``): the
test fails when the drift is anything else, so a new disagreement is seen.

Refresh a snapshot after a deliberate upgrade with
``python -m rollout.gateway.drift write CLI TOOLS.json VERSION``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

SNAPSHOTS = Path(__file__).with_name("snapshots")
# CLI name -> the emulated harness that stands for it in the rotation
EMULATED = {"claude": "claude_code", "codex": "codex", "kimi": "kimi_cli"}


def surface(tools: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """name -> argument schema (``parameters``), from canonical or wire-format tools."""
    out: dict[str, Any] = {}
    for tool in tools:
        fn = tool.get("function", tool)
        out[str(fn.get("name"))] = _strip(fn.get("parameters") or fn.get("input_schema") or {})
    return dict(sorted(out.items()))


def _strip(schema: Any) -> Any:
    """The schema without prose (descriptions change every release without changing the surface)."""
    if isinstance(schema, Mapping):
        return {k: _strip(v) for k, v in sorted(schema.items()) if k not in ("description", "title", "examples")}
    if isinstance(schema, list):
        return [_strip(v) for v in schema]
    return schema


def load_snapshot(cli: str) -> dict[str, Any]:
    return json.loads((SNAPSHOTS / f"{cli}.json").read_text())


def diff_tools(live: Mapping[str, Any], snapshot: Mapping[str, Any]) -> list[str]:
    """What differs, one line each (empty: the same surface)."""
    lines = [f"tool {n!r} is new (not in the snapshot)" for n in sorted(set(live) - set(snapshot))]
    lines += [f"tool {n!r} is gone (in the snapshot)" for n in sorted(set(snapshot) - set(live))]
    lines += [f"tool {n!r} changed its arguments: {json.dumps(snapshot[n], sort_keys=True)} -> {json.dumps(live[n], sort_keys=True)}"
              for n in sorted(set(live) & set(snapshot)) if live[n] != snapshot[n]]
    return lines


def emulated_drift(cli: str) -> list[str]:
    """How the emulated harness's tools disagree with the CLI's snapshot: tools the CLI does not offer,
    and arguments of a shared tool that the CLI's schema does not have."""
    from rollout.harnesses import get_harness

    snap = load_snapshot(cli)["tools"]
    rendered = get_harness(EMULATED[cli]).render("x", "high")
    emulated = surface(rendered.tools)
    out = [f"emulated tool {n!r} is not offered by the CLI" for n in sorted(set(emulated) - set(snap))]
    for name in sorted(set(emulated) & set(snap)):
        extra = set(emulated[name].get("properties", {})) - set(snap[name].get("properties", {}))
        out += [f"emulated {name}.{arg} is not an argument of the CLI's {name}" for arg in sorted(extra)]
    return out


def write_snapshot(cli: str, tools: Sequence[Mapping[str, Any]], version: str, known_drift: Sequence[str] | None = None) -> Path:
    path = SNAPSHOTS / f"{cli}.json"
    SNAPSHOTS.mkdir(exist_ok=True)
    doc = {"cli": cli, "version": version, "tools": surface(tools), "emulated_known_drift": list(known_drift or [])}
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    if known_drift is None:
        doc["emulated_known_drift"] = emulated_drift(cli)
        path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return path


if __name__ == "__main__":  # python -m rollout.gateway.drift write CLI TOOLS.json VERSION
    _, cmd, cli, tools_json, version = sys.argv
    assert cmd == "write", "usage: python -m rollout.gateway.drift write CLI TOOLS.json VERSION"
    print(write_snapshot(cli, json.loads(Path(tools_json).read_text()), version))

__all__ = ["EMULATED", "diff_tools", "emulated_drift", "load_snapshot", "surface", "write_snapshot"]
