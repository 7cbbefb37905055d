"""Native harnesses: the real third-party agent programs (CLIs), how each is started in a sandbox and what it reports back.

``native:claude_code``, ``native:codex`` and ``native:kimi_cli`` run the pinned real
program (``sandboxes.native_images``) inside the task's sandbox; its model calls go
through the recording gateway (``rollout.gateway``), whose record is the
trajectory (``rollout.native_attempt``). The older prefix ``cli:`` is read as
``native:`` wherever a harness name is taken (``rollout.harnesses.canonical_harness``).
This module imports no Docker client (the learner side imports it through the
scripted policies). A profile says:

* the command line: the instruction, the turn budget where the CLI has one, the
  effort level mapped to the CLI's own setting;
* its environment and config files (pointing it at the gateway forwarder on
  127.0.0.1, offline switches);
* how to read its final message from its JSON output (graded as the answer).

Kimi CLI's only effort knob is thinking on or off (``--thinking``): ``low``
runs it without thinking, every higher level with.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field

from rollout.harnesses import canonical_harness
from sandboxes.types import GATEWAY_FORWARD_PORT as FORWARD_PORT
from sandboxes.types import NATIVE_INSTALL_DIR as INSTALL_DIR

# The program's HOME: on the sandbox's /tmp, never in the graded workdir (the path keeps its old name; it is
# only ever inside a sandbox).
NATIVE_HOME = "/tmp/agentenv-cli-home"
MODEL_NAME = {"claude": "agentenv-policy", "codex": "gpt-5.5", "kimi": "agentenv-policy"}  # codex: a catalog slug, else no apply_patch
KIMI_CONFIG = f"{NATIVE_HOME}/kimi-config.json"
KIMI_CONTEXT = 131072  # what the CLI believes the model's context is (it compacts near it; our budgets end episodes first)


class NativeUnavailable(LookupError):
    """The native harness is named but cannot run here (the message says why)."""


@dataclass(frozen=True)
class NativeProfile:
    harness: str  # "native:claude_code"
    program: str  # the program's image recipe name (``sandboxes.native_images.RECIPES``): "claude" | "codex" | "kimi"
    emulated: str  # the emulated harness of the same tool surface
    shell_tool: tuple[str, str]  # (tool name, command argument) the CLI's shell tool takes
    efforts: dict[str, str] = field(default_factory=dict)  # our effort level -> the CLI's own setting

    def effort(self, level: str | None) -> str:
        return self.efforts.get(level or "high", self.efforts.get("high", "high"))

    def setup_files(self, token: str) -> dict[str, str]:
        """Config files written (as the sandbox user) before the CLI starts: path -> text."""
        if self.program == "codex":
            config = (
                f'model_provider = "agentenv"\nmodel = "{MODEL_NAME["codex"]}"\napproval_policy = "never"\n'
                'sandbox_mode = "danger-full-access"\n[model_providers.agentenv]\nname = "agentenv"\n'
                f'base_url = "http://127.0.0.1:{FORWARD_PORT}/v1"\nwire_api = "responses"\nenv_key = "AGENTENV_GATEWAY_TOKEN"\n'
                "stream_max_retries = 0\nrequest_max_retries = 0\n"
            )
            return {f"{NATIVE_HOME}/.codex/config.toml": config}
        if self.program == "kimi":
            kimi = {
                "default_model": "agentenv", "telemetry": False,
                "providers": {"agentenv": {"type": "openai_legacy", "base_url": f"http://127.0.0.1:{FORWARD_PORT}/v1", "api_key": token}},
                "models": {"agentenv": {"provider": "agentenv", "model": MODEL_NAME["kimi"], "max_context_size": KIMI_CONTEXT}},
                "loop_control": {"max_retries_per_step": 1},
            }
            return {KIMI_CONFIG: json.dumps(kimi, indent=1)}
        return {}

    def env(self, token: str) -> dict[str, str]:
        base = {"HOME": NATIVE_HOME, "AGENTENV_GATEWAY_TOKEN": token, "NO_COLOR": "1"}
        if self.program == "claude":
            return {
                **base, "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{FORWARD_PORT}", "ANTHROPIC_AUTH_TOKEN": token,
                "ANTHROPIC_MODEL": MODEL_NAME["claude"], "ANTHROPIC_SMALL_FAST_MODEL": MODEL_NAME["claude"],
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1",
                "ENABLE_TOOL_SEARCH": "false", "IS_SANDBOX": "1", "DISABLE_AUTO_COMPACT": "1",
            }
        if self.program == "kimi":
            return {**base, "KIMI_DISABLE_TELEMETRY": "1"}
        return {**base, "CODEX_HOME": f"{NATIVE_HOME}/.codex"}

    def command(self, instruction: str, effort: str | None, max_turns: int) -> str:
        bin_ = f"{INSTALL_DIR}/bin/{self.program}"
        if self.program == "claude":
            argv = [bin_, "-p", instruction, "--dangerously-skip-permissions", "--output-format", "stream-json",
                    "--verbose", "--effort", self.effort(effort), "--max-turns", str(max_turns), "--no-session-persistence"]
        elif self.program == "kimi":
            argv = [bin_, "--print", "-p", instruction, "--output-format", "stream-json", "--yolo", "--config-file", KIMI_CONFIG,
                    f"--{self.effort(effort)}", "--max-steps-per-turn", str(max_turns)]
        else:
            argv = [bin_, "exec", "--json", "--skip-git-repo-check", "-c", f"model_reasoning_effort={self.effort(effort)}", instruction]
        return " ".join(shlex.quote(a) for a in argv)

    def final_message(self, stdout: str) -> str | None:
        """The CLI's last message to the user, from its JSON-lines output (None when it wrote none)."""
        answer: str | None = None
        for line in stdout.splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if not isinstance(event, dict):
                continue
            if self.program == "claude" and event.get("type") == "result" and isinstance(event.get("result"), str):
                answer = event["result"]
            elif self.program == "codex" and event.get("type") == "item.completed":
                item = event.get("item") or {}
                if item.get("type") == "agent_message" and isinstance(item.get("text"), str):
                    answer = item["text"]
            elif self.program == "kimi" and event.get("role") == "assistant":
                text = _kimi_text(event.get("content"))
                if text:
                    answer = text
        return answer


def _kimi_text(content: object) -> str:
    """The text of a kimi stream-json assistant message (a string, or parts of which ``text`` ones count)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str))
    return ""


NATIVE_HARNESSES: dict[str, NativeProfile] = {
    "native:claude_code": NativeProfile("native:claude_code", "claude", "claude_code", ("Bash", "command"),
                                        {"low": "low", "medium": "medium", "high": "high", "max": "max"}),
    "native:codex": NativeProfile("native:codex", "codex", "codex", ("exec_command", "cmd"),
                                  {"low": "low", "medium": "medium", "high": "high", "max": "xhigh"}),
    "native:kimi_cli": NativeProfile("native:kimi_cli", "kimi", "kimi_cli", ("Shell", "command"),
                                     {"low": "no-thinking", "medium": "thinking", "high": "thinking", "max": "thinking"}),
}


def native_profile(name: str) -> NativeProfile:
    """The profile of a native harness (``native:codex``, or ``cli:codex``)."""
    try:
        return NATIVE_HARNESSES[canonical_harness(name)]
    except KeyError:
        raise NativeUnavailable(f"unknown native harness {name!r} (known: {sorted(NATIVE_HARNESSES)})") from None


__all__ = ["NATIVE_HARNESSES", "NATIVE_HOME", "NativeProfile", "NativeUnavailable", "native_profile"]
