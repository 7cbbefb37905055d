"""The teacher's context: the student's render without the effort message, the student's tokens spliced in.

MOPD's teacher must judge the student's response as if nobody had told it the
effort level: the effort is what the student learns to follow, the teacher
already *is* that effort. So the teacher's prompt is the same harness render
with ``effort=None`` (``BaseHarness.render`` puts the effort text in a system
message of its own, named ``"effort"``), tokenized exactly as the episode
runner tokenizes the student's (``EpisodeRenderer(...).prompt_ids()``).

The rule for one stored sample (``rollout.types.Sample``) whose ids begin with
the student prompt ``S`` and a teacher prompt ``T``::

    teacher_ids = T + sample.token_ids[len(S):]          # spliced verbatim, never re-tokenized
    teacher_pos = [i + len(T) - len(S) for i where sample.loss_mask[i] == 1]

so ``teacher_ids[teacher_pos[k]] == sample.token_ids[student_pos[k]]`` for every k.
A sample that does not begin with ``S`` raises ``ContextMismatch``.

Later samples of a non-append-only template (``EpisodeRenderer`` opened a new
sample because the template re-rendered the history): such a sample begins
with the template's fresh rendering of the whole history, whose first tokens
are again the opening messages (system, effort, user) and the first
generation prompt, i.e. ``S``. The same rule applies to it: ``S`` is replaced
by ``T`` and everything after (re-rendered earlier turns, mask 0, and the new
sampled tokens, mask 1) is kept verbatim. If a template renders the opening
differently once later turns exist, ``S`` is not a prefix and the sample is
refused with ``ContextMismatch``, never guessed at.

>>> s_ids, t_ids = prompt_pair(tok, "codex", instruction, "high")        # doctest: +SKIP
>>> ctx = splice("coding/high", sample.token_ids, sample.loss_mask, s_ids, t_ids, sample_id="ep1#0")
>>> ctx.request.positions == tuple(p + ctx.shift for p in ctx.student_positions)
True
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentenv.intents import EFFORT_LEVELS
from rollout.harnesses import get_harness, is_native_harness
from rollout.harnesses.rendering import ChatTokenizer, EpisodeRenderer
from rollout.types import Trajectory
from teachers.types import ContextMismatch, ScoreRequest, cell_key


@dataclass(frozen=True)
class TeacherContext:
    """One sample's teacher request plus the index map back to the sample.

    ``request.positions[k]`` (teacher sequence) scores the token at
    ``student_positions[k]`` (the sample); ``shift = len(T) - len(S)``.
    """

    request: ScoreRequest
    student_positions: tuple[int, ...]
    shift: int


def prompt_ids(
    tokenizer: ChatTokenizer, harness: str, instruction: str, effort: str | None,
    *, template_kwargs: Mapping[str, Any] | None = None,
) -> list[int]:
    """The opening prompt ids of an episode, tokenized as ``rollout.episode`` does."""
    prompt = get_harness(harness).render(instruction, effort)
    return EpisodeRenderer(tokenizer, prompt.messages, prompt.tools, template_kwargs=template_kwargs).prompt_ids()


def prompt_pair(
    tokenizer: ChatTokenizer, harness: str, instruction: str, effort: str | None,
    *, template_kwargs: Mapping[str, Any] | None = None,
) -> tuple[list[int], list[int]]:
    """``(student_prompt_ids, teacher_prompt_ids)``: the render with ``effort``, and with none."""
    student = prompt_ids(tokenizer, harness, instruction, effort, template_kwargs=template_kwargs)
    teacher = prompt_ids(tokenizer, harness, instruction, None, template_kwargs=template_kwargs) if effort else list(student)
    return student, teacher


def splice(
    cell: str,
    token_ids: Sequence[int],
    loss_mask: Sequence[int],
    student_prompt_ids: Sequence[int],
    teacher_prompt_ids: Sequence[int],
    *,
    sample_id: str = "",
) -> TeacherContext:
    """The ``ScoreRequest`` of one sample for ``cell`` (see the module docstring); pure.

    Raises ``ContextMismatch`` naming ``sample_id`` when the student prompt is not a
    prefix of ``token_ids``, when the mask and ids differ in length, or when a prompt
    token is marked as sampled.
    """
    name = sample_id or "<unnamed sample>"
    ids, mask, s_ids = list(token_ids), list(loss_mask), list(student_prompt_ids)
    if len(ids) != len(mask):
        raise ContextMismatch(f"sample {name}: loss_mask has {len(mask)} entries for {len(ids)} token ids")
    n = len(s_ids)
    if ids[:n] != s_ids:
        at = next((i for i, (a, b) in enumerate(zip(ids, s_ids)) if a != b), min(len(ids), n))
        raise ContextMismatch(
            f"sample {name}: the re-rendered student prompt ({n} tokens) is not a prefix of the sample "
            f"({len(ids)} tokens); first difference at position {at} "
            f"(expected {s_ids[at] if at < n else 'end of prompt'}, got {ids[at] if at < len(ids) else 'end of sample'}); "
            "was it rendered with another tokenizer, harness, instruction or effort?"
        )
    student_pos = tuple(i for i, m in enumerate(mask) if m)
    if student_pos and student_pos[0] < n:
        raise ContextMismatch(f"sample {name}: loss_mask marks prompt position {student_pos[0]} as sampled (prompt is {n} tokens)")
    shift = len(teacher_prompt_ids) - n
    teacher_ids = tuple(int(t) for t in teacher_prompt_ids) + tuple(ids[n:])
    request = ScoreRequest(cell, teacher_ids, tuple(p + shift for p in student_pos), sample_id)
    return TeacherContext(request, student_pos, shift)


def trajectory_contexts(
    tokenizer: ChatTokenizer,
    trajectory: Trajectory,
    *,
    cell: str | None = None,
    instruction: str | None = None,
    get_task: Callable[[str], Any] | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> list[TeacherContext]:
    """One ``TeacherContext`` per sample of ``trajectory`` (ids ``"{episode_id}#{k}"``).

    The instruction is re-created from the task registry (``task.variant(seed).instruction``,
    as ``rollout.episode`` does) unless given; ``cell`` defaults to the trajectory's
    ``domain/effort``. A native harness (``native:...``) has no re-renderable prompt and is
    refused with ``ContextMismatch``.
    """
    if is_native_harness(trajectory.harness):
        raise ContextMismatch(
            f"trajectory {trajectory.episode_id}: harness {trajectory.harness!r} is a native program (a real CLI) recorded by the gateway; "
            "its prompt cannot be re-rendered without the effort message"
        )
    if instruction is None:
        if get_task is None:
            from agentenv.registry import get_task as registry_get_task

            get_task = registry_get_task
        instruction = get_task(trajectory.task_id).variant(trajectory.seed).instruction
    effort = trajectory.effort if trajectory.effort in EFFORT_LEVELS else None
    s_ids, t_ids = prompt_pair(tokenizer, trajectory.harness, str(instruction), effort, template_kwargs=template_kwargs)
    key = cell if cell is not None else cell_key(trajectory.domain, trajectory.effort)
    return [
        splice(key, s.token_ids, s.loss_mask, s_ids, t_ids, sample_id=f"{trajectory.episode_id}#{k}")
        for k, s in enumerate(trajectory.samples)
    ]


__all__ = ["TeacherContext", "prompt_ids", "prompt_pair", "splice", "trajectory_contexts"]
