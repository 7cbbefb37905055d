"""The MOPD loop: the post-training engine with teacher advantages (``agentenv distill CONFIG``).

Nothing of the engine is copied: ``learner.loop.TrainLoop`` runs the student's
rollouts (rotated harnesses, drawn efforts, real sandboxes, verifiers), keeps
the staleness bound, partial rollouts, checkpoints and evaluations, and takes
the learner's one loss (``learner.losses.policy_loss``, with its masked or
truncated importance weights, ``rl.loss.is_correction``). ``MOPDAdvantages`` is
the one step that differs, given to it as its ``AdvantageProvider``::

    groups of trajectories -> teacher contexts (no effort message) -> teachers score (T = 1)
        -> the learner's current weights score the same tokens (T = 1)
        -> A_t = clip(logp_T - logp_S, -R, R) [+ alpha * A_outcome] per token -> TrainItems

and the metrics of that step: advantage mean / std / clip fraction and the
student-teacher KL per cell, clamped teacher logprobs, lengths per effort.
The learner never talks to Docker; the teachers run where the learner runs.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from distill.advantages import CellStats, token_advantages
from distill.routing import ContextsOf, score_samples, student_contexts
from distill.types import DistillConfig, DistillConfigError, MOPDConfig
from learner.advantages import group_advantages, shaped_reward
from learner.loop import NullReporter, Reporter, TrainLoop
from learner.model import PolicyModel
from learner.types import AdvantageConfig, TrainItem
from rollout.types import Trajectory
from teachers.grid import TeacherGridConfig, build_scorer
from teachers.scoring import HFScorer
from teachers.types import TeacherScorer, cell_key

__all__ = ["MOPDAdvantages", "check_effort_agrees", "check_routable", "load_grid", "run_distill"]


class MOPDAdvantages:
    """The engine's ``AdvantageProvider`` for MOPD (see the module docstring).

    ``teachers``: a scorer over the grid's cells (``teachers.grid.build_scorer``).
    ``contexts_of``: a trajectory's teacher contexts (``trajectory_contexts`` bound
    to the student's tokenizer). ``outcome``: the estimator of ``A_outcome``
    (used when ``cfg.alpha > 0``), over rewards shaped as the RL step shapes
    them: ``shaping`` holds ``items_from_groups``'s keyword arguments for the
    effort rule (``EffortShaping.kwargs()``), so an episode over ``tau * b0``
    counts -1 in the outcome term too. ``history`` keeps each call's metrics.
    ``bf16``: score the student under bf16 autocast, as the trainer's forward
    runs (``trainer.bf16``; None = on CUDA only). On the H200 the fp32 scoring
    forward took 3.39 s of a 4.45 s MOPD step against 0.42 s under autocast
    (docs/benchmarks.md): fp32 there is 8x the cost for a logprob the loss
    itself computes under autocast. Only the student's forward: teachers
    score in their own dtype.
    """

    def __init__(
        self, cfg: MOPDConfig, teachers: TeacherScorer, contexts_of: ContextsOf, *,
        outcome: AdvantageConfig | None = None, reporter: Reporter | None = None, batch_tokens: int = 16384,
        bf16: bool | None = None, shaping: Mapping[str, Callable[[Trajectory], Any]] | None = None,
    ) -> None:
        self.cfg = cfg
        self.shaping = dict(shaping or {})
        self.teachers = teachers
        self.contexts_of = contexts_of
        self.outcome = outcome or AdvantageConfig()
        self.reporter: Reporter = reporter or NullReporter()
        self.batch_tokens = batch_tokens
        self.bf16 = bf16
        self.history: list[dict[str, float]] = []

    def student_scorer(self, model: PolicyModel) -> TeacherScorer | None:
        """The learner's current weights as a scorer (T = 1), or None for the sampling-time logprobs."""
        if self.cfg.student_logprobs == "rollout":
            return None
        bf16 = self.bf16 if self.bf16 is not None else model.device.type == "cuda"
        return HFScorer(model.lm, batch_tokens=self.batch_tokens, device=model.device,
                        autocast=torch.bfloat16 if bf16 else None)

    def __call__(self, groups: Sequence[Sequence[Trajectory]], model: PolicyModel) -> tuple[list[TrainItem], dict[str, float]]:
        t0 = time.monotonic()
        trajs = [t for g in groups for t in g]
        outcome: dict[str, float] = {}
        if self.cfg.alpha > 0:
            rewards = [[shaped_reward(t, self.outcome, **self.shaping) for t in g] for g in groups]
            for group, adv_G in zip(groups, group_advantages(rewards, self.outcome)):
                outcome.update({t.episode_id: a for t, a in zip(group, adv_G)})
        scored = score_samples(trajs, self.contexts_of, self.teachers, self.student_scorer(model))
        by_cell: dict[str, CellStats] = defaultdict(CellStats)
        lengths: dict[str, list[int]] = defaultdict(list)
        items: list[TrainItem] = []
        for traj, samples in zip(trajs, scored):
            lengths[traj.effort].append(sum(s.num_sampled for s in traj.samples))
            tags = {"harness": traj.harness, "effort": traj.effort, "domain": traj.domain, "task": traj.task_id}
            for sc in samples:
                sample = traj.samples[sc.index]
                by_cell[sc.cell].add(sc.teacher_logp, sc.student_logp, self.cfg.clip, sc.teacher_clamped)
                adv_T = token_advantages(sc.teacher_logp, sc.student_logp, sc.positions, len(sample.token_ids),
                                         self.cfg.clip, alpha=self.cfg.alpha, outcome=outcome.get(traj.episode_id, 0.0))
                items.append(TrainItem(
                    token_ids=sample.token_ids, rollout_logprobs=sample.logprobs, loss_mask=sample.loss_mask,
                    advantage=adv_T, sample_id=f"{traj.episode_id}/{sc.index}", group_id=f"{traj.task_id}/{traj.seed}",
                    tags=tags,
                ))
        total = CellStats()
        metrics: dict[str, float] = {}
        for cell in sorted(by_cell):
            total.merge(by_cell[cell])
            metrics |= by_cell[cell].as_metrics(f"/cell={cell}")
        metrics |= total.as_metrics()
        for effort, lens in sorted(lengths.items()):
            metrics[f"mopd/len/effort={effort or '-'}"] = sum(lens) / len(lens)
        metrics["mopd/score_s"] = time.monotonic() - t0
        self.history.append(metrics)
        self.reporter.log(_summary_line(metrics, sorted(by_cell)))
        return items, metrics


def _summary_line(m: dict[str, float], cells: Sequence[str]) -> str:
    per_cell = " ".join(f"{c}:{m[f'mopd/kl/cell={c}']:.3f}" for c in cells)
    lens = " ".join(f"{k.split('=')[1]}:{v:.0f}" for k, v in m.items() if k.startswith("mopd/len/effort="))
    return (f"MOPD: KL(student||teacher) {m['mopd/kl']:.3f}, advantage {m['mopd/adv_mean']:+.3f} ± "
            f"{m['mopd/adv_std']:.3f}, clipped {100 * m['mopd/clip_frac']:.1f}%, clamped {m['mopd/clamped']:.0f}, "
            f"{m['mopd/tokens']:.0f} tokens scored in {m['mopd/score_s']:.1f}s | KL by cell {per_cell} | len by effort {lens}")


def load_grid(cfg: DistillConfig, root: Path) -> TeacherGridConfig:
    """``distill.teachers``: a grid file (relative to ``root``, the config's folder) or an inline grid."""
    spec = cfg.distill.teachers
    if isinstance(spec, str):
        path = Path(spec) if Path(spec).is_absolute() else root / spec
        return TeacherGridConfig.load(path)
    return TeacherGridConfig.parse(spec, source="distill.teachers", root=root)


def check_routable(grid: TeacherGridConfig, task_domains: dict[str, str], cfg: DistillConfig) -> None:
    """Every task's domain and every drawn effort level has a cell; ``DistillConfigError`` naming the field if not."""
    bad_tasks = {t: d for t, d in task_domains.items() if d not in grid.domains}
    if bad_tasks:
        t, d = next(iter(bad_tasks.items()))
        raise DistillConfigError(
            f"rollout.tasks: task {t!r} has domain {d!r}, which the teacher grid lacks (domains: {', '.join(grid.domains)})"
        )
    levels = [lv for lv in cfg.rollout.efforts.levels if lv not in grid.efforts]
    if levels:
        raise DistillConfigError(
            f"rollout.efforts.levels: {levels[0]!r} has no teachers in the grid (efforts: {', '.join(grid.efforts)}); "
            f"e.g. cell {cell_key(next(iter(task_domains.values())), levels[0])!r} is missing"
        )
    check_effort_agrees(grid, cfg)


def check_effort_agrees(grid: TeacherGridConfig, cfg: DistillConfig) -> None:
    """A level's tau and thinking cap, given both by the run (``effort.tau``, ``effort.max_thinking_tokens``) and by
    the grid (``efforts.<level>``: what its teachers were trained with), must agree; ``DistillConfigError`` naming both."""
    tau = cfg.effort.tau
    for lv in cfg.rollout.efforts.levels:
        level = grid.efforts.get(lv)
        if level is None:
            continue
        mine = tau.get(lv) if isinstance(tau, dict) else tau
        if mine is not None and mine != level.tau:
            raise DistillConfigError(
                f"effort.tau: {mine} for level {lv!r} conflicts with the teacher grid's efforts.{lv}.tau: {level.tau} "
                "(distill.teachers); the student's effort reward and its teacher's budget are one factor: give them equal"
            )
        cap = cfg.effort.thinking_budget(lv)
        if cap is not None and level.max_thinking_tokens is not None and cap != level.max_thinking_tokens:
            raise DistillConfigError(
                f"effort.max_thinking_tokens: {cap} for level {lv!r} conflicts with the teacher grid's "
                f"efforts.{lv}.max_thinking_tokens: {level.max_thinking_tokens} (distill.teachers); give them equal"
            )


def run_distill(
    cfg: DistillConfig, root: Path, *, json_path: Path | None = None, reporter: Reporter | None = None,
    resume: bool = False,
) -> dict[str, Any]:
    """Load the grid, check it covers the run, then the engine with ``MOPDAdvantages``; outputs as ``agentenv train``'s."""
    from learner.report import write_outputs
    from rollout.job import resolve_tasks
    from teachers.context import trajectory_contexts

    grid = load_grid(cfg, root)
    tasks = resolve_tasks(cfg.rollout.tasks)
    check_routable(grid, tasks, cfg)
    t0 = time.monotonic()
    teachers = build_scorer(grid, device=cfg.distill.teacher_device)
    load_s = time.monotonic() - t0
    try:
        loop = TrainLoop(cfg, tasks, reporter=reporter, resume=resume)
        tokenizer = loop.tokenizer
        contexts: ContextsOf = (
            (lambda t: trajectory_contexts(tokenizer, t)) if cfg.distill.teacher_context == "without_effort"
            else (lambda t: student_contexts(tokenizer, t))
        )
        provider = MOPDAdvantages(
            cfg.distill, teachers, contexts, outcome=cfg.rl.advantage,
            reporter=reporter, batch_tokens=grid.batch_tokens, bf16=cfg.trainer.bf16,
            shaping=loop.effort.kwargs() if loop.effort is not None else None,  # the effort reward, as RL's
        )
        loop.advantages = provider
        summary = asyncio.run(loop.run())
    finally:
        teachers.close()
    summary["distill"] = {
        "grid_cells": grid.cell_keys, "clip": cfg.distill.clip, "alpha": cfg.distill.alpha,
        "student_logprobs": cfg.distill.student_logprobs, "teacher_context": cfg.distill.teacher_context,
        "teacher_load_s": round(load_s, 1),
        # from the engine's history, which a resumed run restores (the provider's own starts empty)
        "steps": [{k: v for k, v in row.items() if k.startswith("mopd/")} for row in loop.history.rl],
    }
    return write_outputs(summary, loop.history, cfg.run_dir(), json_path)
