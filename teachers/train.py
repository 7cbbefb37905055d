"""The expert recipe (``agentenv teachers train TEACHERS.yaml``): one teacher per domain x effort cell, all
trained on the engine (``learner.loop.TrainLoop``) from one shared warm start.

Phases::

    warm start   SFT on oracle episodes of every domain's tasks, each demonstration in
                 a drawn effort's style (low: the call; high: a short plan, then the call;
                 max: plan, call, then a verifying call), with no effort message
    budgets      b0 per task: the warm start's sampled episodes (teachers/budgets.py),
                 unless a budgets file is given
    per cell     from the warm start's weights:
      eval #0    the shared init on the cell's tasks at the cell's effort (held-out seeds)
      SFT        oracle episodes of the cell's domain in the cell's effort style
      eval #1
      RL         the cell's tasks, reward -1 if T(y) > tau_e * b0(x) else R_task, thinking
                 closed at the level's max_thinking_tokens
      eval #2    -> the expert, saved in Hugging Face format
    grid.yaml    a teachers.grid.TeacherGridConfig over the experts (kind: hf)

Why one shared warm start: experts that drift apart from the student they teach
distil badly (the student starts from the same warm start). Why no effort message:
a teacher scores the student's tokens in the student's context *without* the
effort message (``teachers.context``), so each teacher is trained in that context
and its effort is unconditional: its style, its budget and its thinking cap.
What makes the cells differ: the domain's tasks, the effort style of the cell's
SFT demonstrations, the level's tau in the RL reward, and its thinking cap.

The config (``TeacherTrainConfig``; ``examples/teachers.yaml`` is a commented one)::

    name: teachers
    out_dir: runs/teachers
    domains: {general: [general/count_lines], agent: [...], coding: [...]}
    efforts: {low: {tau: 0.8, max_thinking_tokens: 4}, high: {tau: 1.3}, max: {tau: 2.5}}
    budgets: null               # or a budgets file; null: measured on the warm start
    base: {...}                 # learner.train_config.TrainConfig fields every phase shares
    warm_start: {...}           # an SFTConfig
    expert: {sft: {...}, rl: {...}}
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agentenv.intents import EFFORT_LEVELS
from agentenv.configs import explain_error, format_loc, read_yaml, validate_config, validation_problems
from learner.effort import Budgets, EffortShaping, episode_tokens
from learner.loop import NullReporter, Reporter, TrainLoop
from learner.metrics import passed
from learner.train_config import RLConfig, SFTConfig, TrainConfig
from rollout.harnesses.parsing import CALL_CLOSE
from rollout.policy.models import save_checkpoint
from rollout.policy.types import SamplingParams
from rollout.types import Trajectory
from teachers.budgets import measure
from teachers.grid import EffortLevel, TeacherGridConfig
from teachers.types import TeacherConfigError, cell_key

__all__ = ["ExpertConfig", "LevelOverride", "TeacherTrainConfig", "eval_row", "evaluate_with_tokens", "train_teachers"]

_STRICT = ConfigDict(extra="forbid", frozen=True)
# The parts of a TrainConfig this recipe sets itself, per phase; giving them under base: is an error.
_OWN = ("run_id", "store", "out_dir", "sft", "rl", "effort")


class LevelOverride(BaseModel):
    """What one effort level's experts change of ``expert:`` (``expert.by_effort.max: {rl: {iterations: 1}}``).

    Why per level: the cells differ in episode length, and what RL does to a tiny model's format
    differs with it (docs/teachers.md: RL broke the long max episodes at the rate that helped low).
    ``rl`` / ``sft`` are partial ``RLConfig`` / ``SFTConfig`` fields merged over ``expert.rl`` /
    ``expert.sft``; ``lr`` replaces ``base.trainer.lr`` for the level's RL.
    """

    model_config = _STRICT
    sft: dict[str, Any] = Field(default_factory=dict)
    rl: dict[str, Any] = Field(default_factory=dict)
    lr: float | None = Field(default=None, gt=0.0)


class ExpertConfig(BaseModel):
    """What each cell's expert gets after the shared warm start: SFT in its style, then effort RL."""

    model_config = _STRICT
    sft: SFTConfig = SFTConfig(episodes=12, steps=20)
    rl: RLConfig = RLConfig(iterations=3)
    by_effort: dict[str, LevelOverride] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _overrides(self) -> ExpertConfig:
        for e in self.by_effort:
            try:
                self.for_level(e)
            except ValidationError as exc:
                err = exc.errors()[0]
                raise ValueError(f"by_effort.{e}: {format_loc(err['loc'])}: {explain_error(err)}") from None
        return self

    def for_level(self, effort: str) -> tuple[SFTConfig, RLConfig, float | None]:
        """The level's SFT and RL configs (``by_effort`` merged over the shared ones) and its lr override."""
        over = self.by_effort.get(effort)
        if over is None:
            return self.sft, self.rl, None
        sft = SFTConfig.model_validate({**self.sft.model_dump(), **over.sft})
        rl = RLConfig.model_validate({**self.rl.model_dump(), **over.rl})
        return sft, rl, over.lr


class TeacherTrainConfig(BaseModel):
    """``agentenv teachers train``'s config; see the module docstring."""

    model_config = _STRICT

    name: str = Field(default="teachers", pattern=r"^[A-Za-z0-9_.-]+$")
    out_dir: str = "runs/teachers"
    store: str | None = None
    domains: dict[str, tuple[str, ...]]
    efforts: dict[str, EffortLevel] = Field(default_factory=lambda: {
        "low": EffortLevel(tau=0.5), "high": EffortLevel(tau=1.0), "max": EffortLevel(tau=2.0)})
    budgets: str | None = Field(default=None, description="a budgets file; None: measured on the warm start")
    init: str | None = Field(default=None, description="an existing shared warm start (checkpoint folder) to start "
                             "every expert from, instead of training one")
    budget_seeds: int = Field(default=12, ge=1, description="episodes per task for the measured budgets")
    base: dict[str, Any] = Field(default_factory=dict)
    warm_start: SFTConfig = SFTConfig(episodes=36, steps=80)
    expert: ExpertConfig = ExpertConfig()

    @field_validator("domains")
    @classmethod
    def _domains(cls, v: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
        if not v:
            raise ValueError("expected at least one domain with its task ids")
        empty = [d for d, tasks in v.items() if not tasks]
        if empty:
            raise ValueError(f"domain {empty[0]!r} has no task ids; each cell trains on its domain's tasks")
        return v

    @field_validator("efforts")
    @classmethod
    def _efforts(cls, v: dict[str, EffortLevel]) -> dict[str, EffortLevel]:
        bad = [e for e in v if e not in EFFORT_LEVELS]
        if not v or bad:
            raise ValueError(f"expected effort levels among {', '.join(EFFORT_LEVELS)} (the harnesses render only those), "
                             f"got {list(v)}")
        return v

    @field_validator("base")
    @classmethod
    def _base(cls, v: dict[str, Any]) -> dict[str, Any]:
        own = [k for k in v if k in _OWN]
        if own:
            raise ValueError(f"{own[0]!r} is set by the recipe per phase (warm_start:, expert:, budgets:, name:, out_dir:, "
                             "store:); remove it from base")
        rollout = v.get("rollout") or {}
        for key in ("tasks", "efforts"):
            if key in rollout:
                raise ValueError(f"rollout.{key} comes from domains: / efforts:; remove it from base")
        return v

    @property
    def cells(self) -> list[tuple[str, str]]:
        return [(d, e) for d in self.domains for e in self.efforts]

    @property
    def task_domains(self) -> dict[str, str]:
        return {t: d for d, tasks in self.domains.items() for t in tasks}

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> TeacherTrainConfig:
        """Read and validate the YAML; each error is a line ``file: field.path: why`` of a ``TeacherConfigError``."""
        where = Path(path)
        data = read_yaml(where, error=TeacherConfigError, what="teachers config")
        return cls.parse(data, source=str(where), root=where.parent)

    @classmethod
    def parse(cls, data: Any, *, source: str, root: Path) -> TeacherTrainConfig:
        """Validate a mapping (a file's, or a section of another config); ``init`` / ``budgets`` resolve against
        ``root``; errors are lines ``source: field.path: why`` of a ``TeacherConfigError``."""
        where = source
        cfg = validate_config(cls, data, source=where, error=TeacherConfigError)
        unknown = [e for e in cfg.expert.by_effort if e not in cfg.efforts]
        if unknown:
            raise TeacherConfigError(f"{where}: expert.by_effort: level {unknown[0]!r} is not one of efforts: {list(cfg.efforts)}")

        def rooted(p: str | None) -> str | None:
            return p if p is None or Path(p).is_absolute() else str(root / p)

        cfg = cfg.model_copy(update={"budgets": rooted(cfg.budgets), "init": rooted(cfg.init)})
        cfg.train_config("check", cfg.warm_start, RLConfig(iterations=0), list(cfg.efforts), {}, source=where)
        return cfg

    def train_config(
        self, run_id: str, sft: SFTConfig, rl: RLConfig, levels: Sequence[str], effort: Mapping[str, Any], *,
        task_ids: Sequence[str] | None = None, source: str = "teachers config", trainer: Mapping[str, Any] | None = None,
    ) -> TrainConfig:
        """One phase's ``TrainConfig``: ``base`` plus the phase's tasks, levels, SFT, RL and effort settings
        (``trainer``: fields merged over ``base.trainer``, e.g. a level's ``lr``)."""
        base = dict(self.base)
        if trainer:
            base["trainer"] = {**dict(base.get("trainer") or {}), **dict(trainer)}
        rollout = {**dict(base.pop("rollout", None) or {}), "tasks": {"ids": list(task_ids or self.task_domains)},
                   "efforts": {"levels": list(levels)}}
        data = {**base, "run_id": run_id, "store": self.store, "out_dir": self.out_dir, "rollout": rollout,
                "sft": sft.model_dump(), "rl": rl.model_dump(), "effort": dict(effort),
                "checkpoint": {"every": 0}}
        try:
            return TrainConfig.model_validate(data)
        except ValidationError as exc:
            raise TeacherConfigError("\n  ".join(validation_problems(exc, source=source, prefix="base", model=TrainConfig))) from None


def eval_row(trajs: Sequence[Trajectory], shaping: EffortShaping | None = None) -> dict[str, float]:
    """Pass rate, median sampled tokens, and (with the cell's budget) the share that passed within tau * b0."""
    tokens = [episode_tokens(t) for t in trajs]
    ok = [passed(t) and t.trainable for t in trajs]
    row = {"pass_rate": sum(ok) / len(ok) if ok else 0.0, "median_tokens": statistics.median(tokens) if tokens else 0.0,
           "n": len(trajs)}
    if shaping is not None and trajs:
        limits = [shaping.limit(t) for t in trajs]
        row["pass_within_budget"] = sum(o and (lim is None or n <= lim) for o, n, lim in zip(ok, tokens, limits)) / len(trajs)
    return row


async def evaluate_with_tokens(loop: TrainLoop, index: int, iteration: int) -> dict[str, float]:
    """``loop.evaluate`` plus the held-out episodes' median sampled tokens (read back from the store)."""
    await loop.evaluate(index, iteration)
    trajs = [t for t in loop.store.query(run_id=loop.run_id) if f"/eval{index}/" in t.episode_id]
    return eval_row(trajs, loop.effort)


async def _warm_start(cfg: TeacherTrainConfig, out: Path, reporter: Reporter) -> tuple[Path, Budgets, dict[str, Any]]:
    levels = list(cfg.efforts)
    caps = {e: lv.max_thinking_tokens for e, lv in cfg.efforts.items() if lv.max_thinking_tokens is not None}
    sft = cfg.warm_start if cfg.init is None else cfg.warm_start.model_copy(update={"episodes": 0})
    tc = cfg.train_config(f"{cfg.name}-warm-start", sft, RLConfig(iterations=0), levels,
                          {"message": False, "oracle_styles": True, "max_thinking_tokens": caps or None})
    if cfg.init is not None:  # an existing shared warm start: measured (budgets), not trained
        tc = tc.model_copy(update={"model": tc.model.model_copy(update={"checkpoint": cfg.init})})
    loop = TrainLoop(tc, cfg.task_domains, reporter=reporter)
    t0 = time.monotonic()
    try:
        await loop.runner.start(loop.task_ids)
        await loop.warm_start()
        where = save_checkpoint(loop.model.lm, loop.tokenizer, out / "warm_start") if cfg.init is None else Path(cfg.init)
        if cfg.budgets is not None:
            budgets = Budgets.load(cfg.budgets)
        else:
            reporter.phase("budgets: the warm start's sampled episodes", cfg.budget_seeds * len(loop.task_ids))
            rs = tc.rollout
            budgets = await measure(
                loop.runner, loop.task_ids, run_id=loop.run_id, seeds=range(cfg.budget_seeds),
                harnesses=rs.rotation.harnesses, efforts=levels, show_effort=False, checkpoint=str(where), seed=tc.seed,
                sampling=SamplingParams(temperature=rs.sampling.temperature, top_p=rs.sampling.top_p,
                                        max_new_tokens=rs.sampling.max_new_tokens,
                                        stop=(CALL_CLOSE,) if tc.stop_at_call_end else ()),
            )
        budgets.require(loop.task_ids, source=cfg.budgets or "measured budgets")
        path = budgets.save(out / "budgets.json")
        reporter.log(f"budgets ({path}): " + ", ".join(f"{k} {v}" for k, v in budgets.budgets.items()))
    finally:
        await loop.runner.close()
    info = {"run_id": loop.run_id, "checkpoint": str(where), "sft": loop.history.sft[-1:] if loop.history.sft else [],
            "seconds": time.monotonic() - t0}
    return where, budgets, info


async def _expert(
    cfg: TeacherTrainConfig, domain: str, effort: str, warm: Path, budgets_path: Path, out: Path, reporter: Reporter,
) -> dict[str, Any]:
    level = cfg.efforts[effort]
    tasks = list(cfg.domains[domain])
    effort_cfg: dict[str, Any] = {"message": False, "oracle_styles": True, "budgets": str(budgets_path),
                                  "tau": {effort: level.tau}}
    if level.max_thinking_tokens is not None:
        effort_cfg["max_thinking_tokens"] = {effort: level.max_thinking_tokens}
    sft, rl, lr = cfg.expert.for_level(effort)
    tc = cfg.train_config(f"{cfg.name}-{domain}-{effort}", sft, rl, [effort], effort_cfg, task_ids=tasks,
                          trainer=None if lr is None else {"lr": lr})
    tc = tc.model_copy(update={"model": tc.model.model_copy(update={"checkpoint": str(warm)})})
    loop = TrainLoop(tc, {t: domain for t in tasks}, reporter=reporter)
    t0 = time.monotonic()
    try:
        await loop.runner.start(loop.task_ids)
        await loop.runner.publish(0, loop.model.lm.state_dict())
        reporter.log(f"{cell_key(domain, effort)}: the shared init on the cell")
        init = await evaluate_with_tokens(loop, 0, 0)
        await loop.warm_start()
        after_sft = await evaluate_with_tokens(loop, 1, 0)
        await loop.rl()
        expert = await evaluate_with_tokens(loop, 2, tc.rl.iterations)
        where = save_checkpoint(loop.model.lm, loop.tokenizer, out / "experts" / f"{domain}-{effort}")
    finally:
        await loop.runner.close()
    row = {"cell": cell_key(domain, effort), "run_id": loop.run_id, "checkpoint": str(where), "tasks": tasks,
           "tau": level.tau, "max_thinking_tokens": level.max_thinking_tokens, "init": init, "after_sft": after_sft,
           "expert": expert, "gain_points": round(100 * (expert["pass_rate"] - init["pass_rate"]), 1),
           "rl": loop.history.rl, "sft": {"episodes": tc.sft.episodes, "steps": tc.sft.steps, "batch_size": tc.sft.batch_size},
           "lr": tc.trainer.lr, "timings_s": dict(loop.history.timings), "seconds": time.monotonic() - t0}
    reporter.log(f"{row['cell']}: pass {init['pass_rate']:.2f} -> {after_sft['pass_rate']:.2f} -> {expert['pass_rate']:.2f}, "
                 f"median tokens {init['median_tokens']:.0f} -> {expert['median_tokens']:.0f}")
    return row


def _grid_yaml(cfg: TeacherTrainConfig, rows: Sequence[Mapping[str, Any]], out: Path) -> Path:
    data = {
        "domains": list(cfg.domains),
        "efforts": {e: lv.model_dump(exclude_none=True) for e, lv in cfg.efforts.items()},
        "cells": {r["cell"]: {"kind": "hf", "path": os.path.relpath(r["checkpoint"], out)} for r in rows},
    }
    path = out / "grid.yaml"
    path.write_text("# written by agentenv teachers train: the experts as a teacher grid (teachers.grid)\n"
                    + yaml.safe_dump(data, sort_keys=False))
    TeacherGridConfig.load(path)  # what we wrote must load as a grid
    return path


def train_teachers(cfg: TeacherTrainConfig, *, reporter: Reporter | None = None, json_path: Path | None = None) -> dict[str, Any]:
    """Run the recipe (see the module docstring); returns the summary also written to ``out_dir/name/summary.json``."""
    rep: Reporter = reporter or NullReporter()
    out = Path(cfg.out_dir) / cfg.name
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    warm, budgets, warm_info = asyncio.run(_warm_start(cfg, out, rep))
    rows = [asyncio.run(_expert(cfg, d, e, warm, out / "budgets.json", out, rep)) for d, e in cfg.cells]
    grid = _grid_yaml(cfg, rows, out)
    summary = {
        "name": cfg.name, "grid": str(grid), "warm_start": warm_info, "budgets": budgets.budgets,
        "budgets_file": str(out / "budgets.json"), "cells": rows,
        "median_tokens_order": _orders(cfg, rows), "seconds": time.monotonic() - t0,
    }
    text = json.dumps(summary, indent=2, default=float)
    (out / "summary.json").write_text(text + "\n")
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(text + "\n")
    return summary


def _orders(cfg: TeacherTrainConfig, rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """Per domain, the experts' median held-out tokens by effort level (in the config's level order)."""
    by_cell = {r["cell"]: r for r in rows}
    return {d: {e: by_cell[cell_key(d, e)]["expert"]["median_tokens"] for e in cfg.efforts} for d in cfg.domains}
