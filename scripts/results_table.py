"""Render the README's results table (and docs/training.md's seed table) from docs/results.json.

    python scripts/results_table.py            # rewrite the tables between their markers
    python scripts/results_table.py --check    # exit 1 if a table is not the rendering

The README shows every headline number exactly once, in this table, and the table is generated, so
two sections can never give two results for the same run. To record a new result, edit
docs/results.json (and add the run to dev/LOG.md), then rerun this script.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results.json"
README = ROOT / "README.md"
TRAINING = ROOT / "docs" / "training.md"
START, END = "<!-- results:start -->", "<!-- results:end -->"


def _span(values: list[float], fmt: str = "{:.2f}") -> str:
    lo, hi = min(values), max(values)
    return fmt.format(lo) if lo == hi else f"{fmt.format(lo)}-{fmt.format(hi)}"


def _pts(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return f"+{lo:.1f}" if lo == hi else f"+{lo:.1f} to +{hi:.1f}"


def _main_job(r: dict[str, Any]) -> str:
    seeds = r["seeds"]
    s = [v["sampled"] for v in seeds.values()]
    g = [v["greedy"] for v in seeds.values()]
    gain_s = [v["gain_points"]["sampled"] for v in seeds.values()]
    gain_g = [v["gain_points"]["greedy"] for v in seeds.values()]
    wall = [v["wall_s"] for v in seeds.values()]
    return (f"sampled (T = 0.7) **{_pts(gain_s)} points** ({_span([x[0] for x in s])} -> {_span([x[-1] for x in s])}), "
            f"greedy **{_pts(gain_g)}** ({_span([x[0] for x in g])} -> {_span([x[-1] for x in g])}); "
            f"seeds {', '.join(seeds)}; {_span(wall, '{:.0f}')} s a run")


def _rollout(r: dict[str, Any]) -> str:
    ratios = ", ".join(f"{x:.2f}x" for x in r["ratios"])
    return f"**{ratios}** episodes/s over {len(r['ratios'])} runs (target >= {r['target']:g}x)"


def _sandbox(r: dict[str, Any]) -> str:
    return "; ".join(f"{name} **{ratio:g}**" for name, ratio in r["ratios"].items())


def _learner_gpu(r: dict[str, Any]) -> str:
    return (f"**{r['tokens_per_s'] / 1000:.1f}k tokens/s, {100 * r['mfu']:.1f}% MFU**, "
            f"{r['vs_padded_hf_loop']:.2f}x a padded Hugging Face loop")


def _mopd_gpu(r: dict[str, Any]) -> str:
    return (f"LoRA grid **{r['lora_tokens_per_s_vs_copies']:.3f}x** the copies' tokens/s at "
            f"**{r['lora_peak_memory_vs_copies']:.3f}x** their peak memory; MOPD step {100 * r['mopd_step_mfu']:.1f}% MFU "
            f"vs RL's {100 * r['rl_step_mfu']:.1f}%")


def _grid(r: dict[str, Any]) -> str:
    cells = r["cells"]
    ratio = {name: c["student"] / c["teacher"] for name, c in cells.items()}
    good = [v for v in ratio.values() if v >= 0.9]
    short = ", ".join(f"{name} {v:.2f}" for name, v in ratio.items() if v < 0.9)
    m = r["mean"]
    text = (f"student / teacher **{_span(good)} in {len(good)} of {len(cells)} cells**"
            + (f" ({short})" if short else "")
            + f"; mean pass: student {m['student']:.2f}, teachers {m['teacher']:.2f}, "
            f"multi-task RL baseline {m['baseline']:.2f}, shared init {m['init']:.2f}")
    return text


def _engine_gpu(r: dict[str, Any]) -> str:
    return (f"at 72 turns **{r['tokens_per_s_72']:,} tokens/s**, {r['vs_episode_path_72']:.0f}x one turn at a time and "
            f"{r['vs_generate_72']:.1f}x batched `generate`; at 256 turns **{r['tokens_per_s_256']:,} tokens/s**")


def _weight_sync_gpu(r: dict[str, Any]) -> str:
    return "; ".join(f"{name} **{secs:g} s**" for name, secs in r["seconds"].items()) + " a version"


ROWS = (("main_job", _main_job), ("rollout_bench", _rollout), ("sandbox_bench", _sandbox),
        ("grid_demo", _grid), ("learner_gpu", _learner_gpu), ("mopd_gpu", _mopd_gpu), ("engine_gpu", _engine_gpu),
        ("weight_sync_gpu", _weight_sync_gpu))


def render(results: dict[str, Any]) -> str:
    """The Markdown table, one row per result, in a fixed order."""
    lines = ["| result | measured | run |", "| --- | --- | --- |"]
    for key, fmt in ROWS:
        r = results[key]
        caveat = f"; {r['caveat']}" if r.get("caveat") else ""
        lines.append(f"| {r['what']} (`{r['command']}`) | {fmt(r)} | {r['date']}, {r['machine']}{caveat} |")
    return "\n".join(lines)


def render_seeds(results: dict[str, Any]) -> str:
    """docs/training.md's per-seed table of the main job."""
    lines = ["| seed | sampled: warm start -> 5 -> 10 | greedy: warm start -> 5 -> 10 | wall |", "| --- | --- | --- | --- |"]
    for seed, v in results["main_job"]["seeds"].items():
        curves = []
        for kind in ("sampled", "greedy"):
            *first, last = (f"{x:.2f}" for x in v[kind])
            curves.append(f"{' -> '.join(first)} -> **{last}** (+{v['gain_points'][kind]:.1f})")
        lines.append(f"| {seed} | {curves[0]} | {curves[1]} | {v['wall_s']} s |")
    return "\n".join(lines)


def targets(results: dict[str, Any]) -> list[tuple[Path, str]]:
    """Each generated file with its table."""
    return [(README, render(results)), (TRAINING, render_seeds(results))]


def splice(readme: str, table: str) -> str:
    """``readme`` with the text between the markers replaced by ``table``."""
    head, rest = readme.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{table}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a table differs from its rendering")
    args = parser.parse_args(argv)
    stale = []
    for path, table in targets(json.loads(RESULTS.read_text())):
        text = path.read_text()
        want = splice(text, table)
        if want != text:
            stale.append(path.relative_to(ROOT))
            if not args.check:
                path.write_text(want)
    if args.check:
        for path in stale:
            print(f"{path}: its results table differs from docs/results.json: run python scripts/results_table.py")
        return 1 if stale else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
