"""Per-task effort budgets ``b0(x)``, measured on the cold-start model (``agentenv teachers budgets``).

Effort RL's reward is ``-1 if T(y) > tau * b0(x) else R_task``; ``b0`` is how
long the cold-start model's answers to ``x`` are, so ``tau`` reads as "this
level may spend tau times what the model spent before effort training".

What is measured, and why:

* ``T(y)`` is every token the policy sampled in the episode, all turns
  (``learner.effort.episode_tokens``): the engine counts the same thing when it
  applies the rule, so a budget and the count it is compared with never differ
  in kind. Inserted tokens (a forced ``</think>``) are not counted.
* ``b0(x)`` is per **task id**: the **median** of ``T(y)`` over the cold-start
  model's sampled episodes of that task, on training seeds, through the rotated
  harnesses and every configured effort level, at the training temperature,
  uncapped. Per task rather than per variant because variants of one family
  share one solution shape and a per-variant median from a handful of samples
  would be noise; the median rather than the mean because a few runaway
  episodes (a model looping to the token cap) would drag a mean up and loosen
  every level's limit. Every episode that is a statement about the policy
  counts, passing or not (``Trajectory.trainable``): a budget from passing
  episodes only would be undefined for a task the cold start cannot solve yet.
* The file also keeps the quartiles, the mean, the pass rate and the median per
  effort level, so a budget can be judged (``learner.effort.TaskBudget``).

>>> budgets = asyncio.run(measure(runner, ["general/count_lines"], run_id="b0", seeds=range(12)))  # doctest: +SKIP
>>> budgets.save("runs/budgets.json")
"""

from __future__ import annotations

import dataclasses
import hashlib
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from learner.effort import Budgets, TaskBudget, episode_tokens
from learner.metrics import passed
from rollout.episode import EpisodeRequest
from rollout.harnesses.parsing import CALL_CLOSE
from rollout.policy.types import SamplingParams
from rollout.runner import RolloutRunner, run_all
from rollout.types import Trajectory
from teachers.types import TeacherError

__all__ = ["BudgetError", "budget_requests", "measure", "measure_checkpoint", "summarize"]


class BudgetError(TeacherError, RuntimeError):
    """No budget could be measured (a task with no scorable episode)."""


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    at = q * (len(ordered) - 1)
    lo = int(at)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (at - lo)


def budget_requests(
    task_ids: Sequence[str], *, run_id: str, seeds: Sequence[int], harnesses: Sequence[str],
    efforts: Sequence[str | None], show_effort: bool = True, sampling: SamplingParams | None = None, seed: int = 0,
) -> list[EpisodeRequest]:
    """One sampled episode per (task, seed); harness and effort rotate with the episode's position."""
    base = sampling or SamplingParams(temperature=1.0, max_new_tokens=96, stop=(CALL_CLOSE,))
    out = []
    for i, (task_id, s) in enumerate((t, s) for t in task_ids for s in seeds):
        key = f"budget/{task_id}/{s}"
        digest = hashlib.sha256(f"sample:{seed}:{key}".encode()).digest()
        effort = efforts[i % len(efforts)] if efforts else None
        out.append(EpisodeRequest(
            episode_id=f"{run_id}/{key}", run_id=run_id, task_id=task_id, seed=s, harness=harnesses[i % len(harnesses)],
            effort=effort, group_id=key, policy="train", show_effort=show_effort and effort is not None,
            sampling=dataclasses.replace(base, seed=int.from_bytes(digest[:4], "big")),
        ))
    return out


def summarize(trajectories: Sequence[Trajectory], *, checkpoint: str = "", temperature: float = 1.0) -> Budgets:
    """The budgets file of these episodes: per task, the median sampled tokens (see the module docstring)."""
    by_task: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        by_task[t.task_id].append(t)
    budgets: dict[str, int] = {}
    detail: dict[str, TaskBudget] = {}
    for task_id, trajs in sorted(by_task.items()):
        scored = [t for t in trajs if t.trainable]
        if not scored:
            statuses = sorted({t.status.value for t in trajs})
            raise BudgetError(f"task {task_id!r}: none of its {len(trajs)} episodes is scorable (statuses: {statuses}); "
                              "no budget can be measured")
        tokens = [float(episode_tokens(t)) for t in scored]
        by_effort: dict[str, list[float]] = defaultdict(list)
        for t, n in zip(scored, tokens):
            by_effort[t.effort or "-"].append(n)
        median = statistics.median(tokens)
        budgets[task_id] = max(1, round(median))
        detail[task_id] = TaskBudget(
            n=len(tokens), median=median, p25=_quantile(tokens, 0.25), p75=_quantile(tokens, 0.75),
            mean=statistics.fmean(tokens), pass_rate=sum(passed(t) for t in scored) / len(scored),
            by_effort={e: statistics.median(v) for e, v in sorted(by_effort.items())},
        )
    return Budgets(checkpoint=checkpoint, temperature=temperature, budgets=budgets, detail=detail)


async def measure(
    runner: RolloutRunner, task_ids: Sequence[str], *, run_id: str, seeds: Sequence[int],
    harnesses: Sequence[str] = ("claude_code", "codex", "kimi_code"), efforts: Sequence[str | None] = ("low", "high", "max"),
    show_effort: bool = True, sampling: SamplingParams | None = None, checkpoint: str = "", seed: int = 0,
) -> Budgets:
    """Run the cold-start episodes on a started ``runner`` (its ``train`` policy is the cold-start model)."""
    requests = budget_requests(task_ids, run_id=run_id, seeds=seeds, harnesses=harnesses, efforts=efforts,
                               show_effort=show_effort, sampling=sampling, seed=seed)
    trajs = await run_all(runner, requests)
    temperature = requests[0].sampling.temperature if requests and requests[0].sampling else 1.0
    return summarize(trajs, checkpoint=checkpoint, temperature=temperature)


def measure_checkpoint(
    checkpoint: str | Path, task_ids: Sequence[str], *, out: str | Path, seeds: Sequence[int],
    harnesses: Sequence[str] = ("claude_code", "codex", "kimi_code"), efforts: Sequence[str | None] = ("low", "high", "max"),
    show_effort: bool = True, temperature: float = 1.0, max_new_tokens: int = 96, backend: str = "docker",
    store: str | None = None, run_id: str = "budgets", concurrency: int = 4, seed: int = 0, device: str = "cpu",
) -> Budgets:
    """``agentenv teachers budgets``: load the checkpoint, sample its episodes in sandboxes, write the file."""
    import asyncio
    import time

    from rollout.policy.hf import HFPolicy
    from rollout.runner import InProcessRunner
    from rollout.store import TrajectoryStore

    policy = HFPolicy(str(checkpoint), device=device, name="cold-start")
    run = f"{run_id}-{time.strftime('%Y%m%d-%H%M%S')}"
    trajectory_store = TrajectoryStore(store) if store else TrajectoryStore()
    trajectory_store.ensure_run(run, {"checkpoint": str(checkpoint), "tasks": list(task_ids), "purpose": "budgets"})
    sampling = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, stop=(CALL_CLOSE,))

    async def go() -> Budgets:
        runner = InProcessRunner(policy, tokenizer=policy.tokenizer, backend=backend, run_id=run, store=trajectory_store,
                                 concurrency=concurrency, pool_size=2)
        try:
            await runner.start(task_ids)
            return await measure(runner, task_ids, run_id=run, seeds=seeds, harnesses=harnesses, efforts=efforts,
                                 show_effort=show_effort, sampling=sampling, checkpoint=str(checkpoint), seed=seed)
        finally:
            await runner.close()

    budgets = asyncio.run(go())
    budgets.save(out)
    return budgets


def describe(budgets: Budgets) -> list[dict[str, Any]]:
    """One row per task, for the CLI's table and logs."""
    return [{"task": k, "b0": v, **(budgets.detail[k].model_dump() if k in budgets.detail else {})}
            for k, v in sorted(budgets.budgets.items())]
