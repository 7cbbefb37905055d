"""The trust boundary between the sandbox user and the in-container agent, attacked directly.

One test per way across it we could think of (docs/sandboxes.md, "Trust boundary"): each runs the
attack as the sandbox user through ``exec`` and asserts it failed, that the next answer is still
our agent's, and that the sandbox's verdicts (quiesce, reset) come out true. 17 cases.
"""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Iterator

import pytest

from sandboxes.channel import AGENT_DIR, FRAME, AgentChannel
from sandboxes.docker_backend import DockerBackend, DockerSandbox
from sandboxes.errors import SandboxFileTooLarge, SandboxTampered
from sandboxes.host_view import HostView
from sandboxes.types import SandboxSpec, SnapshotKind

pytestmark = pytest.mark.docker

AGENT_PID = "pgrep -o -f /opt/agentenv/agent.py"


@pytest.fixture
def sb(backend_docker: DockerBackend, base_image: str) -> Iterator[DockerSandbox]:
    made = backend_docker.create(SandboxSpec(image=base_image))
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def backend_docker(docker_client, tmp_path) -> Iterator[DockerBackend]:  # type: ignore[no-untyped-def]
    with DockerBackend(docker_client, snapshot_dir=tmp_path / "snaps") as b:
        yield b


def _agent_pid(sb: DockerSandbox) -> int:
    r = sb.exec(AGENT_PID)
    assert r.ok, r.stderr
    return int(r.stdout.split()[0])


def _still_ours(sb: DockerSandbox) -> None:
    assert sb.exec("echo genuine").stdout == "genuine\n"
    assert sb.trusted, sb.compromised or sb.untrusted


def test_agent_is_root_and_commands_are_the_sandbox_user(sb: DockerSandbox) -> None:
    ping, _ = sb.agent_call({"op": "ping"}, timeout=5)
    assert ping["uid"] == 0 and ping["user_uid"] == sb.user_ids[0] != 0
    assert sb.exec("id -u").stdout.strip() == str(sb.user_ids[0])
    status = sb.exec("cat /proc/self/status").stdout
    assert "CapEff:\t0000000000000000" in status and "CapPrm:\t0000000000000000" in status
    assert "NoNewPrivs:\t1" in status


def test_user_cannot_write_the_agents_output_pipe(sb: DockerSandbox) -> None:
    pid = _agent_pid(sb)
    r = sb.exec(f"printf '\\000\\000\\000\\020forged' > /proc/{pid}/fd/1; echo rc=$?")
    assert "rc=0" not in r.stdout
    _still_ours(sb)


def test_user_cannot_open_the_agents_stdin_or_list_its_fds(sb: DockerSandbox) -> None:
    pid = _agent_pid(sb)
    r = sb.exec(f"ls /proc/{pid}/fd; cat /proc/{pid}/fd/0 & sleep 0.2; echo done")
    assert "Permission denied" in r.stderr
    _still_ours(sb)


def test_user_cannot_signal_the_agent(sb: DockerSandbox) -> None:
    pid = _agent_pid(sb)
    for sig in ("STOP", "KILL", "TERM", "SEGV"):
        r = sb.exec(f"kill -{sig} {pid}")
        assert r.exit_code != 0 and "not permitted" in r.stderr, (sig, r)
    _still_ours(sb)
    assert _agent_pid(sb) == pid


def test_user_cannot_trace_or_read_the_agents_memory(sb: DockerSandbox) -> None:
    pid = _agent_pid(sb)
    script = (
        "import ctypes, sys\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        f"rc = libc.ptrace(16, {pid}, None, None)\n"  # PTRACE_ATTACH
        "print('attach', rc, ctypes.get_errno())\n"
        f"for name in ('mem', 'environ', 'maps'):\n"
        f"    try:\n"
        f"        open('/proc/{pid}/' + name, 'rb').read(16); print('read', name)\n"
        f"    except OSError as e:\n"
        f"        print('denied', name, e.errno)\n"
    )
    r = sb.exec(["python3", "-c", script])
    assert "attach -1 1" in r.stdout, r.stdout  # EPERM
    assert "read " not in r.stdout, r.stdout
    _still_ours(sb)


def test_user_cannot_replace_the_agent_or_its_interpreter(sb: DockerSandbox) -> None:
    r = sb.exec(
        "echo 'import os' > /opt/agentenv/agent.py; echo a=$?; touch /opt/agentenv/x; echo b=$?; "
        "cp /bin/true $(readlink -f $(command -v python3)); echo c=$?; "
        "touch /usr/lib/python3*/json/evil.py; echo d=$?"
    )
    for tag in "abcd":
        assert f"{tag}=0" not in r.stdout, r.stdout
    ping, _ = sb.agent_call({"op": "ping"}, timeout=5)
    assert ping["untrusted_paths"] == []
    assert sb.quiesce() is None and sb.reset(), sb.last_reset_refusal


def test_user_cannot_become_root(sb: DockerSandbox) -> None:
    r = sb.exec(
        "python3 -c 'import os; os.setuid(0)'; echo a=$?; su -c id root </dev/null; echo b=$?; "
        "find / -xdev -perm -4000 -type f 2>/dev/null | head -3 | while read f; do $f --help >/dev/null 2>&1; done; "
        "id -u"
    )
    assert "a=0" not in r.stdout and "b=0" not in r.stdout
    assert r.stdout.strip().splitlines()[-1] == str(sb.user_ids[0])


def test_forged_bytes_on_the_channel_are_rejected_and_the_sandbox_is_never_reused(sb: DockerSandbox) -> None:
    # Bytes that reach the host's stream without the agent's key: as if a process had written them.
    channel = sb._channel
    assert isinstance(channel, AgentChannel)
    head = b'{"ok": true, "exit_code": 0, "timed_out": false, "truncated": false, "oom_killed": false, "duration_s": 0, "stdout_len": 4}'
    channel._stdout += FRAME.pack(len(head), 4) + head + b"PASS" + b"\0" * 16
    with pytest.raises(SandboxTampered):
        sb.exec("echo hi")
    assert sb.compromised and not sb.trusted
    with pytest.raises(SandboxTampered):
        sb.exec("echo again")  # no more requests, not even after a restart
    assert sb.quiesce() is not None
    assert sb.reset() is False


def test_an_answer_out_of_sequence_is_rejected(sb: DockerSandbox) -> None:
    # A genuine answer replayed later carries an old sequence number; here the host's counter is
    # moved back instead, so the agent's next (genuine) answer is the one out of sequence.
    channel = sb._channel
    assert isinstance(channel, AgentChannel)
    seq_before = channel._recv_seq
    sb.agent_call({"op": "ping"}, timeout=5)
    assert channel._recv_seq == seq_before + 1
    channel._recv_seq -= 1
    with pytest.raises(SandboxTampered):
        sb.exec("echo x")


def test_the_exec_deadline_kills_new_sessions_and_double_forks(sb: DockerSandbox) -> None:
    r = sb.exec(
        "setsid sleep 301 & (setsid sh -c 'sleep 302 & exit' &) ; nohup sleep 303 >/dev/null 2>&1 & disown; sleep 30",
        timeout=1.5,
    )
    assert r.timed_out
    left = sb.exec("ps -eo args | grep -c '^sleep 30[123]' || true").stdout.strip()
    assert left == "0"
    host = [p.cmd for p in HostView(sb.container).processes()]
    assert not any(c.startswith("sleep 30") for c in host), host


def test_background_jobs_of_earlier_commands_survive_a_later_deadline(sb: DockerSandbox) -> None:
    assert sb.exec("setsid sleep 400 >/dev/null 2>&1 &").ok
    assert sb.exec("sleep 30", timeout=1).timed_out
    assert sb.exec("ps -eo args | grep -c '^sleep 400$'").stdout.strip() == "1"  # a server started earlier is not this command's
    assert sb.quiesce() is None
    assert not HostView(sb.container).user_processes(0)


def test_a_backgrounded_fork_bomb_is_stopped(backend_docker: DockerBackend, base_image: str) -> None:
    sb = backend_docker.create(SandboxSpec(image=base_image, pids=64))
    try:
        sb.exec("bomb() { bomb | bomb & }; (bomb &) ; sleep 0.5", timeout=10)
        r = sb.exec("echo alive")  # the next command finds the sandbox near its pids limit and clears it
        after = sb.exec("ps -e --no-headers | wc -l")
        assert after.ok and int(after.stdout) < 32, (r, after)
        assert sb.quiesce() is None
    finally:
        sb.close()


# Run as root beside the agent, with the agent's own functions: the one-go SIGSTOP of the sandbox
# user's processes is done by a child forked as that user, which a bomb holding the pids limit
# refuses. Here that child never forks, as at the limit, and /proc reads are slow, as on a loaded
# host (CI once ran a command into "Cannot fork" after a bomb was cleared that way).
BOMB_WITHOUT_STOPPER = """
import subprocess, sys, time
sys.path.insert(0, %(dir)r)
import agent
agent.Session.uid, agent.Session.gid, agent.Session.pids_limit = %(uid)d, %(gid)d, %(limit)d
agent.signal_as_user = lambda sig: False
scan = agent.user_processes
def slow_scan():
    found = scan()
    time.sleep(0.05)
    return found
def states():  # {pid: state letter} of the user's live processes, read as the agent reads them
    return {pid: rest[0].decode() for pid, rest in agent.user_stats() if rest[0] != b"Z"}
subprocess.Popen(["bash", "-c", "b(){ b | b & }; b"], user=%(uid)d, group=%(gid)d,
                 extra_groups=[], start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
end, peak = time.monotonic() + 10, 0
while peak < %(limit)d - 4 and time.monotonic() < end:
    time.sleep(0.01)
    peak = max(peak, agent.pids_in_use())
resume = agent.stop_every_user_process()
time.sleep(0.05)  # a fork in flight when the stop landed ends in a child born stopped (T): nothing runs
first = states()
time.sleep(0.2)
second = states()
running = sum(1 for s in list(first.values()) + list(second.values()) if s not in "Tt")
if resume is not None:
    resume()
agent.user_processes = slow_scan
killed = agent.kill_until_gone(list)
time.sleep(0.5)
print(peak, int(resume is not None), running, int(set(first) == set(second)), killed,
      len(scan()), agent.pids_in_use())
"""


def test_a_bomb_at_the_pids_limit_is_stopped_and_killed_when_no_child_can_be_forked(
    backend_docker: DockerBackend, base_image: str
) -> None:
    limit = 64
    sb = backend_docker.create(SandboxSpec(image=base_image, pids=limit))
    try:
        uid, gid = sb.user_ids
        script = BOMB_WITHOUT_STOPPER % {"dir": AGENT_DIR, "uid": uid, "gid": gid, "limit": limit}
        code, out = sb.container.exec_run(["python3", "-B", "-c", script], user="root")
        assert code == 0, out.decode(errors="replace")
        peak, stopped, running, same, killed, left, in_use = (int(x) for x in out.split()[-7:])
        assert peak >= limit - 4, f"the bomb never reached the pids limit ({peak} of {limit}): nothing was tested"
        assert stopped, "nothing stopped the bomb in one go without a forked child"
        assert running == 0 and same, f"{running} bomb processes ran on (or were born) while it was stopped"
        assert killed > 0
        assert left == 0, f"{left} bomb processes outlived kill_until_gone"
        assert in_use < limit // 4, in_use
        _still_ours(sb)  # the agent itself was stopped and continued with the rest
        assert sb.quiesce() is None
    finally:
        sb.close()


def test_quiesce_leaves_no_process_the_host_can_see(sb: DockerSandbox) -> None:
    sb.exec("for i in 1 2 3; do (setsid sh -c 'trap \"\" TERM HUP; sleep 500' &); done; true")
    assert HostView(sb.container).user_processes(0)
    assert sb.quiesce() is None
    assert HostView(sb.container).user_processes(0) == []
    _still_ours(sb)


def test_reset_removes_extended_attributes_and_the_host_checks_them(sb: DockerSandbox) -> None:
    script = (
        "import os\n"
        "os.setxattr('/workspace', 'user.leak', b'1')\n"
        "open('/workspace/f', 'w').write('x')\n"
        "os.setxattr('/workspace/f', 'user.leak', b'2')\n"
        "os.setxattr(os.path.expanduser('~/.bashrc'), 'user.leak', b'3')\n"
        "print('set')\n"
    )
    assert sb.exec(["python3", "-c", script]).stdout == "set\n"
    assert sb.reset(), sb.last_reset_refusal
    probe = sb.exec(["python3", "-c", "import os; print(os.listxattr('/workspace'), os.listxattr(os.path.expanduser('~/.bashrc')))"])
    assert probe.stdout == "[] []\n"


def test_read_file_refuses_fifos_and_huge_sparse_files_without_hurting_the_agent(sb: DockerSandbox) -> None:
    assert sb.exec("mkfifo /workspace/pipe && truncate -s 20G /workspace/huge").ok
    with pytest.raises(Exception, match="not a regular file"):
        sb.read_file("/workspace/pipe")
    with pytest.raises(SandboxFileTooLarge):
        sb.read_file("/workspace/huge")
    _still_ours(sb)


def test_snapshots_are_taken_on_the_host_and_restore_writes_no_root_file(backend_docker: DockerBackend, sb: DockerSandbox) -> None:
    # The old hole: a forged pack answer, replayed by restore's root fallback, put a root-owned file
    # ahead of /bin/bash on PATH. Now the blob is tarred from the upper dir on the host.
    assert sb.exec("mkdir -p /workspace/bin && printf '#!/bin/sh\\necho pwned\\n' > /workspace/bin/bash && chmod +x /workspace/bin/bash").ok
    ref = sb.snapshot(SnapshotKind.FAST)
    with tarfile.open(ref.location) as tar:
        owners = {m.name: (m.uid, m.gid) for m in tar.getmembers() if m.name.startswith("workspace/bin")}
    assert owners and all(uid == sb.user_ids[0] for uid, _ in owners.values()), owners
    fork = backend_docker.restore(ref)
    try:
        assert fork.exec("stat -c %u /workspace/bin/bash").stdout.strip() == str(sb.user_ids[0])
        assert fork.trusted
    finally:
        fork.close()


def test_an_untrusted_root_user_sandbox_is_never_reset_or_quiesced(backend_docker: DockerBackend, base_image: str) -> None:
    sb = backend_docker.create(SandboxSpec(image=base_image, user="root"))
    try:
        assert not sb.trusted
        assert sb.quiesce() is not None
        assert sb.reset() is False
        assert sb.exec("true").ok
        blob = io.BytesIO(open(sb.snapshot(SnapshotKind.FAST).location, "rb").read())
        assert tarfile.open(fileobj=blob).getmembers()  # taken on the host: works without trusting the agent
        assert os.path.exists(f"/proc/{HostView(sb.container).init_pid()}")
    finally:
        sb.close()


@pytest.mark.unit
def test_the_agent_and_the_host_agree_on_which_xattrs_are_the_overlays() -> None:
    import sandboxes.agent as agent
    import sandboxes.overlay as overlay

    assert agent.INTERNAL_XATTRS == overlay.INTERNAL_XATTRS
