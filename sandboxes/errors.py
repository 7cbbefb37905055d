"""The one exception tree of ``sandboxes``.

Every class also inherits the matching built-in, so callers that only know
Python's own exceptions (``TimeoutError``, ``FileNotFoundError`` ...) still catch
them. Messages name the sandbox, the path or the argument, and say what was
expected and what arrived.
"""

from __future__ import annotations


class SandboxError(Exception):
    """Base of every error raised by a sandbox or a backend."""


class SpecError(SandboxError, ValueError):
    """A ``SandboxSpec`` or an argument is invalid (names the field)."""


class DaemonUnavailable(SandboxError, ConnectionError):
    """The container engine cannot be reached (socket missing, daemon down)."""


class ImageNotFound(SandboxError, LookupError):
    """The image is not present locally and cannot be pulled (no registry)."""


class SandboxLost(SandboxError, ConnectionError):
    """The sandbox died under us: container killed, removed, or its agent gone."""


class SandboxTampered(SandboxLost):
    """The sandbox can no longer be trusted: an answer on its agent channel failed authentication.

    A subclass of ``SandboxLost`` (the sandbox is unusable), kept apart so callers can
    record that the episode itself, not the infrastructure, broke it.
    """


class SandboxTimeout(SandboxError, TimeoutError):
    """A non-exec operation (file transfer, snapshot, start) passed its deadline.

    ``exec`` never raises this for the command itself: a command that runs past
    its deadline is killed and returns ``ExecResult(timed_out=True)``.
    """


class SandboxFileNotFound(SandboxError, FileNotFoundError):
    """A path inside the sandbox does not exist."""


class SandboxPermissionError(SandboxError, PermissionError):
    """The sandbox user may not read or write the path (read-only, not owner)."""


class PathEscape(SandboxPermissionError):
    """A path resolves outside the sandbox root (``..`` or a symlink escape)."""


class SandboxFileTooLarge(SandboxError, OSError):
    """A file is larger than a read may return (``read_file``'s ``limit``); nothing was read."""


class SnapshotError(SandboxError, RuntimeError):
    """A snapshot could not be taken or restored (unknown ref, broken blob)."""


class SnapshotTooLarge(SnapshotError):
    """The sandbox holds more changed bytes than a FAST snapshot may carry (the episode's doing)."""


class PoolClosed(SandboxError, RuntimeError):
    """``acquire`` was called on a pool that has been shut down."""


__all__ = [
    "SnapshotTooLarge",
    "SandboxTampered",
    "SandboxFileTooLarge",
    "DaemonUnavailable",
    "ImageNotFound",
    "PathEscape",
    "PoolClosed",
    "SandboxError",
    "SandboxFileNotFound",
    "SandboxLost",
    "SandboxPermissionError",
    "SandboxTimeout",
    "SnapshotError",
    "SpecError",
    "UnknownBackend",
]


class UnknownBackend(SandboxError, LookupError):
    """A backend name that ``sandboxes.backends.make_backend`` does not know (names the known ones)."""
