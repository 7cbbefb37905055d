"""Each student sample to its (domain, effort) teacher: contexts, one scoring call, results stitched back.

For a batch of trajectories:

1. every sample's teacher context (``teachers.context``: the student's harness
   render without the effort message, the sample's ids after the prompt
   spliced verbatim) names its cell ``domain/effort``; a cell the grid lacks is
   ``UnroutableSample`` naming the cell, the episode and the grid's cells,
   raised before any teacher runs;
2. the teachers score all of the batch's requests in one call (a
   ``RoutingScorer`` makes one call per backend), at temperature 1;
3. the student's own logprobs of the same tokens come from ``student`` (an
   ``HFScorer`` over the learner's current weights, same temperature 1, its
   own context: the sample as sampled), or, without one, from the sample's
   sampling-time logprobs;
4. results come back as one ``ScoredSample`` per sample: positions in the
   sample, and the two logprobs at each.

Partial rollouts: an episode held while the learner trained and continued
under newer weights is stored once, whole; its samples are scored here once,
each token exactly once (re-rendered history in a later sample is mask 0 and
not scored), and the per-token values are stitched back at the sample's own
positions whatever version sampled them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agentenv.intents import EFFORT_LEVELS
from distill.types import UnroutableSample
from rollout.harnesses.rendering import ChatTokenizer
from rollout.types import Trajectory
from teachers.context import TeacherContext, prompt_ids, splice
from teachers.types import RoutedScorer, ScoreRequest, ScoringError, TeacherScorer, cell_key

__all__ = ["ContextsOf", "ScoredSample", "route", "score_samples", "student_contexts"]

#: a trajectory's teacher contexts, one per sample (``teachers.context.trajectory_contexts`` bound to a tokenizer)
ContextsOf = Callable[[Trajectory], list[TeacherContext]]


@dataclass(frozen=True)
class ScoredSample:
    """One sample's sampled tokens, scored by its teacher and by the student, both at temperature 1."""

    episode_id: str
    index: int  # the sample's index in its trajectory
    cell: str
    positions: tuple[int, ...]  # indices into the sample's token ids (its loss-mask positions)
    teacher_logp: tuple[float, ...]
    student_logp: tuple[float, ...]
    teacher_clamped: int = 0


def student_contexts(tokenizer: ChatTokenizer, trajectory: Trajectory) -> list[TeacherContext]:
    """The ablation of ``teachers.context.trajectory_contexts``: the teacher sees the student's own prompt, effort
    message included (``distill.teacher_context: student``), for teachers that were trained seeing it."""
    from agentenv.registry import get_task

    instruction = get_task(trajectory.task_id).variant(trajectory.seed).instruction
    effort = trajectory.effort if trajectory.effort in EFFORT_LEVELS else None
    s_ids = prompt_ids(tokenizer, trajectory.harness, str(instruction), effort)
    key = cell_key(trajectory.domain, trajectory.effort)
    return [splice(key, s.token_ids, s.loss_mask, s_ids, s_ids, sample_id=f"{trajectory.episode_id}#{k}")
            for k, s in enumerate(trajectory.samples)]


def route(trajectories: Sequence[Trajectory], contexts_of: ContextsOf, cells: Sequence[str] | None) -> list[list[TeacherContext]]:
    """Every trajectory's contexts, checked against the grid's ``cells`` (None: not checked here)."""
    out = [contexts_of(t) for t in trajectories]
    if cells is not None:
        known = set(cells)
        for traj, contexts in zip(trajectories, out):
            for ctx in contexts:
                if ctx.request.cell not in known:
                    raise UnroutableSample(
                        f"no teacher for cell {ctx.request.cell!r} of episode {traj.episode_id} "
                        f"(task {traj.task_id}, domain {traj.domain!r}, effort {traj.effort!r}); "
                        f"the grid's cells: {', '.join(cells)}"
                    )
    return out


def score_samples(
    trajectories: Sequence[Trajectory],
    contexts_of: ContextsOf,
    teachers: TeacherScorer,
    student: TeacherScorer | None = None,
) -> list[list[ScoredSample]]:
    """One list of ``ScoredSample`` per trajectory, in trajectory and sample order (see the module docstring)."""
    cells = list(teachers.cells) if isinstance(teachers, RoutedScorer) else None
    contexts = route(trajectories, contexts_of, cells)
    flat = [(t, k, ctx) for t, cs in zip(trajectories, contexts) for k, ctx in enumerate(cs)]
    teacher_out = teachers.score([ctx.request for _, _, ctx in flat])
    if len(teacher_out) != len(flat):
        raise ScoringError(f"teachers returned {len(teacher_out)} results for {len(flat)} samples")
    if student is not None:
        student_out = student.score([
            ScoreRequest(ctx.request.cell, t.samples[k].token_ids, ctx.student_positions, ctx.request.sample_id)
            for t, k, ctx in flat
        ])
        student_logp = [r.logprobs for r in student_out]
    else:
        student_logp = [tuple(t.samples[k].logprobs[p] for p in ctx.student_positions) for t, k, ctx in flat]
    result: dict[str, list[ScoredSample]] = {t.episode_id: [] for t in trajectories}
    for (t, k, ctx), tr, st in zip(flat, teacher_out, student_logp):
        if not len(tr.logprobs) == len(st) == len(ctx.student_positions):
            raise ScoringError(
                f"sample {ctx.request.sample_id}: {len(ctx.student_positions)} sampled tokens, but the teacher returned "
                f"{len(tr.logprobs)} logprobs and the student {len(st)}"
            )
        result[t.episode_id].append(ScoredSample(
            t.episode_id, k, ctx.request.cell, ctx.student_positions, tuple(tr.logprobs), tuple(st), tr.clamped,
        ))
    return [result[t.episode_id] for t in trajectories]
