"""Host-side reads beneath a root the sandbox user controls (``sandboxes.beneath``), on a host tmp dir."""

from __future__ import annotations

import io
import os
import tarfile
import threading
from pathlib import Path

import pytest

from sandboxes import docker_snapshots
from sandboxes.beneath import Deadline, DeadlinePassed, open_dir_beneath, open_entry
from sandboxes.errors import SnapshotError
from sandboxes.overlay import walk_upper

pytestmark = pytest.mark.unit


def _pack(upper: Path, paths: list[str], seconds: float = 30) -> dict[str, tarfile.TarInfo | bytes]:
    blob = docker_snapshots.pack_upper(str(upper), paths, {"m": 1}, "sb-test", 1 << 30, Deadline(seconds, "test"))
    out: dict[str, tarfile.TarInfo | bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        for m in tar.getmembers():
            out[m.name] = tar.extractfile(m).read() if m.isreg() else m  # type: ignore[union-attr]
    return out


def test_a_parent_that_is_a_symlink_to_the_host_is_never_read_through(tmp_path: Path) -> None:
    host = tmp_path / "host"
    host.mkdir()
    (host / "secret").write_text("HOST")
    upper = tmp_path / "upper"
    (upper / "w").mkdir(parents=True)
    (upper / "w" / "d").symlink_to(host)  # the walk listed w/d/secret while d was a directory
    got = _pack(upper, ["/w", "/w/d", "/w/d/secret"])
    assert "w/d/secret" not in got
    assert got["w/d"].issym()  # type: ignore[union-attr]
    with pytest.raises(OSError):
        open_dir_beneath(os.open(upper, os.O_RDONLY), "w/d")


def test_a_fifo_where_a_file_was_is_stored_as_a_fifo_without_blocking(tmp_path: Path) -> None:
    upper = tmp_path / "upper"
    (upper / "w").mkdir(parents=True)
    os.mkfifo(upper / "w" / "f")  # no writer: an open for reading would block forever
    box: list[object] = []
    t = threading.Thread(target=lambda: box.append(_pack(upper, ["/w/f"])), daemon=True)
    t.start()
    t.join(20)
    if t.is_alive():
        fd = os.open(upper / "w" / "f", os.O_WRONLY | os.O_NONBLOCK)  # release the hung thread
        os.close(fd)
        pytest.fail("packing a FIFO blocked")
    got = box[0]
    assert got["w/f"].isfifo()  # type: ignore[index, union-attr]


def test_a_file_swapped_for_a_fifo_after_its_listing_is_never_opened_for_reading(tmp_path: Path) -> None:
    parent = tmp_path / "p"
    parent.mkdir()
    os.mkfifo(parent / "f")
    pfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        entry = open_entry(pfd, "f")
    finally:
        os.close(pfd)
    assert entry is not None and entry.fd is None


def test_a_dotdot_or_symlink_component_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "l").symlink_to(tmp_path / "a")
    root = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for rel in ("../", "a/../..", "l", "l/"):
            with pytest.raises(OSError):
                os.close(open_dir_beneath(root, rel))
        os.close(open_dir_beneath(root, "a"))
    finally:
        os.close(root)


def test_the_walk_does_not_list_through_a_symlinked_directory(tmp_path: Path) -> None:
    host = tmp_path / "host"
    host.mkdir()
    (host / "secret").write_text("HOST")
    upper = tmp_path / "upper"
    (upper / "w").mkdir(parents=True)
    (upper / "w" / "d").symlink_to(host)
    paths, _, _ = walk_upper(str(upper))
    assert sorted(paths) == ["/w", "/w/d"]


def test_a_pack_past_its_deadline_is_refused(tmp_path: Path) -> None:
    upper = tmp_path / "upper"
    (upper / "w").mkdir(parents=True)
    (upper / "w" / "f").write_text("x")
    with pytest.raises(DeadlinePassed):
        _pack(upper, ["/w/f"], seconds=-1)
    assert issubclass(DeadlinePassed, TimeoutError) and not issubclass(DeadlinePassed, SnapshotError)


def test_a_child_of_a_parent_packed_as_a_symlink_is_left_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race the Docker swap test hit: the parent is read while a symlink, its child after it is a
    directory again. A blob with a member beneath a symlink member is one a restore refuses."""
    upper = tmp_path / "upper"
    (upper / "w" / "real").mkdir(parents=True)
    (upper / "w" / "real" / "f").write_text("sandbox")
    (upper / "w" / "d").symlink_to("/etc")
    plain = docker_snapshots.open_entry

    def swap_back(parent_fd: int, name: str):  # noqa: ANN202
        entry = plain(parent_fd, name)
        if name == "d":  # read as a symlink; now a directory again
            (upper / "w" / "d").unlink()
            (upper / "w" / "real").rename(upper / "w" / "d")
        return entry

    monkeypatch.setattr(docker_snapshots, "open_entry", swap_back)
    got = _pack(upper, ["/w", "/w/d", "/w/d/f"])
    assert got["w/d"].issym() and "w/d/f" not in got  # type: ignore[union-attr]
