"""Packing a file that shrinks between its stat and its read (a daemon racing the snapshot that grading
takes): stored as read, never an "unexpected end of data" that turns a graded episode into an excluded one."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from sandboxes import agent

pytestmark = pytest.mark.unit


class ShrinkingTar(tarfile.TarFile):
    """Truncates the file right after its stat, as a racing process would."""

    def gettarinfo(self, name=None, arcname=None, fileobj=None):  # noqa: ANN001, ANN201
        ti = super().gettarinfo(name, arcname, fileobj)
        Path(name).write_bytes(b"short")
        return ti


def test_a_file_shrunk_after_its_stat_is_stored_as_read(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100_000)
    buf = io.BytesIO()
    with ShrinkingTar.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        agent.add_as_it_is_now(tar, str(path), "f")
    with tarfile.open(fileobj=io.BytesIO(buf.getvalue())) as tar:
        assert tar.extractfile("f").read() == b"short"


def test_plain_tar_add_fails_on_the_same_race(tmp_path: Path) -> None:
    """What the agent did before: the race is real, and this is the error CI saw."""
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100_000)
    with ShrinkingTar.open(fileobj=io.BytesIO(), mode="w") as tar, pytest.raises(OSError, match="unexpected end of data"):
        tar.add(str(path), arcname="f", recursive=False)


def test_the_host_side_pack_of_the_upper_dir_stores_a_shrunk_file_as_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sandboxes import docker_snapshots

    upper = tmp_path / "upper"
    (upper / "workspace").mkdir(parents=True)
    (upper / "workspace" / "f").write_bytes(b"x" * 100_000)
    plain = docker_snapshots.open_entry

    def shrinking(parent_fd, name):  # noqa: ANN001, ANN202 - the entry is opened and stat'ed, then shrinks
        entry = plain(parent_fd, name)
        (upper / "workspace" / name).write_bytes(b"short")
        return entry

    monkeypatch.setattr(docker_snapshots, "open_entry", shrinking)
    deadline = docker_snapshots.Deadline(60, "test pack")
    blob = docker_snapshots.pack_upper(str(upper), ["/workspace/f"], {"m": 1}, "sb-test", 1 << 30, deadline)
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        assert tar.extractfile("workspace/f").read() == b"short"
