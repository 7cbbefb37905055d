"""Tree rollouts against plain GRPO, seed by seed: held-out gain against what each arm spent; a PNG of both.

``python -m examples.branching.compare --plain P0.json P1.json ... --tree T0.json T1.json ... [--png PATH]
[--json PATH] [--max-cost 0.6] [--gain-tolerance 0]``

Each file is what ``agentenv train ... --json`` wrote for ``examples/branching/plain.yaml`` or
``tree.yaml`` (``--plain`` and ``--tree`` pair up by position: the same seed). Costs come from the
rl rows: generated tokens and sandbox-seconds per group (``gen_tokens_per_group``,
``per_group_sandbox_s``), summed over the run's iterations (both arms run the same groups per iteration), and the tokens the learner forwarded
(``forward_tokens``; none in an iteration whose groups all had one reward). Issue 29's goal, per seed: the tree's held-out sampled gain at least the
plain arm's (less ``--gain-tolerance`` points) with at most ``--max-cost`` of its generated tokens and
of its sandbox-seconds. Sandbox-seconds are wall time, so compare arms that ran side by side.
The PNG: held-out sampled pass rate per iteration of every run, and the training rollouts' pass rate
against the cumulative generated tokens.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from examples.seed_sweep.seeds import load_summary, save_png, seed_rows

__all__ = ["ArmCost", "PairRow", "arm_cost", "pair_rows", "plot_pairs", "verdict"]


@dataclass(frozen=True)
class ArmCost:
    gen_tokens: float
    sandbox_s: float
    forward_tokens: float


def arm_cost(summary: dict[str, Any], path: Path) -> ArmCost:
    rows = summary["rl"]
    missing = [k for k in ("gen_tokens_per_group", "per_group_sandbox_s") if any(k not in r for r in rows)]
    if missing:
        raise SystemExit(f"{path}: rl rows lack {missing}: a run from before the tree costs were recorded")
    return ArmCost(  # per group, summed over iterations: both arms run the same groups per iteration
        gen_tokens=sum(r["gen_tokens_per_group"] for r in rows),
        sandbox_s=sum(r["per_group_sandbox_s"] for r in rows),
        forward_tokens=float(sum(r.get("forward_tokens", 0) for r in rows)),  # absent: an iteration with nothing to train
    )


@dataclass(frozen=True)
class PairRow:
    seed: int
    plain_run: str
    tree_run: str
    plain_gain: float
    tree_gain: float
    plain_greedy_gain: float | None
    tree_greedy_gain: float | None
    gen_tokens_ratio: float
    sandbox_s_ratio: float
    forward_tokens_ratio: float


def pair_rows(plain: list[tuple[Path, dict[str, Any]]], tree: list[tuple[Path, dict[str, Any]]]) -> list[PairRow]:
    if len(plain) != len(tree):
        raise SystemExit(f"--plain has {len(plain)} runs and --tree {len(tree)}: pair them seed by seed")
    out: list[PairRow] = []
    for (pp, p), (tp, t) in zip(plain, tree, strict=True):
        if p.get("seed") is not None and t.get("seed") is not None and p["seed"] != t["seed"]:
            raise SystemExit(f"{pp} (seed {p['seed']}) and {tp} (seed {t['seed']}) are not the same seed")
        (rp,), (rt,) = seed_rows([p]), seed_rows([t])
        seed = next((int(s["seed"]) for s in (p, t) if s.get("seed") is not None), len(out))
        cp, ct = arm_cost(p, pp), arm_cost(t, tp)
        out.append(PairRow(
            seed=seed, plain_run=rp.run_id, tree_run=rt.run_id,
            plain_gain=rp.sampled_gain, tree_gain=rt.sampled_gain,
            plain_greedy_gain=rp.greedy_gain, tree_greedy_gain=rt.greedy_gain,
            gen_tokens_ratio=ct.gen_tokens / cp.gen_tokens, sandbox_s_ratio=ct.sandbox_s / cp.sandbox_s,
            forward_tokens_ratio=ct.forward_tokens / cp.forward_tokens,
        ))
    return out


def verdict(rows: list[PairRow], max_cost: float, tolerance: float) -> list[str]:
    """Each seed's breaches of the goal; empty when every seed meets it."""
    bad = []
    for r in rows:
        if r.tree_gain < r.plain_gain - tolerance:
            bad.append(f"seed {r.seed}: tree gain {r.tree_gain:+.1f} < plain {r.plain_gain:+.1f} - {tolerance:g}")
        if r.gen_tokens_ratio > max_cost:
            bad.append(f"seed {r.seed}: generated tokens {r.gen_tokens_ratio:.2f}x > {max_cost:g}x")
        if r.sandbox_s_ratio > max_cost:
            bad.append(f"seed {r.seed}: sandbox-seconds {r.sandbox_s_ratio:.2f}x > {max_cost:g}x")
    return bad


def plot_pairs(plain: list[dict[str, Any]], tree: list[dict[str, Any]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(11, 4))
    for runs, color, label in ((plain, "tab:blue", "plain GRPO"), (tree, "tab:green", "tree")):
        for i, s in enumerate(runs):
            marker = "osD^v<>"[i % 7]
            name = f"{label}, seed {s.get('seed', i)}"
            ax0.plot([e["iteration"] for e in s["evals"]], [e["pass_rate"] for e in s["evals"]], f"{marker}-", color=color,
                     alpha=0.8, label=name)
            spent, xs, ys = 0.0, [], []
            for r in s["rl"]:
                spent += r["gen_tokens_per_group"]
                xs.append(spent / 1000.0)
                ys.append(r["pass_rate"])
            ax1.plot(xs, ys, f"{marker}-", color=color, alpha=0.8, markersize=3, label=name)
    ax0.set(title="held-out pass rate (sampled)", xlabel="RL iteration", ylabel="pass rate", ylim=(-0.02, 1.02))
    ax1.set(title="training rollouts' pass rate (verifier)", xlabel="generated tokens per group, cumulative (thousands)",
            ylabel="pass rate", ylim=(-0.02, 1.02))
    for ax in (ax0, ax1):
        ax.legend(loc="best", fontsize=8)
    return save_png(fig, path)


def _print(rows: list[PairRow]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="tree rollouts against plain GRPO (held-out sampled gain, points; tree cost / plain cost)")
    for col in ("seed", "plain gain", "tree gain", "greedy plain / tree", "generated tokens", "sandbox-s", "learner tokens"):
        table.add_column(col)
    for r in rows:
        greedy = "/".join("-" if g is None else f"{g:+.1f}" for g in (r.plain_greedy_gain, r.tree_greedy_gain))
        table.add_row(str(r.seed), f"{r.plain_gain:+.1f}", f"{r.tree_gain:+.1f}", greedy, f"{r.gen_tokens_ratio:.2f}x",
                      f"{r.sandbox_s_ratio:.2f}x", f"{r.forward_tokens_ratio:.2f}x")
    Console(width=120).print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.branching.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("--plain", nargs="+", type=Path, required=True, help="plain.yaml summaries, one per seed")
    parser.add_argument("--tree", nargs="+", type=Path, required=True, help="tree.yaml summaries, the same seeds in order")
    parser.add_argument("--png", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--max-cost", type=float, default=0.6, help="tree / plain, tokens and sandbox-s (default 0.6)")
    parser.add_argument("--gain-tolerance", type=float, default=0.0, help="points the tree may fall short (default 0)")
    args = parser.parse_args(argv)
    plain = [(p, load_summary(p)) for p in args.plain]
    tree = [(p, load_summary(p)) for p in args.tree]
    rows = pair_rows(plain, tree)
    _print(rows)
    bad = verdict(rows, args.max_cost, args.gain_tolerance)
    print("goal met by every seed" if not bad else "goal NOT met:\n  " + "\n  ".join(bad))
    if args.png:
        print(f"curves: {plot_pairs([s for _, s in plain], [s for _, s in tree], args.png)}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"max_cost": args.max_cost, "gain_tolerance": args.gain_tolerance,
                                         "goal_met": not bad, "breaches": bad, "seeds": [asdict(r) for r in rows]}, indent=2))
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
