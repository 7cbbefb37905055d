"""The sandbox side of the ``calls`` verifier: import the agent's code, make one check's calls, print plain data.

Run by ``agentenv.verifiers.calls`` as ``python3 -I -B -c <this file's source> WORKDIR`` in the
grading sandbox, as the sandbox user, one process per check, with the request (the steps,
*never* the expected values) on stdin. Standard library only; it must run on any image's
``python3`` (3.8+).

What it does, in order, before any of the agent's code runs:

* keeps a private copy of its stdout for the one result line and points fd 1 at fd 2, so
  whatever the agent's code prints (``print``, ``os.write(1, ...)``, a child) never lands
  on the result channel by accident;
* imports from source only: ``sys.dont_write_bytecode``, a ``sys.pycache_prefix``
  that can never be a directory (so a ``__pycache__/*.pyc`` next to a source is never read) and a
  path hook without the sourceless ``.pyc`` loader;
* puts the workdir first on ``sys.path`` (``-I`` left out the cwd and every ``PYTHON*``).

Then it runs the steps, catching everything (``SystemExit`` too), and writes exactly one
line: ``{"results": [...]}`` with, per reported step, ``{"value": <tagged>}``,
``{"raised": [qualified names of the exception's classes]}`` or
``{"unencodable": "<type>"}``, plus ``"stdout"`` (what the step printed) when asked, then
``os._exit(0)`` so no ``atexit`` hook of the agent's runs after it.

Values are encoded with exact type checks (``type(x) is int``, never ``isinstance``): a
subclass of ``int`` with an ``__eq__`` that always says yes is ``unencodable``, never a
value. Nothing here is trusted by the host: the agent's code runs in this process and can
rewrite any of it; what it can gain by that is choosing the bytes of this one check's
result, which is what returning a value already lets it do. The host never sees an
object, only the line, and the expected values never enter this process.
"""

import builtins
import contextlib
import importlib
import importlib.machinery
import io
import json
import os
import sys

_type, _str, _len, _isinstance = type, str, len, isinstance
MAX_NODES = 100000
MAX_DEPTH = 64
MAX_STDOUT = 65536


class Unencodable(Exception):
    pass


def encode(x, depth=0, budget=None):
    budget = budget if budget is not None else [MAX_NODES]
    budget[0] -= 1
    if budget[0] < 0 or depth > MAX_DEPTH:
        raise Unencodable("too large or too deep")
    t = _type(x)
    if x is None:
        return ["none"]
    if t is bool:
        return ["bool", x]
    if t is int:
        try:
            return ["int", int.__repr__(x)]
        except ValueError:  # past the int -> str digit limit
            raise Unencodable("int with too many digits")
    if t is float:
        return ["float", float.hex(x)]
    if t is str:
        return ["str", x]
    if t is list or t is tuple:
        return ["list" if t is list else "tuple", [encode(v, depth + 1, budget) for v in x]]
    if t is dict:
        return ["dict", [[encode(k, depth + 1, budget), encode(v, depth + 1, budget)] for k, v in dict.items(x)]]
    raise Unencodable(getattr(t, "__module__", "?") + "." + getattr(t, "__qualname__", "?"))


def class_names(exc):
    """Qualified names of the exception's classes; a class posing as a built-in one is named as what it is."""
    names = []
    for cls in _type(exc).__mro__:
        module, name = getattr(cls, "__module__", "?"), getattr(cls, "__qualname__", "?")
        if module == "builtins" and getattr(builtins, name, None) is not cls:
            module = "<impostor>"
        names.append(module + "." + name)
    return names


def resolve(target, bound):
    """``pkg.mod:attr.path`` imports ``pkg.mod``; ``name.attr`` starts from a value bound by an earlier step."""
    if ":" in target:
        module, _, path = target.partition(":")
        obj = importlib.import_module(module)
    else:
        first, _, path = target.partition(".")
        obj = bound[first]
    for part in [p for p in path.split(".") if p]:
        obj = getattr(obj, part)
    return obj


def decode_arg(value, bound):
    """Arguments are JSON; ``{"$ref": name}`` passes a value bound by an earlier step."""
    if _isinstance(value, dict):
        if list(value) == ["$ref"]:
            return bound[value["$ref"]]
        return {k: decode_arg(v, bound) for k, v in value.items()}
    if _isinstance(value, list):
        return [decode_arg(v, bound) for v in value]
    return value


def run(request):
    bound, results = {}, []
    for step in request["steps"]:
        out = io.StringIO()
        entry = {}
        try:
            with contextlib.redirect_stdout(out):
                target = resolve(step["target"], bound)
                if step["call"]:
                    args = decode_arg(step.get("args", []), bound)
                    kwargs = decode_arg(step.get("kwargs", {}), bound)
                    value = target(*args, **kwargs)
                else:
                    value = target
            if step.get("as"):
                bound[step["as"]] = value
            if step["report"]:
                try:
                    entry["value"] = encode(value)
                except Unencodable as exc:
                    entry["unencodable"] = _str(exc)
        except BaseException as exc:  # noqa: BLE001 - SystemExit from the agent's code is a result too
            if not step["report"]:
                results.append({"step": step["index"], "raised": class_names(exc), "unreported": True})
                break
            entry["raised"] = class_names(exc)
        if step["report"]:
            if step.get("stdout"):
                text = out.getvalue()
                entry["stdout"] = text[:MAX_STDOUT]
                entry["stdout_truncated"] = _len(text) > MAX_STDOUT
            entry["step"] = step["index"]
            results.append(entry)
    return results


def main():
    workdir = sys.argv[1]
    request = json.loads(sys.stdin.read(1 << 20))
    result_fd = os.dup(1)  # not inherited across exec; fd 1 now goes to stderr
    os.dup2(2, 1)
    sys.dont_write_bytecode = True
    sys.pycache_prefix = "/dev/null/nocache"  # never a directory: no cache is read, none written
    source_only = importlib.machinery.FileFinder.path_hook(
        (importlib.machinery.ExtensionFileLoader, importlib.machinery.EXTENSION_SUFFIXES),
        (importlib.machinery.SourceFileLoader, importlib.machinery.SOURCE_SUFFIXES),
    )
    sys.path_hooks[:] = [h for h in sys.path_hooks if "FileFinder" not in repr(h)] + [source_only]
    sys.path_importer_cache.clear()
    sys.path.insert(0, workdir)
    os.chdir(workdir)
    line = json.dumps({"results": run(request)}, ensure_ascii=True, allow_nan=False) + "\n"
    with os.fdopen(result_fd, "wb") as channel:
        channel.write(line.encode("ascii"))
    os._exit(0)


main()
