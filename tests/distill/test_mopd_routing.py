"""Routing: each sample to its (domain, effort) teacher, unknown cells named, partial rollouts scored once and stitched."""

from __future__ import annotations

import random

import pytest

from distill.loop import MOPDAdvantages
from distill.routing import score_samples
from distill.types import MOPDConfig, UnroutableSample
from teachers.scoring import RoutingScorer
from teachers.types import DOMAINS, EFFORTS, UnknownCell, cell_key
from distill_fakes import ConstantScorer, contexts_of, trajectory

pytestmark = pytest.mark.unit

CELLS = [cell_key(d, e) for d in DOMAINS for e in EFFORTS]


def _grid() -> tuple[RoutingScorer, dict[str, ConstantScorer]]:
    fakes = {c: ConstantScorer(-float(i + 1)) for i, c in enumerate(CELLS)}  # cell i scores -(i+1) everywhere
    return RoutingScorer(fakes), fakes


def test_a_shuffled_batch_covering_nine_cells_is_routed_right(tok: object) -> None:
    scorer, fakes = _grid()
    trajs = [trajectory(tok, f"ep-{c}-{k}", *c.split("/"), harness=("codex", "claude_code", "kimi_code")[k % 3],
                        responses=((20 + k, 21, 22),))
             for c in CELLS for k in range(2)]
    random.Random(7).shuffle(trajs)
    provider = MOPDAdvantages(MOPDConfig(teachers="unused", clip=100.0, student_logprobs="rollout"), scorer, contexts_of(tok))
    items, metrics = provider([trajs[:9], trajs[9:]], model=None)  # type: ignore[arg-type]  # rollout logprobs: no model

    for t, item in zip(trajs, items):
        assert item.sample_id == f"{t.episode_id}/0"
        expected = -float(CELLS.index(f"{t.domain}/{t.effort}") + 1) - (-0.7)  # teacher - student (sampling logprob)
        sampled = [a for a, m in zip(item.advantage, item.loss_mask) if m]  # type: ignore[arg-type]
        assert sampled == pytest.approx([expected] * 3, abs=1e-6)
    for c, fake in fakes.items():
        assert fake.calls == 1  # one call per backend for the whole batch
        assert sorted(r.sample_id for r in fake.requests) == sorted(f"ep-{c}-{k}#0" for k in range(2))
        assert {r.cell for r in fake.requests} == {c}
        assert metrics[f"mopd/kl/cell={c}"] == pytest.approx(-0.7 + CELLS.index(c) + 1, abs=1e-6)
    assert metrics["mopd/tokens"] == 18 * 3


def test_an_unknown_cell_is_an_error_naming_it(tok: object) -> None:
    scorer, fakes = _grid()
    good = trajectory(tok, "ep-ok", "coding", "high")
    bad = trajectory(tok, "ep-bad", "math", "high")
    with pytest.raises(UnroutableSample, match=r"no teacher for cell 'math/high' of episode ep-bad") as info:
        score_samples([good, bad], contexts_of(tok), scorer)
    assert isinstance(info.value, UnknownCell) and isinstance(info.value, KeyError)
    assert "coding/high" in str(info.value)  # the grid's cells are listed
    assert all(f.calls == 0 for f in fakes.values())  # refused before any teacher ran


def test_teacher_context_has_no_effort_message_and_scores_the_same_tokens(tok: object) -> None:
    scorer, fakes = _grid()
    t = trajectory(tok, "ep", "agent", "max", responses=((30, 31), (32, 33, 34)))
    (scored,) = score_samples([t], contexts_of(tok), scorer)
    (req,) = fakes["agent/max"].requests
    sample = t.samples[0]
    assert len(req.token_ids) < len(sample.token_ids)  # the effort message is gone
    assert [req.token_ids[p] for p in req.positions] == [sample.token_ids[p] for p in scored[0].positions]
    assert scored[0].positions == tuple(i for i, m in enumerate(sample.loss_mask) if m)


def test_partial_and_split_rollouts_are_scored_once_and_stitched(tok: object) -> None:
    """Turns sampled by versions 3 and 4 (a partial rollout) over two samples (a re-rendered history)."""
    scorer, fakes = _grid()
    student = ConstantScorer(-2.0)
    t = trajectory(tok, "ep-partial", "general", "low", responses=((40, 41), (42, 43, 44)), split=True, versions=(3, 4))
    provider = MOPDAdvantages(MOPDConfig(teachers="unused", clip=100.0), scorer, contexts_of(tok))
    provider.student_scorer = lambda model: student  # type: ignore[method-assign]
    items, _ = provider([[t]], model=None)  # type: ignore[arg-type]

    teacher = fakes["general/low"]
    assert teacher.calls == 1 and [r.sample_id for r in teacher.requests] == ["ep-partial#0", "ep-partial#1"]
    assert student.calls == 1 and len(student.requests) == 2
    # every sampled token scored exactly once: the second sample's repeated history is not
    assert [len(r.positions) for r in teacher.requests] == [2, 3]
    assert len(items) == 2
    for item, sample in zip(items, t.samples):
        assert len(item.advantage) == len(sample.token_ids)  # type: ignore[arg-type]
        for a, m in zip(item.advantage, sample.loss_mask):  # type: ignore[arg-type]
            assert a == pytest.approx(-1.0 - (-2.0) if m else 0.0)  # general/low is cell 0: -1


def test_clamped_teacher_logprobs_are_counted_and_clipped(tok: object) -> None:
    fakes = {c: ConstantScorer(-1e4, clamped=3) for c in CELLS}
    t = trajectory(tok, "ep", "coding", "low", responses=((50, 51, 52),))
    provider = MOPDAdvantages(MOPDConfig(teachers="unused", clip=4.0, student_logprobs="rollout"), RoutingScorer(fakes),
                              contexts_of(tok))
    items, m = provider([[t]], model=None)  # type: ignore[arg-type]
    assert [a for a, k in zip(items[0].advantage, items[0].loss_mask) if k] == [-4.0] * 3  # type: ignore[arg-type]
    assert m["mopd/clamped"] == 3 and m["mopd/clamped/cell=coding/low"] == 3
    assert m["mopd/clip_frac"] == 1.0


def test_the_outcome_term_is_group_normalised_and_weighted(tok: object) -> None:
    fakes = {c: ConstantScorer(-0.7) for c in CELLS}  # teacher == sampling logprob: the MOPD term is 0
    group = [trajectory(tok, f"ep{i}", "general", "high", reward=r) for i, r in enumerate((1.0, 0.0, 0.0, 1.0))]
    provider = MOPDAdvantages(MOPDConfig(teachers="unused", alpha=0.5, student_logprobs="rollout"),
                              RoutingScorer(fakes), contexts_of(tok))
    items, _ = provider([group], model=None)  # type: ignore[arg-type]
    # GRPO over (1, 0, 0, 1): mean 0.5, sample std 0.577 -> +-0.866
    for item, r in zip(items, (1.0, 0.0, 0.0, 1.0)):
        sampled = {round(a, 4) for a, k in zip(item.advantage, item.loss_mask) if k}  # type: ignore[arg-type]
        assert sampled == {round(0.5 * (0.866 if r else -0.866), 4)} or sampled == pytest.approx({0.5 * (0.8660 if r else -0.8660)}, abs=1e-3)


def test_the_outcome_term_takes_the_effort_reward_as_the_rl_step_does(tok: object) -> None:
    """An episode over ``tau * b0`` counts -1 in ``A_outcome``, exactly as in ``items_from_groups``."""
    from learner.advantages import items_from_groups
    from learner.effort import EffortShaping
    from learner.types import AdvantageConfig

    fakes = {c: ConstantScorer(-0.7) for c in CELLS}  # the MOPD term is 0: only the outcome term is left
    long, short = (60, 61, 62, 63, 64, 65), (60, 61)
    group = [trajectory(tok, f"ep{i}", "general", "low", reward=1.0, responses=(resp,))
             for i, resp in enumerate((short, long, short, long))]
    shaping = EffortShaping({group[0].task_id: 4}, {"low": 1.0})  # limit 4 tokens: the long ones are over
    provider = MOPDAdvantages(MOPDConfig(teachers="unused", alpha=1.0, student_logprobs="rollout"),
                              RoutingScorer(fakes), contexts_of(tok), shaping=shaping.kwargs())
    items, _ = provider([group], model=None)  # type: ignore[arg-type]
    rl_items = items_from_groups([group], AdvantageConfig(), **shaping.kwargs())
    for item, rl_item, resp in zip(items, rl_items, (short, long, short, long)):
        sampled = {round(a, 6) for a, k in zip(item.advantage, item.loss_mask) if k}  # type: ignore[arg-type]
        assert sampled == {round(float(rl_item.advantage), 6)}  # type: ignore[arg-type]
        assert (rl_item.advantage > 0) == (resp is short)  # type: ignore[operator]  # all passed; the long ones pay -1
    unshaped, _ = MOPDAdvantages(MOPDConfig(teachers="unused", alpha=1.0, student_logprobs="rollout"),
                                 RoutingScorer(fakes), contexts_of(tok))([group], model=None)  # type: ignore[arg-type]
    assert max(abs(a) for item in unshaped for a in item.advantage) < 1e-6  # type: ignore[union-attr]  # same rewards: no signal


def test_the_same_context_ablation_gives_the_teacher_the_students_own_prompt(tok: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """``teacher_context: student``: the teacher scores the sample as sampled, effort message included."""
    from types import SimpleNamespace

    import agentenv.registry
    from distill.routing import student_contexts
    from distill_fakes import INSTRUCTION

    task = SimpleNamespace(variant=lambda seed: SimpleNamespace(instruction=INSTRUCTION))
    monkeypatch.setattr(agentenv.registry, "get_task", lambda task_id: task)
    t = trajectory(tok, "ep", "coding", "max", responses=((70, 71), (72,)))
    (ctx,) = student_contexts(tok, t)  # type: ignore[arg-type]
    assert ctx.request.token_ids == t.samples[0].token_ids and ctx.shift == 0
    assert ctx.request.positions == ctx.student_positions == tuple(i for i, m in enumerate(t.samples[0].loss_mask) if m)
    assert ctx.request.cell == "coding/max" and ctx.request.sample_id == "ep#0"
