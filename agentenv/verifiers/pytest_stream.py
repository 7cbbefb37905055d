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
each test: setup, call, teardown), ``internal`` (an internal error) and
``finish`` (exit status, collected, failed). Lines sent are gone to the
host: code that runs later in the process can add lines, never take one back,
and the grader refuses a duplicate (see ``agentenv.verifiers.pytest_outcomes``).
"""

from __future__ import annotations

import fcntl
import json
import os

_NONCE = ""
_FD = -1


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
    line = _NONCE + " " + json.dumps(dict(k=kind, **fields), sort_keys=True, separators=(",", ":")) + "\n"
    data = line.encode("utf-8", "replace")
    while data:
        try:
            written = os.write(_FD, data)
        except OSError:
            return
        data = data[written:]


if "AGENTENV_STREAM_FD" in os.environ:  # only under the verifier's wrapper, never on import elsewhere
    _NONCE = _take_nonce()
    _FD = _take_stream()
    _emit("start", pid=os.getpid())


def pytest_collectreport(report):  # type: ignore[no-untyped-def]
    if report.outcome != "passed":
        _emit("collect", id=report.nodeid, outcome=report.outcome)


def pytest_collection_finish(session):  # type: ignore[no-untyped-def]
    _emit("items", n=len(session.items))


def pytest_runtest_logreport(report):  # type: ignore[no-untyped-def]
    _emit("test", id=report.nodeid, when=report.when, outcome=report.outcome, xfail=hasattr(report, "wasxfail"))


def pytest_internalerror(excrepr, excinfo):  # type: ignore[no-untyped-def]
    _emit("internal", error=str(getattr(excinfo, "typename", "")))


def pytest_sessionfinish(session, exitstatus):  # type: ignore[no-untyped-def]
    _emit("finish", exit=int(exitstatus), collected=int(session.testscollected), failed=int(session.testsfailed))
