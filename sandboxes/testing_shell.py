"""The small sh a ``sandboxes.testing.FakeSandbox`` runs commands with, over its in-memory tree.

What it understands is listed in ``sandboxes.testing``'s docstring; anything else fails as a shell
would (exit 127 for an unknown program) or, for syntax it does not model, exits 2 with
``fake shell: unsupported``, so a test never passes by accident on a command the fake did not run.
"""

from __future__ import annotations

import itertools
import posixpath
import re
import shlex
import signal
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from sandboxes.errors import SandboxError
from sandboxes.types import ExecResult

if TYPE_CHECKING:
    from sandboxes.testing import FakeSandbox


def parents(path: str) -> list[str]:
    """Every directory above ``path`` but ``/``, nearest first."""
    out = []
    while (path := posixpath.dirname(path)) not in ("", "/"):
        out.append(path)
    return out


class _Exit(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


class _Deadline(Exception):
    pass


_VAR = re.compile(  # $NAME, ${NAME}, ${NAME:-default}, $1, $$, $?
    r"\$(?:\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?\}|(?P<plain>[A-Za-z_][A-Za-z0-9_]*|[0-9$?]))"
)
_UNSUPPORTED = ("|", "&", "<<", ";;&")
_FAKE_PID = 4242
_FD = "\x00fd"  # marks a descriptor number written against its redirection (never in a real word)


class FakeShell:
    """The little sh a ``FakeSandbox`` runs commands with (see the module docstring for its limits)."""

    COMMANDS = frozenset({
        "true", "false", ":", "exit", "echo", "printf", "cat", "ls", "test", "[", "mkdir", "rm", "ln", "chmod", "touch",
        "truncate", "wc", "head", "tail", "mktemp", "stat", "sleep", "kill", "pwd", "cd",
        "sh", "bash", "export", "od",
    })

    def __init__(self, sandbox: FakeSandbox, *, env: Mapping[str, str], cwd: str, deadline: float,
                 stdin: bytes | None) -> None:
        self.sb, self.env, self.cwd, self.deadline = sandbox, dict(env), cwd, deadline
        self.stdin = stdin or b""
        self.out, self.err = bytearray(), bytearray()
        self.status = 0
        self.positional: list[str] = []

    def run(self, cmd: str | Sequence[str]) -> ExecResult:
        start = time.monotonic()
        timed_out = False
        try:
            if isinstance(cmd, str):
                self.status = self.script(cmd)
            else:
                self.status = self.command(list(cmd), self.out, self.err)
        except _Exit as done:
            self.status = done.code
        except _Deadline:
            self.status, timed_out = 124, True
        limit = self.sb.spec.output_limit
        stdout, stderr = bytes(self.out[:limit]), bytes(self.err[:limit])
        return ExecResult(self.status, stdout.decode(errors="replace"), stderr.decode(errors="replace"),
                          timed_out=timed_out, truncated=len(self.out) > limit or len(self.err) > limit,
                          duration_s=time.monotonic() - start)

    # -- parsing --------------------------------------------------------------------

    def script(self, text: str) -> int:
        """Run a script: commands joined by ``;``, newlines, ``&&``, ``||``, and ``for ... do ... done`` loops."""
        return self._run_list(self._split(text))

    def _run_list(self, commands: list[tuple[str, str]]) -> int:
        status, i = self.status, 0
        while i < len(commands):
            op, raw = commands[i]
            runs = op == ";" or (op == "&&" and status == 0) or (op == "||" and status != 0)
            if raw.split(None, 1)[0] == "for":
                end = next((j for j in range(i + 1, len(commands)) if commands[j][1].split()[0] == "done"), None)
                if end is None or not commands[i + 1][1].startswith("do"):
                    self.err += b"fake shell: for without do ... done\n"
                    return 2
                body = [(";", commands[i + 1][1][2:].strip()), *commands[i + 2:end]]
                if runs:
                    status = self._loop(raw, [(o, c) for o, c in body if c])
                i = end + 1
                continue
            if runs:
                try:
                    words = self._words(raw)
                except ValueError as exc:
                    self.err += f"fake shell: {exc}\n".encode()
                    return 2
                status = self.status = self.simple(words)
            i += 1
        return status

    def _loop(self, head: str, body: list[tuple[str, str]]) -> int:
        words = self._words(head)
        if len(words) < 3 or words[2] != "in":
            self.err += f"fake shell: unsupported loop {head!r}\n".encode()
            return 2
        status = 0
        for item in words[3:]:
            self.env[words[1]] = item
            status = self._run_list(body)
        return status

    @staticmethod
    def _split(text: str) -> list[tuple[str, str]]:
        """(operator before it, raw text) per command; splits at unquoted ``;``, newlines, ``&&``, ``||``; drops comments."""
        commands: list[tuple[str, str]] = []
        op, cur = ";", []
        single = double = False
        i = 0
        while i < len(text):
            c = text[i]
            if c == "\\" and not single:
                cur.append(text[i:i + 2])
                i += 2
                continue
            if c == "'" and not double:
                single = not single
            elif c == '"' and not single:
                double = not double
            elif not single and not double:
                sep = ";" if c in ";\n" else text[i:i + 2] if text[i:i + 2] in ("&&", "||") else None
                if c == "#" and (not cur or cur[-1][-1:] in (" ", "\t")):
                    while i < len(text) and text[i] != "\n":
                        i += 1
                    continue
                if sep is not None:
                    if "".join(cur).strip():
                        commands.append((op, "".join(cur).strip()))
                        op = sep
                    elif sep != ";":
                        op = sep
                    cur = []
                    i += len(sep) if sep != ";" else 1
                    continue
            cur.append(c)
            i += 1
        if "".join(cur).strip():
            commands.append((op, "".join(cur).strip()))
        return commands

    def _words(self, raw: str) -> list[str]:
        tokens = self._tokens(self._expand(raw))
        bad = next((t for t in tokens if t in _UNSUPPORTED or t.startswith("|") or t.startswith("&")), None)
        if bad is not None:
            raise ValueError(f"unsupported: {bad}")
        return tokens

    def _expand(self, text: str) -> str:
        """Variables expanded (quotes kept); a descriptor number against its redirection marked."""
        out: list[str] = []
        single = double = False
        i = 0
        while i < len(text):
            c = text[i]
            if c == "\\" and not single:
                out.append(text[i:i + 2])
                i += 2
                continue
            if c == "'" and not double:
                single = not single
            elif c == '"' and not single:
                double = not double
            elif not single and (c == "`" or text.startswith("$(", i)):
                raise ValueError("unsupported: command substitution")
            elif c == "$" and not single and (m := _VAR.match(text, i)):
                value = self._var(m)
                out.append(value.replace("\\", "\\\\").replace('"', '\\"') if double else shlex.quote(value) if value else "")
                i = m.end()
                continue
            elif c in "12" and not single and not double and text.startswith(">", i + 1) and (not out or out[-1][-1:] in (" ", "\t")):
                c = f"{_FD}{c} "  # "2>" names a descriptor; "echo 2 >f" does not
            out.append(c)
            i += 1
        return "".join(out)

    def _var(self, m: re.Match[str]) -> str:
        name = m.group("braced") or m.group("plain")
        if name == "$":
            return str(_FAKE_PID)
        if name == "?":
            return str(self.status)
        if name.isdigit():
            n = int(name)
            return self.positional[n] if n < len(self.positional) else ""
        value = self.env.get(name, "")
        return value if value or m.group("default") is None else m.group("default")

    @staticmethod
    def _tokens(text: str) -> list[str]:
        lex = shlex.shlex(text, posix=True, punctuation_chars=";&|<>")
        lex.whitespace_split, lex.commenters = True, ""
        return list(lex)

    # -- running ----------------------------------------------------------------------

    def simple(self, words: list[str]) -> int:
        """One command with its redirections."""
        argv: list[str] = []
        out, err = self.out, self.err
        targets: list[tuple[str, str]] = []  # (fd, how): how is "w:path", "a:path", "dup" or "null"
        stdin: bytes | None = None
        i = 0
        while i < len(words):
            w = words[i]
            fd = "1"
            if w in (f"{_FD}1", f"{_FD}2") and i + 1 < len(words) and words[i + 1] in (">", ">>", ">&"):
                fd, i = w[-1], i + 1
                w = words[i]
            if w in (">", ">>"):
                path = words[i + 1] if i + 1 < len(words) else ""
                targets.append((fd, "null" if path == "/dev/null" else ("a:" if w == ">>" else "w:") + path))
                i += 2
            elif w == ">&":
                targets.append((fd, "dup" + (words[i + 1] if i + 1 < len(words) else "")))
                i += 2
            elif w == "<":
                try:
                    stdin = self._read(words[i + 1])
                except OSError as exc:
                    self.err += f"sh: {exc}\n".encode()
                    return 1
                i += 2
            else:
                argv.append(w)
                i += 1
        if not argv:
            return 0
        bufs = {"1": bytearray(), "2": bytearray()}
        saved = self.stdin
        if stdin is not None:
            self.stdin = stdin
        try:
            status = self.command(argv, bufs["1"], bufs["2"])
        finally:
            if stdin is not None:
                self.stdin = saved
            self._route(bufs, targets, out, err)
        return status

    def _route(self, bufs: dict[str, bytearray], targets: list[tuple[str, str]], out: bytearray, err: bytearray) -> None:
        sinks: dict[str, bytearray | None] = {"1": out, "2": err}
        for fd, how in targets:
            if how == "null":
                sinks[fd] = None
            elif how.startswith("dup"):
                sinks[fd] = sinks.get(how[3:], out)
            else:
                path = self._abs(how[2:])
                old = self._read(path) if how.startswith("a:") and self.sb.kind(self.sb.follow(path)) else b""
                self.sb.put(self.sb.follow(path), old)
                sinks[fd] = _FileSink(self, self.sb.follow(path))  # type: ignore[assignment]
        for fd in ("1", "2"):
            sink = sinks[fd]
            if sink is not None:
                sink += bufs[fd]

    def command(self, argv: list[str], out: bytearray, err: bytearray) -> int:
        if time.monotonic() > self.deadline:
            raise _Deadline
        name, args = argv[0], argv[1:]
        if "/" in name:
            return self._run_file(name, args, out, err)
        if name not in self.COMMANDS:
            err += f"sh: {name}: command not found\n".encode()
            return 127
        try:
            return getattr(self, "_c_" + {"[": "test", ":": "true"}.get(name, name))(args, out, err)
        except (OSError, SandboxError, ValueError, IndexError) as exc:
            err += f"{name}: {exc}\n".encode()
            return 1

    def _run_file(self, name: str, args: list[str], out: bytearray, err: bytearray) -> int:
        path = self.sb.follow(self._abs(name))
        kind = self.sb.kind(path)
        if kind is None:
            err += f"sh: {name}: not found\n".encode()
            return 127
        if kind != "file" or not self.sb.modes.get(path, 0o644) & 0o111:
            err += f"sh: {name}: Permission denied\n".encode()
            return 126
        body = self.sb.files[path].decode(errors="replace")
        first = body.split("\n", 1)[0]
        if first.startswith("#!") and not re.search(r"\b(sh|bash)\b", first):
            err += f"fake shell: unsupported interpreter {first[2:].strip()!r}\n".encode()
            return 126
        return self._sub(body, [name, *args], out, err)

    def _sub(self, body: str, positional: list[str], out: bytearray, err: bytearray) -> int:
        child = FakeShell(self.sb, env=self.env, cwd=self.cwd, deadline=self.deadline, stdin=self.stdin)
        child.positional, child.out, child.err = positional, out, err
        try:
            status = child.script(body)
        except _Exit as done:
            status = done.code
        self.stdin = child.stdin
        return status

    def _abs(self, path: str) -> str:
        return posixpath.normpath(posixpath.join(self.cwd, path))

    def _read(self, path: str) -> bytes:
        real = self.sb.follow(self._abs(path))
        kind = self.sb.kind(real)
        if kind is None:
            raise FileNotFoundError(f"{path}: No such file or directory")
        if kind == "dir":
            raise IsADirectoryError(f"{path}: Is a directory")
        if kind == "fifo":
            raise OSError(f"{path}: a FIFO (reading it would block)")
        return bytes(self.sb.sparse[real]) if kind == "sparse" else self.sb.files[real]

    def _take_stdin(self) -> bytes:
        data, self.stdin = self.stdin, b""
        return data

    def _inputs(self, files: list[str]) -> bytes:
        return b"".join(self._take_stdin() if f == "-" else self._read(f) for f in files) if files else self._take_stdin()

    # -- the commands -----------------------------------------------------------------

    def _c_true(self, args: list[str], out: bytearray, err: bytearray) -> int:
        return 0

    def _c_false(self, args: list[str], out: bytearray, err: bytearray) -> int:
        return 1

    def _c_exit(self, args: list[str], out: bytearray, err: bytearray) -> int:
        raise _Exit(int(args[0]) & 0xFF if args else self.status)

    def _c_export(self, args: list[str], out: bytearray, err: bytearray) -> int:
        for a in args:
            key, _, value = a.partition("=")
            if _:
                self.env[key] = value
        return 0

    def _c_pwd(self, args: list[str], out: bytearray, err: bytearray) -> int:
        out += f"{self.cwd}\n".encode()
        return 0

    def _c_cd(self, args: list[str], out: bytearray, err: bytearray) -> int:
        target = self.sb.follow(self._abs(args[0] if args else self.sb.spec.workdir))
        if self.sb.kind(target) != "dir":
            raise FileNotFoundError(f"{args[0]}: No such directory")
        self.cwd = target
        return 0

    def _c_echo(self, args: list[str], out: bytearray, err: bytearray) -> int:
        newline = not (args and args[0] == "-n")
        out += (" ".join(args[1:] if not newline else args) + ("\n" if newline else "")).encode()
        return 0

    def _c_printf(self, args: list[str], out: bytearray, err: bytearray) -> int:
        escapes = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "0": "\0", "a": "\a"}
        fmt = re.sub(r"\\(.)", lambda m: escapes.get(m.group(1), m.group(0)), args[0])
        rest = args[1:]
        specs = re.findall(r"%[-0-9.]*[sdi%]", fmt)
        used = sum(s != "%%" for s in specs)
        while True:
            chunk, rest = rest[:used], rest[used:]
            values = iter(chunk)

            def fill(m: re.Match[str]) -> str:
                spec = m.group(0)
                if spec == "%%":
                    return "%"
                value = next(values, "")
                return (spec[:-1] + "d") % int(value or 0) if spec[-1] in "di" else spec % value

            out += re.sub(r"%[-0-9.]*[sdi%]", fill, fmt).encode()
            if not rest or not used:
                return 0

    def _c_cat(self, args: list[str], out: bytearray, err: bytearray) -> int:
        out += self._inputs([a for a in args if a != "--"])
        return 0

    def _c_ls(self, args: list[str], out: bytearray, err: bytearray) -> int:
        show_all = any(a.startswith("-") and "a" in a for a in args)
        targets = [a for a in args if not a.startswith("-")] or ["."]
        status = 0
        for t in targets:
            path = self.sb.follow(self._abs(t))
            kind = self.sb.kind(path)
            if kind is None:
                err += f"ls: cannot access '{t}': No such file or directory\n".encode()
                status = 2
            elif kind != "dir":
                out += f"{t}\n".encode()
            else:
                names = [posixpath.basename(e.path) for e in self.sb.list_files(path)]
                out += "".join(f"{n}\n" for n in names if show_all or not n.startswith(".")).encode()
        return status

    def _c_test(self, args: list[str], out: bytearray, err: bytearray) -> int:
        if args and args[-1] == "]":
            args = args[:-1]
        return 0 if self._test(args) else 1

    def _test(self, a: list[str]) -> bool:
        if not a:
            return False
        if a[0] == "!":
            return not self._test(a[1:])
        if len(a) == 1:
            return a[0] != ""
        if len(a) == 2:
            op, x = a
            if op in ("-n", "-z"):
                return (x != "") == (op == "-n")
            real = self._abs(x) if op in ("-L", "-h") else self.sb.follow(self._abs(x))
            kind = self.sb.kind(real)
            return {
                "-e": kind is not None, "-f": kind in ("file", "sparse"), "-d": kind == "dir", "-L": kind == "link",
                "-h": kind == "link", "-p": kind == "fifo", "-s": kind is not None and self.sb.size(real) > 0,
                "-x": kind is not None and bool(self.sb.modes.get(real, 0o755 if kind == "dir" else 0o644) & 0o111),
                "-r": kind is not None, "-w": kind is not None,
            }[op]
        x, op, y = a[0], a[1], a[2]
        ints = {"-eq": int.__eq__, "-ne": int.__ne__, "-lt": int.__lt__, "-le": int.__le__, "-gt": int.__gt__, "-ge": int.__ge__}
        if op in ints:
            return bool(ints[op](int(x), int(y)))
        return {"=": x == y, "==": x == y, "!=": x != y}[op]

    def _c_mkdir(self, args: list[str], out: bytearray, err: bytearray) -> int:
        make_parents = "-p" in args
        for a in (a for a in args if not a.startswith("-")):
            path = self._abs(a)
            if self.sb.kind(path) is not None and not make_parents:
                raise FileExistsError(f"cannot create directory '{a}': File exists")
            if not make_parents and self.sb.kind(posixpath.dirname(path)) != "dir":
                raise FileNotFoundError(f"cannot create directory '{a}': No such file or directory")
            self.sb.dirs.update({path, *parents(path)})
        return 0

    def _c_rm(self, args: list[str], out: bytearray, err: bytearray) -> int:
        flags = "".join(a[1:] for a in itertools.takewhile(lambda a: a != "--", args) if a.startswith("-"))
        paths = args[args.index("--") + 1:] if "--" in args else [a for a in args if not a.startswith("-")]
        status = 0
        for p in paths:
            path = self._abs(p)
            kind = self.sb.kind(path)
            if kind is None:
                if "f" not in flags:
                    err += f"rm: cannot remove '{p}': No such file or directory\n".encode()
                    status = 1
            elif kind == "dir" and not set(flags) & {"r", "R"}:
                err += f"rm: cannot remove '{p}': Is a directory\n".encode()
                status = 1
            else:
                self.sb.remove(path)
        return status

    def _c_ln(self, args: list[str], out: bytearray, err: bytearray) -> int:
        if not any(a.startswith("-") and "s" in a for a in args):
            raise ValueError("only symbolic links (ln -s) are modelled")
        target, link = [a for a in args if not a.startswith("-")][:2]
        path = self._abs(link)
        if self.sb.kind(path) is not None:
            if not any(a.startswith("-") and "f" in a for a in args):
                raise FileExistsError(f"failed to create symbolic link '{link}': File exists")
            self.sb.remove(path)
        self.sb.links[path] = target
        self.sb.dirs.update(parents(path))
        return 0

    def _c_chmod(self, args: list[str], out: bytearray, err: bytearray) -> int:
        mode, *paths = [a for a in args if not a.startswith("-") or re.fullmatch(r"-[rwx]+", a)]
        for p in paths:
            path = self.sb.follow(self._abs(p))
            if self.sb.kind(path) is None:
                raise FileNotFoundError(f"cannot access '{p}': No such file or directory")
            old = self.sb.modes.get(path, 0o644)
            if re.fullmatch(r"[0-7]{1,4}", mode):
                new = int(mode, 8)
            else:
                m = re.fullmatch(r"([ugoa]*)([+-])([rwx]+)", mode)
                if not m:
                    raise ValueError(f"mode {mode!r} is not modelled")
                who = m.group(1) or "a"
                bits = sum({"r": 4, "w": 2, "x": 1}[c] for c in m.group(3))
                mask = sum(bits << s for w, s in (("u", 6), ("g", 3), ("o", 0)) if w in who or "a" in who)
                new = old | mask if m.group(2) == "+" else old & ~mask
            self.sb.modes[path] = new
        return 0

    def _c_touch(self, args: list[str], out: bytearray, err: bytearray) -> int:
        for a in args:
            path = self.sb.follow(self._abs(a))
            if self.sb.kind(path) is None:
                self.sb.put(path, b"")
        return 0

    def _c_truncate(self, args: list[str], out: bytearray, err: bytearray) -> int:
        size = int(args[args.index("-s") + 1])
        for a in [a for i, a in enumerate(args) if a != "-s" and (i == 0 or args[i - 1] != "-s")]:
            path = self.sb.follow(self._abs(a))
            data = self._read(a) if self.sb.kind(path) == "file" else b""
            mode = self.sb.modes.get(path)
            if size > len(data) and not data.strip(b"\0"):  # all zeros: keep it sparse, never in memory
                self.sb.remove(path)
                self.sb.sparse[path] = size
                self.sb.modes[path] = 0o644 if mode is None else mode
                self.sb.dirs.update(parents(path))
            else:
                self.sb.put(path, data[:size].ljust(size, b"\0"), mode)
        return 0

    def _c_wc(self, args: list[str], out: bytearray, err: bytearray) -> int:
        files = [a for a in args if not a.startswith("-")]
        data = self._inputs(files)
        n = data.count(b"\n") if "-l" in args else len(data.decode(errors="replace").split()) if "-w" in args else len(data)
        out += (f"{n} {files[0]}\n" if len(files) == 1 else f"{n}\n").encode()
        return 0

    def _c_head(self, args: list[str], out: bytearray, err: bytearray) -> int:
        return self._ends(args, out, head=True)

    def _c_tail(self, args: list[str], out: bytearray, err: bytearray) -> int:
        return self._ends(args, out, head=False)

    def _ends(self, args: list[str], out: bytearray, *, head: bool) -> int:
        unit, count, files, i = "-n", 10, list[str](), 0
        while i < len(args):
            if args[i] in ("-c", "-n"):
                unit, count, i = args[i], int(args[i + 1]), i + 2
            elif args[i] == "--":
                files, i = files + args[i + 1:], len(args)
            else:
                files, i = files + [args[i]], i + 1
        data = self._inputs(files)
        if unit == "-c":
            out += data[:count] if head else data[-count:] if count else b""
        else:
            lines = data.splitlines(keepends=True)
            out += b"".join(lines[:count] if head else lines[-count:] if count else [])
        return 0

    def _c_mktemp(self, args: list[str], out: bytearray, err: bytearray) -> int:
        names = [a for a in args if not a.startswith("-")]
        template = names[0] if names else "/tmp/tmp.XXXXXXXXXX"
        path = self._abs(re.sub(r"X{3,}$", lambda m: uuid.uuid4().hex[: len(m.group(0))], template))
        if "-d" in args:
            self.sb.dirs.update({path, *parents(path)})
        else:
            self.sb.put(path, b"", 0o600)
        out += f"{path}\n".encode()
        return 0

    def _c_stat(self, args: list[str], out: bytearray, err: bytearray) -> int:
        fmt = args[args.index("-c") + 1] if "-c" in args else "%n %s"
        paths = args[args.index("--") + 1:] if "--" in args else [a for a in args if not a.startswith("-") and a != fmt]
        follow = "-L" in args
        for p in paths:
            path = self.sb.follow(self._abs(p)) if follow else self._abs(p)
            kind = self.sb.kind(path)
            if kind is None:
                raise FileNotFoundError(f"cannot statx '{p}': No such file or directory")
            entry = self.sb._entry(path)
            fields = {"%s": str(entry.size), "%a": f"{entry.mode & 0o7777:o}", "%n": p, "%F": {
                "dir": "directory", "link": "symbolic link", "fifo": "fifo"}.get(kind, "regular file")}
            out += (re.sub(r"%[sanF]", lambda m: fields[m.group(0)], fmt) + "\n").encode()
        return 0

    def _c_od(self, args: list[str], out: bytearray, err: bytearray) -> int:
        if not {"-An", "-v", "-tx1"} <= set(args):
            raise ValueError("only od -An -v -tx1 is modelled")
        data = self._inputs([a for a in args if not a.startswith("-")])
        out += "".join(" " + " ".join(f"{b:02x}" for b in data[i:i + 16]) + "\n" for i in range(0, len(data), 16)).encode()
        return 0

    def _c_sleep(self, args: list[str], out: bytearray, err: bytearray) -> int:
        want = sum(float(a.rstrip("s")) for a in args)
        left = self.deadline - time.monotonic()
        time.sleep(max(0.0, min(want, left)))
        if want > left:
            raise _Deadline
        return 0

    def _c_kill(self, args: list[str], out: bytearray, err: bytearray) -> int:
        sig = signal.SIGTERM
        pids = []
        for a in args:
            if a.startswith("-") and a != "-s":
                name = a[1:]
                sig = signal.Signals(int(name)) if name.isdigit() else signal.Signals["SIG" + name.removeprefix("SIG")]
            elif a.isdigit():
                pids.append(int(a))
        for pid in pids:
            if pid != _FAKE_PID:
                err += f"kill: ({pid}) - No such process\n".encode()
                return 1
            if sig not in (signal.SIGCHLD, signal.SIGCONT, signal.SIGWINCH, signal.SIGURG):
                raise _Exit(128 + sig.value)
        return 0

    def _c_sh(self, args: list[str], out: bytearray, err: bytearray) -> int:
        if args[:1] == ["-c"]:
            return self._sub(args[1], args[2:] or ["sh"], out, err)
        if args[:1] == ["-s"] or not args:
            return self._sub(self._take_stdin().decode(errors="replace"), ["sh", *args[1:]], out, err)
        return self._sub(self._read(args[0]).decode(errors="replace"), args, out, err)

    _c_bash = _c_sh


class _FileSink:
    """A redirection target: appends go straight into the sandbox's file."""

    def __init__(self, shell: FakeShell, path: str) -> None:
        self.shell, self.path = shell, path

    def __iadd__(self, data: bytes | bytearray) -> _FileSink:
        sb = self.shell.sb
        sb.put(self.path, sb.files.get(self.path, b"") + bytes(data), None)
        return self


__all__ = ["FakeShell", "parents"]
