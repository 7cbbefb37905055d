"""``ScriptedPolicy``: replays a task's oracle through the episode's harness, no model needed.

Two turns, written in the current harness's own tool surface (``from_intent``):

1. one shell call running the variant's oracle script (``Task.oracle_script``),
   as a quoted heredoc fed to ``bash -s`` -- the same way ``Task.oracle`` runs it;
   a script cut into parts by ``# --- next call ---`` lines (``ORACLE_CALL_BREAK``)
   is one shell call per part, in order (a task whose work takes several commands,
   each seeing the last one's output);
2. submit: the harness's submit tool, or, for harnesses that end an episode
   with a text turn (Claude Code, Codex, Kimi), a text turn. For tasks graded
   on a final answer it is the last line the oracle printed, read back from
   the tool result the harness formatted.

So an oracle episode exercises everything a model's episode does (rendering,
parsing, intents, sandbox, formatting, grading) and scores full reward: the
benchmark's policy, the runner's end-to-end test, and warm-start SFT data.

**Effort styles** (``ScriptedPolicy(styled=True)``, the runners' ``oracle_effort``
policy): the demonstration's length follows the request's effort level, so
experts and students can learn effort levels that differ by length:

* ``low``: the call, then submit (as unstyled);
* ``high``: a short plan in ``<think>`` before the call, then submit;
* ``max``: the plan, the call, a verifying turn (``cat`` of the file the oracle
  wrote, else a listing of the workspace), then submit.

A request without an effort is replayed unstyled.

It needs the episode: each attempt calls ``for_episode(ctx)`` and samples
from the returned per-episode policy; calling ``generate`` on the shared
object raises ``PolicyError``.

The oracle of a native episode (``NativeOraclePolicy``: the same oracle script as
the program's own shell tool call, then a text answer) and a policy that does
nothing there (``NativeDoNothingPolicy``) live here too, beside the helpers every
oracle uses (``oracle_command``, ``answer_from_observation``, ``message_text``).
``ScriptedPolicy`` plays a native episode (``native:codex``, ...) as the native
oracle does, in that program's own tools (Codex has no ``shell`` tool, for one);
the effort styles are not written there.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from typing import Any

from agentenv.intents import Intent
from rollout.attempt import EpisodeContext
from rollout.harnesses import is_native_harness
from rollout.harnesses.base import BaseHarness
from rollout.harnesses.native import native_profile
from rollout.policy.types import FinishReason, Generation, Policy, PolicyError, Prompt, SamplingParams, ThinkingBudget

#: Longest the oracle's shell call may run (every harness accepts 300 s).
ORACLE_TIMEOUT_S = 300
_DECORATION = re.compile(
    r"^(\[exit code -?\d+\]|exit code:? -?\d+|wall time: .*|output:|\[timed out after .*\]|command timed out after .*)$",
    re.IGNORECASE,
)
_SYSTEM_NOTE = re.compile(r"<system>.*?</system>", re.DOTALL)
_WRITTEN = re.compile(r">{1,2}\s*(/[\w./-]+)")
_PATH = re.compile(r"(?<![\w.])(/[\w.-]+(?:/[\w.-]+)+)")
#: The thinking the styled oracle writes before its call, per effort level (none for low).
EFFORT_PLANS: Mapping[str, str] = {
    "high": "Plan: the task needs one shell command. I run it, and then I finish.",
    "max": "Plan: the task needs one shell command. I run it, then I read the output file to check the result, "
           "and then I finish.",
}
#: The same plans for an oracle of several calls (``ORACLE_CALL_BREAK``); ``{n}`` is their number.
EFFORT_PLANS_STEPS: Mapping[str, str] = {
    "high": "Plan: the task needs {n} shell commands. I run them in order, and then I finish.",
    "max": "Plan: the task needs {n} shell commands. I run them in order, then I read the output file to check the "
           "result, and then I finish.",
}
#: A line of an oracle script that ends one shell call and starts the next (a comment to bash, so
#: ``Task.oracle`` runs the whole script as it is).
ORACLE_CALL_BREAK = "# --- next call ---"


def oracle_parts(script: str) -> list[str]:
    """The oracle script's shell calls: its parts between ``ORACLE_CALL_BREAK`` lines (empty parts dropped;
    a script without a break is one call, the script as it is)."""
    parts: list[list[str]] = [[]]
    for line in script.splitlines():
        if line.strip() == ORACLE_CALL_BREAK:
            parts.append([])
        else:
            parts[-1].append(line)
    if len(parts) == 1:
        return [script]
    return ["\n".join(p).strip("\n") + "\n" for p in parts if "\n".join(p).strip()] or [script]


def oracle_command(script: str) -> str:
    """The shell call that runs ``script``: a one-line script as it is (what a person types, and
    what a tiny model learns from), anything longer as ``bash -s`` reading a quoted heredoc (no
    expansion) with a delimiter the script lacks."""
    body = script.strip()
    if body and "\n" not in body:
        return body
    delimiter = "AGENTENV_ORACLE"
    while delimiter in script:
        delimiter += "_"
    return f"bash -s <<'{delimiter}'\n{script.rstrip(chr(10))}\n{delimiter}"


def answer_from_observation(text: str) -> str | None:
    """The last line the command printed, from a harness-formatted shell result.

    Harnesses wrap output in their own notes (``[exit code 0]``, ``Exit code:
    0 / Wall time / Output:``, ``<system>...</system>``); those are dropped.
    """
    lines = [line.strip() for line in _SYSTEM_NOTE.sub("", text).splitlines()]
    kept = [line for line in lines if line and not _DECORATION.match(line)]
    return kept[-1] if kept else None


def message_text(message: Mapping[str, Any]) -> str:
    """The text of a chat message (its content, or its text parts joined by newlines)."""
    content = message.get("content", "")
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return str(content or "")


class ScriptedPolicy(Policy):
    """The oracle, replayed through whatever harness the episode uses.

    Usage::

        runner = EpisodeRunner(ScriptedPolicy(), backend=DockerBackend())
    """

    name = "scripted-oracle"

    def __init__(self, *, version: int = 0, styled: bool = False) -> None:
        self._version = version
        self.styled = styled  # write the request's effort style (see the module docstring)

    @property
    def version(self) -> int:
        return self._version

    def for_episode(self, ctx: EpisodeContext) -> Policy:
        """The per-episode policy that knows the task, the variant and the harness: for a native program
        (``native:codex``, ...) the native oracle, which speaks that program's own tools."""
        if is_native_harness(ctx.request.harness):
            return _NativeOracleReplay(self, ctx)
        return _OracleReplay(self, ctx)

    async def generate(self, prompt: Prompt, sampling: SamplingParams, budget: ThinkingBudget | None = None) -> Generation:
        raise PolicyError("ScriptedPolicy needs its episode: run it through EpisodeRunner (which calls for_episode)")


class _OracleReplay(Policy):
    """One episode of ``ScriptedPolicy``: the oracle's calls (one, or one per part), then (max style) a verifying call, then submit."""

    def __init__(self, parent: ScriptedPolicy, ctx: EpisodeContext) -> None:
        self.name = parent.name
        self._parent = parent
        self._ctx = ctx
        self._turn = 0
        self._effort = (ctx.request.effort or "") if parent.styled else ""

    @property
    def version(self) -> int:
        return self._parent.version

    async def generate(self, prompt: Prompt, sampling: SamplingParams, budget: ThinkingBudget | None = None) -> Generation:
        started = time.monotonic()
        harness, task, variant = self._ctx.harness, self._ctx.task, self._ctx.variant
        if not isinstance(harness, BaseHarness):
            raise PolicyError(f"ScriptedPolicy writes calls with BaseHarness.from_intent; {type(harness).__name__} is not one")
        script = task.oracle_script(variant)
        if script is None:
            raise PolicyError(f"task {task.id!r} has no oracle script to replay (its oracle is Python code)")
        parts = oracle_parts(script)
        thinking = ""
        if self._turn < len(parts):
            timeout = min(float(task.limits.wall_time_s), ORACLE_TIMEOUT_S)
            intent = Intent("exec_shell", {"command": oracle_command(parts[self._turn]), "timeout_s": timeout})
            plan = (EFFORT_PLANS if len(parts) == 1 else EFFORT_PLANS_STEPS).get(self._effort) if self._turn == 0 else None
            thinking = f"<think>{plan.format(n=len(parts))}</think>\n" if plan else ""
        elif self._turn == len(parts) and self._effort == "max":
            intent = Intent("exec_shell", {"command": verify_command(script)})
        else:
            answer = None
            if task.oracle_answers():
                tool_results = [m for m in prompt.messages if m.get("role") == "tool"]
                # the oracle's own output: its last call's (a max-style episode's last result is the verifying call's)
                last = len(parts) - 1
                result = (tool_results[min(last, len(tool_results) - 1)] if self._effort == "max" else tool_results[-1]) \
                    if tool_results else None
                answer = answer_from_observation(message_text(result)) if result is not None else None
            intent = Intent("submit", {"answer": answer})
        self._turn += 1
        text = thinking + harness.render_turn([intent])
        return Generation(
            text=text,
            token_ids=(),
            logprobs=(),
            finish_reason=FinishReason.STOP,
            policy_version=self.version,
            latency_s=time.monotonic() - started,
        )


def verify_command(script: str) -> str:
    """The max style's verifying call: show the last file the oracle script redirected output to, else the
    last absolute path it names (a file edited in place), else list the workspace."""
    written = _WRITTEN.findall(script) or _PATH.findall(script)
    return f"cat {written[-1]}" if written else "ls /workspace"


# ---------------------------------------------------------------- the scripted policies of native episodes


class NativeOraclePolicy(Policy):
    """Replays each task's oracle as a native program's own shell tool call, then answers in text.

    Turn 1: the CLI's shell tool (``Bash{command}``, ``exec_command{cmd}``, ``Shell{command}``) running the
    variant's oracle script; turn 2: a text turn -- the CLI ends its run -- whose text is
    the last line the oracle printed where the task is graded on an answer.
    """

    name = "native-oracle"

    def __init__(self, *, version: int = 0, explore: int = 0) -> None:
        self._version = version
        self.explore = explore  # shell calls (``ls -la``) before the oracle: longer episodes for the exactness benchmark

    @property
    def version(self) -> int:
        return self._version

    def for_episode(self, ctx: EpisodeContext) -> Policy:
        return _NativeOracleReplay(self, ctx)

    async def generate(self, prompt: Prompt, sampling: SamplingParams, budget: ThinkingBudget | None = None) -> Generation:
        raise PolicyError("NativeOraclePolicy needs its episode: run it through EpisodeRunner with a native: harness")


class _NativeOracleReplay(Policy):
    """One native episode of ``NativeOraclePolicy`` (or of ``ScriptedPolicy``, which explores nothing)."""

    def __init__(self, parent: NativeOraclePolicy | ScriptedPolicy, ctx: EpisodeContext) -> None:
        self.name, self._parent, self._ctx, self._turn = parent.name, parent, ctx, 0
        self._explore = getattr(parent, "explore", 0)

    @property
    def version(self) -> int:
        return self._parent.version

    async def generate(self, prompt: Prompt, sampling: SamplingParams, budget: ThinkingBudget | None = None) -> Generation:
        ctx = self._ctx
        profile = native_profile(ctx.request.harness)
        tools = {t.get("function", {}).get("name") for t in prompt.tools}
        if profile.shell_tool[0] not in tools:  # a side call (title, summary) without tools: answer briefly
            return Generation("Task", (), (), FinishReason.STOP, self.version)
        explore = min(self._explore, max(ctx.task.limits.max_turns - 2, 0))  # the oracle and the answer still fit
        if self._turn < explore:
            name, arg = profile.shell_tool
            text = f"<tool_call>\n{json.dumps({'name': name, 'arguments': {arg: f'ls -la # look {self._turn}'}})}\n</tool_call>"
        elif self._turn == explore:
            script = ctx.task.oracle_script(ctx.variant)
            if script is None:
                raise PolicyError(f"task {ctx.task.id!r} has no oracle script to replay")
            name, arg = profile.shell_tool
            args: dict[str, Any] = {arg: oracle_command(script)}
            timeout = min(float(ctx.task.limits.wall_time_s), ORACLE_TIMEOUT_S)
            if profile.program == "claude":
                args["timeout"] = int(timeout * 1000)
            elif profile.program == "kimi":
                args["timeout"] = max(1, min(int(timeout), 300))  # seconds; kimi refuses > 300 in the foreground
            else:
                args["yield_time_ms"] = int(timeout * 1000)
            text = f"<tool_call>\n{json.dumps({'name': name, 'arguments': args}, ensure_ascii=False)}\n</tool_call>"
        else:
            answer = None
            if ctx.task.oracle_answers():
                results = [m for m in prompt.messages if m.get("role") == "tool"]
                answer = answer_from_observation(_strip_codex(message_text(results[-1]))) if results else None
            text = answer or "Done."
        self._turn += 1
        return Generation(text, (), (), FinishReason.STOP, self.version)


def _strip_codex(text: str) -> str:
    """Codex wraps exec_command output in a header ending with 'Output:'; keep what follows."""
    marker = "\nOutput:\n"
    return text.split(marker, 1)[1] if marker in text else text


class NativeDoNothingPolicy(Policy):
    """Answers every call with a text turn and calls no tool: the native program ends at once; the task earns 0."""

    name = "do-nothing"
    version = 0

    async def generate(self, prompt: Prompt, sampling: SamplingParams, budget: ThinkingBudget | None = None) -> Generation:
        return Generation("I will not do anything.", (), (), FinishReason.STOP, 0)


__all__ = [
    "EFFORT_PLANS", "ORACLE_TIMEOUT_S", "NativeDoNothingPolicy", "NativeOraclePolicy", "ScriptedPolicy", "answer_from_observation",
    "message_text", "oracle_command", "verify_command",
]
