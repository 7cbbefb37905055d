"""The 3 x 3 grid demonstration of issue #15, end to end: ``python -m examples.grid_demo.run CONFIG [--json PATH] [--reuse]``.

From one shared warm start::

    teachers    agentenv teachers train: a warm start, b0 per task, one expert per domain x effort
                cell (its style's SFT, then RL with the effort reward); each evaluated on its cell
    student     MOPD (agentenv distill) on that grid from the warm start: rotated harnesses,
                sampled effort levels, the effort message in the student's prompt only
    baseline    multi-task RL with the effort reward from the same warm start, on the same
                sandbox-episode budget (iterations x groups x group size) as the student
    cells       held-out evaluation per cell (domain x effort) of the student with the effort
                message, the student without it and without the level's thinking cap (the
                ablation: no effort signal at all) and the baseline; the shared
                init and the teachers are the recipe's own evaluations of each cell (the same
                held-out seeds, harnesses and caps; ``teachers.train.evaluate_with_tokens``)
    report      per cell: pass rates, student / teacher, median sampled tokens per effort; the
                compute table (student vs baseline, the teachers apart and in total); episodes to
                reach 90% of the teachers' mean pass rate; the issue's thresholds, each PASS or
                FAIL from the numbers (``examples.grid_demo.report``); JSON and two PNGs

What the numbers are: every evaluation samples at ``base.eval.temperature`` on
``base.eval.seeds`` (held out from training); costs are read back from the
trajectory store (sampled tokens, tokens given to the learner, MOPD's teacher
contexts) and the runs' own timings. The shared warm start and the budgets are
counted apart: both student and baseline start from them.

The config (``examples/grid_demo/config.yaml`` is a commented one)::

    name: grid-demo
    out_dir: runs                 # everything under runs/grid-demo/
    store: sqlite:///runs/grid_demo.db
    teachers: {...}               # a teachers.train.TeacherTrainConfig (name, out_dir, store: from here)
    budget: {iterations: 8, groups_per_iter: 4, updates_per_iter: 1}   # the student's and the baseline's
    eval_every: 2                 # held-out evaluations during both runs (episodes to target)
    student: {lr: 5.0e-4, clip: 5.0, alpha: 0.0, loss: {...}}
    baseline: {lr: 2.0e-4, loss: {...}, advantage: {...}}

``--reuse``: a stage whose output already exists under ``out_dir/name`` is read
back instead of rerun (the teachers' summary, the student's and the baseline's
summaries, the cells' evaluations).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agentenv.configs import read_yaml, validate_config
from examples.grid_demo.report import (
    TARGET_FRACTION, Check, Cost, RunCurve, cell, check_ablation_collapses, check_compute, check_order, check_ratios,
    check_teacher_gains, compute_ratios, plot_grid, plot_lengths, ratio,
)
from learner.effort import episode_tokens
from learner.loop import NullReporter, Reporter, TrainLoop, eval_requests
from learner.train_config import SFTConfig
from learner.types import AdvantageConfig, LossConfig
from rollout.config import ConfigError
from rollout.types import Trajectory

__all__ = ["Budget", "GridDemoConfig", "build_report", "main", "model_requests", "phase_config", "run_demo"]

_STRICT = ConfigDict(extra="forbid", frozen=True)


class Budget(BaseModel):
    """The student's and the baseline's training budget: the same sandbox episodes for both."""

    model_config = _STRICT
    iterations: int = Field(default=8, ge=1)
    groups_per_iter: int = Field(default=4, ge=1)
    updates_per_iter: int = Field(default=1, ge=1)


class StudentConfig(BaseModel):
    """MOPD's settings (``distill.types.MOPDConfig`` less the grid, which is the teachers stage's)."""

    model_config = _STRICT
    lr: float = Field(default=5e-4, gt=0.0)
    clip: float = Field(default=5.0, gt=0.0)
    alpha: float = Field(default=0.0, ge=0.0)
    loss: LossConfig = LossConfig.dapo()


class BaselineConfig(BaseModel):
    """Multi-task RL's settings: its optimizer step size, loss and outcome advantage (with the effort reward)."""

    model_config = _STRICT
    lr: float = Field(default=2e-4, gt=0.0)
    loss: LossConfig = LossConfig.dapo()
    advantage: AdvantageConfig = AdvantageConfig()


class GridDemoConfig(BaseModel):
    """``python -m examples.grid_demo.run``'s config; see the module docstring."""

    model_config = _STRICT
    name: str = Field(default="grid-demo", pattern=r"^[A-Za-z0-9_.-]+$")
    out_dir: str = "runs"
    store: str | None = None
    teachers: dict[str, Any]
    budget: Budget = Budget()
    eval_every: int = Field(default=2, ge=0, description="held-out evaluations every N iterations of student and baseline")
    adapt: SFTConfig = Field(
        default=SFTConfig(episodes=0, steps=0),
        description="before student and baseline alike: SFT on plain oracle demonstrations (one style for every level) "
        "with the effort message shown, so a warm start trained without the message has seen it; the message says "
        "nothing yet (MOPD or the effort reward must teach what it means); counted in both runs' costs",
    )
    adapt_styles: bool = Field(
        default=False,
        description="the adaptation's demonstrations in each episode's effort style (low: the call; high: plan, call; "
        "max: + a check; effort.oracle_styles) instead of one plain style: a cold start that already ties the message "
        "to a length, as the K3 recipe's SFT does before MOPD; the same for student and baseline",
    )
    adapt_moments: bool = Field(
        default=True,
        description="student and baseline start their Adam from the adaptation's moments (rl.continue_sft_optimizer), "
        "as the experts and the quickstart do: a fresh Adam's first steps move every weight by about lr whatever the "
        "signal's size (docs/training.md); attempts 1 to 6 ran without (false)",
    )
    target_fraction: float = Field(default=TARGET_FRACTION, gt=0.0, le=1.0)
    student: StudentConfig = StudentConfig()
    baseline: BaselineConfig = BaselineConfig()

    @property
    def root(self) -> Path:
        return Path(self.out_dir) / self.name

    @classmethod
    def load(cls, path: str | Path) -> tuple[GridDemoConfig, Any]:
        """The config and its ``TeacherTrainConfig`` (relative paths against the file's folder); errors name the field."""
        from teachers.train import TeacherTrainConfig

        where = Path(path)
        cfg = validate_config(cls, read_yaml(where, error=ConfigError), source=str(where), error=ConfigError)
        own = [k for k in ("name", "out_dir", "store") if k in cfg.teachers]
        if own:
            raise ConfigError(f"{where}: teachers.{own[0]}: set by the demo (its name, out_dir and store); remove it")
        section = {**cfg.teachers, "name": "teachers", "out_dir": str(cfg.root), "store": cfg.store}
        teachers = TeacherTrainConfig.parse(section, source=f"{where}: teachers", root=where.parent)
        return cfg, teachers


# ------------------------------------------------------------------ the runs


def phase_config(cfg: GridDemoConfig, tcfg: Any, run: str, warm: str, budgets: Path, *, loss: LossConfig,
                 lr: float, advantage: AdvantageConfig | None = None, adapt: bool = False) -> dict[str, Any]:
    """The student's / baseline's ``TrainConfig`` fields: the teachers' base, every domain and level, from the
    warm start, the effort message shown, each level's cap, the effort reward's budgets and taus."""
    from learner.train_config import RLConfig

    levels = list(tcfg.efforts)
    caps = {e: lv.max_thinking_tokens for e, lv in tcfg.efforts.items() if lv.max_thinking_tokens is not None}
    effort = {"message": True, "budgets": str(budgets), "tau": {e: lv.tau for e, lv in tcfg.efforts.items()},
              "max_thinking_tokens": caps or None, "oracle_styles": adapt and cfg.adapt_styles}
    rl = RLConfig(iterations=cfg.budget.iterations, groups_per_iter=cfg.budget.groups_per_iter,
                  updates_per_iter=cfg.budget.updates_per_iter, loss=loss, advantage=advantage or AdvantageConfig(),
                  continue_sft_optimizer=adapt and cfg.adapt_moments and cfg.adapt.steps > 0)
    tc = tcfg.train_config(f"{cfg.name}-{run}", cfg.adapt if adapt else SFTConfig(episodes=0, steps=0), rl, levels, effort, trainer={"lr": lr},
                           source=f"{cfg.name}: {run}")
    data = tc.model_dump(mode="json", exclude_unset=True)  # what was set: rollout's unused defaults (seeds) are refused
    data["model"] = {**data.get("model", {}), "checkpoint": warm}
    data["eval"] = {**data.get("eval", {}), "every": cfg.eval_every}
    data["checkpoint"] = {"every": cfg.budget.iterations, "keep": 1}  # the final weights, for the cells' evaluation
    return data


def _episodes(tc: Any) -> int:
    """The sandbox-episode budget: iterations x groups x group size (the same for student and baseline)."""
    return int(tc.rl.iterations * tc.rl.groups_per_iter * tc.rollout.group_size)


def _final_weights(summary: Mapping[str, Any], run_dir: Path) -> str:
    from learner.checkpoint import RunCheckpoints

    latest = RunCheckpoints(run_dir / "checkpoints").latest()
    if latest is None:
        raise RuntimeError(f"{summary['run_id']}: no checkpoint under {run_dir}/checkpoints")
    return str(latest / "trainer" / "model")


def _student(cfg: GridDemoConfig, tcfg: Any, teachers: Mapping[str, Any], reporter: Reporter) -> dict[str, Any]:
    from distill.loop import run_distill
    from distill.types import DistillConfig

    data = phase_config(cfg, tcfg, "student", teachers["warm_start"]["checkpoint"], Path(teachers["budgets_file"]),
                         loss=cfg.student.loss, lr=cfg.student.lr, adapt=True)
    data["distill"] = {"teachers": str(Path(teachers["grid"]).resolve()), "clip": cfg.student.clip, "alpha": cfg.student.alpha}
    dc = DistillConfig.model_validate(data)
    reporter.log(f"student: MOPD on {teachers['grid']} for {_episodes(dc)} episodes"
                 + (f" + {cfg.student.alpha} x the outcome advantage, effort reward included" if cfg.student.alpha > 0
                    else " (alpha 0: no outcome term, so no effort reward; over_budget is logged)"))
    summary = run_distill(dc, Path("."), reporter=reporter)
    return {**summary, "final_weights": _final_weights(summary, dc.run_dir())}


def _baseline(cfg: GridDemoConfig, tcfg: Any, teachers: Mapping[str, Any], reporter: Reporter) -> dict[str, Any]:
    from learner.job import run_training
    from learner.train_config import TrainConfig

    data = phase_config(cfg, tcfg, "baseline", teachers["warm_start"]["checkpoint"], Path(teachers["budgets_file"]),
                         loss=cfg.baseline.loss, lr=cfg.baseline.lr, advantage=cfg.baseline.advantage, adapt=True)
    tc = TrainConfig.model_validate(data)
    reporter.log(f"baseline: multi-task RL with the effort reward for {_episodes(tc)} episodes")
    summary = run_training(tc, reporter=reporter)
    return {**summary, "final_weights": _final_weights(summary, tc.run_dir())}


def model_requests(requests: Sequence[Any], run_id: str, name: str, show_effort: bool) -> list[Any]:
    """The cells' held-out requests for the model ``name``: its own episode ids, the effort message shown or not.

    Without the message the level's thinking cap goes too (the ablation): a cap tells the level by another
    channel (attempt 5's ablation kept them, and low's 4 thinking tokens alone kept low the shortest), so
    with it the ablation could not show what the message itself does.
    """
    return [dataclasses.replace(r, show_effort=show_effort, thinking_budget=r.thinking_budget if show_effort else None,
                                episode_id=r.episode_id.replace(f"{run_id}/", f"{run_id}/{name}/", 1))
            for r in requests]


async def _evaluate_cells(
    cfg: GridDemoConfig, tcfg: Any, teachers: Mapping[str, Any], plan: Sequence[tuple[str, str, bool]], reporter: Reporter,
) -> dict[str, dict[str, dict[str, float]]]:
    """Each ``(name, checkpoint, show_effort)`` on every cell's held-out episodes, through one runner whose policy is
    given each model's weights in turn: ``{name: {cell: teachers.train.eval_row}}``.

    A cell's requests are the recipe's own evaluation requests (``learner.loop.eval_requests`` at the cell's level:
    the same seeds, harness rotation and thinking cap); every model gets the same requests and sampling seeds.
    """
    from learner.train_config import TrainConfig
    from rollout.harnesses.parsing import CALL_CLOSE
    from rollout.policy.models import load_checkpoint
    from rollout.policy.types import SamplingParams
    from rollout.runner import run_all
    from teachers.train import eval_row

    data = phase_config(cfg, tcfg, "cells", teachers["warm_start"]["checkpoint"], Path(teachers["budgets_file"]),
                         loss=LossConfig.dapo(), lr=1e-4)
    data["checkpoint"] = {"every": 0}
    tc = TrainConfig.model_validate(data)
    loop = TrainLoop(tc, tcfg.task_domains, reporter=reporter)
    sampling = SamplingParams(temperature=tc.eval.temperature, max_new_tokens=tc.rollout.sampling.max_new_tokens,
                              stop=(CALL_CLOSE,) if tc.stop_at_call_end else ())
    requests = []
    for d, tasks in tcfg.domains.items():
        for e in tcfg.efforts:
            at_e = tc.model_copy(update={"rollout": tc.rollout.model_copy(
                update={"efforts": tc.rollout.efforts.model_copy(update={"levels": (e,), "weights": None})})})
            requests += eval_requests(at_e, list(tasks), loop.run_id, 0, tag=f"cell-{d}-{e}-", sampling=sampling)
    out: dict[str, dict[str, dict[str, float]]] = {}
    try:
        await loop.runner.start(loop.task_ids)
        for version, (name, checkpoint, show) in enumerate(plan, start=1):
            lm, _ = load_checkpoint(checkpoint)
            await loop.runner.publish(version, lm.state_dict())
            reqs = model_requests(requests, loop.run_id, name, show)
            reporter.phase(f"cells: {name} ({len(reqs)} held-out episodes)", len(reqs))
            trajs = await run_all(loop.runner, reqs, lambda req, t: reporter.advance(f"{req.task_id} {req.effort}: r={t.reward:.0f}"))
            by_cell: dict[str, list[Trajectory]] = defaultdict(list)
            for t in trajs:
                by_cell[cell(tcfg.task_domains[t.task_id], str(t.effort))].append(t)
            out[name] = {c: eval_row(ts, loop.effort) for c, ts in by_cell.items()}
            reporter.log(f"cells: {name}: " + ", ".join(f"{c} {r['pass_rate']:.2f}/{r['median_tokens']:.0f}" for c, r in out[name].items()))
    finally:
        await loop.runner.close()
    return out


# ------------------------------------------------------------------ costs, from the store


def _sample_tokens(t: Trajectory) -> int:
    return sum(len(s.token_ids) for s in t.samples)


def _curve(summary: Mapping[str, Any], trajs: Sequence[Trajectory], scoring_of: Any = None, start: Cost = Cost()) -> RunCurve:
    """Cost through each iteration (K = 0: an iteration's episodes were sampled by the version before it) and the evals;
    ``start``: what the run spent before its first iteration (the adaptation SFT)."""
    per: dict[int, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        per[t.policy_version + 1].append(t)
    through = [start]
    for row in summary["rl"]:
        it = int(row["iteration"])
        ts = per.get(it, [])
        trained = [t for t in ts if t.trainable]
        learner = sum(_sample_tokens(t) for t in trained)
        step = Cost(episodes=len(ts), sampled_tokens=sum(episode_tokens(t) for t in ts), learner_tokens=learner,
                    scoring_tokens=sum(scoring_of(t) for t in trained) if scoring_of else 0,
                    wall_s=float(row.get("rollout_s", 0.0)) + float(row.get("learner_s", 0.0)))
        through.append(through[-1] + step)
    evals = tuple((int(e["iteration"]), float(e["pass_rate"])) for e in summary["evals"])
    return RunCurve(evals, tuple(through))


def _sft_tokens(trajs: Sequence[Trajectory], steps: int, batch_size: int) -> int:
    """SFT's learner tokens: steps x batch size x the mean demonstration sample length."""
    lengths = [len(s.token_ids) for t in trajs for s in t.samples]
    return round(steps * batch_size * (sum(lengths) / len(lengths))) if lengths else 0


def _costs(cfg: GridDemoConfig, tcfg: Any, teachers: Mapping[str, Any], student: Mapping[str, Any],
           baseline: Mapping[str, Any]) -> dict[str, Any]:
    from rollout.policy.models import load_checkpoint
    from rollout.store import TrajectoryStore
    from teachers.context import trajectory_contexts

    _, tokenizer = load_checkpoint(teachers["warm_start"]["checkpoint"])

    def mopd_scoring(t: Trajectory) -> int:  # the teacher's contexts, plus the student's own forward of the sample
        return sum(len(c.request.token_ids) for c in trajectory_contexts(tokenizer, t)) + _sample_tokens(t)

    with TrajectoryStore(student["store"]) as store:
        def rl_of(run_id: str) -> list[Trajectory]:
            return [t for t in store.query(run_id=run_id) if "/rl" in t.episode_id]

        def adapt_of(summary: Mapping[str, Any]) -> Cost:
            demos = [t for t in store.query(run_id=summary["run_id"]) if "/sft/" in t.episode_id]
            return Cost(episodes=len(demos), learner_tokens=_sft_tokens([t for t in demos if t.reward >= 1.0],
                                                                        cfg.adapt.steps, cfg.adapt.batch_size),
                        wall_s=float(summary["timings_s"].get("warm_start_s", 0.0)))

        s_curve = _curve(student, rl_of(student["run_id"]), mopd_scoring, adapt_of(student))
        b_curve = _curve(baseline, rl_of(baseline["run_id"]), start=adapt_of(baseline))
        cells: dict[str, Cost] = {}
        for row in teachers["cells"]:
            trajs = store.query(run_id=row["run_id"])
            demos = [t for t in trajs if "/sft/" in t.episode_id]
            rl = [t for t in trajs if "/rl" in t.episode_id]
            timings = row.get("timings_s", {})
            cells[row["cell"]] = Cost(
                episodes=len(demos) + len(rl), sampled_tokens=sum(episode_tokens(t) for t in rl),
                learner_tokens=_sft_tokens([t for t in demos if t.reward >= 1.0], row["sft"]["steps"], row["sft"]["batch_size"])
                + sum(_sample_tokens(t) for t in rl if t.trainable),
                wall_s=sum(float(timings.get(k, 0.0)) for k in ("warm_start_s", "rl_rollout_s", "rl_learner_s")))
        warm_run = teachers["warm_start"]["run_id"]
        warm = store.query(run_id=warm_run)
        demos = [t for t in warm if "/sft/" in t.episode_id]
        ws = tcfg.warm_start
        shared = Cost(episodes=len(warm), sampled_tokens=sum(episode_tokens(t) for t in warm if "/sft/" not in t.episode_id),
                      learner_tokens=_sft_tokens([t for t in demos if t.reward >= 1.0], ws.steps if tcfg.init is None else 0,
                                                 ws.batch_size),
                      wall_s=float(teachers["warm_start"]["seconds"]))
    teachers_total = sum(cells.values(), Cost())
    return {"student": s_curve, "baseline": b_curve, "teacher_cells": cells, "teachers": teachers_total, "shared": shared}


# ------------------------------------------------------------------ the report


def build_report(
    domains: Sequence[str], efforts: Sequence[str], teachers: Mapping[str, Any], cells: Mapping[str, Mapping[str, Mapping[str, float]]],
    costs: Mapping[str, Any], target_fraction: float = TARGET_FRACTION,
) -> dict[str, Any]:
    """The per-cell table, the compute table and the thresholds, from measured numbers only (pure)."""
    by_cell = {r["cell"]: r for r in teachers["cells"]}
    keys = [cell(d, e) for d in domains for e in efforts]

    def pick(source: Mapping[str, Mapping[str, float]], field: str) -> dict[str, float]:
        return {c: float(source[c][field]) for c in keys}

    init = {c: by_cell[c]["init"] for c in keys}
    teacher = {c: by_cell[c]["expert"] for c in keys}
    student, ablation, baseline = cells["student"], cells["student_no_message"], cells["baseline"]
    table = [{
        "cell": c, "init": init[c]["pass_rate"], "teacher": teacher[c]["pass_rate"], "student": student[c]["pass_rate"],
        "student_no_message": ablation[c]["pass_rate"], "baseline": baseline[c]["pass_rate"],
        "ratio": ratio(student[c]["pass_rate"], teacher[c]["pass_rate"]),
        "median_tokens": {"init": init[c]["median_tokens"], "teacher": teacher[c]["median_tokens"],
                          "student": student[c]["median_tokens"], "student_no_message": ablation[c]["median_tokens"],
                          "baseline": baseline[c]["median_tokens"]},
        "n": student[c]["n"],
    } for c in keys]
    teacher_mean = sum(teacher[c]["pass_rate"] for c in keys) / len(keys)
    target = target_fraction * teacher_mean
    compute = compute_ratios(costs["student"], costs["baseline"], costs["teachers"], target)
    checks: list[Check] = [
        check_teacher_gains(pick(init, "pass_rate"), pick(teacher, "pass_rate")),
        check_ratios(pick(student, "pass_rate"), pick(teacher, "pass_rate")),
        check_order("teachers", pick(teacher, "median_tokens"), domains, efforts),
        check_order("student, effort message", pick(student, "median_tokens"), domains, efforts),
        check_ablation_collapses(pick(ablation, "median_tokens"), domains, efforts),
        check_compute(compute),
    ]
    return {
        "domains": list(domains), "efforts": list(efforts), "cells": table,
        "means": {k: sum(r[k] for r in table) / len(table) for k in ("init", "teacher", "student", "student_no_message", "baseline")},
        "target": {"fraction": target_fraction, "teachers_mean": teacher_mean, "pass_rate": target},
        "compute": {
            "student": costs["student"].total.as_dict(), "baseline": costs["baseline"].total.as_dict(),
            "teachers": costs["teachers"].as_dict(), "student_plus_teachers": (costs["student"].total + costs["teachers"]).as_dict(),
            "shared_warm_start": costs["shared"].as_dict(),
            "teacher_cells": {c: v.as_dict() for c, v in costs["teacher_cells"].items()},
            "curves": {k: {"evals": costs[k].evals, "episodes_through": [x.episodes for x in costs[k].cost_through]}
                       for k in ("student", "baseline")},
            "to_target": compute,
        },
        "checks": [dataclasses.asdict(c) | {"verdict": "PASS" if c.passed else "FAIL"} for c in checks],
    }


def _print_report(report: Mapping[str, Any], console: Any) -> None:
    from rich.table import Table

    t = Table(title="held-out per cell: pass rate (median sampled tokens)")
    for col in ("cell", "shared init", "teacher", "student", "student / teacher", "student, no message", "baseline RL"):
        t.add_column(col)
    for r in report["cells"]:
        m = r["median_tokens"]
        t.add_row(r["cell"], f"{r['init']:.2f} ({m['init']:.0f})", f"{r['teacher']:.2f} ({m['teacher']:.0f})",
                  f"{r['student']:.2f} ({m['student']:.0f})", f"{r['ratio']:.2f}",
                  f"{r['student_no_message']:.2f} ({m['student_no_message']:.0f})", f"{r['baseline']:.2f} ({m['baseline']:.0f})")
    console.print(t)
    c = report["compute"]
    t = Table(title="compute (training only; the shared warm start apart)")
    for col in ("run", "sandbox episodes", "generated tokens", "learner tokens", "scoring-forward tokens", "wall s"):
        t.add_column(col)
    for name in ("student", "baseline", "teachers", "student_plus_teachers", "shared_warm_start"):
        x = c[name]
        t.add_row(name.replace("_", " "), str(x["episodes"]), str(x["sampled_tokens"]), str(x["learner_tokens"]),
                  str(x["scoring_tokens"]), f"{x['wall_s']:.0f}")
    console.print(t)
    tt = c["to_target"]
    console.print(f"target: {report['target']['fraction']:.0%} of the teachers' mean pass rate "
                  f"{report['target']['teachers_mean']:.2f} = {tt['target']:.2f}; student reached it after iteration "
                  f"{tt['student_iteration']} ({tt['student_to_target']['episodes']} episodes), baseline after "
                  f"{tt['baseline_iteration']} ({tt['baseline_to_target']['episodes']} episodes)")
    for ch in report["checks"]:
        console.print(f"[{'green' if ch['passed'] else 'red'}]{ch['verdict']}[/]  {ch['name']}: {ch['detail']}")


def run_demo(cfg: GridDemoConfig, tcfg: Any, *, reporter: Reporter | None = None, reuse: bool = False,
             json_path: Path | None = None) -> dict[str, Any]:
    """Every stage (see the module docstring); returns the report, also written to ``out_dir/name/report.json``."""
    from teachers.train import train_teachers

    rep: Reporter = reporter or NullReporter()
    root = cfg.root
    root.mkdir(parents=True, exist_ok=True)
    seconds: dict[str, float] = {}

    def stage(name: str, path: Path, fn: Any) -> Any:
        if reuse and path.exists():
            rep.log(f"{name}: reusing {path}")
            return json.loads(path.read_text())
        t0 = time.monotonic()
        out = fn()
        seconds[name] = round(time.monotonic() - t0, 1)
        path.write_text(json.dumps(out, indent=2, default=str) + "\n")
        return out

    t0 = time.monotonic()
    teachers = stage("teachers", root / "teachers" / "summary.json", lambda: train_teachers(tcfg, reporter=rep))
    student = stage("student", root / "student.json", lambda: _student(cfg, tcfg, teachers, rep))
    baseline = stage("baseline", root / "baseline.json", lambda: _baseline(cfg, tcfg, teachers, rep))
    plan = [("student", student["final_weights"], True), ("student_no_message", student["final_weights"], False),
            ("baseline", baseline["final_weights"], True)]
    cells = stage("cells", root / "cells.json", lambda: asyncio.run(_evaluate_cells(cfg, tcfg, teachers, plan, rep)))
    domains, efforts = list(tcfg.domains), list(tcfg.efforts)
    report = build_report(domains, efforts, teachers, cells, _costs(cfg, tcfg, teachers, student, baseline),
                          cfg.target_fraction)
    by_cell = {r["cell"]: r for r in report["cells"]}
    grid_png = plot_grid(domains, efforts, {c: r["teacher"] for c, r in by_cell.items()},
                         {c: r["student"] for c, r in by_cell.items()}, root / "grid.png")
    series = {name: {c: r["median_tokens"][key] for c, r in by_cell.items()}
              for name, key in (("teachers", "teacher"), ("student", "student"), ("student, no message", "student_no_message"),
                                ("baseline RL", "baseline"), ("shared init", "init"))}
    lengths_png = plot_lengths(domains, efforts, series, root / "lengths.png")
    report |= {"name": cfg.name, "config": cfg.model_dump(mode="json"), "runs": {
        "teachers": str(root / "teachers" / "summary.json"), "student": student["run_id"], "baseline": baseline["run_id"],
        "store": student["store"]}, "grid_png": str(grid_png), "lengths_png": str(lengths_png),
        "stage_seconds": seconds, "seconds": round(time.monotonic() - t0, 1),
        "stage_seconds_recorded": {"teachers": teachers.get("seconds"), "student": student["timings_s"].get("total_s"),
                                   "baseline": baseline["timings_s"].get("total_s")}}
    text = json.dumps(report, indent=2, default=float)
    (root / "report.json").write_text(text + "\n")
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(text + "\n")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser("python -m examples.grid_demo.run", description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("--json", type=Path, default=None, help="also write the report here")
    parser.add_argument("--reuse", action="store_true", help="read back stages whose outputs exist instead of rerunning them")
    args = parser.parse_args(argv)
    from agentenv.progress import console, phase_progress
    from teachers.types import TeacherError

    try:
        cfg, tcfg = GridDemoConfig.load(args.config)
    except (ConfigError, TeacherError) as exc:
        print(exc, file=sys.stderr)
        return 2
    with phase_progress() as reporter:
        report = run_demo(cfg, tcfg, reporter=reporter, reuse=args.reuse, json_path=args.json)
    _print_report(report, console)
    console.print(f"report: {cfg.root / 'report.json'}\npictures: {report['grid_png']}, {report['lengths_png']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
