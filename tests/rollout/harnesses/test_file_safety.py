"""File tools through each harness: a binary file is refused in that harness's error style and left as
it was; a file over the read limit reads by range. The executor's own rules are in
tests/agentenv/test_intent_exec.py; here only what each surface shows the model."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from agentenv.intent_exec import IntentExecutor
from agentenv.intents import Intent, ToolCall
from rollout.harnesses import get_harness
from sandboxes.errors import SandboxFileNotFound, SandboxFileTooLarge
from sandboxes.types import READ_LIMIT, ExecResult, SandboxSpec

pytestmark = pytest.mark.unit
BLOB = b"\x7fELF\x02\x01\x01\x00x = 1\x00\x00\x00\n"


class HostDir:
    """A fake sandbox over a host directory (new contract: read ``limit``, write ``mode=None``)."""

    def __init__(self, root: Path) -> None:
        self.id, self.spec = "host", SandboxSpec(image="fake", workdir=str(root))

    def exec(self, cmd: str | Sequence[str], *, timeout: float | None = None, cwd: str | None = None,
             env: Mapping[str, str] | None = None, stdin: bytes | None = None) -> ExecResult:
        p = subprocess.run(cmd, shell=isinstance(cmd, str), input=stdin or b"", capture_output=True,
                           timeout=timeout or 60, cwd=cwd or self.spec.workdir)
        return ExecResult(p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace"))

    def read_file(self, path: str, *, limit: int | None = None) -> bytes:
        if not Path(path).is_file():
            raise SandboxFileNotFound(path)
        if Path(path).stat().st_size > (READ_LIMIT if limit is None else limit):
            raise SandboxFileTooLarge(path)
        return Path(path).read_bytes()

    def write_file(self, path: str, data: bytes | str, *, mode: int | None = None) -> None:
        existed = Path(path).exists()
        Path(path).write_bytes(data.encode() if isinstance(data, str) else data)
        if mode is not None or not existed:
            Path(path).chmod(0o644 if mode is None else mode)


def _run(harness_name: str, tool: str, args: dict[str, object], root: Path, **options: object) -> str:
    harness = get_harness(harness_name)
    intent = harness.to_intent(ToolCall(tool, args, "call_1"))
    assert isinstance(intent, Intent), intent
    result = IntentExecutor(HostDir(root), **options).execute(intent)  # type: ignore[arg-type]
    return str(harness.format_result(result)["content"])


PATCH = "*** Begin Patch\n*** Update File: blob.bin\n@@\n-x = 1\n+x = 2\n*** End Patch"


@pytest.mark.parametrize(
    ("harness", "tool", "args", "style"),
    [
        ("claude_code", "Edit", {"file_path": "{root}/blob.bin", "old_string": "x = 1", "new_string": "x = 2"}, "<tool_use_error>"),
        ("claude_code", "MultiEdit", {"file_path": "{root}/blob.bin", "edits": [{"old_string": "x = 1", "new_string": "x = 2"}]}, "<tool_use_error>"),
        ("kimi_code", "Edit", {"path": "blob.bin", "old_string": "x = 1", "new_string": "x = 2"}, "<system>ERROR:"),
        ("kimi_cli", "StrReplaceFile", {"path": "blob.bin", "edit": {"old": "x = 1", "new": "x = 2"}}, "<system>ERROR:"),
        ("codex", "apply_patch", {"input": PATCH}, "failed to run tool:"),
    ],
)
def test_an_edit_of_a_binary_file_is_a_tool_error_in_the_harness_style(
    tmp_path: Path, harness: str, tool: str, args: dict[str, object], style: str
) -> None:
    (tmp_path / "blob.bin").write_bytes(BLOB)
    args = {k: v.replace("{root}", str(tmp_path)) if isinstance(v, str) else v for k, v in args.items()}
    text = _run(harness, tool, args, tmp_path)
    assert text.startswith(style) and "binary file" in text and tool in text, text
    assert (tmp_path / "blob.bin").read_bytes() == BLOB, "the binary file was rewritten"


def test_a_large_file_reads_by_range_through_kimi_and_claude_code(tmp_path: Path) -> None:
    (tmp_path / "big.log").write_bytes(b"".join(b"row %d\n" % i for i in range(1, 3001)))
    text = _run("kimi_cli", "ReadFile", {"path": "big.log", "line_offset": 100, "n_lines": 2}, tmp_path, read_limit=1024)
    assert text.startswith("   100\trow 100\n   101\trow 101\n<system>2 lines read") and "3000 lines in total" in text, text
    text = _run("claude_code", "Read", {"file_path": f"{tmp_path}/big.log", "offset": 2999}, tmp_path, read_limit=1024)
    assert text == "  2999\trow 2999\n  3000\trow 3000", text
