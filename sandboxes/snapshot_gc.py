"""A lifetime for FAST-snapshot blobs (``<sha256>.tar`` under the snapshot dir).

Blobs are content-addressed and written once; nothing else ever deletes
them, so a dozen bench runs left 1.5 GB. ``gc_snapshots`` removes, in order:

1. leftover ``.tmp-*`` files (a writer that died between write and rename);
2. blobs not used for ``max_age_s``;
3. the least recently used blobs until the rest fit in ``max_bytes``.

"Used" is the later of mtime and atime. With the usual ``relatime`` mount
option the kernel refreshes atime on a read at most once a day, so a blob read
daily counts as used that day; ``max_age_s`` should stay well above a day.
Never removed: a blob named in ``keep`` (digests or paths: the snapshot refs
a live pool still holds), and any file touched within ``min_idle_s`` (a
snapshot being written or restored right now). Only names that look like
ours are considered; symlinks and other files are left alone.

A ref whose blob was removed fails to restore with ``SnapshotError`` (blob
unreadable); its owner takes a new snapshot.

Usage::

    report = gc_snapshots(default_snapshot_dir(), max_age_s=7 * 86400, max_bytes=10 << 30, keep=set())
    print(report.freed_bytes, [r.name for r in report.removed])
"""

from __future__ import annotations

import os
import re
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from sandboxes.errors import SpecError

DEFAULT_MAX_AGE_S = 7 * 86400.0
DEFAULT_MAX_BYTES = 10 << 30
MIN_IDLE_S = 60.0
BLOB_NAME = re.compile(r"^[0-9a-f]{64}\.tar$")
TMP_PREFIX = ".tmp-"

Reason = Literal["tmp", "age", "size"]


@dataclass(frozen=True)
class RemovedBlob:
    """One file ``gc_snapshots`` removed (or, in a dry run, would remove)."""

    name: str
    size: int
    idle_s: float  # seconds since it was last used
    reason: Reason


@dataclass(frozen=True)
class GcReport:
    """What one pass removed and what it left."""

    dir: Path
    removed: tuple[RemovedBlob, ...] = ()
    kept_count: int = 0
    kept_bytes: int = 0
    dry_run: bool = False
    errors: tuple[str, ...] = field(default=())  # files that could not be removed, with why

    @property
    def freed_bytes(self) -> int:
        return sum(r.size for r in self.removed)


@dataclass(frozen=True)
class _File:
    path: Path
    size: int
    used: float


def gc_snapshots(
    dir: Path,
    *,
    max_age_s: float = DEFAULT_MAX_AGE_S,
    max_bytes: int = DEFAULT_MAX_BYTES,
    keep: Iterable[str] = frozenset(),
    min_idle_s: float = MIN_IDLE_S,
    dry_run: bool = False,
    now: float | None = None,
) -> GcReport:
    """Remove stale blobs from ``dir`` (see the module docstring); a missing dir is empty.

    ``keep`` holds digests (``<sha256>``), blob names or paths (a ``SnapshotRef.location``).
    """
    if max_age_s <= 0:
        raise SpecError(f"max_age_s: expected seconds > 0, got {max_age_s!r}")
    if max_bytes < 0:
        raise SpecError(f"max_bytes: expected bytes >= 0, got {max_bytes!r}")
    now = time.time() if now is None else now
    kept_names = {_blob_name(k) for k in keep}
    tmps, blobs = _scan(Path(dir))
    doomed: list[tuple[_File, Reason]] = []
    for f in tmps:
        if now - f.used >= min_idle_s:
            doomed.append((f, "tmp"))
    survivors = []
    for f in sorted(blobs, key=lambda f: f.used):  # least recently used first
        protected = f.path.name in kept_names or now - f.used < min_idle_s
        if not protected and now - f.used >= max_age_s:
            doomed.append((f, "age"))
        else:
            survivors.append((f, protected))
    total = sum(f.size for f, _ in survivors)
    kept = []
    for f, protected in survivors:
        if total > max_bytes and not protected:
            doomed.append((f, "size"))
            total -= f.size
        else:
            kept.append(f)
    removed, errors = [], []
    for f, reason in doomed:
        if not dry_run:
            try:
                f.path.unlink()
            except FileNotFoundError:
                pass  # another gc got there first: gone either way
            except OSError as exc:
                errors.append(f"{f.path}: {exc.strerror or exc}")
                kept.append(f)
                continue
        removed.append(RemovedBlob(f.path.name, f.size, max(0.0, now - f.used), reason))
    return GcReport(Path(dir), tuple(removed), len(kept), sum(f.size for f in kept), dry_run, tuple(errors))


def _blob_name(ref: str) -> str:
    name = os.path.basename(ref)
    return name if name.endswith(".tar") else f"{name}.tar"


def _scan(dir: Path) -> tuple[list[_File], list[_File]]:
    tmps: list[_File] = []
    blobs: list[_File] = []
    try:
        entries = list(os.scandir(dir))
    except FileNotFoundError:
        return tmps, blobs
    for entry in entries:
        is_tmp, is_blob = entry.name.startswith(TMP_PREFIX), bool(BLOB_NAME.match(entry.name))
        if not (is_tmp or is_blob):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(st.st_mode):
            continue
        (tmps if is_tmp else blobs).append(_File(Path(entry.path), st.st_size, max(st.st_mtime, st.st_atime)))
    return tmps, blobs


__all__ = ["DEFAULT_MAX_AGE_S", "DEFAULT_MAX_BYTES", "GcReport", "MIN_IDLE_S", "RemovedBlob", "gc_snapshots"]
