"""Adversarial: what Kimi CLI's own Python (the runtime under /opt/agentenv-cli) gives a hostile sandbox user.

Claims (docs/sandboxes.md, "The CLIs' own files"): nothing under /opt/agentenv-cli is
writable by the sandbox user, so the CLI cannot be replaced to lie about anything (and
it decides nothing anyway: the gateway records, the host grades); the runtime brings
no setuid or setgid file; it changes nothing of the task's own environment (the
image's python3 is still its own, without kimi's packages; no loader or Python
variable is set), while the CLI itself runs as that user.
"""

from __future__ import annotations

import pytest

from sandboxes.native_images import INSTALL_DIR, ensure_native_image
from sandboxes.docker_backend import DockerBackend
from sandboxes.types import SandboxSpec

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def kimi_sandbox(docker_client, base_image):
    sandbox = DockerBackend(docker_client).create(SandboxSpec(image=ensure_native_image(docker_client, "kimi", base_image)))
    try:
        yield sandbox
    finally:
        sandbox.close()


def _sh(sandbox, cmd: str):
    return sandbox.exec(["bash", "-c", cmd], timeout=120)


def test_the_cli_files_cannot_be_replaced_by_the_sandbox_user(kimi_sandbox) -> None:
    assert _sh(kimi_sandbox, "id -u").stdout.strip() != "0"
    assert _sh(kimi_sandbox, f"find {INSTALL_DIR} -writable").stdout == ""
    kimi = f"{INSTALL_DIR}/kimi/venv/bin/kimi"
    for attack in (f"echo x > {kimi}", f"rm -f {kimi}", f"touch {INSTALL_DIR}/kimi/root/usr/lib/x86_64-linux-gnu/evil.so",
                   f"ln -sf /tmp/x {INSTALL_DIR}/bin/kimi", f"mv {INSTALL_DIR}/kimi/venv /tmp/v"):
        assert _sh(kimi_sandbox, attack).exit_code != 0, attack


def test_the_runtime_brings_no_setuid_or_setgid_file(kimi_sandbox) -> None:
    r = _sh(kimi_sandbox, f"find {INSTALL_DIR} -perm /6000")
    assert r.exit_code == 0 and r.stdout == ""


def test_the_task_environment_is_its_own_and_the_cli_runs_as_the_sandbox_user(kimi_sandbox) -> None:
    own = _sh(kimi_sandbox, "python3 -c 'import sys; print(sys.version_info[:2])'; python3 -c 'import kimi_cli' 2>&1; "
                            "env | grep -E '^(LD_|PYTHON)' || true")
    assert own.stdout.startswith("(3, 11)") and "No module named 'kimi_cli'" in own.stdout and "LD_" not in own.stdout
    cli = _sh(kimi_sandbox, f"{INSTALL_DIR}/bin/kimi --version && {INSTALL_DIR}/kimi/venv/bin/python -c "
                            "'import os, sys, ssl; print(sys.version_info[:2], os.getuid(), sorted({l.split()[-1] for l in open(\"/proc/self/maps\") "
                            "if \".so\" in l and not l.split()[-1].startswith(\"/opt/\")}))'")
    assert cli.exit_code == 0, cli.stderr
    assert "kimi, version 1.51.0" in cli.stdout
    # trixie's Python, as the sandbox user, with none of the image's own libraries mapped in
    assert "(3, 13) 1000 []" in cli.stdout, cli.stdout
