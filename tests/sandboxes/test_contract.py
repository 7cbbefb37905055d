"""The contract every sandbox backend passes (``backend`` is parametrized in conftest.py).

Commands use paths relative to the workdir: a plain-subprocess local sandbox
runs on the host, where ``/workspace`` does not exist. File operations use
absolute sandbox paths, which every backend maps.

The in-memory ``fake`` backend (``sandboxes.testing``) runs every case but those marked
``not_modelled_by_fake`` (it has no processes and no pipes). Isolation is no property of this
contract: the Docker sandbox's is tested in ``test_docker_isolation.py``, and the fake has none.
"""

from __future__ import annotations

import json
import pickle
import secrets
import time
from collections.abc import Callable

import pytest

from sandboxes.errors import SandboxFileNotFound, SandboxFileTooLarge, SandboxLost
from sandboxes.types import READ_LIMIT, ExecResult, Sandbox, SandboxBackend, SandboxSpec, SnapshotKind, SnapshotRef

SLACK_S = 5.0  # start-up and transport overhead a deadline may overrun by


def _w(sandbox: Sandbox, rel: str) -> str:
    return f"{sandbox.spec.workdir.rstrip('/')}/{rel}"


def _ok(result: ExecResult) -> ExecResult:
    assert result.exit_code == 0 and not result.timed_out, result
    return result


# -- exec -------------------------------------------------------------------


def test_backend_and_sandbox_satisfy_the_protocols(backend: SandboxBackend, sandbox: Sandbox) -> None:
    assert isinstance(backend, SandboxBackend) and isinstance(sandbox, Sandbox)
    assert backend.name in ("local", "docker", "fake")


def test_exec_shell_string_gives_stdout_stderr_and_exit_code(sandbox: Sandbox) -> None:
    result = sandbox.exec("echo out; echo err >&2; exit 3")
    assert (result.exit_code, result.stdout, result.stderr) == (3, "out\n", "err\n")
    assert not result.timed_out and not result.truncated and not result.ok
    assert result.duration_s >= 0


def test_exec_argv_list_is_not_split_by_a_shell(sandbox: Sandbox) -> None:
    result = _ok(sandbox.exec(["printf", "%s|", "a b", "$HOME", "c"]))
    assert result.stdout == "a b|$HOME|c|"


def test_death_by_signal_is_128_plus_n(sandbox: Sandbox) -> None:
    assert sandbox.exec("kill -9 $$").exit_code == 137
    assert sandbox.exec("kill -TERM $$").exit_code == 143


def test_cwd_and_env_are_per_call(sandbox: Sandbox) -> None:
    sandbox.write_file(_w(sandbox, "sub/marker.txt"), b"x")
    assert _ok(sandbox.exec("ls", cwd=_w(sandbox, "sub"))).stdout == "marker.txt\n"
    assert _ok(sandbox.exec("ls")).stdout == "sub\n"  # default cwd is the workdir
    assert _ok(sandbox.exec("echo ${FOO:-unset}", env={"FOO": "bar baz"})).stdout == "bar baz\n"
    assert _ok(sandbox.exec("echo ${FOO:-unset}")).stdout == "unset\n"


def test_spec_env_reaches_every_command_and_call_env_wins(
    backend: SandboxBackend, make_spec: Callable[..., SandboxSpec]
) -> None:
    sandbox = backend.create(make_spec(env={"SPEC_VAR": "from-spec", "BOTH": "spec"}))
    try:
        assert _ok(sandbox.exec('echo "$SPEC_VAR $BOTH"')).stdout == "from-spec spec\n"
        assert _ok(sandbox.exec('echo "$SPEC_VAR $BOTH"', env={"BOTH": "call"})).stdout == "from-spec call\n"
    finally:
        sandbox.close()


def test_stdin_bytes_reach_the_command(sandbox: Sandbox) -> None:
    assert _ok(sandbox.exec("cat", stdin=b"hello\x00world")).stdout == "hello\x00world"
    big = secrets.token_bytes(1 << 20)
    assert _ok(sandbox.exec("wc -c", stdin=big)).stdout.strip() == str(len(big))


def test_a_command_that_ignores_its_stdin_neither_blocks_nor_fails(sandbox: Sandbox) -> None:
    big = secrets.token_bytes(1 << 20)
    for cmd in ("true", "exit 5", "head -c 10 >/dev/null"):  # stdin never (fully) read
        result = sandbox.exec(cmd, stdin=big, timeout=20)  # blocked on stdin, it would hit the deadline
        assert result.exit_code == (5 if cmd == "exit 5" else 0) and not result.timed_out, (cmd, result)
    assert _ok(sandbox.exec("echo alive")).stdout == "alive\n"


def test_no_stdin_means_eof_not_a_hang(sandbox: Sandbox) -> None:
    result = sandbox.exec("cat", timeout=10)
    assert result.exit_code == 0 and not result.timed_out and result.stdout == ""


@pytest.mark.not_modelled_by_fake("no processes: a command's children and background jobs do not exist in memory")
def test_deadline_kills_the_command_and_its_children(
    backend: SandboxBackend, sandbox: Sandbox, host_pids: Callable[[str], list[int]]
) -> None:
    token = f"29{secrets.randbelow(10)}.{secrets.randbelow(10**6):06d}"  # a unique sleep length
    start = time.monotonic()
    result = sandbox.exec(f"sleep {token} & sleep {token}", timeout=1.5)
    elapsed = time.monotonic() - start
    assert result.timed_out and result.exit_code == 124 and not result.ok, result
    assert elapsed < 1.5 + SLACK_S
    # "[2]9..." matches the sleeps' command lines but not this grep's own
    probe = f"grep -ls '[{token[0]}]{token[1:].replace('.', '[.]')}' /proc/[0-9]*/cmdline | wc -l"
    deadline = time.monotonic() + 3
    while (left := sandbox.exec(probe).stdout.strip()) != "0" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == "0", f"{left} process(es) of the timed-out command survive in the sandbox"
    if backend.name == "local":
        assert host_pids(f"sleep\0{token}") == []


@pytest.mark.not_modelled_by_fake("no processes: a command's children and background jobs do not exist in memory")
def test_a_background_child_holding_stdout_does_not_hold_exec(sandbox: Sandbox) -> None:
    # the child outlives the deadline: had exec waited for its stdout to close, it would have timed out
    result = sandbox.exec("sleep 30 & echo started", timeout=25)
    assert result.exit_code == 0 and not result.timed_out and result.stdout == "started\n", result


@pytest.mark.not_modelled_by_fake("no pipes or endless programs (yes | head): the fake caps what its commands print, see test_fake_backend.py")
def test_output_is_capped_and_a_flood_is_drained(sandbox: Sandbox) -> None:
    limit = sandbox.spec.output_limit
    result = sandbox.exec("yes | head -c 50000000", timeout=60)  # how fast: the sandbox bench's output_flood
    assert result.exit_code == 0 and result.truncated and not result.timed_out
    assert 0 < len(result.stdout.encode()) <= limit
    assert result.stdout.startswith("y\ny\ny\n")
    assert not sandbox.exec("echo small").truncated


@pytest.mark.not_modelled_by_fake("no pipes or endless programs (yes | head): the fake caps what its commands print, see test_fake_backend.py")
def test_stderr_is_capped_separately(backend: SandboxBackend, make_spec: Callable[..., SandboxSpec]) -> None:
    sandbox = backend.create(make_spec(output_limit=4096))
    try:
        result = sandbox.exec("echo fine; yes e | head -c 1000000 >&2", timeout=30)
        assert result.exit_code == 0 and result.truncated and result.stdout == "fine\n"
        assert 0 < len(result.stderr.encode()) <= 4096
    finally:
        sandbox.close()


# -- files ------------------------------------------------------------------


def test_binary_round_trip_of_all_byte_values(sandbox: Sandbox) -> None:
    data = bytes(range(256)) * 3
    sandbox.write_file(_w(sandbox, "all.bin"), data)
    assert sandbox.read_file(_w(sandbox, "all.bin")) == data
    # the command side sees the very same bytes
    seen = _ok(sandbox.exec("od -An -v -tx1 all.bin")).stdout
    assert "".join(seen.split()) == data.hex()


def test_text_is_written_as_utf8(sandbox: Sandbox) -> None:
    sandbox.write_file(_w(sandbox, "t.txt"), "héllo ✓\n")
    assert sandbox.read_file(_w(sandbox, "t.txt")) == "héllo ✓\n".encode()


def test_write_creates_parent_dirs_and_applies_mode(sandbox: Sandbox) -> None:
    sandbox.write_file(_w(sandbox, "deep/er/run.sh"), "#!/bin/sh\necho ran\n", mode=0o755)
    assert _ok(sandbox.exec("./deep/er/run.sh")).stdout == "ran\n"
    entry = {e.path: e for e in sandbox.list_files(_w(sandbox, "deep/er"))}[_w(sandbox, "deep/er/run.sh")]
    assert entry.mode & 0o777 == 0o755 and entry.size == len("#!/bin/sh\necho ran\n")
    sandbox.write_file(_w(sandbox, "deep/er/run.sh"), b"replaced")
    assert sandbox.read_file(_w(sandbox, "deep/er/run.sh")) == b"replaced"


def _mode(sandbox: Sandbox, rel: str) -> int:
    path = _w(sandbox, rel)
    return {e.path: e for e in sandbox.list_files(path.rsplit("/", 1)[0])}[path].mode & 0o7777


def test_write_without_mode_keeps_an_existing_files_mode_and_new_files_get_0644(sandbox: Sandbox) -> None:
    sandbox.write_file(_w(sandbox, "new.txt"), b"new")
    assert _mode(sandbox, "new.txt") == 0o644
    sandbox.write_file(_w(sandbox, "tool.sh"), "#!/bin/sh\necho v1\n", mode=0o755)
    sandbox.write_file(_w(sandbox, "tool.sh"), "#!/bin/sh\necho v2\n")  # an edit keeps the execute bit
    assert _mode(sandbox, "tool.sh") == 0o755
    assert _ok(sandbox.exec("./tool.sh")).stdout == "v2\n"
    _ok(sandbox.exec("printf x > private.txt && chmod 600 private.txt"))  # made by a command, not write_file
    sandbox.write_file(_w(sandbox, "private.txt"), b"still private")
    assert _mode(sandbox, "private.txt") == 0o600
    sandbox.write_file(_w(sandbox, "tool.sh"), b"#!/bin/sh\n", mode=0o640)  # an explicit mode still wins
    assert _mode(sandbox, "tool.sh") == 0o640
    assert sandbox.read_file(_w(sandbox, "private.txt")) == b"still private"


def test_read_refuses_a_file_over_its_limit_before_reading(sandbox: Sandbox) -> None:
    sandbox.write_file(_w(sandbox, "ten.bin"), b"0123456789")
    assert sandbox.read_file(_w(sandbox, "ten.bin"), limit=10) == b"0123456789"  # at the limit is fine
    with pytest.raises(SandboxFileTooLarge, match="ten.bin") as info:
        sandbox.read_file(_w(sandbox, "ten.bin"), limit=9)
    assert isinstance(info.value, OSError) and "9" in str(info.value)
    # the default cap: a sparse file one byte over READ_LIMIT costs no disk and must not be loaded
    _ok(sandbox.exec(f"truncate -s {READ_LIMIT + 1} huge.bin"))
    with pytest.raises(SandboxFileTooLarge, match="huge.bin"):
        sandbox.read_file(_w(sandbox, "huge.bin"))
    assert len(sandbox.read_file(_w(sandbox, "huge.bin"), limit=READ_LIMIT + 1)) == READ_LIMIT + 1
    assert _ok(sandbox.exec("echo alive")).stdout == "alive\n"


def test_list_files_sorted_recursive_and_not(sandbox: Sandbox) -> None:
    for rel in ("lst/z.txt", "lst/a/b.txt", "lst/a/c/d.txt", "lst/m.txt"):
        sandbox.write_file(_w(sandbox, rel), rel.encode())
    top = sandbox.list_files(_w(sandbox, "lst"))
    assert [(e.path, e.is_dir) for e in top] == [
        (_w(sandbox, "lst/a"), True),
        (_w(sandbox, "lst/m.txt"), False),
        (_w(sandbox, "lst/z.txt"), False),
    ]
    deep = sandbox.list_files(_w(sandbox, "lst"), recursive=True)
    assert [e.path for e in deep] == [
        _w(sandbox, p) for p in ("lst/a", "lst/a/b.txt", "lst/a/c", "lst/a/c/d.txt", "lst/m.txt", "lst/z.txt")
    ]
    sizes = {e.path: e.size for e in deep if not e.is_dir}
    assert sizes[_w(sandbox, "lst/a/c/d.txt")] == len("lst/a/c/d.txt")


def test_missing_paths_raise_sandbox_file_not_found(sandbox: Sandbox) -> None:
    with pytest.raises(SandboxFileNotFound):
        sandbox.read_file(_w(sandbox, "nope.txt"))
    with pytest.raises(FileNotFoundError):  # the built-in still catches it
        sandbox.read_file(_w(sandbox, "no/such/dir/file"))
    with pytest.raises(SandboxFileNotFound):
        sandbox.list_files(_w(sandbox, "nodir"))


# -- snapshots --------------------------------------------------------------


def test_snapshot_restore_gives_the_same_files_and_later_changes_do_not_leak(
    backend: SandboxBackend, sandbox: Sandbox
) -> None:
    sandbox.write_file(_w(sandbox, "keep.txt"), b"v1")
    sandbox.write_file(_w(sandbox, "dir/bin.dat"), bytes(range(256)))
    _ok(sandbox.exec("mkdir -p empty && ln -s keep.txt link"))
    ref = sandbox.snapshot(SnapshotKind.FAST)
    assert ref.kind is SnapshotKind.FAST and ref.backend == backend.name
    sandbox.write_file(_w(sandbox, "keep.txt"), b"v2")
    sandbox.write_file(_w(sandbox, "after.txt"), b"late")

    restored = backend.restore(ref)
    try:
        assert restored.id != sandbox.id
        assert restored.read_file(_w(restored, "keep.txt")) == b"v1"
        assert restored.read_file(_w(restored, "dir/bin.dat")) == bytes(range(256))
        assert _ok(restored.exec("cat link; test -d empty && echo dir")).stdout == "v1dir\n"
        with pytest.raises(SandboxFileNotFound):
            restored.read_file(_w(restored, "after.txt"))
        restored.write_file(_w(restored, "keep.txt"), b"v3")  # and nothing flows back
        assert sandbox.read_file(_w(sandbox, "keep.txt")) == b"v2"
    finally:
        restored.close()


def test_snapshots_capture_deletions(backend: SandboxBackend, sandbox: Sandbox) -> None:
    sandbox.write_file(_w(sandbox, "doomed.txt"), b"x")
    sandbox.write_file(_w(sandbox, "gone/inner.txt"), b"y")
    with_files = sandbox.snapshot()
    _ok(sandbox.exec("rm doomed.txt && rm -r gone"))
    without = sandbox.snapshot()
    a, b = backend.restore(without), backend.restore(with_files)
    try:
        with pytest.raises(SandboxFileNotFound):
            a.read_file(_w(a, "doomed.txt"))
        assert _ok(a.exec("test -e gone || echo absent")).stdout == "absent\n"
        assert b.read_file(_w(b, "doomed.txt")) == b"x"
        assert b.read_file(_w(b, "gone/inner.txt")) == b"y"
    finally:
        a.close()
        b.close()


def test_fork_gives_independent_sandboxes(backend: SandboxBackend, sandbox: Sandbox) -> None:
    sandbox.write_file(_w(sandbox, "shared.txt"), b"base")
    forks = backend.fork(sandbox.snapshot(), 3)
    try:
        assert len(forks) == 3 and len({f.id for f in forks} | {sandbox.id}) == 4
        for i, fork in enumerate(forks):
            fork.write_file(_w(fork, "shared.txt"), f"fork{i}".encode())
            _ok(fork.exec(f"echo {i} > own.txt"))
        for i, fork in enumerate(forks):
            assert fork.read_file(_w(fork, "shared.txt")) == f"fork{i}".encode()
            assert fork.read_file(_w(fork, "own.txt")) == f"{i}\n".encode()
        assert sandbox.read_file(_w(sandbox, "shared.txt")) == b"base"
    finally:
        for fork in forks:
            fork.close()


def test_snapshot_ref_round_trips_json_and_still_restores(backend: SandboxBackend, sandbox: Sandbox) -> None:
    sandbox.write_file(_w(sandbox, "f.txt"), b"json")
    ref = sandbox.snapshot()
    again = SnapshotRef.from_dict(json.loads(json.dumps(ref.to_dict())))
    assert again == ref == pickle.loads(pickle.dumps(ref))
    restored = backend.restore(again)
    try:
        assert restored.read_file(_w(restored, "f.txt")) == b"json"
        assert restored.spec == sandbox.spec
    finally:
        restored.close()


def test_image_snapshot_restores(backend: SandboxBackend, sandbox: Sandbox) -> None:
    sandbox.write_file(_w(sandbox, "img.txt"), b"durable")
    ref = sandbox.snapshot(SnapshotKind.IMAGE)
    assert ref.kind is SnapshotKind.IMAGE
    restored = backend.restore(ref)
    try:
        assert restored.read_file(_w(restored, "img.txt")) == b"durable"
    finally:
        restored.close()


@pytest.mark.slow
def test_snapshot_restore_lineage(backend: SandboxBackend, spec: SandboxSpec, request: pytest.FixtureRequest) -> None:
    # 200 generations, each deleting the one before; Docker 50 (~0.7 s a cycle): its 200-deep FAST lineages are
    # test_docker_snapshots.py's and test_docker_reset.py's own
    cycles = 50 if request.node.callspec.params["backend"] == "docker" else 200
    current = backend.create(spec)
    previous: SnapshotRef | None = None
    try:
        for i in range(cycles):
            current.write_file(_w(current, "counter"), str(i).encode())
            current.write_file(_w(current, f"gen/{i}.txt"), str(i).encode())
            if i:
                _ok(current.exec(f"rm gen/{i - 1}.txt"))  # every generation also deletes
            ref = current.snapshot()
            if previous is not None:
                assert (ref.parent, ref.depth) == (previous.id, previous.depth + 1)
            current.close()
            current = backend.restore(ref)
            assert current.read_file(_w(current, "counter")) == str(i).encode()
            previous = ref
        names = [e.path for e in current.list_files(_w(current, "gen"))]
        assert names == [_w(current, f"gen/{cycles - 1}.txt")]
    finally:
        current.close()


# -- lifecycle --------------------------------------------------------------


def test_close_is_idempotent_and_later_calls_raise_sandbox_lost(backend: SandboxBackend, spec: SandboxSpec) -> None:
    sandbox = backend.create(spec)
    sandbox.close()
    sandbox.close()
    with pytest.raises(SandboxLost):
        sandbox.exec("true")
    with pytest.raises(SandboxLost):
        sandbox.read_file(_w(sandbox, "x"))
    with pytest.raises(SandboxLost):
        sandbox.write_file(_w(sandbox, "x"), b"x")
    with pytest.raises(SandboxLost):
        sandbox.snapshot()


def test_backend_close_closes_what_it_made(backend: SandboxBackend, spec: SandboxSpec) -> None:
    sandbox = backend.create(spec)
    backend.close()
    with pytest.raises(SandboxLost):
        sandbox.exec("true")
    backend.close()  # the fixture closes it once more: idempotent too
