"""The sharded trainer's shortcuts at world size 1 (in this process, gloo): the same steps as without them.

``ShardedTrainer`` clips and steps AdamW on the local shards (``local_optimizer``)
and keeps the layers gathered between micro-batches (``keep_gathered``); both
must give the same weights as the plain DTensor path and as the single-process
``Trainer`` (the reference, never sharded against sharded alone).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest
import torch
from transformers import Qwen2Config

from learner.distributed import (
    free_address, full_state_dict, init_distributed, reshards_after_forward, shard_model, teardown,
)
from learner.model import PolicyModel
from learner.sharded_trainer import ShardedTrainer
from learner.trainer import Trainer
from learner.types import LossConfig, TrainerConfig
from learner_fakes import random_items

pytestmark = [pytest.mark.timeout(120)]

CFG = TrainerConfig(lr=1e-4, micro_batch_tokens=64, weight_decay=0.01, world_size=1)


@pytest.fixture
def mesh() -> Iterator[object]:
    _, port = free_address()
    yield init_distributed(0, 1, "127.0.0.1", port, timeout_s=30.0)
    teardown()


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys(), set(a) ^ set(b)
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


@pytest.mark.parametrize("fused", [False, True])
def test_local_shard_steps_equal_the_dtensor_path_and_one_process(
    mesh: object, tiny_config: Qwen2Config, vocab_size: int, fused: bool
) -> None:
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.tensor import DTensor

    cfg = CFG.model_copy(update={"fused_optimizer": fused})
    start = PolicyModel.from_config(tiny_config, seed=0)
    data = [random_items(12, vocab_size, seed=20 + k) for k in range(3)]

    def sharded(local_optimizer: bool = True, keep_gathered: bool | None = None) -> ShardedTrainer:
        model = copy.deepcopy(start)
        shard_model(model, mesh)
        return ShardedTrainer(model, LossConfig.dapo(), cfg, local_optimizer=local_optimizer,
                              keep_gathered=keep_gathered)

    reference = Trainer(copy.deepcopy(start), LossConfig.dapo(), cfg)
    fast, plain = sharded(), sharded(local_optimizer=False, keep_gathered=False)
    assert not reshards_after_forward(fast.model) and fast.keep_gathered and not plain.keep_gathered
    seen: list[bool] = []  # per optimizer step of ``fast``: did it run on local shards (plain tensors)?
    step = fast.optimizer.step  # the scheduler's wrapper around AdamW.step

    def spy(*args: object, **kwargs: object) -> object:
        seen.append(not isinstance(fast.optimizer.param_groups[0]["params"][0], DTensor))
        return step(*args, **kwargs)

    spy._wrapped_by_lr_sched = True  # type: ignore[attr-defined]  # still the scheduler's: no warning
    fast.optimizer.step = spy  # type: ignore[method-assign]
    for batch in data:
        m_ref, m_fast, m_plain = reference.step(batch), fast.step(batch), plain.step(batch)
        assert m_fast.num_micro_batches > 1  # the layers stay gathered between micro-batches
        assert m_fast.grad_norm == m_plain.grad_norm == pytest.approx(m_ref.grad_norm, rel=1e-6)
        assert m_fast.loss == m_plain.loss == pytest.approx(m_ref.loss, abs=1e-7)
    assert seen == [False, True, True]  # the first step creates the state (as DTensors), the others run locally
    w_fast, w_plain = full_state_dict(fast.model), full_state_dict(plain.model)
    assert w_fast is not None and w_plain is not None
    assert _max_diff(w_fast, w_plain) == 0.0  # the same kernels on the same shards
    assert _max_diff(w_fast, reference.model.lm.state_dict()) <= 1e-6
    # the state stays keyed by the sharded parameters, as DTensors: what a distributed checkpoint reads
    state = fast.optimizer.state
    assert all(isinstance(state[p]["exp_avg"], DTensor) for p in fast.model.parameters())
    _, optim_sd = get_state_dict(fast.model, fast.optimizer)
    assert len(optim_sd["state"]) == len(list(fast.model.parameters()))
    with torch.no_grad():  # no second reference to the gradients is left on the shards
        assert all(p.to_local().grad is None for p in fast.model.parameters())  # type: ignore[attr-defined]
