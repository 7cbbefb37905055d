"""The real harness CLIs as harnesses: how each is started in a sandbox and what it reports back.

``cli:claude_code``, ``cli:codex`` and ``cli:kimi_cli`` run the pinned real CLI (``sandboxes.cli_images``)
inside the task's sandbox; the CLI's model calls go through the recording
gateway (``rollout.gateway``), whose record is the trajectory. A profile says:

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

from sandboxes.cli_images import FORWARD_PORT, INSTALL_DIR

CLI_HOME = "/tmp/agentenv-cli-home"  # the CLI's HOME: on the sandbox's /tmp, never in the graded workdir
MODEL_NAME = {"claude": "agentenv-policy", "codex": "gpt-5.5", "kimi": "agentenv-policy"}  # codex: a catalog slug, else no apply_patch
KIMI_CONFIG = f"{CLI_HOME}/kimi-config.json"
KIMI_CONTEXT = 131072  # what the CLI believes the model's context is (it compacts near it; our budgets end episodes first)


class CliUnavailable(LookupError):
    """The CLI harness is named but cannot run here (the message says why)."""


@dataclass(frozen=True)
class CliProfile:
    harness: str  # "cli:claude_code"
    cli: str  # image recipe name: "claude" | "codex"
    emulated: str  # the emulated harness of the same tool surface
    shell_tool: tuple[str, str]  # (tool name, command argument) the CLI's shell tool takes
    efforts: dict[str, str] = field(default_factory=dict)  # our effort level -> the CLI's own setting

    def effort(self, level: str | None) -> str:
        return self.efforts.get(level or "high", self.efforts.get("high", "high"))

    def setup_files(self, token: str) -> dict[str, str]:
        """Config files written (as the sandbox user) before the CLI starts: path -> text."""
        if self.cli == "codex":
            config = (
                f'model_provider = "agentenv"\nmodel = "{MODEL_NAME["codex"]}"\napproval_policy = "never"\n'
                'sandbox_mode = "danger-full-access"\n[model_providers.agentenv]\nname = "agentenv"\n'
                f'base_url = "http://127.0.0.1:{FORWARD_PORT}/v1"\nwire_api = "responses"\nenv_key = "AGENTENV_GATEWAY_TOKEN"\n'
                "stream_max_retries = 0\nrequest_max_retries = 0\n"
            )
            return {f"{CLI_HOME}/.codex/config.toml": config}
        if self.cli == "kimi":
            kimi = {
                "default_model": "agentenv", "telemetry": False,
                "providers": {"agentenv": {"type": "openai_legacy", "base_url": f"http://127.0.0.1:{FORWARD_PORT}/v1", "api_key": token}},
                "models": {"agentenv": {"provider": "agentenv", "model": MODEL_NAME["kimi"], "max_context_size": KIMI_CONTEXT}},
                "loop_control": {"max_retries_per_step": 1},
            }
            return {KIMI_CONFIG: json.dumps(kimi, indent=1)}
        return {}

    def env(self, token: str) -> dict[str, str]:
        base = {"HOME": CLI_HOME, "AGENTENV_GATEWAY_TOKEN": token, "NO_COLOR": "1"}
        if self.cli == "claude":
            return {
                **base, "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{FORWARD_PORT}", "ANTHROPIC_AUTH_TOKEN": token,
                "ANTHROPIC_MODEL": MODEL_NAME["claude"], "ANTHROPIC_SMALL_FAST_MODEL": MODEL_NAME["claude"],
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1",
                "ENABLE_TOOL_SEARCH": "false", "IS_SANDBOX": "1", "DISABLE_AUTO_COMPACT": "1",
            }
        if self.cli == "kimi":
            return {**base, "KIMI_DISABLE_TELEMETRY": "1"}
        return {**base, "CODEX_HOME": f"{CLI_HOME}/.codex"}

    def command(self, instruction: str, effort: str | None, max_turns: int) -> str:
        bin_ = f"{INSTALL_DIR}/bin/{self.cli}"
        if self.cli == "claude":
            argv = [bin_, "-p", instruction, "--dangerously-skip-permissions", "--output-format", "stream-json",
                    "--verbose", "--effort", self.effort(effort), "--max-turns", str(max_turns), "--no-session-persistence"]
        elif self.cli == "kimi":
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
            if self.cli == "claude" and event.get("type") == "result" and isinstance(event.get("result"), str):
                answer = event["result"]
            elif self.cli == "codex" and event.get("type") == "item.completed":
                item = event.get("item") or {}
                if item.get("type") == "agent_message" and isinstance(item.get("text"), str):
                    answer = item["text"]
            elif self.cli == "kimi" and event.get("role") == "assistant":
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


CLI_HARNESSES: dict[str, CliProfile] = {
    "cli:claude_code": CliProfile("cli:claude_code", "claude", "claude_code", ("Bash", "command"),
                                  {"low": "low", "medium": "medium", "high": "high", "max": "max"}),
    "cli:codex": CliProfile("cli:codex", "codex", "codex", ("exec_command", "cmd"),
                            {"low": "low", "medium": "medium", "high": "high", "max": "xhigh"}),
    "cli:kimi_cli": CliProfile("cli:kimi_cli", "kimi", "kimi_cli", ("Shell", "command"),
                               {"low": "no-thinking", "medium": "thinking", "high": "thinking", "max": "thinking"}),
}


def cli_profile(name: str) -> CliProfile:
    try:
        return CLI_HARNESSES[name]
    except KeyError:
        raise CliUnavailable(f"unknown CLI harness {name!r} (known: {sorted(CLI_HARNESSES)})") from None


def is_cli_harness(name: str) -> bool:
    return name.startswith("cli:")


__all__ = ["CLI_HARNESSES", "CLI_HOME", "CliProfile", "CliUnavailable", "cli_profile", "is_cli_harness"]
