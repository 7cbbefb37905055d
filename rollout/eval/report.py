"""What a sweep leaves behind: results.json, episodes.parquet, report.md, PNG pictures, terminal tables.

Every score printed or written here carries its n and its counts of
infrastructure and invalid episodes (``Score.cell``); nothing is dropped from a
table without a count saying so. ``load_results`` reads an ``episodes.parquet``
back into ``EpisodeResult``s, which is what ``agentenv eval compare`` uses.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from rollout.eval.stats import Score, breakdown, pareto_frontier, pass_at_k_table, score
from rollout.eval.types import EpisodeResult, Outcome, SweepConfigError

__all__ = ["cost_rows", "effort_frontier", "load_results", "summarise", "write_outputs"]

_COST_FIELDS = ("prompt_tokens", "completion_tokens", "thinking_tokens", "wall_s", "tool_calls")


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def cost_rows(results: Iterable[EpisodeResult]) -> list[dict[str, Any]]:
    """Per cell (policy, task, harness, effort): outcome counts and mean costs per episode."""
    cells: dict[tuple[str, str, str, str], list[EpisodeResult]] = defaultdict(list)
    for r in results:
        cells[(r.policy, r.task_id, r.harness, r.effort)].append(r)
    rows = []
    for (policy, task, harness, effort), rs in sorted(cells.items()):
        s = score(rs, resamples=200)
        calls = sum(r.tool_calls for r in rs)
        rows.append({
            "policy": policy, "task_id": task, "harness": harness, "effort": effort, "n": s.n,
            "infrastructure": s.infrastructure, "invalid": s.invalid, "pass_rate": s.pass_rate,
            **{f: _mean([float(getattr(r, f)) for r in rs]) for f in _COST_FIELDS},
            "tool_errors": _mean([float(r.tool_errors) for r in rs]),
            "tool_error_rate": sum(r.tool_errors for r in rs) / calls if calls else 0.0,
        })
    return rows


def effort_frontier(results: Iterable[EpisodeResult]) -> list[dict[str, Any]]:
    """Per policy x effort: mean tokens (prompt + completion + thinking) per episode, pass rate, and
    whether the point is on the policy's Pareto frontier (fewer tokens, higher score)."""
    groups: dict[tuple[str, str], list[EpisodeResult]] = defaultdict(list)
    for r in results:
        groups[(r.policy, r.effort)].append(r)
    rows: list[dict[str, Any]] = []
    for (policy, effort), rs in sorted(groups.items()):
        s = score(rs, resamples=200)
        tokens = _mean([float(r.prompt_tokens + r.completion_tokens + r.thinking_tokens) for r in rs])
        rows.append({"policy": policy, "effort": effort, "tokens": tokens,
                     "completion_tokens": _mean([float(r.completion_tokens) for r in rs]),
                     "thinking_tokens": _mean([float(r.thinking_tokens) for r in rs]),
                     "pass_rate": s.pass_rate, "n": s.n, "infrastructure": s.infrastructure, "invalid": s.invalid})
    for policy in {r["policy"] for r in rows}:
        mine = [row for row in rows if row["policy"] == policy]
        front = set(pareto_frontier([(row["effort"], row["tokens"], row["pass_rate"]) for row in mine]))
        for row in mine:
            row["frontier"] = row["effort"] in front
    return rows


def harness_tool_errors(results: Iterable[EpisodeResult]) -> list[dict[str, Any]]:
    """The cross-harness table: per policy x harness, tool calls, tool errors and their rate."""
    groups: dict[tuple[str, str], list[EpisodeResult]] = defaultdict(list)
    for r in results:
        groups[(r.policy, r.harness)].append(r)
    out = []
    for (policy, harness), rs in sorted(groups.items()):
        calls, errors = sum(r.tool_calls for r in rs), sum(r.tool_errors for r in rs)
        out.append({"policy": policy, "harness": harness, "episodes": len(rs), "tool_calls": calls,
                    "tool_errors": errors, "tool_error_rate": errors / calls if calls else 0.0})
    return out


def _scores(d: dict[Any, Score]) -> dict[str, Any]:
    return {str(k): v.as_dict() for k, v in d.items()}


def summarise(results: list[EpisodeResult], *, resamples: int = 1000, seed: int = 0) -> dict[str, Any]:
    """The numbers of results.json: per policy its score, pass@k, breakdowns; then costs and frontier."""
    per_policy: dict[str, list[EpisodeResult]] = defaultdict(list)
    for r in results:
        per_policy[r.policy].append(r)
    policies = {}
    for name, rs in per_policy.items():
        policies[name] = {
            "score": score(rs, resamples=resamples, seed=seed).as_dict(),
            "pass_at_k": [vars(p) for p in pass_at_k_table(rs)],
            "by": {f: _scores(breakdown(rs, f, resamples=resamples, seed=seed))
                   for f in ("domain", "task_id", "harness", "effort")},
            "outcomes": {o.value: sum(r.outcome is o for r in rs) for o in Outcome},
        }
    return {
        "policies": policies,
        "by_policy": _scores(breakdown(results, "policy", resamples=resamples, seed=seed)),
        "cells": cost_rows(results),
        "effort_frontier": effort_frontier(results),
        "harness_tool_errors": harness_tool_errors(results),
    }


def _fmt(x: float, nd: int = 2) -> str:
    return "–" if isinstance(x, float) and math.isnan(x) else f"{x:.{nd}f}"


def _md_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _score_row(name: str, s: dict[str, Any]) -> list[str]:
    return [name, str(s["n"]), _fmt(s["pass_rate"]), _fmt(s["se"]), f"[{_fmt(s['ci_low'])}, {_fmt(s['ci_high'])}]",
            _fmt(s["mean_reward"]), str(s["infrastructure"]), str(s["invalid"])]


SCORE_HEADERS = ("", "n", "pass rate", "SE (clustered)", "95% CI (bootstrap)", "mean reward", "infra", "invalid")


def report_md(summary: dict[str, Any], meta: dict[str, Any]) -> str:
    out = [f"# Eval sweep `{meta['sweep_id']}`", "",
           f"{meta['planned']} planned cells, {meta['stored']} stored, {len(meta['missing'])} missing; "
           f"this run: {meta['counters'].get('ran', 0)} ran, {meta['counters'].get('skipped', 0)} already stored, "
           f"{meta['counters'].get('infra_retries', 0)} infrastructure reruns, "
           f"{meta['counters'].get('worker_reruns', 0)} reruns after a lost worker.",
           "", "Scores are over passed + failed episodes; infrastructure and invalid ones are counted beside them, "
           "never as failures. SEs are clustered by variant (task, seed, harness, effort).", "",
           "## By policy", "", _md_table(SCORE_HEADERS, [_score_row(k, v) for k, v in summary["by_policy"].items()])]
    for name, p in summary["policies"].items():
        out += ["", f"## {name}", "", "pass@k (unbiased) and pass^k over variants with at least k scored samples:", "",
                _md_table(("k", "pass@k", "pass^k", "variants"),
                          [[q["k"], _fmt(q["pass_at_k"], 3), _fmt(q["pass_hat_k"], 3), q["variants"]] for q in p["pass_at_k"]])]
        for f in ("domain", "harness", "effort", "task_id"):
            out += ["", f"By {f}:", "", _md_table(SCORE_HEADERS, [_score_row(k, v) for k, v in p["by"][f].items()])]
    out += ["", "## Effort x tokens x score (mean tokens per episode; * = on the Pareto frontier)", "",
            _md_table(("policy", "effort", "tokens", "completion", "thinking", "pass rate", "n", "infra", "invalid", "frontier"),
                      [[r["policy"], r["effort"], _fmt(r["tokens"], 1), _fmt(r["completion_tokens"], 1),
                        _fmt(r["thinking_tokens"], 1), _fmt(r["pass_rate"]), r["n"], r["infrastructure"], r["invalid"],
                        "*" if r["frontier"] else ""] for r in summary["effort_frontier"]]),
            "", "## Tool errors by harness", "",
            _md_table(("policy", "harness", "episodes", "tool calls", "tool errors", "errors per call"),
                      [[r["policy"], r["harness"], r["episodes"], r["tool_calls"], r["tool_errors"], _fmt(r["tool_error_rate"], 3)]
                       for r in summary["harness_tool_errors"]]),
            "", "## Costs per cell (means per episode)", "",
            _md_table(("policy", "task", "harness", "effort", "n", "infra", "invalid", "pass", "prompt tok", "completion tok",
                       "thinking tok", "wall s", "tool calls", "tool err rate"),
                      [[r["policy"], r["task_id"], r["harness"], r["effort"], r["n"], r["infrastructure"], r["invalid"],
                        _fmt(r["pass_rate"]), _fmt(r["prompt_tokens"], 0), _fmt(r["completion_tokens"], 0),
                        _fmt(r["thinking_tokens"], 0), _fmt(r["wall_s"]), _fmt(r["tool_calls"], 1), _fmt(r["tool_error_rate"], 3)]
                       for r in summary["cells"]])]
    if meta.get("pictures"):
        out += ["", "## Pictures", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in meta["pictures"]]
    return "\n".join(out) + "\n"


def _heatmap(ax: Any, rows: list[str], cols: list[str], values: dict[Any, float], title: str) -> None:
    import numpy as np

    grid = np.array([[values.get((r, c), float("nan")) for c in cols] for r in rows], dtype=float)
    im = ax.imshow(np.ma.masked_invalid(grid), vmin=0.0, vmax=1.0, cmap="RdYlGn", aspect="auto")
    ax.set_xticks(range(len(cols)), cols, rotation=30, ha="right", fontsize=7)
    ax.set_yticks(range(len(rows)), rows, fontsize=7)
    for i in range(len(rows)):
        for j in range(len(cols)):
            v = grid[i, j]
            ax.text(j, i, "–" if np.isnan(v) else f"{v:.2f}", ha="center", va="center", fontsize=6)
    ax.set_title(title, fontsize=9)
    return im


def pictures(results: list[EpisodeResult], out: Path) -> list[Path]:
    """Pass-rate heatmaps (task x harness per policy; domain x effort per policy) and the tokens-vs-score
    frontier by effort, as PNG files in ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    policies = sorted({r.policy for r in results})
    for policy in policies:
        rs = [r for r in results if r.policy == policy]
        tasks, harnesses = sorted({r.task_id for r in rs}), sorted({r.harness for r in rs})
        vals = {k: s.pass_rate for k, s in breakdown(rs, lambda r: (r.task_id, r.harness), resamples=100).items()}
        fig, ax = plt.subplots(figsize=(2 + 1.2 * len(harnesses), 1 + 0.35 * len(tasks)))
        _heatmap(ax, tasks, harnesses, vals, f"{policy}: pass rate, task x harness")
        fig.tight_layout()
        path = out / f"heatmap_task_harness_{policy}.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    fig, axes = plt.subplots(1, len(policies), figsize=(3.5 * len(policies), 2.8), squeeze=False)
    for ax, policy in zip(axes[0], policies):
        rs = [r for r in results if r.policy == policy]
        domains, efforts = sorted({r.domain for r in rs}), sorted({r.effort for r in rs})
        vals = {k: s.pass_rate for k, s in breakdown(rs, lambda r: (r.domain, r.effort), resamples=100).items()}
        _heatmap(ax, domains, efforts, vals, f"{policy}: domain x effort")
    fig.tight_layout()
    path = out / "heatmap_domain_effort.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    written.append(path)
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for policy in policies:
        rows = [r for r in effort_frontier(results) if r["policy"] == policy]
        xs, ys = [r["tokens"] for r in rows], [r["pass_rate"] for r in rows]
        ax.scatter(xs, ys, label=policy)
        for r in rows:
            ax.annotate(r["effort"], (r["tokens"], r["pass_rate"]), fontsize=7)
        front = sorted((r["tokens"], r["pass_rate"]) for r in rows if r["frontier"])
        if front:
            ax.plot([f[0] for f in front], [f[1] for f in front], "--", linewidth=1)
    ax.set_xlabel("mean tokens per episode (prompt + completion + thinking)")
    ax.set_ylabel("pass rate")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title("tokens vs score by effort (dashed: Pareto frontier)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = out / "frontier_tokens_score.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    written.append(path)
    return written


def write_parquet(results: list[EpisodeResult], path: Path) -> None:
    """One row per planned cell's episode; pandas and ``datasets`` load it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tmp = path.with_name(path.name + ".partial")
    pq.write_table(pa.Table.from_pylist([r.row() for r in results]), tmp)
    tmp.replace(path)


def load_results(path: str | Path) -> list[EpisodeResult]:
    """``EpisodeResult``s from a sweep's output folder or its ``episodes.parquet``."""
    import pyarrow.parquet as pq

    p = Path(path)
    if p.is_dir():
        p = p / "episodes.parquet"
    if not p.is_file():
        raise SweepConfigError(f"{path}: expected a sweep output folder holding episodes.parquet, or that file; found none")
    fields = set(EpisodeResult.__dataclass_fields__)
    out = []
    for row in pq.read_table(p).to_pylist():
        kw = {k: v for k, v in row.items() if k in fields}
        kw["outcome"] = Outcome(kw["outcome"])
        kw["extra"] = json.loads(kw.get("extra") or "{}")
        out.append(EpisodeResult(**kw))
    return out


def write_outputs(run: Any, out: Path, *, json_path: Path | None = None, with_pictures: bool = True) -> dict[str, Any]:
    """results.json, episodes.parquet, report.md and the PNGs of a ``SweepRun`` into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    cfg = run.cfg
    summary = summarise(run.results, resamples=cfg.stats.resamples, seed=cfg.stats.seed)
    pics = [str(p) for p in pictures(run.results, out)] if with_pictures and run.results else []
    meta = {"sweep_id": cfg.sweep_id, "store": cfg.store, "planned": len(run.planned), "stored": len(run.results),
            "missing": run.missing, "complete": run.complete, "counters": run.counters, "pictures": pics,
            "config": cfg.model_dump(mode="json")}
    doc = {**meta, **summary}
    text = json.dumps(doc, indent=2, sort_keys=True, default=str)
    (out / "results.json").write_text(text)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(text)
    write_parquet(run.results, out / "episodes.parquet")
    (out / "report.md").write_text(report_md(summary, meta))
    return doc
