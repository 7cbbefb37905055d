"""Sweep statistics: scores with honest denominators, pass@k / pass^k, clustered errors, bootstrap, paired tests.

Everything here is a pure function of ``EpisodeResult`` lists (or plain numbers),
each with a hand-computed unit test (``tests/rollout/eval/test_stats.py``).

* **Denominator.** A score is over *scored* episodes (passed + failed). Invalid
  and infrastructure episodes are never in it, and never silently dropped:
  every ``Score`` carries their counts, and every table prints them beside n.
* **pass@k** (Chen et al. 2021, the unbiased Codex estimator) per variant with
  n scored samples of which c passed: ``1 - C(n-c, k) / C(n, k)``, computed as
  the product ``prod_{i=n-c+1}^{n} (1 - k/i)`` (no huge binomials), averaged
  over variants with ``n >= k``. **pass^k** (tau-bench's reliability):
  ``C(c, k) / C(n, k)``, the chance that k samples drawn without replacement
  all pass.
* **Clustered standard error.** Samples of one task variant (task, seed,
  harness, effort) are correlated, so the SE of a mean uses the cluster-robust
  (CR1) form ``Var = G/(G-1) * sum_g (sum_{i in g} (x_i - xbar))^2 / N^2``; with
  one observation per cluster it is the usual ``s / sqrt(N)``.
* **Bootstrap.** 95% percentile intervals resample whole clusters with a fixed
  seed, so the same data always give the same interval.
* **Paired comparison.** Two policies (or runs) on the same cells (task, seed,
  harness, effort, sample index): the mean of ``B - A``, a paired cluster
  bootstrap interval, McNemar's exact p-value on the discordant pairs, and the
  number of pairs a two-sided test at alpha 0.05 would need for 80% power at
  the observed effect, ``n = ((z_{0.975} + z_{0.8}) * sd(d) / mean(d))^2``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

from rollout.eval.types import EpisodeResult, Outcome, SweepConfigError

__all__ = [
    "Comparison",
    "PassAtK",
    "Score",
    "bootstrap_ci",
    "breakdown",
    "clustered_se",
    "compare",
    "mcnemar_p",
    "pareto_frontier",
    "pass_at_k",
    "pass_at_k_table",
    "pass_hat_k",
    "samples_needed",
    "score",
]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c passes: ``1 - C(n-c, k) / C(n, k)``."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise SweepConfigError(f"pass_at_k: expected 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def pass_hat_k(n: int, c: int, k: int) -> float:
    """pass^k: the chance that k of the n samples, drawn without replacement, all pass: ``C(c,k)/C(n,k)``."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise SweepConfigError(f"pass_hat_k: expected 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    return math.comb(c, k) / math.comb(n, k)


def _cluster_arrays(values: Sequence[float], clusters: Sequence[Hashable]) -> tuple[np.ndarray, np.ndarray]:
    if len(values) != len(clusters):
        raise SweepConfigError(f"clusters: expected one cluster label per value ({len(values)}), got {len(clusters)}")
    sums: dict[Hashable, float] = defaultdict(float)
    sizes: dict[Hashable, int] = defaultdict(int)
    for v, g in zip(values, clusters):
        sums[g] += float(v)
        sizes[g] += 1
    order = list(sums)
    return np.array([sums[g] for g in order]), np.array([sizes[g] for g in order], dtype=float)


def clustered_se(values: Sequence[float], clusters: Sequence[Hashable] | None = None) -> float:
    """Cluster-robust (CR1) standard error of the mean; ``clusters`` None: one cluster per value."""
    n = len(values)
    if n < 2:
        return float("nan")
    clusters = list(range(n)) if clusters is None else clusters
    x = np.asarray(values, dtype=float)
    mean = x.mean()
    sums, sizes = _cluster_arrays(list(x - mean), clusters)
    g = len(sums)
    if g < 2:
        return float("nan")
    return float(math.sqrt(g / (g - 1) * float((sums**2).sum())) / n)


def bootstrap_ci(
    values: Sequence[float],
    clusters: Sequence[Hashable] | None = None,
    *,
    resamples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float]:
    """Percentile interval of the mean, resampling whole clusters ``resamples`` times from ``seed``."""
    if not values:
        return (float("nan"), float("nan"))
    clusters = list(range(len(values))) if clusters is None else clusters
    sums, sizes = _cluster_arrays(values, clusters)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(sums), size=(resamples, len(sums)))
    means = sums[idx].sum(axis=1) / sizes[idx].sum(axis=1)
    alpha = (1.0 - level) / 2
    lo, hi = np.quantile(means, [alpha, 1.0 - alpha])
    return (float(lo), float(hi))


@dataclass(frozen=True)
class Score:
    """A score and its denominator: ``n`` scored episodes, with invalid and infrastructure counted apart."""

    n: int
    passed: int
    failed: int
    invalid: int
    infrastructure: int
    pass_rate: float
    mean_reward: float
    se: float
    ci_low: float
    ci_high: float
    clusters: int

    @property
    def total(self) -> int:
        return self.n + self.invalid + self.infrastructure

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def cell(self) -> str:
        """``0.83 ± 0.05 (n=24; 1 infra, 0 invalid)`` for tables."""
        if self.n == 0:
            return f"– (n=0; {self.infrastructure} infra, {self.invalid} invalid)"
        se = "" if math.isnan(self.se) else f" ± {self.se:.2f}"
        return f"{self.pass_rate:.2f}{se} (n={self.n}; {self.infrastructure} infra, {self.invalid} invalid)"


def score(results: Iterable[EpisodeResult], *, resamples: int = 1000, seed: int = 0) -> Score:
    """Pass rate and mean reward over the scored episodes, SE clustered by variant, bootstrap 95% CI."""
    rs = list(results)
    scored = [r for r in rs if r.scored]
    passed = sum(r.outcome is Outcome.PASSED for r in scored)
    values = [1.0 if r.outcome is Outcome.PASSED else 0.0 for r in scored]
    clusters = [r.variant for r in scored]
    lo, hi = bootstrap_ci(values, clusters, resamples=resamples, seed=seed) if scored else (float("nan"),) * 2
    return Score(
        n=len(scored),
        passed=passed,
        failed=len(scored) - passed,
        invalid=sum(r.outcome is Outcome.INVALID for r in rs),
        infrastructure=sum(r.outcome is Outcome.INFRASTRUCTURE for r in rs),
        pass_rate=passed / len(scored) if scored else float("nan"),
        mean_reward=float(np.mean([r.reward for r in scored])) if scored else float("nan"),
        se=clustered_se(values, clusters),
        ci_low=lo,
        ci_high=hi,
        clusters=len(set(clusters)),
    )


def breakdown(
    results: Iterable[EpisodeResult], by: str | Callable[[EpisodeResult], Hashable], **kw: Any
) -> dict[Hashable, Score]:
    """``Score`` per value of a field (``"domain"``, ``"task_id"``, ``"harness"``, ``"effort"``, ``"policy"``)."""
    key = (lambda r: getattr(r, by)) if isinstance(by, str) else by
    groups: dict[Hashable, list[EpisodeResult]] = defaultdict(list)
    for r in results:
        groups[key(r)].append(r)
    return {k: score(v, **kw) for k, v in sorted(groups.items(), key=lambda kv: str(kv[0]))}


@dataclass(frozen=True)
class PassAtK:
    k: int
    pass_at_k: float
    pass_hat_k: float
    variants: int  # variants with at least k scored samples


def pass_at_k_table(results: Iterable[EpisodeResult]) -> list[PassAtK]:
    """pass@k and pass^k for every k up to the most scored samples any variant has."""
    per: dict[tuple[Any, ...], list[bool]] = defaultdict(list)
    for r in results:
        if r.scored:
            per[r.variant].append(r.outcome is Outcome.PASSED)
    if not per:
        return []
    out = []
    for k in range(1, max(len(v) for v in per.values()) + 1):
        ok = [(len(v), sum(v)) for v in per.values() if len(v) >= k]
        out.append(
            PassAtK(
                k,
                float(np.mean([pass_at_k(n, c, k) for n, c in ok])),
                float(np.mean([pass_hat_k(n, c, k) for n, c in ok])),
                len(ok),
            )
        )
    return out


def mcnemar_p(b: int, c: int) -> float:
    """Exact two-sided McNemar p-value from the discordant counts (A-only passes b, B-only passes c)."""
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2**n
    return min(1.0, 2.0 * tail)


def samples_needed(diffs: Sequence[float], *, alpha: float = 0.05, power: float = 0.8) -> float:
    """Pairs a two-sided paired test needs to detect the observed mean difference (inf when it is 0)."""
    d = np.asarray(diffs, dtype=float)
    if len(d) < 2:
        return float("inf")
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    if mean == 0.0:
        return float("inf")
    z = NormalDist().inv_cdf(1 - alpha / 2) + NormalDist().inv_cdf(power)
    return float(math.ceil((z * sd / mean) ** 2)) if sd > 0 else 2.0


@dataclass(frozen=True)
class Comparison:
    """B minus A on the cells both scored. ``only_a`` / ``only_b`` / ``unscored`` say what was left out."""

    a: str
    b: str
    pairs: int
    a_rate: float
    b_rate: float
    diff: float
    ci_low: float
    ci_high: float
    a_only: int  # A passed, B failed
    b_only: int  # B passed, A failed
    mcnemar_p: float
    needed: float  # pairs needed for 80% power at the observed effect
    more_needed: float
    only_a: int
    only_b: int
    unscored: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _pair_key(r: EpisodeResult) -> tuple[Any, ...]:
    return (r.task_id, r.seed, r.harness, r.effort, r.sample)


def compare(
    a: Iterable[EpisodeResult], b: Iterable[EpisodeResult], *, names: tuple[str, str] = ("A", "B"),
    resamples: int = 2000, seed: int = 0,
) -> Comparison:
    """Paired comparison of two result sets on their shared cells; see the module docstring."""
    ka = {_pair_key(r): r for r in a}
    kb = {_pair_key(r): r for r in b}
    shared = sorted(set(ka) & set(kb), key=str)
    both = [(ka[k], kb[k]) for k in shared if ka[k].scored and kb[k].scored]
    if not both:
        raise SweepConfigError(
            f"compare: {names[0]} and {names[1]} share no cell that both scored "
            f"({len(ka)} and {len(kb)} episodes, {len(shared)} shared cells)"
        )
    xa = [1.0 if ra.outcome is Outcome.PASSED else 0.0 for ra, _ in both]
    xb = [1.0 if rb.outcome is Outcome.PASSED else 0.0 for _, rb in both]
    diffs = [y - x for x, y in zip(xa, xb)]
    lo, hi = bootstrap_ci(diffs, [ra.variant for ra, _ in both], resamples=resamples, seed=seed)
    a_only = sum(x > y for x, y in zip(xa, xb))
    b_only = sum(y > x for x, y in zip(xa, xb))
    needed = samples_needed(diffs)
    return Comparison(
        a=names[0], b=names[1], pairs=len(both), a_rate=float(np.mean(xa)), b_rate=float(np.mean(xb)),
        diff=float(np.mean(diffs)), ci_low=lo, ci_high=hi, a_only=a_only, b_only=b_only,
        mcnemar_p=mcnemar_p(a_only, b_only), needed=needed, more_needed=max(0.0, needed - len(both)),
        only_a=len(set(ka) - set(kb)), only_b=len(set(kb) - set(ka)), unscored=len(shared) - len(both),
    )


def pareto_frontier(points: Sequence[tuple[str, float, float]]) -> list[str]:
    """Labels of the points (label, cost, score) that no other point beats on both: cheaper-or-equal
    cost with a higher score, or lower cost with an equal-or-higher score. Ordered by cost."""
    front: list[tuple[str, float]] = []
    for label, cost, sc in sorted(points, key=lambda p: (p[1], -p[2])):
        if math.isnan(sc):
            continue
        if not front or sc > front[-1][1]:
            front.append((label, sc))
    return [label for label, _ in front]
