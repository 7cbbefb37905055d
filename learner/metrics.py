"""Per-step metrics that come from the trajectories rather than the gradients.

Reward, pass rate and tool-error rate split by harness, effort and domain:
the questions a post-training run is asked ("does the Codex harness lag?",
"does max effort pay?") are answered by these splits, so the trainer reports
them every step with the same keys the trajectory store's metric tags use.
"""

from __future__ import annotations

from collections.abc import Sequence

from rollout.types import Trajectory

__all__ = ["SPLIT_TAGS", "passed", "trajectory_splits"]

SPLIT_TAGS = ("harness", "effort", "domain")


def passed(t: Trajectory) -> bool:
    """The verifier's verdict when recorded, else full reward counts as a pass."""
    verdict = t.verifier.get("passed")
    return bool(verdict) if verdict is not None else t.reward >= 1.0


def trajectory_splits(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """``reward``, ``pass_rate``, ``tool_error_rate`` overall and as ``name/tag=value`` per split.

    Tool-error rate is tool errors per tool call, over the turns recorded.
    """
    out: dict[str, float] = {}
    buckets: dict[str, list[Trajectory]] = {"": list(trajectories)}
    for t in trajectories:
        for tag in SPLIT_TAGS:
            buckets.setdefault(f"/{tag}={getattr(t, tag) or '-'}", []).append(t)
    for suffix, ts in buckets.items():
        if not ts:
            continue
        calls = sum(turn.tool_calls for t in ts for turn in t.turns)
        errors = sum(t.tool_errors for t in ts)
        out[f"reward{suffix}"] = sum(t.reward for t in ts) / len(ts)
        out[f"pass_rate{suffix}"] = sum(passed(t) for t in ts) / len(ts)
        out[f"tool_error_rate{suffix}"] = errors / calls if calls else 0.0
    return out
