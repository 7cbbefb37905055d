"""Execute a canonical ``Intent`` on any ``Sandbox`` and say what happened.

Why one executor for every harness: Claude Code's ``Edit``, Kimi's
``StrReplaceFile`` and Codex's ``apply_patch`` must change files by the same
rules, or a model trained through one harness learns a different world than
through another. The harness only translates names and formats results.

Failure policy (a bad call is data, not a crash): anything the *model* got
wrong -- a missing file, an ambiguous edit, a patch that does not apply, bad
argument types -- comes back as ``IntentResult(ok=False, error=...)``. Failures
of the *infrastructure* -- ``SandboxLost``, ``SandboxTimeout`` -- propagate,
because the episode cannot go on and the runner records them as its status.

``glob`` and ``grep`` run one small Python script inside the sandbox (the base
image has ``python3``) so a search over a thousand files is one ``exec``, not a
thousand file transfers; regexes are Python's, close to ripgrep's.

Files are bytes, and a tool must not change bytes it was not asked to change:
edits decode with ``surrogateescape`` (a Latin-1 byte survives an edit of
another line), appends work on bytes, and every write keeps the file's mode
(``write_file(mode=None)``; a moved file keeps its source's), so an edit never
strips a script's execute bit. A binary file -- a NUL byte, or text that is
mostly not UTF-8 -- is refused by the editing tools (edit, apply_patch) with an
error, never rewritten. No file is loaded whole past ``read_limit`` bytes (the
agent in the sandbox holds what it sends): a larger file is read by line range
with a script in the sandbox, and an edit of one is refused with its size.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentenv.intents import PLAN_STATUSES, Intent, IntentResult
from agentenv.patch import PatchError, apply_patch, parse_patch
from sandboxes.errors import SandboxError, SandboxFileNotFound, SandboxFileTooLarge, SandboxLost, SandboxTimeout
from sandboxes.types import Sandbox

DEFAULT_READ_LIMIT = 2000  # lines, when the model gives no limit
MAX_RESULTS = 1000  # glob paths / grep lines kept before saying "truncated"
WHOLE_FILE_LIMIT = 8 << 20  # bytes of a file loaded whole (to read or edit it); larger ones are read by range
RANGE_SCAN_LIMIT = 1 << 30  # bytes a ranged read scans to count lines (and to read from the end)
MAX_LINE_BYTES = 8000  # bytes of one line a ranged read keeps (the formatters cut at 2000 characters)


@dataclass
class EpisodeState:
    """What intents remember across one episode: the plan and whether it was submitted."""

    plan: list[dict[str, str]] = field(default_factory=list)
    explanation: str = ""
    plan_updates: int = 0
    submitted: bool = False
    answer: str | None = None


class IntentArgError(ValueError):
    """An intent's arguments have the wrong shape; reported to the model, never raised out."""


class IntentRefused(ValueError):
    """The intent cannot be done on this file (binary, too large); the message says why and what to do."""


def looks_binary(data: bytes) -> str | None:
    """Why ``data`` is not text to edit, or ``None``: a NUL byte anywhere, or a first 8 KiB that is
    mostly not UTF-8 (over 30% undecodable bytes or control characters). A few stray non-UTF-8
    bytes (a Latin-1 comment) are text: edits keep them as they are."""
    if b"\0" in data:
        return "it contains NUL bytes"
    sample = data[:8192].decode("utf-8", "surrogateescape")
    bad = sum(1 for c in sample if "\udc80" <= c <= "\udcff" or (c < " " and c not in "\t\n\r\f\v\b\x1b"))
    if sample and bad > 0.3 * len(sample):
        return "it is not UTF-8 text"
    return None


def _decode(data: bytes) -> str:
    """Bytes as text that encodes back to the same bytes (``_encode``)."""
    return data.decode("utf-8", "surrogateescape")


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def _arg(args: Mapping[str, Any], key: str, typ: type | tuple[type, ...], default: Any = ..., *, none_ok: bool = True) -> Any:
    value = args.get(key, default)
    if value is ...:
        raise IntentArgError(f"missing argument {key!r}")
    if value is None and none_ok and default is not ...:
        return default
    if typ is int and isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) and typ in (int, float, (int, float)):
        raise IntentArgError(f"argument {key!r} must be a number, got a boolean")
    if not isinstance(value, typ):
        raise IntentArgError(f"argument {key!r} must be {getattr(typ, '__name__', typ)}, got {type(value).__name__}")
    return value


def _clip(text: str, limit: int) -> tuple[str, bool]:
    """Keep head and tail of long output: errors usually sit at the end."""
    if len(text) <= limit:
        return text, False
    half = limit // 2
    dropped = len(text) - 2 * half
    return f"{text[:half]}\n[... {dropped} characters dropped ...]\n{text[-half:]}", True


class IntentExecutor:
    """Runs intents for one episode on one sandbox.

    >>> ex = IntentExecutor(sandbox)                                  # doctest: +SKIP
    >>> ex.execute(Intent("read_file", {"path": "README.md", "limit": 20}))  # doctest: +SKIP
    """

    def __init__(
        self,
        sandbox: Sandbox,
        *,
        cwd: str | None = None,
        default_timeout_s: float = 60.0,
        max_timeout_s: float = 600.0,
        output_limit: int = 30_000,
        state: EpisodeState | None = None,
        read_limit: int | None = None,
    ) -> None:
        self.sandbox = sandbox
        self.cwd = cwd or sandbox.spec.workdir
        self.default_timeout_s = default_timeout_s
        self.max_timeout_s = max_timeout_s
        self.output_limit = output_limit
        self.state = state if state is not None else EpisodeState()
        # The in-sandbox agent holds a file it sends: stay well under its memory limit.
        memory = sandbox.spec.memory_mb << 20
        self.read_limit = read_limit if read_limit is not None else min(WHOLE_FILE_LIMIT, memory // 8)

    # ------------------------------------------------------------ dispatch

    def execute(self, intent: Intent) -> IntentResult:
        handler = getattr(self, f"_do_{intent.name}", None)
        if handler is None:
            return IntentResult(intent, ok=False, error=f"unknown intent {intent.name!r}")
        try:
            return handler(intent, intent.args if isinstance(intent.args, Mapping) else {})
        except (SandboxLost, SandboxTimeout):
            raise
        except IntentArgError as exc:
            return IntentResult(intent, ok=False, error=f"{intent.name}: {exc}")
        except (PatchError, IntentRefused) as exc:
            return IntentResult(intent, ok=False, error=str(exc))
        except SandboxFileNotFound as exc:
            return IntentResult(intent, ok=False, error=f"file not found: {exc}")
        except SandboxError as exc:
            return IntentResult(intent, ok=False, error=f"{type(exc).__name__}: {exc}")
        except (UnicodeError, OSError, ValueError) as exc:
            # e.g. a NUL byte or a lone surrogate in a command: the model's input, not our failure
            return IntentResult(intent, ok=False, error=f"{type(exc).__name__}: {exc}")

    def _path(self, path: str, base: str | None = None) -> str:
        if not path:
            raise IntentArgError("path is empty")
        if "\0" in path:
            raise IntentArgError("path contains a NUL byte")
        return posixpath.normpath(posixpath.join(base or self.cwd, path))

    def _timeout(self, args: Mapping[str, Any]) -> float:
        t = _arg(args, "timeout_s", (int, float), self.default_timeout_s)
        return float(min(max(t, 1.0), self.max_timeout_s))

    def _read_bytes(self, path: str, purpose: str) -> bytes | None:
        """A file's bytes for a tool that needs it whole; ``None`` if missing; refused past ``read_limit``."""
        try:
            return self.sandbox.read_file(path, limit=self.read_limit)
        except SandboxFileNotFound:
            return None
        except SandboxFileTooLarge:
            raise IntentRefused(
                f"{path}: {self._size_text(path)}over the {self.read_limit}-byte limit for {purpose}; "
                "change it with a shell command instead (sed -i, python)"
            ) from None

    def _editable_text(self, path: str, intent: Intent) -> str | None:
        """The text of a file an edit will change, decoded so that every byte it does not change
        is written back as it was; ``None`` if missing. A binary file is refused."""
        data = self._read_bytes(path, "editing a file whole")
        if data is None:
            return None
        why = looks_binary(data)
        if why:
            raise IntentRefused(
                f"{path} is a binary file ({why}); {intent.tool or intent.name} edits text files only. "
                "Change it with a shell command instead."
            )
        return _decode(data)

    def _exists(self, path: str) -> bool:
        try:
            self.sandbox.read_file(path, limit=0)  # refused before any byte is read, if not empty
        except SandboxFileNotFound:
            return False
        except SandboxFileTooLarge:
            pass
        return True

    def _stat(self, path: str, fmt: str) -> str | None:
        try:
            res = self.sandbox.exec(["stat", "-L", "-c", fmt, "--", path], timeout=30)
        except (SandboxError, OSError):
            return None
        return res.stdout.strip() if res.ok else None

    def _size_text(self, path: str) -> str:
        size = self._stat(path, "%s")
        return f"file is {size} bytes, " if size and size.isdigit() else "file is "

    def _mode(self, path: str) -> int | None:
        mode = self._stat(path, "%a")
        try:
            return int(mode, 8) if mode else None
        except ValueError:
            return None

    # ------------------------------------------------------------ intents

    def _do_exec_shell(self, intent: Intent, args: Mapping[str, Any]) -> IntentResult:
        command = _arg(args, "command", (str, list))
        if isinstance(command, list) and (not command or not all(isinstance(c, str) for c in command)):
            raise IntentArgError("argument 'command' must be a non-empty list of strings")
        if isinstance(command, str) and not command.strip():
            raise IntentArgError("argument 'command' is empty")
        cwd = self._path(_arg(args, "cwd", str, self.cwd))
        timeout = self._timeout(args)
        res = self.sandbox.exec(command, timeout=timeout, cwd=cwd)
        stdout, cut_out = _clip(res.stdout, self.output_limit)
        stderr, cut_err = _clip(res.stderr, self.output_limit // 3)
        output = stdout + (("\n" if stdout and not stdout.endswith("\n") else "") + stderr if stderr else "")
        error = f"command timed out after {timeout:g} s" if res.timed_out else None
        return IntentResult(
            intent,
            ok=res.ok,
            output=output,
            error=error,
            exit_code=res.exit_code,
            timed_out=res.timed_out,
            truncated=res.truncated or cut_out or cut_err,
            data={"stdout": stdout, "stderr": stderr, "duration_s": res.duration_s, "cwd": cwd, "timeout_s": timeout},
        )

    def _do_read_file(self, intent: Intent, args: Mapping[str, Any]) -> IntentResult:
        path = self._path(_arg(args, "path", str))
        offset = _arg(args, "offset", int, 1)
        limit = _arg(args, "limit", int, DEFAULT_READ_LIMIT)
        if limit < 1:
            raise IntentArgError(f"argument 'limit' must be >= 1, got {limit}")
        try:
            data = self.sandbox.read_file(path, limit=self.read_limit)
        except SandboxFileNotFound:
            return IntentResult(intent, ok=False, error=f"file not found: {path}")
        except SandboxFileTooLarge:
            return self._read_range(intent, path, offset, limit)
        lines = data.decode("utf-8", errors="replace").splitlines()
        total = len(lines)
        start = offset if offset > 0 else max(total + offset + 1, 1) if offset < 0 else 1
        chunk = lines[start - 1 : start - 1 + limit]
        out, cut = _clip("\n".join(chunk), self.output_limit)
        return IntentResult(
            intent,
            ok=True,
            output=out,
            truncated=cut or start - 1 + limit < total,
            data={"path": path, "start": start, "lines": chunk, "total_lines": total},
        )

    def _read_range(self, intent: Intent, path: str, offset: int, limit: int) -> IntentResult:
        """Lines ``offset .. offset+limit-1`` of a file too large to load, read by a script in the sandbox."""
        request = {"path": path, "offset": offset, "limit": limit, "line_max": MAX_LINE_BYTES,
                   "out_max": max(4 * self.output_limit, 64 << 10), "scan_max": RANGE_SCAN_LIMIT}
        res = self.sandbox.exec(["python3", "-c", _RANGE_SCRIPT], stdin=json.dumps(request).encode(),
                                timeout=self._timeout(intent.args), cwd=self.cwd)
        try:
            reply = json.loads(res.stdout)
        except ValueError:
            why = "timed out" if res.timed_out else f"exit {res.exit_code}: {res.stderr.strip()[-300:]}"
            return IntentResult(
                intent,
                ok=False,
                timed_out=res.timed_out,
                error=f"{path}: {self._size_text(path)}over the {self.read_limit}-byte read limit, and reading "
                f"lines {offset}.. of it failed ({why}); read a range with a shell command (sed -n, head, tail)",
            )
        if reply.get("error"):
            return IntentResult(intent, ok=False, error=f"{path}: {reply['error']}")
        chunk: list[str] = reply["lines"]
        out, cut = _clip("\n".join(chunk), self.output_limit)
        return IntentResult(
            intent,
            ok=True,
            output=out,
            truncated=cut or bool(reply["more"]),
            data={"path": path, "start": reply["start"], "lines": chunk, "total_lines": reply["total_lines"],
                  "size": reply["size"], "ranged": True},
        )

    def _do_write_file(self, intent: Intent, args: Mapping[str, Any]) -> IntentResult:
        path = self._path(_arg(args, "path", str))
        content = _arg(args, "content", str)
        append = _arg(args, "append", bool, False)
        new = _encode(content)
        if append:
            old = self._read_bytes(path, "appending to a file")
            existed = old is not None
            data = (old or b"") + new  # bytes: what was there stays exactly as it was
        else:
            existed = self._exists(path)
            data = new
        self.sandbox.write_file(path, data, mode=None)  # an existing file keeps its mode
        verb = "appended to" if append and existed else "wrote"
        return IntentResult(
            intent,
            ok=True,
            output=f"{verb} {path} ({len(new)} bytes)",
            data={"path": path, "bytes": len(new), "created": not existed, "append": append},
        )

    def _do_edit_replace(self, intent: Intent, args: Mapping[str, Any]) -> IntentResult:
        path = self._path(_arg(args, "path", str))
        if "edits" in args:
            edits = _arg(args, "edits", list)
            if not edits:
                raise IntentArgError("argument 'edits' is empty")
        else:
            edits = [args]
        text = self._editable_text(path, intent)
        if text is None:
            return IntentResult(intent, ok=False, error=f"file not found: {path}")
        total = 0
        first_at = -1
        for n, edit in enumerate(edits, 1):
            if not isinstance(edit, Mapping):
                raise IntentArgError(f"edit {n} must be an object")
            where = f" (edit {n})" if len(edits) > 1 else ""
            old, new = _arg(edit, "old", str), _arg(edit, "new", str)
            replace_all = _arg(edit, "replace_all", bool, False)
            if old == new:
                return IntentResult(intent, ok=False, error=f"old and new strings are identical{where}; nothing to change")
            if not old:
                return IntentResult(intent, ok=False, error=f"old string is empty{where}")
            count = text.count(old)
            if count == 0:
                return IntentResult(intent, ok=False, error=f"old string not found in {path}{where}")
            if count > 1 and not replace_all:
                return IntentResult(
                    intent,
                    ok=False,
                    error=f"old string occurs {count} times in {path}{where}; add surrounding lines to make it "
                    "unique, or set replace_all to replace every occurrence",
                )
            pos = text.index(old)
            first_at = pos if first_at < 0 else min(first_at, pos)
            text = text.replace(old, new) if replace_all else text.replace(old, new, 1)
            total += count if replace_all else 1
        data = _encode(text)
        self.sandbox.write_file(path, data, mode=None)  # keeps the file's mode (an execute bit)
        line = text.count("\n", 0, max(first_at, 0))
        lines = data.decode("utf-8", "replace").splitlines()  # what the model is shown: no lone surrogates
        lo = max(line - 4, 0)
        return IntentResult(
            intent,
            ok=True,
            output=f"edited {path}: {total} replacement{'s' if total != 1 else ''}",
            data={"path": path, "replacements": total, "snippet_start": lo + 1, "snippet": lines[lo : line + 5]},
        )

    def _do_apply_patch(self, intent: Intent, args: Mapping[str, Any]) -> IntentResult:
        patch = _arg(args, "patch", str)
        base = self._path(_arg(args, "cwd", str, self.cwd))
        ops = parse_patch(patch)
        changes = apply_patch(ops, lambda p: self._editable_text(self._path(p, base), intent))
        # A moved file keeps its source's mode; read before the source is deleted.
        modes = {ch.path: self._mode(self._path(ch.moved_from, base)) for ch in changes if ch.moved_from}
        summary: dict[str, list[str]] = {"A": [], "M": [], "D": []}
        for ch in changes:
            full = self._path(ch.path, base)
            if ch.content is None:
                res = self.sandbox.exec(["rm", "-f", "--", full], timeout=30)
                if not res.ok:
                    return IntentResult(intent, ok=False, error=f"could not delete {ch.path}: {res.stderr.strip()}")
            else:
                self.sandbox.write_file(full, _encode(ch.content), mode=modes.get(ch.path))
            summary[ch.kind].append(ch.path)
        listing = "\n".join(f"{k} {p}" for k in "AMD" for p in summary[k])
        return IntentResult(
            intent,
            ok=True,
            output=f"Success. Updated the following files:\n{listing}",
            data={"added": summary["A"], "modified": summary["M"], "deleted": summary["D"]},
        )

    def _search(self, intent: Intent, request: dict[str, Any]) -> IntentResult:
        res = self.sandbox.exec(
            ["python3", "-c", _SEARCH_SCRIPT],
            stdin=json.dumps(request).encode(),
            timeout=self._timeout(intent.args),
            cwd=self.cwd,
        )
        if res.timed_out:
            return IntentResult(intent, ok=False, error="search timed out", timed_out=True)
        try:
            reply = json.loads(res.stdout)
        except ValueError:
            return IntentResult(intent, ok=False, error=f"search failed (exit {res.exit_code}): {res.stderr.strip()[-500:]}")
        if reply.get("error"):
            return IntentResult(intent, ok=False, error=reply["error"])
        items: list[str] = reply["items"]
        out, cut = _clip("\n".join(items), self.output_limit)
        return IntentResult(
            intent,
            ok=True,
            output=out,
            truncated=cut or bool(reply["truncated"]),
            data={"items": items, "truncated": bool(reply["truncated"]), "total": reply["total"]},
        )

    def _do_glob(self, intent: Intent, args: Mapping[str, Any]) -> IntentResult:
        pattern = _arg(args, "pattern", str)
        if not pattern:
            raise IntentArgError("argument 'pattern' is empty")
        path = self._path(_arg(args, "path", str, self.cwd))
        return self._search(intent, {"op": "glob", "pattern": pattern, "path": path, "max": MAX_RESULTS})

    def _do_grep(self, intent: Intent, args: Mapping[str, Any]) -> IntentResult:
        mode = _arg(args, "output_mode", str, "files_with_matches")
        if mode not in ("content", "files_with_matches", "count"):
            raise IntentArgError(f"output_mode must be content, files_with_matches or count, got {mode!r}")
        ctx = _arg(args, "context", int, 0)
        request = {
            "op": "grep",
            "pattern": _arg(args, "pattern", str),
            "path": self._path(_arg(args, "path", str, self.cwd)),
            "glob": _arg(args, "glob", str, ""),
            "type": _arg(args, "type", str, ""),
            "ignore_case": _arg(args, "ignore_case", bool, False),
            "line_numbers": _arg(args, "line_numbers", bool, True),
            "before": _arg(args, "context_before", int, ctx),
            "after": _arg(args, "context_after", int, ctx),
            "multiline": _arg(args, "multiline", bool, False),
            "mode": mode,
            "offset": _arg(args, "offset", int, 0),
            "max": min(_arg(args, "head_limit", int, MAX_RESULTS) or MAX_RESULTS, MAX_RESULTS),
        }
        return self._search(intent, request)

    def _do_plan_update(self, intent: Intent, args: Mapping[str, Any]) -> IntentResult:
        items = args.get("items")
        if items is not None:
            if not isinstance(items, Sequence) or isinstance(items, str):
                raise IntentArgError("argument 'items' must be a list")
            plan: list[dict[str, str]] = []
            for n, item in enumerate(items, 1):
                if not isinstance(item, Mapping):
                    raise IntentArgError(f"plan item {n} must be an object")
                text, status = _arg(item, "text", str), _arg(item, "status", str)
                if status not in PLAN_STATUSES:
                    raise IntentArgError(f"plan item {n}: status must be one of {', '.join(PLAN_STATUSES)}, got {status!r}")
                plan.append({"text": text, "status": status})
            self.state.plan = plan
            self.state.explanation = _arg(args, "explanation", str, "")
            self.state.plan_updates += 1
        marks = {"pending": "[ ]", "in_progress": "[~]", "completed": "[x]"}
        out = "\n".join(f"{marks[i['status']]} {i['text']}" for i in self.state.plan) or "(plan is empty)"
        return IntentResult(
            intent,
            ok=True,
            output=out,
            data={"items": [dict(i) for i in self.state.plan], "explanation": self.state.explanation, "updated": items is not None},
        )

    def _do_submit(self, intent: Intent, args: Mapping[str, Any]) -> IntentResult:
        answer = args.get("answer")
        self.state.submitted = True
        self.state.answer = None if answer is None else str(answer)
        return IntentResult(intent, ok=True, output="submitted", data={"submitted": True, "answer": self.state.answer})


# Runs inside the sandbox: reads {"path", "offset", "limit", "line_max", "out_max", "scan_max"} on stdin,
# prints {"start", "lines", "total_lines", "more", "size", "error"}. Memory stays at a chunk and one
# capped line: a huge file (or one huge line) is streamed, never loaded. Lines split on "\n" only.
_RANGE_SCRIPT = r"""
import json, os, sys
q = json.load(sys.stdin)
CHUNK = 1 << 20
def reply(**kw):
    print(json.dumps(kw)); sys.exit(0)
try:
    size = os.path.getsize(q["path"])
    f = open(q["path"], "rb")
except OSError as e:
    reply(error=e.strerror or str(e))
total = None
if size <= q["scan_max"]:
    n, last = 0, b""
    while True:
        chunk = f.read(CHUNK)
        if not chunk:
            break
        n += chunk.count(b"\n"); last = chunk[-1:]
    total = n + (1 if size and last != b"\n" else 0)
    f.seek(0)
off = q["offset"]
if off < 0:
    if total is None:
        reply(error="file is %d bytes, too large to count its lines from the end; read it from the start "
              "with a positive offset, or use tail -n" % size)
    start = max(total + off + 1, 1)
else:
    start = max(off, 1)
need, pos = start - 1, 0
while need:
    chunk = f.read(CHUNK)
    if not chunk:
        break
    c = chunk.count(b"\n")
    if c < need:
        need -= c; pos += len(chunk); continue
    i = -1
    for _ in range(need):
        i = chunk.index(b"\n", i + 1)
    need = 0
    f.seek(pos + i + 1)
lines, used, more = [], 0, False
if not need:
    while len(lines) < q["limit"]:
        line = f.readline(q["line_max"] + 1)
        if not line:
            break
        cut = len(line) > q["line_max"] and not line.endswith(b"\n")
        if cut:
            line = line[:q["line_max"]]
            while True:  # skip the rest of a long line
                rest = f.readline(CHUNK)
                if not rest or rest.endswith(b"\n"):
                    break
        text = line.rstrip(b"\n").rstrip(b"\r").decode("utf-8", "replace") + (" [line truncated]" if cut else "")
        lines.append(text); used += len(text)
        if used > q["out_max"]:
            break
    more = bool(f.read(1))
reply(start=start, lines=lines, total_lines=total, more=more, size=size, error=None)
"""


# Runs inside the sandbox: reads a JSON request on stdin, prints {"items", "truncated", "total", "error"}.
_SEARCH_SCRIPT = r"""
import fnmatch, json, os, re, stat, sys
from pathlib import Path
q = json.load(sys.stdin)
TYPES = {"py": ["*.py", "*.pyi"], "js": ["*.js", "*.mjs", "*.cjs", "*.jsx"], "ts": ["*.ts", "*.tsx"],
    "rust": ["*.rs"], "go": ["*.go"], "java": ["*.java"], "c": ["*.c", "*.h"], "cpp": ["*.cpp", "*.cc", "*.hpp", "*.h"],
    "md": ["*.md"], "json": ["*.json"], "yaml": ["*.yaml", "*.yml"], "sh": ["*.sh", "*.bash"], "txt": ["*.txt"],
    "toml": ["*.toml"], "html": ["*.html", "*.htm"], "css": ["*.css"], "sql": ["*.sql"]}
def expand(p):
    m = re.search(r"\{([^{}]*)\}", p)
    return [x for alt in m.group(1).split(",") for x in expand(p[:m.start()] + alt + p[m.end():])] if m else [p]
def reply(items=(), truncated=False, total=0, error=None):
    print(json.dumps({"items": list(items), "truncated": truncated, "total": total, "error": error}))
    sys.exit(0)
base = q["path"]
if not os.path.exists(base):
    reply(error="path does not exist: " + base)
def walk(root):
    if os.path.isfile(root):
        yield root; return
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x != ".git")
        for f in sorted(files):
            yield os.path.join(d, f)
if q["op"] == "glob":
    pat = q["pattern"]
    if pat.startswith("/"):
        base, pat = "/", pat.lstrip("/")
    found = set()
    for p in expand(pat):
        try:
            found.update(str(x) for x in Path(base).glob(p) if x.is_file() and ".git" not in x.parts)
        except (ValueError, OSError) as e:
            reply(error="bad glob pattern %r: %s" % (q["pattern"], e))
    found = sorted(found)
    reply(found[:q["max"]], len(found) > q["max"], len(found))
try:
    rx = re.compile(q["pattern"], (re.I if q["ignore_case"] else 0) | (re.S | re.M if q["multiline"] else 0))
except re.error as e:
    reply(error="bad regex %r: %s" % (q["pattern"], e))
globs = [g for x in (q["glob"] or "").split() for g in expand(x)]
types = TYPES.get(q["type"], ["*." + q["type"]]) if q["type"] else []
out, total = [], 0
def keep(f):
    rel = os.path.relpath(f, base) if os.path.isdir(base) else os.path.basename(f)
    name = os.path.basename(f)
    ok = lambda pats: not pats or any(fnmatch.fnmatch(name, g) or fnmatch.fnmatch(rel, g) for g in pats)
    return ok(globs) and ok(types)
for f in walk(base):
    if not keep(f):
        continue
    try:
        if not stat.S_ISREG(os.stat(f).st_mode):
            continue  # a FIFO or a device would block the read
        with open(f, "rb") as fh:
            raw = fh.read(8 << 20)
    except OSError:
        continue
    if b"\0" in raw[:8192]:
        continue
    text = raw.decode("utf-8", "replace")
    lines = text.splitlines()
    if q["multiline"]:
        hits = sorted({text.count("\n", 0, m.start()) for m in rx.finditer(text)})
    else:
        hits = [i for i, ln in enumerate(lines) if rx.search(ln)]
    if not hits:
        continue
    if q["mode"] == "files_with_matches":
        out.append(f)
    elif q["mode"] == "count":
        out.append("%s:%d" % (f, len(hits)))
    else:
        shown, last, hit_set = set(), None, set(hits)
        for h in hits:
            for i in range(max(h - q["before"], 0), min(h + q["after"] + 1, len(lines))):
                if i in shown:
                    continue
                if last is not None and i > last + 1 and (q["before"] or q["after"]):
                    out.append("--")
                sep = ":" if i in hit_set else "-"
                out.append(f + sep + (str(i + 1) + sep if q["line_numbers"] else "") + lines[i][:2000])
                shown.add(i); last = i
    if len(out) > q["offset"] + q["max"] + 1:
        break
total = len(out)
items = out[q["offset"]:q["offset"] + q["max"]]
reply(items, total > q["offset"] + q["max"], total)
"""

__all__ = ["DEFAULT_READ_LIMIT", "EpisodeState", "IntentArgError", "IntentExecutor", "IntentRefused", "looks_binary"]
