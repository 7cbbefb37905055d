"""The pytest plugin that streams every test outcome to the grader as it happens (runs in the sandbox).

Staged by the unit-tests verifier into a fresh directory as ``agentenv_stream.py``
and loaded with ``-p agentenv_stream``, so pytest imports it while it parses
its command line: before any conftest, test module or code under test. Self
contained (standard library and pytest only; Python 3.8+, pytest 7+): it never
imports ``agentenv``.

At load it takes

* the per-run nonce from its stdin (one line; the host writes it into the
  exec's stdin, so it is in no environment block, command line or file that
  ``/proc`` shows), then points fd 0 at ``/dev/null``;
* the stream: fd ``AGENTENV_STREAM_FD`` (3), which the ``bash`` wrapper made a
  copy of the exec's stdout before sending pytest's own stdout and stderr to a
  log file. It moves the stream to a close-on-exec descriptor above 100 and
  closes fd 3, so no subprocess of a test inherits it.

Then it writes one line per event, ``<nonce> <json>``, with one ``os.write``
each (atomic on a pipe): ``start``, ``items`` (collection done, how many),
``collect`` (a collector that failed or skipped), ``test`` (one per phase of
each test: setup, call, teardown), ``internal`` (an internal error), ``tamper``
(see Integrity, below) and ``finish`` (exit status, collected, failed). Lines sent are gone to the
host: code that runs later in the process can add lines, never take one back,
and the grader refuses a duplicate (see ``agentenv.verifiers.pytest_outcomes``).

**Integrity.** At load, before any conftest, test module or code under test
is imported, it records what decides an outcome (see ``_Guard``): every
function and class of pytest's runner, reports, collection, JUnit, skipping,
assertion-rewriting and ``raises``/``approx`` modules, pluggy's dispatch,
``unittest.case``, ``json``, a few builtins (``__import__``, ``AssertionError``,
``compile``, ...) and this plugin's own functions, each as the object, its
``__code__`` and defaults. Before collection it adds every hook
implementation registered so far. It checks them all again at every
``pytest_runtest_logreport`` and at session finish, and writes a ``tamper``
line (``what``: the names that changed) for any difference, through
references it took at load. What it cannot see: code that first patches this
plugin's recorded references or the check itself, or rewrites a code
object's bytes in place (``ctypes``); the ast detector is the guard there.
"""

from __future__ import annotations

import builtins
import fcntl
import json
import os
import sys
import types
from collections.abc import Mapping
from typing import Any

import pytest

_NONCE = ""
_FD = -1
_write = os.write  # taken at load: a later ``os.write = ...`` does not reach the stream


def _encoder():  # type: ignore[no-untyped-def]
    """A compact, key-sorted JSON encoder bound at load (the C one where there is one: no module global it reads
    later can be patched to rewrite a line)."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode
    encode = make(None, repr, json.encoder.encode_basestring_ascii, None, ":", ",", True, False, True)
    return lambda obj: "".join(encode(obj, 0))


_dumps = _encoder()

#: Modules whose functions and classes decide, record or dispatch an outcome (absent ones are skipped:
#: their names differ across pytest / pluggy versions).
GUARDED_MODULES = (
    "_pytest.reports", "_pytest.runner", "_pytest.python", "_pytest.main", "_pytest.junitxml",
    "_pytest.skipping", "_pytest.outcomes", "_pytest.unittest", "_pytest.nodes", "_pytest.python_api",
    "_pytest.raises", "_pytest.assertion", "_pytest.assertion.rewrite", "_pytest.assertion.util", "_pytest.legacypath",
    "pytest",
    "pluggy._callers", "pluggy._hooks", "pluggy._manager", "pluggy._result", "unittest.case",
)
#: Builtins that the runner, assertion rewriting or this plugin rely on; a test that patches one of these
#: is not expected (``input``, ``open``, ``print`` are left out: hidden tests monkeypatch them).
GUARDED_BUILTINS = (
    "__import__", "AssertionError", "compile", "exec", "eval", "isinstance", "hasattr", "getattr", "setattr",
    "len", "int", "str", "bool", "dict", "list", "tuple", "set", "frozenset", "type", "id", "sorted", "repr",
)


def _take_nonce() -> str:
    chunks = b""
    while b"\n" not in chunks and len(chunks) < 256:
        try:
            got = os.read(0, 256 - len(chunks))
        except OSError:
            break
        if not got:
            break
        chunks += got
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
    except OSError:
        pass
    return chunks.split(b"\n", 1)[0].decode("ascii", "replace").strip()


def _take_stream() -> int:
    fd = int(os.environ.pop("AGENTENV_STREAM_FD", "3"))
    try:
        private = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 100)
    except OSError:
        return -1
    os.close(fd)
    return private


def _emit(kind: str, **fields: object) -> None:
    if _FD < 0:
        return
    line = _NONCE + " " + _dumps(dict(k=kind, **fields)) + "\n"
    data = line.encode("utf-8", "replace")
    while data:
        try:
            written = _write(_FD, data)
        except OSError:
            return
        data = data[written:]


# What the guard itself calls, taken at load: builtins patched later do not reach the check.
_isinstance, _getattr, _len, _zip, _sorted, _list, _tuple = isinstance, getattr, len, zip, sorted, list, tuple
_CALLABLE = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, property, classmethod, staticmethod, type)
_OURS = ("_pytest", "pytest", "pluggy", "unittest")


def _pins(obj: Any) -> tuple:
    """What fixes the behaviour of ``obj``: itself and, for each Python function in it, its code and defaults."""
    if _isinstance(obj, property):
        inner: tuple = (obj.fget, obj.fset, obj.fdel)
    elif _isinstance(obj, (classmethod, staticmethod)):
        inner = (obj.__func__,)
    else:
        inner = (obj,)
    out = [obj]
    for fn in inner:
        if _isinstance(fn, types.FunctionType):
            out += (fn.__code__, fn.__defaults__, fn.__kwdefaults__)
    return _tuple(out)


def _members(namespace: Mapping[str, Any], names: tuple = ()) -> dict:
    """name -> pins of every function, descriptor or class in a module or class namespace (or of just ``names``)."""
    if names:
        return {n: _pins(namespace.get(n)) for n in names}
    return {n: _pins(v) for n, v in _list(namespace.items()) if _isinstance(v, _CALLABLE)}


def _same(a: tuple, b: tuple) -> bool:
    return _len(a) == _len(b) and all(x is y for x, y in _zip(a, b))


def _intact(namespace: dict, names: tuple, recorded: dict, size: int) -> bool:
    """The fast path of a check (it runs three times a test): nothing added, every recorded member as it was."""
    if not names and _len(namespace) != size:
        return False
    get, function = namespace.get, types.FunctionType
    for name, pins in recorded.items():
        obj = get(name)
        if obj is not pins[0]:
            return False
        if type(obj) is function:  # noqa: E721 - exactly a function: the common case, checked without _pins
            if obj.__code__ is not pins[1] or obj.__defaults__ is not pins[2] or obj.__kwdefaults__ is not pins[3]:
                return False
        elif _len(pins) > 1 and not _same(_pins(obj), pins):
            return False
    return True


def _codes(code: Any, into: set) -> None:
    """``code`` and every code object nested in it (its functions, lambdas, comprehensions), by id."""
    if _isinstance(code, types.CodeType) and id(code) not in into:
        into.add(id(code))
        for const in code.co_consts:
            _codes(const, into)


def _code_file(fn: object) -> str:
    code: Any = _getattr(_getattr(fn, "__func__", fn), "__code__", None)
    return code.co_filename if _isinstance(code, types.CodeType) else ""


class _Guard:
    """The identities that decide an outcome, recorded at load and compared at each check."""

    def __init__(self) -> None:
        # [label, namespace, names or (), recorded members, the class or None, its size, the names recorded at load]
        self.spaces: list = []
        seen: set = set()
        for name in GUARDED_MODULES:
            module = sys.modules.get(name)
            if module is None:
                try:
                    module = __import__(name, fromlist=["_"])
                except Exception:  # noqa: BLE001 - not in this pytest / pluggy version
                    continue
            self._add(name, module.__dict__)
            for value in _list(module.__dict__.values()):
                if _isinstance(value, type) and id(value) not in seen and str(value.__module__).split(".")[0] in _OURS:
                    seen.add(id(value))
                    self._add(f"{value.__module__}.{value.__qualname__}", value.__dict__, owner=value)
        self._add("builtins", builtins.__dict__, GUARDED_BUILTINS)
        # pytest's own code, by identity: what pytest itself may set later (legacypath's properties at
        # pytest_load_initial_conftests, assertion's _reprcompare closure during a test)
        self.known: set = set()
        self.known_globals: set = set()
        for name, module in _list(sys.modules.items()):
            if name.split(".")[0] in ("_pytest", "pytest", "pluggy") and module is not None:
                self.known_globals.add(id(module.__dict__))
                for value in _list(module.__dict__.values()):
                    for member in ([value] + _list(value.__dict__.values()) if _isinstance(value, type) else [value]):
                        for pin in _pins(member) if _isinstance(member, _CALLABLE) else ():
                            _codes(pin, self.known)
        tests = os.environ.get("AGENTENV_TESTS_DIR", "")
        self.tests = tests.rstrip(os.sep) + os.sep if tests else None
        self.me = _code_file(_Guard.check)
        self.hooks: dict = {}
        self.manager: object = None
        self.reported: set = set()

    def _add(self, label: str, namespace: Mapping[str, Any], names: tuple = (), owner: type | None = None) -> None:
        recorded = _members(namespace, names)
        self.spaces.append([label, namespace, names, recorded, owner, _len(namespace), frozenset(recorded)])

    def watch_plugin(self, plugin: dict) -> None:
        """This module's own functions, its references taken at load, the guard object and its class."""
        names = _tuple(n for n, v in plugin.items() if n.startswith(("pytest_", "_")) and _isinstance(v, (*_CALLABLE, _Guard)))
        self._add("agentenv_stream", plugin, names)
        self._add("agentenv_stream._Guard", _Guard.__dict__)

    def watch_hooks(self, manager: object) -> None:
        """Record every hook implementation registered now (this plugin's registration: before any conftest)."""
        if self.manager is None:
            self.manager = manager
            self.hooks = self._hooks()

    def _pytests_own(self, pins: tuple) -> bool:
        """Does ``pins`` (a member set after load) run only pytest's own code, as pytest loaded it? (A swap of one
        pytest function for another passes; none of them forces an outcome.)"""
        functions = [f for f in pins if _isinstance(f, types.FunctionType)]
        if _isinstance(pins[0], (property, classmethod, staticmethod)):
            functions += [f for f in (_getattr(pins[0], a, None) for a in ("fget", "fset", "fdel", "__func__"))
                          if _isinstance(f, types.FunctionType)]
        return bool(functions) and all(id(f.__code__) in self.known and id(f.__globals__) in self.known_globals
                                       for f in functions)

    def _hook_ok(self, fn: Any) -> bool:
        """A hook implementation registered after this plugin: pytest's own, this plugin's, or the hidden tests'."""
        fn = _getattr(fn, "__func__", fn)
        if _isinstance(fn, types.FunctionType) and id(fn.__code__) in self.known:
            return True
        where = _code_file(fn)
        return where == self.me or (self.tests is not None and where.startswith(self.tests))

    def _hooks(self) -> dict:
        out: dict = {"_inner_hookexec": (_getattr(self.manager, "_inner_hookexec", None),)}
        relay = _getattr(self.manager, "hook", None)
        for name, caller in _list(_getattr(relay, "__dict__", {}).items()):
            impls = _getattr(caller, "get_hookimpls", None)
            functions = _tuple(i.function for i in impls()) if impls is not None else ()
            out[name] = (caller, _getattr(caller, "_hookexec", None), *functions)
        return out

    def changed(self) -> list:
        """Names whose object, code or defaults differ from the record, or hook implementations added from elsewhere."""
        out = []
        for space in self.spaces:
            label, namespace, names, recorded, owner, _, original = space
            if _intact(namespace, names, recorded, space[5]):
                continue
            now = _members(namespace, names)
            bad = []
            for name in _sorted(set(recorded) | set(now)):
                shadows = owner is not None and name not in recorded and any(name in k.__dict__ for k in owner.__mro__[1:])
                if name in now and not shadows and self._pytests_own(now[name]):
                    continue
                if name not in now and name not in original:  # pytest's own addition, unset again (_reprcompare)
                    continue
                if name not in now or name not in recorded or not _same(recorded[name], now[name]):
                    bad.append(f"{label}.{name}")
            if not bad:  # only what pytest itself set: the new baseline, so the fast path holds again
                space[3], space[5] = now, _len(namespace)
            out += bad
        if self.manager is not None:
            now = self._hooks()
            for name, pins in _sorted(now.items()):
                before = self.hooks.get(name, pins[:2])  # a new hook is judged by where its implementations come from
                if not _same(before[:2], pins[:2]):
                    out.append(f"hook {name}")
                    continue
                added = [f for f in pins[2:] if not any(f is g for g in before[2:])]
                gone = [g for g in before[2:] if not any(f is g for f in pins[2:])]
                if gone or not all(self._hook_ok(f) for f in added):
                    out.append(f"hook {name}")
        return out

    def check(self) -> None:
        fresh = [what for what in self.changed() if what not in self.reported]
        if fresh:
            self.reported.update(fresh)
            _EMIT("tamper", what=fresh[:20], n=_len(fresh))


_GUARD: _Guard | None = None
_EMIT = _emit


def _check() -> None:
    if _GUARD is not None:
        _GUARD.check()


def pytest_plugin_registered(plugin, manager):  # type: ignore[no-untyped-def]
    if _GUARD is not None:  # the first call is this plugin's own registration: the hooks then are the baseline
        _GUARD.watch_hooks(manager)


def pytest_collectreport(report):  # type: ignore[no-untyped-def]
    if report.outcome != "passed":
        _emit("collect", id=report.nodeid, outcome=report.outcome)


def pytest_collection_finish(session):  # type: ignore[no-untyped-def]
    _emit("items", n=len(session.items))


def pytest_runtest_logreport(report):  # type: ignore[no-untyped-def]
    _check()
    _emit("test", id=report.nodeid, when=report.when, outcome=report.outcome, xfail=hasattr(report, "wasxfail"))


def pytest_internalerror(excrepr, excinfo):  # type: ignore[no-untyped-def]
    _emit("internal", error=str(getattr(excinfo, "typename", "")))


@pytest.hookimpl(trylast=True)  # after the JUnit report is written
def pytest_sessionfinish(session, exitstatus):  # type: ignore[no-untyped-def]
    _check()
    _emit("finish", exit=int(exitstatus), collected=int(session.testscollected), failed=int(session.testsfailed))


if "AGENTENV_STREAM_FD" in os.environ:  # only under the verifier's wrapper, never on import elsewhere
    _NONCE = _take_nonce()
    _FD = _take_stream()
    _emit("start", pid=os.getpid())
    _GUARD = _Guard()
    _GUARD.watch_plugin(globals())
