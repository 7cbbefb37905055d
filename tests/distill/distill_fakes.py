"""Trajectories that begin with a real harness render, and scorers that say which cell they were asked for."""

from __future__ import annotations

from collections.abc import Sequence

from rollout.types import Sample, Status, Trajectory, Turn
from teachers.context import TeacherContext, prompt_ids, trajectory_contexts
from teachers.types import ScoreRequest, ScoreResult

INSTRUCTION = "Count the lines of /workspace/data.txt and write the count to /workspace/answer.txt."


def sample_after(prompt: Sequence[int], parts: Sequence[tuple[Sequence[int], int]], logprob: float = -0.7) -> Sample:
    """``prompt`` (mask 0), then each ``(ids, mask)`` part; sampled tokens get ``logprob``."""
    ids, mask = list(prompt), [0] * len(prompt)
    for part, m in parts:
        ids += list(part)
        mask += [m] * len(part)
    return Sample(tuple(ids), tuple(logprob if m else 0.0 for m in mask), tuple(mask))


def trajectory(
    tok: object, episode_id: str, domain: str, effort: str, *, harness: str = "codex",
    responses: Sequence[Sequence[int]] = ((11, 12, 13),), split: bool = False, versions: Sequence[int] = (0,),
    reward: float = 1.0, group: str = "g",
) -> Trajectory:
    """One episode whose samples start with the student's render of ``INSTRUCTION`` under ``effort``.

    Each response is sampled (mask 1) and followed by a tool result (mask 0). ``split``: every
    response after the first opens a new sample that repeats the history (mask 0), as a
    non-append-only template does. ``versions``: the policy version of each turn.
    """
    prompt = prompt_ids(tok, harness, INSTRUCTION, effort)  # type: ignore[arg-type]
    tool = (5, 6)
    if not split:
        samples = [sample_after(prompt, [part for r in responses for part in ((r, 1), (tool, 0))])]
    else:  # each response after the first opens a sample repeating the history (mask 0)
        samples, seen = [], []
        for r in responses:
            samples.append(sample_after(prompt, [(seen, 0), (r, 1), (tool, 0)]))
            seen = [*seen, *r, *tool]
    turns = tuple(Turn(index=i, policy_version=v) for i, v in enumerate(versions))
    return Trajectory(
        episode_id=episode_id, run_id="r", task_id=f"{domain}/toy", domain=domain, seed=0, harness=harness,
        effort=effort, policy_version=min(versions), status=Status.OK, reward=reward,
        verifier={"group_id": group}, samples=tuple(samples), turns=turns,
    )


def contexts_of(tok: object):  # type: ignore[no-untyped-def]
    def of(t: Trajectory) -> list[TeacherContext]:
        return trajectory_contexts(tok, t, instruction=INSTRUCTION)  # type: ignore[arg-type]

    return of


class ConstantScorer:
    """Scores every position ``value``; records the requests it saw."""

    def __init__(self, value: float, clamped: int = 0) -> None:
        self.value, self.clamped = value, clamped
        self.requests: list[ScoreRequest] = []
        self.calls = 0

    def score(self, requests: Sequence[ScoreRequest]) -> list[ScoreResult]:
        self.calls += 1
        self.requests += list(requests)
        return [ScoreResult(tuple(self.value for _ in r.positions), self.clamped if r.positions else 0) for r in requests]

    def close(self) -> None:
        pass
