"""The MOPD per-token advantage, and the statistics one step reports about it.

For a student token ``y_t`` sampled under effort ``e`` and routed to the teacher
of its cell ``(d, e)``::

    A_t = clip(sg(log pi_T(d,e)(y_t | x, y<t) - log pi_S(y_t | e, x, y<t)), -R, R)  [+ alpha * A_outcome]

Put into the learner's one loss as a per-token advantage (``-A_t log pi_S(y_t)``
at ratio 1), its expectation over ``y_t ~ pi_S`` is the gradient of the reverse
KL ``KL(pi_S || pi_T)`` at that position, which MOPD minimises; the clip bounds
the step where the two models disagree most (a teacher's clamped -inf becomes
``-R``). ``A_outcome`` is the group-relative outcome advantage (the
``rl.advantage`` estimator over each group's verifier rewards), one value per
trajectory, added on the trajectory's sampled tokens (MiMo, NeMo-RL).

Both logprobs are at temperature 1: the advantage compares two distributions,
not two sampling procedures. Departure from the papers: none in the formula;
``sg`` is implicit (the inputs are plain numbers, not graph tensors).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["CellStats", "mopd_advantage", "token_advantages"]


def mopd_advantage(teacher_logp_N: torch.Tensor, student_logp_N: torch.Tensor, clip: float) -> torch.Tensor:
    """``A_N = clip(sg(teacher_logp_N - student_logp_N), -clip, clip)`` at N sampled tokens."""
    gap_N = (teacher_logp_N - student_logp_N).detach()
    return gap_N.clamp(min=-clip, max=clip)


def token_advantages(
    teacher_logp_N: Sequence[float],
    student_logp_N: Sequence[float],
    positions_N: Sequence[int],
    length: int,
    clip: float,
    *,
    alpha: float = 0.0,
    outcome: float = 0.0,
) -> tuple[float, ...]:
    """One advantage per token of a sample of ``length`` tokens: MOPD's at ``positions_N``, 0 elsewhere.

    ``positions_N[k]`` is the sample index of the k-th sampled token, scored
    ``teacher_logp_N[k]`` / ``student_logp_N[k]``; ``outcome`` is the sample's
    trajectory's outcome advantage, weighted by ``alpha`` (sampled tokens only).
    """
    teacher_N = torch.tensor(list(teacher_logp_N), dtype=torch.float64)
    student_N = torch.tensor(list(student_logp_N), dtype=torch.float64)
    adv_N = mopd_advantage(teacher_N, student_N, clip) + alpha * outcome
    adv_T = torch.zeros(length, dtype=torch.float64)
    adv_T[torch.tensor(list(positions_N), dtype=torch.long)] = adv_N
    return tuple(adv_T.tolist())


@dataclass
class CellStats:
    """Sums over one cell's sampled tokens in one step; ``as_metrics`` turns them into the reported numbers.

    ``kl`` is the sampled-token (k1) estimate of ``KL(pi_S || pi_T)``: the mean
    of ``log pi_S - log pi_T`` over tokens drawn from the student.
    """

    tokens: int = 0
    samples: int = 0
    adv_sum: float = 0.0
    adv_sq_sum: float = 0.0
    clipped_low: int = 0
    clipped_high: int = 0
    kl_sum: float = 0.0
    clamped: int = 0

    def add(self, teacher_logp_N: Sequence[float], student_logp_N: Sequence[float], clip: float, clamped: int = 0) -> None:
        """Account one sample's scored tokens (the MOPD term alone, before any outcome term)."""
        gap_N = torch.tensor(list(teacher_logp_N), dtype=torch.float64) - torch.tensor(list(student_logp_N), dtype=torch.float64)
        adv_N = gap_N.clamp(min=-clip, max=clip)
        self.tokens += int(gap_N.numel())
        self.samples += 1
        self.adv_sum += float(adv_N.sum())
        self.adv_sq_sum += float((adv_N * adv_N).sum())
        self.clipped_low += int((gap_N < -clip).sum())
        self.clipped_high += int((gap_N > clip).sum())
        self.kl_sum += float(-gap_N.sum())
        self.clamped += int(clamped)

    def merge(self, other: CellStats) -> None:
        for name in vars(self):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def as_metrics(self, suffix: str = "") -> dict[str, float]:
        """``adv_mean``, ``adv_std`` (population), ``clip_frac`` (both sides), ``kl``, ``clamped``, ``tokens`` + suffix."""
        n = max(self.tokens, 1)
        mean = self.adv_sum / n
        var = max(self.adv_sq_sum / n - mean * mean, 0.0)
        return {
            f"mopd/adv_mean{suffix}": mean,
            f"mopd/adv_std{suffix}": var ** 0.5,
            f"mopd/clip_frac{suffix}": (self.clipped_low + self.clipped_high) / n,
            f"mopd/kl{suffix}": self.kl_sum / n,
            f"mopd/clamped{suffix}": float(self.clamped),
            f"mopd/tokens{suffix}": float(self.tokens),
        }
