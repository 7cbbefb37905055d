"""What ``sandboxes.testing``'s fake does beyond the backend contract (which it passes in test_contract.py)."""

from __future__ import annotations

import time

import pytest

from sandboxes.errors import SandboxFileTooLarge, SandboxLost, SnapshotError
from sandboxes.testing import FakeBackend, FakeSandbox
from sandboxes.types import ExecResult, Quiescable, ResettableBackend, SandboxSpec, SnapshotApplier, SnapshotKind, SnapshotRef

pytestmark = pytest.mark.unit

SPEC = SandboxSpec(image="img:1", output_limit=4096)


def test_output_past_the_limit_is_dropped_per_stream_and_flagged() -> None:
    sb = FakeBackend().create(SPEC)
    sb.write_file("big.txt", b"y\n" * 10_000)
    out = sb.exec("cat big.txt; echo fine >&2")
    assert out.truncated and len(out.stdout) == 4096 and out.stdout.startswith("y\ny\n") and out.stderr == "fine\n"
    err = sb.exec("echo fine; cat big.txt >&2")
    assert err.truncated and err.stdout == "fine\n" and len(err.stderr) == 4096
    assert not sb.exec("echo small").truncated


def test_a_sleep_past_the_deadline_waits_only_until_it_and_times_out() -> None:
    sb = FakeSandbox()
    t0 = time.monotonic()
    result = sb.exec("echo before; sleep 30; echo after", timeout=0.3)
    assert result.timed_out and result.exit_code == 124 and result.stdout == "before\n"
    assert 0.25 < time.monotonic() - t0 < 5


def test_a_killed_sandbox_is_lost_and_still_closes_quietly() -> None:
    backend = FakeBackend()
    sb = backend.create(SPEC)
    backend.kill(sb)
    for call in (lambda: sb.exec("true"), lambda: sb.read_file("/workspace/x"), lambda: sb.write_file("x", b""),
                 lambda: sb.list_files("/workspace"), lambda: sb.snapshot()):
        with pytest.raises(SandboxLost, match="killed"):
            call()
    sb.close()
    sb.close()


def test_unsupported_syntax_and_unknown_programs_fail_as_a_shell_would() -> None:
    sb = FakeSandbox()
    piped = sb.exec("yes | head -c 5")
    assert piped.exit_code == 2 and "unsupported" in piped.stderr
    assert sb.exec("echo $(id)").exit_code == 2
    missing = sb.exec(["python3", "-c", "print(1)"])
    assert missing.exit_code == 127 and "python3" in missing.stderr


def test_the_grading_prep_script_runs_clears_and_reports_survivors() -> None:
    """agentenv.grading clears hidden paths with an rm and a for-loop in one bash -c; the fake runs both."""
    sb = FakeSandbox({"/tests/test_a.py": b"x", "/workspace/keep": b"1"})
    quoted = "/tests '/other dir'"
    result = sb.exec(["bash", "-c", f"rm -rf -- {quoted} 2>/dev/null; for p in {quoted}; do [ -e \"$p\" ] && echo \"$p\"; done; true"])
    assert result.ok and result.stdout == "" and list(sb.files) == ["/workspace/keep"]
    loop = sb.exec("for p in a b; do echo $p >> seen.txt; done; cat seen.txt")
    assert loop.stdout == "a\nb\n"


def test_a_handler_scripts_what_the_shell_does_not_and_sees_every_call() -> None:
    seen: list[str] = []

    def handler(sb: FakeSandbox, cmd: str) -> ExecResult | None:
        seen.append(cmd)
        return ExecResult(0, "scripted\n", "") if cmd.startswith("pytest") else None

    sb = FakeSandbox({"/workspace/a.txt": b"A"}, handler=handler)
    assert sb.exec("pytest -q").stdout == "scripted\n"
    assert sb.exec("cat a.txt").stdout == "A"  # the handler declined: the shell answered
    assert sb.exec(["bash", "-c", "cat a.txt"], env={"K": "v"}, stdin=b"in").stdout == "A"
    assert sb.exec(["mktemp", "-d", "/tmp/x-XXXXXXXX"]).stdout.startswith("/tmp/x-")  # plumbing: never the handler's
    assert seen == ["pytest -q", "cat a.txt", "bash -c cat a.txt"]
    assert sb.last_argv[:2] == ["mktemp", "-d"] and sb.execs[2] == (["bash", "-c", "cat a.txt"], {"K": "v"}, b"in")


def test_planted_entries_are_what_a_test_cannot_write() -> None:
    sb = FakeSandbox(special={"/workspace/pipe": "fifo", "/workspace/huge": 1 << 40, "/workspace/d": "dir",
                              "/workspace/ln": "symlink"})
    entries = {e.path.rsplit("/", 1)[1]: e for e in sb.list_files("/workspace")}
    assert entries["huge"].size == 1 << 40 and entries["d"].is_dir and entries["ln"].is_symlink
    with pytest.raises(AssertionError, match="FIFO"):
        sb.read_file("/workspace/pipe")  # a real read would block forever
    with pytest.raises(SandboxFileTooLarge, match="huge"):
        sb.read_file("/workspace/huge")  # READ_LIMIT applies; nothing is materialised
    assert sb.reads[-1] == ("/workspace/huge", None)


def test_optional_capabilities_are_off_unless_asked_for() -> None:
    plain = FakeBackend()
    assert not isinstance(plain, ResettableBackend) and not isinstance(plain, SnapshotApplier)
    assert not isinstance(plain.create(SPEC), Quiescable)
    full = FakeBackend(resettable=True, applies_snapshots=True, refuse_reset=lambda sb: "/workspace/keep" in sb.files)
    assert isinstance(full, ResettableBackend) and isinstance(full, SnapshotApplier)


def test_reset_and_apply_snapshot_bring_a_live_sandbox_to_a_state_in_place() -> None:
    backend = FakeBackend(resettable=True, applies_snapshots=True, refuse_reset=lambda sb: "/workspace/keep" in sb.files)
    source = backend.create(SPEC)
    source.write_file("state.txt", b"mid")
    ref = source.snapshot(SnapshotKind.FAST)
    sb = backend.create(SPEC)
    sb.write_file("dirty", b"x")
    assert backend.reset(sb) and sb.files == {} and backend.resets == [sb.id]
    backend.apply_snapshot(sb, ref)
    assert sb.read_file("/workspace/state.txt") == b"mid" and backend.applied == [(sb.id, ref.id)]
    sb.write_file("keep", b"root-owned")
    assert backend.reset(sb) is False and sb.read_file("/workspace/keep") == b"root-owned"


def test_only_snapshots_of_fake_sandboxes_restore() -> None:
    foreign = SnapshotRef("nope", SnapshotKind.FAST, "docker", "img:1", "/var/lib/x", SPEC)
    with pytest.raises(SnapshotError, match="nope"):
        FakeBackend().restore(foreign)
    standalone = FakeSandbox({"/workspace/f": b"1"})
    restored = FakeBackend().restore(standalone.snapshot())  # any fake backend restores any fake snapshot
    assert restored.read_file("/workspace/f") == b"1"
