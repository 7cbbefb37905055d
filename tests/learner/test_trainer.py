"""Trainer: exact resume, packing-invariant steps, publishing, schedule, metrics."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import Qwen2Config

from learner.model import VARLEN_ATTENTION, PolicyModel
from learner.publish import CheckpointPublisher, latest_version
from learner.trainer import Trainer, lr_factor
from learner.types import LossConfig, TrainerConfig
from rollout.types import Sample, Status, Trajectory, Turn
from learner_fakes import random_items

pytestmark = pytest.mark.unit


def _batches(vocab: int, n: int) -> list[list]:
    return [random_items(6, vocab, seed=100 + k) for k in range(n)]


def _params(model: PolicyModel) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def test_exact_resume(tiny_config: Qwen2Config, vocab_size: int, tmp_path: Path) -> None:
    """4 steps straight == 2 steps, save, resume into a new object, 2 steps: bit-identical weights.

    Attention dropout is on, so the resumed RNG state matters too.
    """
    config = Qwen2Config(**{**tiny_config.to_dict(), "attention_dropout": 0.1})
    cfg = TrainerConfig(lr=1e-3, micro_batch_tokens=64, schedule="cosine", warmup_steps=1, total_steps=4)
    data = _batches(vocab_size, 4)

    torch.manual_seed(7)
    straight = Trainer(PolicyModel.from_config(config, seed=0), LossConfig.dapo(), cfg)
    for batch in data:
        straight.step(batch)

    torch.manual_seed(7)
    first = Trainer(PolicyModel.from_config(config, seed=0), LossConfig.dapo(), cfg)
    for batch in data[:2]:
        first.step(batch)
    first.save(tmp_path / "ckpt")
    torch.manual_seed(12345)  # whatever happens in between must not matter
    resumed = Trainer.resume(tmp_path / "ckpt")
    assert (resumed.state.step, resumed.state.data_position) == (2, 12)
    for batch in data[resumed.state.step:]:
        resumed.step(batch)

    a, b = _params(straight.model), _params(resumed.model)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert resumed.scheduler.get_last_lr() == straight.scheduler.get_last_lr()


def test_step_does_not_depend_on_packing(tiny_config: Qwen2Config, vocab_size: int) -> None:
    items = random_items(10, vocab_size, seed=5)
    results = []
    for micro in (40, 400):
        trainer = Trainer(PolicyModel.from_config(tiny_config, seed=0), LossConfig.grpo(), TrainerConfig(
            lr=1e-3, micro_batch_tokens=micro))
        m = trainer.step(items)
        results.append((m, {k: p.grad.clone() for k, p in trainer.model.named_parameters()}))
    (m_small, p_small), (m_big, p_big) = results
    assert m_small.num_micro_batches > m_big.num_micro_batches == 1
    assert m_small.loss == pytest.approx(m_big.loss, abs=1e-6)
    assert m_small.grad_norm == pytest.approx(m_big.grad_norm, rel=1e-4)
    for name in p_small:  # the gradients, not the weights: Adam's first step is ~lr * sign(g)
        torch.testing.assert_close(p_small[name], p_big[name], rtol=1e-4, atol=1e-8)


def test_gpu_throughput_options_keep_the_step(tiny_config: Qwen2Config, vocab_size: int) -> None:
    """Stacked rows, varlen attention, chunked logprobs and fused AdamW change speed, not the gradient."""
    items = random_items(10, vocab_size, seed=5)
    plain = Trainer(PolicyModel.from_config(tiny_config, seed=0), LossConfig.grpo(), TrainerConfig(
        lr=1e-3, micro_batch_tokens=64))
    fast_model = PolicyModel.from_config(tiny_config, seed=0, attn_implementation=VARLEN_ATTENTION)
    fast = Trainer(fast_model, LossConfig.grpo(),
                   TrainerConfig(lr=1e-3, micro_batch_tokens=64, pad_to_multiple=64, rows_per_micro_batch=3,
                                 logprob_chunk_tokens=50, logprob_keep_logits=True, fused_optimizer=True))
    m_plain, m_fast = plain.step(items), fast.step(items)
    assert m_fast.num_micro_batches == -(-m_plain.num_micro_batches // 3)
    assert m_fast.loss == pytest.approx(m_plain.loss, abs=1e-6)
    assert m_fast.entropy == pytest.approx(m_plain.entropy, rel=1e-5)
    for (name, p), q in zip(plain.model.named_parameters(), fast.model.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-7, msg=name)
    assert fast.optimizer.param_groups[0]["fused"] and not plain.optimizer.param_groups[0]["fused"]


def test_logprobs_at_loss_tokens_keep_the_step(tiny_config: Qwen2Config, vocab_size: int) -> None:
    """The LM head only at the loss mask's positions: same loss, entropy, KL and gradients as full logits."""
    items = random_items(10, vocab_size, seed=7)
    assert any(0 in it.loss_mask for it in items)  # some positions are skipped, or the test shows nothing
    steps = []
    for only in (False, True):
        model = PolicyModel.from_config(tiny_config, seed=0)
        ref = PolicyModel.from_config(tiny_config, seed=1)
        trainer = Trainer(model, LossConfig.grpo(kl_coef=0.1), TrainerConfig(
            lr=1e-3, micro_batch_tokens=64, logprobs_at_loss_tokens=only), ref_model=ref)
        steps.append((trainer.step(items), trainer))
    (m_full, full), (m_only, only) = steps
    assert m_only.loss == pytest.approx(m_full.loss, abs=1e-6)
    assert m_only.kl == pytest.approx(m_full.kl, rel=1e-5) and m_full.kl > 0
    assert m_only.entropy == pytest.approx(m_full.entropy, rel=1e-5)
    for (name, p), q in zip(full.model.named_parameters(), only.model.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-7, msg=name)


def test_positive_advantage_raises_logprob(tiny_model: PolicyModel, vocab_size: int) -> None:
    items = [it for it in random_items(4, vocab_size, seed=9) if it.advantage > 0]
    trainer = Trainer(tiny_model, LossConfig.dapo(is_correction="none"), TrainerConfig(lr=1e-2, grad_clip=None))
    ids = torch.tensor([items[0].token_ids])
    pos = torch.arange(len(items[0]))[None]
    mask = torch.tensor([items[0].loss_mask], dtype=torch.float32)
    with torch.no_grad():
        before = float((tiny_model.logprobs(ids, pos)[0] * mask).sum())
    for _ in range(3):
        trainer.step(items)
    with torch.no_grad():
        after = float((tiny_model.logprobs(ids, pos)[0] * mask).sum())
    assert after > before + 1.0


def _traj(eid: str, harness: str, reward: float, passed: bool) -> Trajectory:
    return Trajectory(
        episode_id=eid, run_id="r", task_id="t", domain="coding", seed=0, harness=harness, effort="high",
        policy_version=0, status=Status.OK, reward=reward, verifier={"passed": passed},
        samples=(Sample((1, 2), (0.0, -1.0), (0, 1)),), turns=(Turn(0, 0, tool_calls=4),), tool_errors=1,
    )


def test_metrics(tiny_model: PolicyModel, vocab_size: int) -> None:
    items = random_items(5, vocab_size, seed=2)
    trajs = [_traj("a", "codex", 1.0, True), _traj("b", "codex", 0.0, False), _traj("c", "claude", 0.5, False)]
    m = Trainer(tiny_model, LossConfig.dapo(), TrainerConfig(micro_batch_tokens=50)).step(items, trajectories=trajs)
    assert m.step == 1 and m.num_samples == 5
    assert m.num_loss_tokens == sum(it.num_loss_tokens for it in items)
    assert m.clip_frac == 0.0  # one step per batch: the proximal policy is the current one
    assert 0.0 < m.is_weight_min <= m.is_weight_mean <= m.is_weight_max <= 2.0
    assert m.entropy > 0.0 and m.grad_norm > 0.0
    assert m.total_s >= m.forward_backward_s > 0.0
    assert m.splits["reward/harness=codex"] == 0.5 and m.splits["pass_rate/harness=claude"] == 0.0
    assert m.splits["pass_rate"] == pytest.approx(1 / 3) and m.splits["tool_error_rate"] == pytest.approx(0.25)
    assert m.as_dict()["reward/effort=high"] == pytest.approx(0.5)


def test_kl_to_reference_model(tiny_config: Qwen2Config, vocab_size: int) -> None:
    items = random_items(3, vocab_size, seed=4)
    model = PolicyModel.from_config(tiny_config, seed=0)
    ref = PolicyModel.from_config(tiny_config, seed=1)
    trainer = Trainer(model, LossConfig(kl_coef=0.5, kl_estimator="k3"), TrainerConfig(), ref_model=ref)
    assert trainer.step(items).kl > 0.0
    same = Trainer(PolicyModel.from_config(tiny_config, seed=0), LossConfig(kl_coef=0.5), TrainerConfig(),
                   ref_model=PolicyModel.from_config(tiny_config, seed=0))
    assert same.step(items).kl == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError, match="ref_model"):
        Trainer(PolicyModel.from_config(tiny_config), LossConfig(kl_coef=0.5)).step(items)


def test_publishes_versioned_checkpoints(tiny_model: PolicyModel, vocab_size: int, tmp_path: Path) -> None:
    pub = CheckpointPublisher(tmp_path / "weights", keep=2)
    trainer = Trainer(tiny_model, LossConfig.dapo(), TrainerConfig(lr=1e-3), publisher=pub)
    assert latest_version(tmp_path / "weights") is None
    for batch in _batches(vocab_size, 3):
        trainer.step(batch)
    version, where = latest_version(tmp_path / "weights")  # type: ignore[misc]
    assert version == trainer.version == 3 and trainer.last_published == str(where)
    assert sorted(p.name for p in (tmp_path / "weights").iterdir()) == ["LATEST", "v00000002", "v00000003"]
    loaded = PolicyModel.from_pretrained(where)
    for p, q in zip(trainer.model.parameters(), loaded.parameters()):
        assert torch.equal(p, q)


def test_lr_schedule() -> None:
    cfg = TrainerConfig(lr=1.0, schedule="linear", warmup_steps=2, total_steps=6, min_lr_ratio=0.0)
    assert [lr_factor(cfg, s) for s in range(7)] == pytest.approx([0.5, 1.0, 1.0, 0.75, 0.5, 0.25, 0.0])
    cos = TrainerConfig(schedule="cosine", total_steps=4, min_lr_ratio=0.1)
    assert [lr_factor(cos, s) for s in (0, 2, 4)] == pytest.approx([1.0, 0.55, 0.1])
    with pytest.raises(ValueError, match="total_steps"):
        TrainerConfig(schedule="cosine")


def test_step_rejects_empty_input(tiny_model: PolicyModel) -> None:
    trainer = Trainer(tiny_model, LossConfig())
    with pytest.raises(ValueError, match="at least one"):
        trainer.step([])


def test_checkpoint_restores_every_rng(tiny_model: PolicyModel, vocab_size: int, tmp_path: Path) -> None:
    import random

    import numpy as np

    trainer = Trainer(tiny_model, LossConfig())
    trainer.step(random_items(2, vocab_size), data_position=41)
    trainer.save(tmp_path / "ckpt")
    expected = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    resumed = Trainer.resume(tmp_path / "ckpt")
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expected
    assert resumed.state.data_position == 41 and resumed.version == 1
