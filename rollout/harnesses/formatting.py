"""Result-formatting helpers several harnesses share (line numbering, search summaries)."""

from __future__ import annotations

from collections.abc import Sequence

from agentenv.intents import IntentResult

MAX_LINE_CHARS = 2000  # long lines (minified files) are cut, as the real tools do


def numbered(lines: Sequence[str], start: int, *, width: int = 6, sep: str = "\t") -> str:
    """``cat -n`` style: right-aligned line number, a separator, the line."""
    out = []
    for n, line in enumerate(lines, start):
        if len(line) > MAX_LINE_CHARS:
            line = line[:MAX_LINE_CHARS] + " [line truncated]"
        out.append(f"{n:>{width}}{sep}{line}")
    return "\n".join(out)


def shell_output(result: IntentResult) -> str:
    """stdout then stderr, each only when present."""
    stdout = str(result.data.get("stdout", result.output))
    stderr = str(result.data.get("stderr", ""))
    parts = [p.rstrip("\n") for p in (stdout, stderr) if p]
    return "\n".join(parts)


def items(result: IntentResult) -> list[str]:
    return [str(x) for x in result.data.get("items", ())]
