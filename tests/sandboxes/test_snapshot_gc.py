"""gc_snapshots on a temporary snapshot dir, with file times set by hand."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from sandboxes.errors import SpecError
from sandboxes.snapshot_gc import gc_snapshots

pytestmark = pytest.mark.unit

NOW = 1_800_000_000.0
DAY = 86400.0


def _blob(dir: Path, tag: str, size: int, idle_s: float, *, atime_idle_s: float | None = None) -> Path:
    path = dir / f"{hashlib.sha256(tag.encode()).hexdigest()}.tar"
    path.write_bytes(b"x" * size)
    atime = NOW - (idle_s if atime_idle_s is None else atime_idle_s)
    os.utime(path, (atime, NOW - idle_s))
    return path


def _names(report: object) -> set[str]:
    return {r.name for r in report.removed}  # type: ignore[attr-defined]


def test_old_blobs_go_recent_ones_stay(tmp_path: Path) -> None:
    old = _blob(tmp_path, "old", 100, 10 * DAY)
    new = _blob(tmp_path, "new", 100, 1 * DAY)
    report = gc_snapshots(tmp_path, max_age_s=7 * DAY, max_bytes=1 << 30, now=NOW)
    assert _names(report) == {old.name} and [r.reason for r in report.removed] == ["age"]
    assert not old.exists() and new.exists()
    assert (report.kept_count, report.kept_bytes, report.freed_bytes) == (1, 100, 100)


def test_a_recent_read_counts_as_use(tmp_path: Path) -> None:
    read = _blob(tmp_path, "read", 100, 30 * DAY, atime_idle_s=DAY)  # written long ago, restored yesterday
    assert gc_snapshots(tmp_path, max_age_s=7 * DAY, max_bytes=1 << 30, now=NOW).removed == ()
    assert read.exists()


def test_over_the_byte_cap_the_least_recently_used_go_first(tmp_path: Path) -> None:
    a = _blob(tmp_path, "a", 400, 5 * DAY)
    b = _blob(tmp_path, "b", 400, 3 * DAY)
    c = _blob(tmp_path, "c", 400, 1 * DAY)
    report = gc_snapshots(tmp_path, max_age_s=30 * DAY, max_bytes=900, now=NOW)
    assert [r.name for r in report.removed] == [a.name] and report.removed[0].reason == "size"
    assert b.exists() and c.exists() and report.kept_bytes == 800


def test_keep_and_the_last_minute_are_never_removed(tmp_path: Path) -> None:
    kept = _blob(tmp_path, "kept", 500, 100 * DAY)
    by_path = _blob(tmp_path, "by-path", 500, 100 * DAY)
    hot = _blob(tmp_path, "hot", 500, 10)  # being written or restored right now
    report = gc_snapshots(
        tmp_path, max_age_s=1, max_bytes=0, keep={kept.stem, str(by_path)}, now=NOW
    )
    assert report.removed == ()
    assert kept.exists() and by_path.exists() and hot.exists()
    assert report.kept_bytes == 1500  # over the cap, and still kept: protection wins


def test_leftover_tmp_files_go_unless_still_being_written(tmp_path: Path) -> None:
    stale, live = tmp_path / ".tmp-abc", tmp_path / ".tmp-def"
    for path, idle in ((stale, 3600), (live, 5)):
        path.write_bytes(b"partial")
        os.utime(path, (NOW - idle, NOW - idle))
    report = gc_snapshots(tmp_path, max_age_s=7 * DAY, max_bytes=1 << 30, now=NOW)
    assert _names(report) == {".tmp-abc"} and report.removed[0].reason == "tmp"
    assert live.exists()


def test_foreign_files_symlinks_and_dirs_are_left_alone(tmp_path: Path) -> None:
    target = _blob(tmp_path, "t", 10, 1)
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / ("f" * 64 + ".tar")).symlink_to(target)
    (tmp_path / ("e" * 64 + ".tar")).mkdir()
    for path in tmp_path.iterdir():
        os.utime(path, (NOW - 100 * DAY, NOW - 100 * DAY), follow_symlinks=False)
    report = gc_snapshots(tmp_path, max_age_s=1, max_bytes=0, now=NOW)
    assert _names(report) == {target.name}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["notes.txt", "f" * 64 + ".tar", "e" * 64 + ".tar"])


def test_dry_run_removes_nothing_and_a_missing_dir_is_empty(tmp_path: Path) -> None:
    old = _blob(tmp_path, "old", 100, 10 * DAY)
    report = gc_snapshots(tmp_path, max_age_s=DAY, max_bytes=1 << 30, dry_run=True, now=NOW)
    assert _names(report) == {old.name} and report.dry_run and old.exists()
    assert gc_snapshots(tmp_path / "missing", max_age_s=DAY, max_bytes=0).removed == ()


@pytest.mark.parametrize(("kwargs", "field"), [({"max_age_s": 0}, "max_age_s"), ({"max_bytes": -1}, "max_bytes")])
def test_bad_limits_name_the_argument(tmp_path: Path, kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(SpecError, match=field):
        gc_snapshots(tmp_path, **kwargs)  # type: ignore[arg-type]
