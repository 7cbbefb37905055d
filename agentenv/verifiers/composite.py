"""A weighted composite of verifiers: the task's reward.

``reward = sum(w_i * r_i) / sum(w_i)`` over the declared verifiers, so partial
credit across verifiers is exactly what the weights declare (within one
verifier, ``partial_credit`` decides). If any part is ``invalid`` the whole
is invalid: an average with a hole in it is not a decision. Its cause is the
grader's if any part's invalid is the grader's (the grade cannot be trusted),
else the agent's. Weight-0 parts are still run and reported (diagnostics), but
do not move the reward; a composite whose weights are all 0 decides nothing
and is refused (``build_composite`` names the field; ``verify`` says invalid).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from agentenv.types import CheckResult, Episode, InvalidCause, Verifier, VerifierResult
from sandboxes.types import Sandbox


@dataclass(frozen=True)
class Weighted:
    verifier: Verifier
    weight: float


class CompositeVerifier:
    kind = "composite"

    def __init__(self, parts: Sequence[Weighted], name: str = "composite") -> None:
        if not parts:
            raise ValueError("a composite needs at least one verifier")
        self.parts = list(parts)
        self.name = name

    def verify(self, sandbox: Sandbox, episode: Episode) -> VerifierResult:
        started = time.monotonic()
        results = [(p, _safe(p.verifier, sandbox, episode)) for p in self.parts]
        details: list[CheckResult] = []
        for part, result in results:
            tag = part.verifier.name
            details.append(CheckResult(tag, result.passed, result.reward, result.reason if result.invalid or not result.passed else ""))
            details.extend(CheckResult(f"{tag}/{c.name}", c.passed, c.score, c.detail) for c in result.details)
        bad = [(p, r) for p, r in results if r.invalid]
        parts_extra = {
            p.verifier.name: {"reward": r.reward, "invalid": r.invalid, "invalid_cause": r.invalid_cause,
                              "duration_s": round(r.duration_s, 3), **_flags(r)}
            for p, r in results
        }
        duration = time.monotonic() - started
        flags = {k: v for _, r in results for k, v in _flags(r).items()}  # surfaced for trainers and people
        if bad:
            reason = "; ".join(f"{p.verifier.name}: {r.reason}" for p, r in bad)
            cause: InvalidCause = "agent" if all(r.invalid_cause == "agent" for _, r in bad) else "grader"
            return VerifierResult(0.0, False, True, reason, tuple(details), duration, {"parts": parts_extra, **flags}, cause)
        total = sum(p.weight for p in self.parts)
        if total <= 0:
            reason = f"every verifier weight is 0 ({', '.join(p.verifier.name for p in self.parts)}): nothing decides the reward"
            return VerifierResult(0.0, False, True, reason, tuple(details), duration, {"parts": parts_extra, **flags}, "grader")
        reward = sum(p.weight * r.reward for p, r in results) / total
        passed = all(r.passed for p, r in results if p.weight > 0)
        failed = [p.verifier.name for p, r in results if not r.passed and p.weight > 0]
        reason = "" if passed else "failed: " + ", ".join(failed)
        return VerifierResult(min(max(reward, 0.0), 1.0), passed, False, reason, tuple(details), duration, {"parts": parts_extra, **flags})


def _flags(result: VerifierResult) -> dict[str, object]:
    """What a part flagged for people and trainers (the tampering scan), kept on the composite's extra."""
    return {k: result.extra[k] for k in ("tampering", "neutralised") if k in result.extra}


def _safe(verifier: Verifier, sandbox: Sandbox, episode: Episode) -> VerifierResult:
    """Our verifiers never raise; a third-party one might, and must not take grading down."""
    try:
        return verifier.verify(sandbox, episode)
    except Exception as exc:  # noqa: BLE001
        return VerifierResult(0.0, False, True, f"{verifier.name}: verifier raised {type(exc).__name__}: {exc}")


__all__ = ["CompositeVerifier", "Weighted"]
