"""Sweep statistics against hand-computed cases and brute-force enumeration."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from rollout.eval import stats
from rollout.eval.types import EpisodeResult, Outcome, SweepConfigError, outcome_of

pytestmark = pytest.mark.unit


def brute_pass_at_k(outcomes: list[bool], k: int) -> float:
    """Fraction of the k-subsets of the samples that hold at least one pass."""
    subsets = list(itertools.combinations(outcomes, k))
    return sum(any(s) for s in subsets) / len(subsets)


def brute_pass_hat_k(outcomes: list[bool], k: int) -> float:
    subsets = list(itertools.combinations(outcomes, k))
    return sum(all(s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_and_pass_hat_k_equal_brute_force_enumeration(n: int) -> None:
    for c in range(n + 1):
        outcomes = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            assert stats.pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(outcomes, k), abs=1e-12)
            assert stats.pass_hat_k(n, c, k) == pytest.approx(brute_pass_hat_k(outcomes, k), abs=1e-12)


def test_pass_at_k_hand_cases_and_bad_arguments() -> None:
    assert stats.pass_at_k(4, 1, 1) == 0.25
    assert stats.pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert stats.pass_at_k(5, 2, 3) == pytest.approx(0.9)  # 1 - C(3,3)/C(5,3) = 1 - 1/10
    assert stats.pass_hat_k(5, 3, 2) == pytest.approx(0.3)  # C(3,2)/C(5,2) = 3/10
    with pytest.raises(SweepConfigError, match="k <= n"):
        stats.pass_at_k(3, 1, 4)


def r(policy: str = "p", task: str = "t", seed: int = 0, harness: str = "h", effort: str = "high", sample: int = 0,
      outcome: Outcome = Outcome.PASSED, reward: float | None = None, domain: str = "general") -> EpisodeResult:
    rew = reward if reward is not None else (1.0 if outcome is Outcome.PASSED else 0.0)
    return EpisodeResult(f"{policy}/{task}/{seed}/{harness}/{effort}/{sample}", policy, "id", task, domain, seed, harness,
                         effort, sample, "ok", outcome, rew)


def test_pass_at_k_table_over_variants() -> None:
    # variant A: 2 of 3 pass; variant B: 0 of 3 pass
    rs = [r(task="A", sample=i, outcome=o) for i, o in enumerate([Outcome.PASSED, Outcome.PASSED, Outcome.FAILED])]
    rs += [r(task="B", sample=i, outcome=Outcome.FAILED) for i in range(3)]
    table = stats.pass_at_k_table(rs)
    assert [t.k for t in table] == [1, 2, 3]
    assert table[0].pass_at_k == pytest.approx((2 / 3 + 0) / 2)
    assert table[1].pass_at_k == pytest.approx((1.0 + 0) / 2)  # A: 1 - C(1,2)/C(3,2) = 1
    assert table[1].pass_hat_k == pytest.approx((1 / 3 + 0) / 2)  # A: C(2,2)/C(3,2)
    assert table[2].pass_hat_k == 0.0 and table[2].variants == 2


def test_clustered_se_hand_computed() -> None:
    x = [1.0, 1.0, 0.0, 0.0, 1.0, 0.0]
    # one observation per cluster: the usual s/sqrt(n); s^2 = 1.5/5 = 0.3
    assert stats.clustered_se(x) == pytest.approx(math.sqrt(0.3 / 6))
    # clusters {0,1}, {2,3}, {4,5}: mean 0.5, residual sums 1, -1, 0 -> var = 3/2 * 2 / 36
    assert stats.clustered_se(x, ["a", "a", "b", "b", "c", "c"]) == pytest.approx(math.sqrt(3 / 2 * 2 / 36))
    assert math.isnan(stats.clustered_se([1.0]))


def test_bootstrap_is_fixed_by_its_seed_and_brackets_the_mean() -> None:
    x = [1.0] * 7 + [0.0] * 5
    a = stats.bootstrap_ci(x, seed=3)
    assert a == stats.bootstrap_ci(x, seed=3)
    assert a != stats.bootstrap_ci(x, seed=4)
    assert a[0] < 7 / 12 < a[1]
    assert stats.bootstrap_ci([1.0] * 5) == (1.0, 1.0)


def test_cluster_bootstrap_covers_the_true_rate_about_95_percent_of_the_time() -> None:
    """Synthetic sweeps: 30 variants x 4 correlated samples, a per-variant rate drawn around p = 0.4."""
    rng = np.random.default_rng(123)
    hits, trials = 0, 300
    for t in range(trials):
        rates = rng.beta(2.0, 3.0, size=30)  # mean 0.4
        x = (rng.random((30, 4)) < rates[:, None]).astype(float)
        lo, hi = stats.bootstrap_ci(list(x.ravel()), [i for i in range(30) for _ in range(4)], resamples=500, seed=t)
        hits += lo <= 0.4 <= hi
    coverage = hits / trials
    assert 0.89 <= coverage <= 0.99, coverage
    # ignoring the clusters under-covers the same data: the reason the clustered interval exists
    naive = 0
    for t in range(trials):
        rates = rng.beta(0.4, 0.6, size=30)  # strongly correlated within a variant, mean 0.4
        x = (rng.random((30, 4)) < rates[:, None]).astype(float)
        lo, hi = stats.bootstrap_ci(list(x.ravel()), resamples=500, seed=t)
        naive += lo <= 0.4 <= hi
    assert naive / trials < coverage


def test_score_keeps_infrastructure_and_invalid_out_of_the_denominator_and_counts_them() -> None:
    rs = [r(sample=0), r(sample=1, outcome=Outcome.FAILED), r(sample=2), r(sample=3, outcome=Outcome.INFRASTRUCTURE),
          r(sample=4, outcome=Outcome.INVALID), r(sample=5, outcome=Outcome.FAILED, reward=0.5)]
    s = stats.score(rs)
    assert (s.n, s.passed, s.failed, s.infrastructure, s.invalid, s.total) == (4, 2, 2, 1, 1, 6)
    assert s.pass_rate == 0.5 and s.mean_reward == pytest.approx((1 + 0 + 1 + 0.5) / 4)
    assert "n=4; 1 infra, 1 invalid" in s.cell()


def test_breakdowns_by_every_axis() -> None:
    rs = [r(harness="codex"), r(harness="codex", sample=1, outcome=Outcome.FAILED), r(harness="bash", effort="low"),
          r(policy="q", domain="coding", outcome=Outcome.FAILED)]
    by_h = stats.breakdown(rs, "harness")
    assert by_h["codex"].pass_rate == 0.5 and by_h["bash"].pass_rate == 1.0 and by_h["h"].pass_rate == 0.0
    assert stats.breakdown(rs, "effort")["low"].n == 1
    assert stats.breakdown(rs, "policy")["q"].pass_rate == 0.0
    assert set(stats.breakdown(rs, "domain")) == {"general", "coding"}
    assert stats.breakdown(rs, "task_id")["t"].n == 4


def test_mcnemar_exact_hand_cases() -> None:
    assert stats.mcnemar_p(0, 0) == 1.0
    assert stats.mcnemar_p(0, 5) == pytest.approx(2 / 32)  # 2 * P(X <= 0), X ~ Bin(5, 1/2)
    assert stats.mcnemar_p(1, 6) == pytest.approx(2 * (1 + 7) / 128)
    assert stats.mcnemar_p(3, 3) == 1.0


def test_samples_needed_hand_case() -> None:
    d = [1.0, 0.0] * 10  # mean 0.5, sd = sqrt(20/19 * 0.25)
    z = 1.959963984540054 + 0.8416212335729143
    sd = math.sqrt(0.25 * 20 / 19)
    assert stats.samples_needed(d) == math.ceil((z * sd / 0.5) ** 2)
    assert stats.samples_needed([0.0, 0.0, 1.0, -1.0]) == float("inf")


def test_paired_compare_on_shared_cells() -> None:
    a = [r(policy="a", task=f"t{i}", outcome=Outcome.PASSED if i < 4 else Outcome.FAILED) for i in range(10)]
    b = [r(policy="b", task=f"t{i}", outcome=Outcome.PASSED if i < 8 else Outcome.FAILED) for i in range(10)]
    b[9] = r(policy="b", task="t9", outcome=Outcome.INFRASTRUCTURE)
    b.append(r(policy="b", task="extra"))
    c = stats.compare(a, b, names=("a", "b"))
    assert c.pairs == 9 and c.unscored == 1 and c.only_b == 1 and c.only_a == 0
    assert (c.a_only, c.b_only) == (0, 4)
    assert c.diff == pytest.approx(4 / 9) and c.ci_low <= c.diff <= c.ci_high
    assert c.mcnemar_p == pytest.approx(2 / 16)
    assert c.needed > 0 and c.more_needed == max(0, c.needed - 9)
    with pytest.raises(SweepConfigError, match="share no cell"):
        stats.compare(a, [r(policy="b", task="zzz")])


def test_pareto_frontier() -> None:
    pts = [("low", 100.0, 0.5), ("high", 300.0, 0.7), ("max", 900.0, 0.7), ("mid", 200.0, 0.4)]
    assert stats.pareto_frontier(pts) == ["low", "high"]


def test_outcome_of_every_status_by_value() -> None:
    assert outcome_of("ok", 1.0) is Outcome.PASSED
    assert outcome_of("truncated", 0.0) is Outcome.FAILED
    assert outcome_of("ok", 1.0, passed=False) is Outcome.FAILED
    assert outcome_of("invalid", 0.0) is Outcome.INVALID
    assert outcome_of("invalid", 0.0, "runner error: KeyError") is Outcome.INFRASTRUCTURE
    lost = "db_state: db_state: verifier crashed: SandboxLost: sandbox x is lost: agent did not start"
    assert outcome_of("invalid", 0.0, lost) is Outcome.INFRASTRUCTURE
    for s in ("sandbox_lost", "worker_lost", "error"):
        assert outcome_of(s, 0.0) is Outcome.INFRASTRUCTURE


@pytest.mark.parametrize(
    ("error", "outcome"),
    [
        ("m: chat request failed after 4 attempt(s): connection failed (refused)", Outcome.INFRASTRUCTURE),
        ("m: chat request failed after 4 attempt(s): no response within 60.0s", Outcome.INFRASTRUCTURE),
        ("m: chat request failed after 4 attempt(s): HTTP 503: overloaded", Outcome.INFRASTRUCTURE),
        ("m: chat request failed after 4 attempt(s): HTTP 429: slow down", Outcome.INFRASTRUCTURE),
        ("policy timed out: ", Outcome.INFRASTRUCTURE),
        # a context flood: the agent's own tool output pushed the prompt past the model's context
        ("m: chat request failed after 1 attempt(s): HTTP 400: This model's maximum context length is 8192 tokens",
         Outcome.FAILED),
        ("m: the server returned no token ids (needs vLLM's return_token_ids)", Outcome.FAILED),
        ("", Outcome.FAILED),  # nothing proves the endpoint failed
    ],
)
def test_a_policy_error_leaves_the_denominator_only_when_the_endpoint_failed(error: str, outcome: Outcome) -> None:
    assert outcome_of("policy_error", 0.0, error) is outcome
