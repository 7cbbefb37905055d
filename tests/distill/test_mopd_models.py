"""MOPD with real tiny models: teacher == student gives exactly zero, teachers score at T = 1."""

from __future__ import annotations

import copy

import pytest
import torch

from distill.loop import MOPDAdvantages
from distill.types import MOPDConfig
from learner.model import PolicyModel
from learner.trainer import Trainer
from learner.types import ISCorrection, LossConfig, TrainerConfig
from rollout.policy.models import tiny_config
from rollout.types import Trajectory
from teachers.context import TeacherContext, splice, trajectory_contexts
from teachers.scoring import HFScorer, RoutingScorer
from teachers.types import DOMAINS, EFFORTS, cell_key
from distill_fakes import INSTRUCTION, contexts_of, trajectory

pytestmark = pytest.mark.unit

CELLS = [cell_key(d, e) for d in DOMAINS for e in EFFORTS]


def _model(tok: object, seed: int) -> PolicyModel:
    return PolicyModel.from_config(tiny_config(tok, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,  # type: ignore[arg-type]
                                               init_std=0.1), seed=seed)


def _batch(tok: object) -> list[Trajectory]:
    return [trajectory(tok, f"ep{i}", d, e, harness=h, responses=((60 + i, 61, 62, 63), (64, 65 + i)))
            for i, (d, e, h) in enumerate([("coding", "high", "codex"), ("agent", "low", "claude_code"),
                                           ("general", "max", "kimi_code")])]


def test_teacher_equal_to_student_with_identical_contexts_gives_zero_advantage_and_zero_gradient(tok: object) -> None:
    student = _model(tok, 0)
    teacher = HFScorer(copy.deepcopy(student.lm))

    def same_context(t: Trajectory) -> list[TeacherContext]:  # the teacher sees exactly the student's prompt
        (ctx,) = trajectory_contexts(tok, t, instruction=INSTRUCTION)  # type: ignore[arg-type]
        s = t.samples[0]
        prompt = s.token_ids[: ctx.student_positions[0]]
        return [splice(ctx.request.cell, s.token_ids, s.loss_mask, prompt, prompt, sample_id=ctx.request.sample_id)]

    provider = MOPDAdvantages(MOPDConfig(teachers="unused"), RoutingScorer({c: teacher for c in CELLS}), same_context)
    items, metrics = provider([_batch(tok)], student)
    assert all(a == 0.0 for item in items for a in item.advantage)  # type: ignore[union-attr]  # exactly
    assert metrics["mopd/kl"] == 0.0 and metrics["mopd/clip_frac"] == 0.0

    before = {k: v.clone() for k, v in student.lm.state_dict().items()}
    trainer = Trainer(student, LossConfig(is_correction=ISCorrection.MIS), TrainerConfig(lr=1e-2))
    m = trainer.step(items)
    assert m.grad_norm == 0.0 and m.num_loss_tokens == 18
    for k, v in student.lm.state_dict().items():
        assert torch.equal(v, before[k]), k  # the optimizer step moved nothing


def _hand_logprobs(model: PolicyModel, ids: tuple[int, ...], positions: tuple[int, ...], temperature: float) -> torch.Tensor:
    with torch.no_grad():
        logits_TV = model.lm(input_ids=torch.tensor([ids])).logits[0].float()
    logp_TV = torch.log_softmax(logits_TV / temperature, dim=-1)
    return torch.stack([logp_TV[p - 1, ids[p]] for p in positions])


def test_teachers_and_the_student_score_at_temperature_one_whatever_the_rollout_temperature(tok: object) -> None:
    student, teacher_model = _model(tok, 0), _model(tok, 1)
    rollout_t = 0.5
    trajs = _batch(tok)
    teacher = RoutingScorer({c: HFScorer(teacher_model.lm) for c in CELLS})
    provider = MOPDAdvantages(MOPDConfig(teachers="unused", clip=100.0), teacher, contexts_of(tok))
    items, _ = provider([trajs], student)
    for t, item in zip(trajs, items):
        (ctx,) = trajectory_contexts(tok, t, instruction=INSTRUCTION)  # type: ignore[arg-type]
        sample = t.samples[0]
        got = torch.tensor([item.advantage[p] for p in ctx.student_positions])  # type: ignore[index]
        at_1 = (_hand_logprobs(teacher_model, ctx.request.token_ids, ctx.request.positions, 1.0)
                - _hand_logprobs(student, sample.token_ids, ctx.student_positions, 1.0))
        at_rollout = (_hand_logprobs(teacher_model, ctx.request.token_ids, ctx.request.positions, rollout_t)
                      - _hand_logprobs(student, sample.token_ids, ctx.student_positions, rollout_t))
        torch.testing.assert_close(got, at_1, atol=1e-4, rtol=0)
        assert (got - at_rollout).abs().max() > 1e-2  # and not at the rollout's temperature


def test_the_student_scores_under_bf16_autocast_when_asked_and_in_fp32_on_cpu_by_default(tok: object) -> None:
    """``bf16=None`` follows the trainer (fp32 on CPU: the hand-computed logprobs exactly); ``bf16=True`` autocasts."""
    student, teacher_model = _model(tok, 0), _model(tok, 1)
    trajs = _batch(tok)
    teacher = RoutingScorer({c: HFScorer(teacher_model.lm) for c in CELLS})

    def advantages(bf16: bool | None) -> torch.Tensor:
        provider = MOPDAdvantages(MOPDConfig(teachers="unused", clip=100.0), teacher, contexts_of(tok), bf16=bf16)
        items, _ = provider([trajs], student)
        return torch.tensor([a for item in items for a in item.advantage])  # type: ignore[union-attr]

    default, fp32, bf16 = advantages(None), advantages(False), advantages(True)
    assert torch.equal(default, fp32)
    gap = (bf16 - fp32).abs().max().item()
    assert 0.0 < gap < 0.1  # bf16 rounding: moved, but the same logprobs to two digits
