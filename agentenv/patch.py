"""The Codex ``apply_patch`` format: parse a patch, then apply it to file texts.

Grammar (one operation per file; paths relative to the working directory)::

    *** Begin Patch
    *** Add File: path          followed by lines that each start with '+'
    *** Delete File: path
    *** Update File: path
    *** Move to: new/path       optional, right after Update File
    @@ optional anchor          then lines starting ' ' (context), '-' or '+'
    *** End of File             optional, pins the hunk to the end of the file
    *** End Patch

Parsing and applying are pure (no I/O) so the grammar is tested on its own and
the executor (``agentenv.intent_exec``) only reads and writes files. Every error
is a ``PatchError`` whose message names the patch line or the file and hunk,
because the message goes back to the model and must let it fix its patch.

Matching a hunk tries the exact lines first, then ignores trailing whitespace,
then surrounding whitespace: models often get indentation of blank lines wrong,
and a patch that is unambiguous despite that should apply.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

BEGIN = "*** Begin Patch"
END = "*** End Patch"
ADD = "*** Add File: "
DELETE = "*** Delete File: "
UPDATE = "*** Update File: "
MOVE = "*** Move to: "
EOF_MARK = "*** End of File"


class PatchError(ValueError):
    """A patch that does not parse or does not apply; the message is meant for the model."""


@dataclass(frozen=True)
class Hunk:
    """One ``@@`` chunk. ``lines`` pairs a kind (' ', '-', '+') with the text after it."""

    anchor: str
    lines: tuple[tuple[str, str], ...]
    end_of_file: bool
    patch_line: int  # 1-based line of the patch where this hunk starts

    @property
    def old(self) -> list[str]:
        return [t for k, t in self.lines if k in " -"]

    @property
    def new(self) -> list[str]:
        return [t for k, t in self.lines if k in " +"]


@dataclass(frozen=True)
class AddFile:
    path: str
    content: str


@dataclass(frozen=True)
class DeleteFile:
    path: str


@dataclass(frozen=True)
class UpdateFile:
    path: str
    move_to: str | None
    hunks: tuple[Hunk, ...]


FileOp = AddFile | DeleteFile | UpdateFile


@dataclass(frozen=True)
class FileChange:
    """The outcome for one path: ``content=None`` deletes it. ``moved_from`` names the file a
    ``*** Move to:`` came from, whose mode (an execute bit) the moved file keeps."""

    path: str
    content: str | None
    kind: str  # "A" added, "M" modified, "D" deleted
    moved_from: str | None = None


def _check_path(path: str, line_no: int) -> str:
    path = path.strip()
    if not path:
        raise PatchError(f"patch line {line_no}: missing file path")
    if path.startswith("/"):
        raise PatchError(f"patch line {line_no}: path {path!r} is absolute; apply_patch takes relative paths only")
    return path


def parse_patch(text: str) -> list[FileOp]:
    """Parse patch text into file operations, or raise ``PatchError`` naming the line."""
    if not isinstance(text, str):
        raise PatchError(f"patch must be text, got {type(text).__name__}")
    lines = text.strip().split("\n")
    lines = [ln[:-1] if ln.endswith("\r") else ln for ln in lines]
    if not lines or lines[0].strip() != BEGIN:
        raise PatchError(f"patch line 1: expected {BEGIN!r}, got {lines[0][:80]!r}" if lines else "empty patch")
    if lines[-1].strip() != END:
        raise PatchError(f"patch line {len(lines)}: expected {END!r} as the last line, got {lines[-1][:80]!r}")
    ops: list[FileOp] = []
    i, last = 1, len(lines) - 1
    while i < last:
        line, no = lines[i], i + 1
        if line.startswith(ADD):
            path = _check_path(line[len(ADD):], no)
            i += 1
            body: list[str] = []
            while i < last and not lines[i].startswith("*** "):
                if not lines[i].startswith("+"):
                    raise PatchError(f"patch line {i + 1}: lines of an added file must start with '+', got {lines[i][:80]!r}")
                body.append(lines[i][1:])
                i += 1
            ops.append(AddFile(path, "\n".join(body) + "\n" if body else ""))
        elif line.startswith(DELETE):
            ops.append(DeleteFile(_check_path(line[len(DELETE):], no)))
            i += 1
        elif line.startswith(UPDATE):
            path = _check_path(line[len(UPDATE):], no)
            i += 1
            move_to = None
            if i < last and lines[i].startswith(MOVE):
                move_to = _check_path(lines[i][len(MOVE):], i + 1)
                i += 1
            hunks, i = _parse_hunks(lines, i, last, path)
            if not hunks:
                raise PatchError(f"patch line {no}: update of {path!r} has no hunks")
            ops.append(UpdateFile(path, move_to, tuple(hunks)))
        elif not line.strip():
            i += 1  # stray blank line between operations
        else:
            raise PatchError(
                f"patch line {no}: expected '*** Add File:', '*** Update File:' or '*** Delete File:', got {line[:80]!r}"
            )
    if not ops:
        raise PatchError("patch has no file operations")
    return ops


def _parse_hunks(lines: Sequence[str], i: int, last: int, path: str) -> tuple[list[Hunk], int]:
    hunks: list[Hunk] = []
    while i < last and not (lines[i].startswith("*** ") and lines[i].strip() != EOF_MARK):
        start = i + 1
        anchor = ""
        if lines[i].startswith("@@"):
            anchor = lines[i][2:].strip()
            i += 1
        elif hunks:
            raise PatchError(f"patch line {i + 1}: expected '@@' to start the next hunk of {path!r}, got {lines[i][:80]!r}")
        body: list[tuple[str, str]] = []
        eof = False
        while i < last and not lines[i].startswith("@@") and not lines[i].startswith("*** "):
            ln = lines[i]
            if ln == "":
                body.append((" ", ""))  # an empty context line whose leading space was lost
            elif ln[0] in " -+":
                body.append((ln[0], ln[1:]))
            else:
                raise PatchError(f"patch line {i + 1}: hunk lines must start with ' ', '-' or '+', got {ln[:80]!r}")
            i += 1
        if i < last and lines[i].strip() == EOF_MARK:
            eof = True
            i += 1
        if not any(k in "-+" for k, _ in body):
            raise PatchError(f"patch line {start}: hunk of {path!r} changes nothing")
        hunks.append(Hunk(anchor, tuple(body), eof, start))
    return hunks, i


_NORMALIZERS: tuple[Callable[[str], str], ...] = (lambda s: s, str.rstrip, str.strip)


def _find(haystack: Sequence[str], needle: Sequence[str], start: int, at_end: bool) -> int:
    """Index where ``needle`` occurs in ``haystack`` at or after ``start``; -1 if nowhere."""
    n = len(needle)
    for norm in _NORMALIZERS:
        want = [norm(x) for x in needle]
        if at_end:
            pos = len(haystack) - n
            if pos >= start and [norm(x) for x in haystack[pos:]] == want:
                return pos
        for pos in range(start, len(haystack) - n + 1):
            if [norm(x) for x in haystack[pos : pos + n]] == want:
                return pos
    return -1


def _merge(h: Hunk, matched: Sequence[str]) -> list[str]:
    """The hunk's new lines, with context lines taken from the file (a fuzzy match keeps the file's whitespace)."""
    out: list[str] = []
    i = 0
    for kind, text in h.lines:
        if kind == " ":
            out.append(matched[i] if i < len(matched) else text)
        elif kind == "+":
            out.append(text)
        if kind in " -":
            i += 1
    return out


def apply_hunks(path: str, original: str, hunks: Sequence[Hunk]) -> str:
    """New text of ``path`` after ``hunks``; ``PatchError`` names the hunk that did not match."""
    had_newline = original.endswith("\n") or original == ""
    lines = original.split("\n")
    if had_newline:
        lines = lines[:-1]
    edits: list[tuple[int, int, list[str]]] = []
    cursor = 0
    for h in hunks:
        if h.anchor:
            pos = _find(lines, [h.anchor], cursor, False)
            if pos < 0:
                raise PatchError(f"{path}: hunk at patch line {h.patch_line}: anchor line {h.anchor!r} not found")
            cursor = pos + 1
        old = h.old
        if not old:
            pos = len(lines) if (h.end_of_file or not h.anchor) else cursor
        else:
            pos = _find(lines, old, cursor, h.end_of_file)
        if pos < 0:
            shown = "\n".join(old[:8])
            raise PatchError(
                f"{path}: hunk at patch line {h.patch_line} does not match the file; "
                f"these lines were not found{' at the end of the file' if h.end_of_file else ''}:\n{shown}"
            )
        edits.append((pos, len(old), _merge(h, lines[pos : pos + len(old)])))
        cursor = pos + len(old)
    for pos, n, new in reversed(edits):
        lines[pos : pos + n] = new
    return "\n".join(lines) + ("\n" if lines else "")


def apply_patch(ops: Sequence[FileOp], read: Callable[[str], str | None]) -> list[FileChange]:
    """Compute every change before any is written, so a bad hunk changes nothing.

    ``read(path)`` returns a file's text or ``None`` when it does not exist. Text is changed line by
    line and every line no hunk touches is kept as it is, so a caller that decodes with
    ``surrogateescape`` gets back every byte the patch did not change.
    """
    changes: list[FileChange] = []
    pending: dict[str, str | None] = {}

    def current(path: str) -> str | None:
        return pending[path] if path in pending else read(path)

    for op in ops:
        if isinstance(op, AddFile):
            pending[op.path] = op.content
            changes.append(FileChange(op.path, op.content, "A"))
        elif isinstance(op, DeleteFile):
            if current(op.path) is None:
                raise PatchError(f"{op.path}: cannot delete, file does not exist")
            pending[op.path] = None
            changes.append(FileChange(op.path, None, "D"))
        else:
            text = current(op.path)
            if text is None:
                raise PatchError(f"{op.path}: cannot update, file does not exist")
            new = apply_hunks(op.path, text, op.hunks)
            if op.move_to and op.move_to != op.path:
                pending[op.path] = None
                changes.append(FileChange(op.path, None, "D"))
                pending[op.move_to] = new
                changes.append(FileChange(op.move_to, new, "M", moved_from=op.path))
            else:
                pending[op.path] = new
                changes.append(FileChange(op.path, new, "M"))
    return changes


__all__ = [
    "AddFile",
    "DeleteFile",
    "FileChange",
    "FileOp",
    "Hunk",
    "PatchError",
    "UpdateFile",
    "apply_hunks",
    "apply_patch",
    "parse_patch",
]
