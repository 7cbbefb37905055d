"""Rich live progress of a sweep (per policy: done / total, ETA, infrastructure errors) and its final tables."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from rollout.eval.types import Outcome, outcome_of

__all__ = ["SweepProgress", "print_tables"]


class SweepProgress:
    """``with SweepProgress(console) as p: run_sweep(cfg, on_event=p.on_event, on_start=p.on_start)``."""

    def __init__(self, console: Console) -> None:
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[detail]}"), console=console,
        )
        self.bars: dict[str, Any] = {}
        self.counts: dict[str, dict[str, int]] = {}

    def __enter__(self) -> SweepProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.__exit__(*exc)

    def on_start(self, _scheduler: Any, planned: dict[str, int], done: dict[str, int]) -> None:
        for policy, total in planned.items():
            self.counts[policy] = {o.value: 0 for o in Outcome} | {"infra_errors": 0, "reruns": 0}
            self.bars[policy] = self.progress.add_task(policy, total=total, completed=done.get(policy, 0), detail="")

    def on_event(self, event: str, req: Any, traj: Any) -> None:
        policy = getattr(req, "policy", "")
        if policy not in self.bars:
            return
        c = self.counts[policy]
        if event == "rerun":
            c["reruns"] += 1
        if event == "stored" and traj is not None:
            self.progress.advance(self.bars[policy])
            passed = traj.verifier.get("passed") if isinstance(traj.verifier.get("passed"), bool) else None
            c[outcome_of(traj.status.value, traj.reward, traj.error, passed).value] += 1
            # every infrastructure attempt this episode had: the sweep's reruns and the runner's sandbox retries
            c["infra_errors"] += len(traj.verifier.get("infra_retries") or ()) + len(traj.verifier.get("retries") or ())
        detail = (f"pass {c['passed']} fail {c['failed']} invalid {c['invalid']} infra {c['infrastructure']} "
                  f"| infra errors so far {c['infra_errors']}" + (f", worker reruns {c['reruns']}" if c["reruns"] else ""))
        self.progress.update(self.bars[policy], detail=detail)


def _f(x: Any, nd: int = 2) -> str:
    return "–" if x is None or (isinstance(x, float) and x != x) else f"{x:.{nd}f}"


def print_tables(console: Console, doc: dict[str, Any]) -> None:
    """The final terminal tables: scores by policy (with n, infra, invalid), harness x effort, frontier."""
    t = Table(title=f"eval {doc['sweep_id']}: {doc['stored']}/{doc['planned']} cells stored")
    for col in ("policy", "n", "pass rate", "SE", "95% CI", "mean reward", "infra", "invalid"):
        t.add_column(col, justify="left" if col == "policy" else "right")
    for name, s in doc["by_policy"].items():
        t.add_row(name, str(s["n"]), _f(s["pass_rate"]), _f(s["se"]), f"[{_f(s['ci_low'])}, {_f(s['ci_high'])}]",
                  _f(s["mean_reward"]), str(s["infrastructure"]), str(s["invalid"]))
    console.print(t)
    for name, p in doc["policies"].items():
        for field in ("harness", "effort", "domain"):
            bt = Table(title=f"{name} by {field}")
            for col in (field, "n", "pass rate", "SE", "infra", "invalid"):
                bt.add_column(col, justify="left" if col == field else "right")
            for k, s in p["by"][field].items():
                bt.add_row(k, str(s["n"]), _f(s["pass_rate"]), _f(s["se"]), str(s["infrastructure"]), str(s["invalid"]))
            console.print(bt)
        if len(p["pass_at_k"]) > 1:
            kt = Table(title=f"{name}: pass@k / pass^k")
            for col in ("k", "pass@k", "pass^k", "variants"):
                kt.add_column(col, justify="right")
            for q in p["pass_at_k"]:
                kt.add_row(str(q["k"]), _f(q["pass_at_k"], 3), _f(q["pass_hat_k"], 3), str(q["variants"]))
            console.print(kt)
    ft = Table(title="effort x tokens x score (* Pareto frontier)")
    for col in ("policy", "effort", "tokens/episode", "pass rate", "n", "infra", "frontier"):
        ft.add_column(col)
    for r in doc["effort_frontier"]:
        ft.add_row(r["policy"], r["effort"], _f(r["tokens"], 1), _f(r["pass_rate"]), str(r["n"]), str(r["infrastructure"]),
                   "*" if r["frontier"] else "")
    console.print(ft)
