"""The sharded learner (FSDP2 over gloo, ranks as Ray actors) against the plain single-process trainer.

Always against ``Trainer`` in this process, never FSDP against FSDP: a gloo bug once summed
gradients instead of averaging them (pytorch#162338), which a sharded-vs-sharded check misses.
"""

from __future__ import annotations

import copy
import hashlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import GPT2Config, Qwen2Config

from learner.distributed import init_distributed, shard_model
from learner.errors import LearnerConfigError, LearnerGroupError, RendezvousTimeout, UnsupportedModel
from learner.group import LearnerGroup
from learner.loop import carry_moments
from learner.model import VARLEN_ATTENTION, PolicyModel
from learner.publish import CheckpointPublisher, latest_version
from learner.sft import sft_step
from learner.trainer import Trainer
from learner.types import LossConfig, TrainerConfig
from learner_fakes import random_items

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(300)]

#: lr 1e-4: Adam's first update is ~lr * g / (|g| + eps), so a gradient near eps turns a 1e-8 difference
#: into up to lr; at 1e-4 the step's weights stay well inside 1e-6 of the reference
CFG = TrainerConfig(lr=1e-4, micro_batch_tokens=64, weight_decay=0.01)


@pytest.fixture(scope="module")
def ray_cpus() -> Iterator[None]:
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False)
    try:
        yield
    finally:
        ray.shutdown()


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys(), set(a) ^ set(b)
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def _tensor_hash(folder: Path) -> str:
    h = hashlib.sha256()
    for shard in sorted(folder.glob("*.safetensors")):
        for name, t in sorted(load_file(str(shard)).items()):
            h.update(name.encode())
            h.update(t.contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def test_world_size_2_matches_one_process_and_its_checkpoint_loads_at_1(
    ray_cpus: None, tiny_config: Qwen2Config, vocab_size: int, tmp_path: Path
) -> None:
    items = random_items(12, vocab_size, seed=5)
    loss_cfg = LossConfig.grpo()  # per-sequence normalisation: the split across ranks must not change it
    # both start from a warm start's AdamW moments (rl.continue_sft_optimizer), as the quickstart does
    start = PolicyModel.from_config(tiny_config, seed=0)
    warm = torch.optim.AdamW(start.parameters(), lr=1e-3)
    sft_step(start, warm, random_items(4, vocab_size, seed=1), 1)
    reference = Trainer(copy.deepcopy(start), loss_cfg, CFG)
    reference_warm = torch.optim.AdamW(reference.model.parameters(), lr=1e-3)
    reference_warm.load_state_dict(copy.deepcopy(warm.state_dict()))  # AdamW shares "step" tensors on load
    carry_moments(reference, reference_warm)
    m_ref = reference.step(items)
    assert m_ref.num_micro_batches % 2 == 1  # one rank runs a stand-in micro-batch

    t0 = time.monotonic()
    with LearnerGroup(start, loss_cfg, CFG.model_copy(update={"world_size": 2}), threads=1,
                      publisher=CheckpointPublisher(tmp_path / "pub2", fsync=False)) as group:
        group.carry_moments(warm, start)
        m = group.step(items)
        grads, weights = group.grads(), group.state_dict()
        group.save(tmp_path / "ckpt2")
    sharded_s = time.monotonic() - t0

    ref_grads = {k: p.grad for k, p in reference.model.lm.named_parameters()}
    grad_diff = _max_diff(grads, ref_grads)
    param_diff = _max_diff(weights, reference.model.lm.state_dict())
    print(f"world size 2 vs one process: max |grad diff| {grad_diff:.2e}, max |param diff| {param_diff:.2e}, "
          f"loss {m.loss:.3e} vs {m_ref.loss:.3e}, grad norm {m.grad_norm:.6f} vs {m_ref.grad_norm:.6f} "
          f"({sharded_s:.1f}s)")
    assert grad_diff <= 1e-6 and param_diff <= 1e-6
    assert m.grad_norm == pytest.approx(m_ref.grad_norm, rel=1e-5)
    assert m.loss == pytest.approx(m_ref.loss, abs=1e-6) and m.entropy == pytest.approx(m_ref.entropy, rel=1e-6)
    assert (m.num_micro_batches, m.num_loss_tokens, m.step) == (m_ref.num_micro_batches, m_ref.num_loss_tokens, 1)
    assert m.is_weight_min == pytest.approx(m_ref.is_weight_min) and m.is_weight_max == pytest.approx(m_ref.is_weight_max)

    # the DCP checkpoint of world size 2, loaded at world size 1: the same weights, step and data position
    with LearnerGroup(PolicyModel.from_config(tiny_config, seed=3), loss_cfg, CFG.model_copy(update={"world_size": 1}),
                      threads=1, publisher=CheckpointPublisher(tmp_path / "pub1", fsync=False)) as one:
        one.load(tmp_path / "ckpt2")
        assert (one.state.step, one.state.data_position) == (1, 12)
        assert _max_diff(one.state_dict(), weights) == 0.0
        one.publish()
        one.save(tmp_path / "ckpt1")
    export2, export1 = tmp_path / "ckpt2" / "model", tmp_path / "ckpt1" / "model"
    assert _tensor_hash(export2) == _tensor_hash(export1)
    loaded = PolicyModel.from_pretrained(export2)
    assert _max_diff(loaded.lm.state_dict(), weights) == 0.0
    (v2, dir2), (v1, dir1) = latest_version(tmp_path / "pub2"), latest_version(tmp_path / "pub1")  # type: ignore[misc]
    assert v2 == v1 == 1 and _tensor_hash(dir2) == _tensor_hash(dir1)


def test_a_killed_rank_fails_the_group_and_resume_trains_nothing_twice(
    ray_cpus: None, tiny_config: Qwen2Config, vocab_size: int, tmp_path: Path
) -> None:
    import ray

    data = [random_items(6, vocab_size, seed=100 + k) for k in range(3)]
    # the GPU fast path's options (stacked rows, varlen attention, chunked logprobs, fused AdamW), on both sides;
    # activation checkpointing on the sharded side only: recomputed layers give the same step
    fast = CFG.model_copy(update={"rows_per_micro_batch": 2, "pad_to_multiple": 64, "logprob_chunk_tokens": 50,
                                  "fused_optimizer": True})
    cfg = fast.model_copy(update={"world_size": 2, "distributed_timeout_s": 60.0, "activation_checkpointing": True})
    straight = Trainer(PolicyModel.from_config(tiny_config, seed=0, attn_implementation=VARLEN_ATTENTION),
                       LossConfig.dapo(), fast)
    for batch in data:
        straight.step(batch)

    start = PolicyModel.from_config(tiny_config, seed=0, attn_implementation=VARLEN_ATTENTION)
    group = LearnerGroup(start, LossConfig.dapo(), cfg, threads=1)
    group.step(data[0])
    group.save(tmp_path / "ckpt")
    group.step(data[1])
    ray.kill(group.actors[1], no_restart=True)
    t0 = time.monotonic()
    with pytest.raises(LearnerGroupError, match=r"rank \d of 2 (died|failed)"):
        group.step(data[2])
    assert time.monotonic() - t0 < 30  # an error, not a hang
    with pytest.raises(LearnerGroupError, match="stopped"):
        group.step(data[2])

    with LearnerGroup(PolicyModel.from_config(tiny_config, seed=9, attn_implementation=VARLEN_ATTENTION),
                      LossConfig.dapo(), cfg, threads=1) as resumed:
        resumed.load(tmp_path / "ckpt")
        assert (resumed.state.step, resumed.state.data_position) == (1, 6)
        for batch in data[resumed.state.data_position // 6:]:  # the batch after the checkpoint, once
            resumed.step(batch)
        assert resumed.version == 3 and resumed.state.data_position == 18
        diff = _max_diff(resumed.state_dict(), straight.model.lm.state_dict())
    print(f"resumed at world size 2 vs 3 straight steps in one process: max |param diff| {diff:.2e}")
    assert diff <= 1e-5


def test_bad_world_size_names_the_field(ray_cpus: None, tiny_model: PolicyModel) -> None:
    with pytest.raises(ValueError, match="world_size"):
        TrainerConfig(world_size=0)
    with pytest.raises(ValueError, match="world_size.*devices_per_node"):
        TrainerConfig(world_size=3, devices_per_node=2)
    with pytest.raises(LearnerConfigError, match=r"trainer.world_size: 8 ranks need 8 CPUs"):
        LearnerGroup(tiny_model, LossConfig(), CFG.model_copy(update={"world_size": 8}))


def test_a_model_without_decoder_layers_is_refused_by_name() -> None:
    gpt2 = PolicyModel.from_config(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=64))
    with pytest.raises(UnsupportedModel, match=r"trainer.world_size: .*GPT2.*\.layers"):
        shard_model(gpt2, mesh=None)


def test_a_rendezvous_that_does_not_complete_names_the_timeout_field() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nobody listens there: rank 0 never came
    t0 = time.monotonic()
    with pytest.raises(RendezvousTimeout, match=r"trainer.distributed_timeout_s: rank 1 of 2 .*127.0.0.1"):
        init_distributed(1, 2, "127.0.0.1", port, timeout_s=2.0)
    assert time.monotonic() - t0 < 30


def test_the_training_config_takes_the_sharded_learner_fields(tmp_path: Path) -> None:
    import yaml

    from learner.train_config import load_train_config

    base = {"run_id": "r", "rollout": {"tasks": {"ids": ["general/answer_number"]}},
            "trainer": {"world_size": 2, "devices_per_node": 2, "activation_checkpointing": True,
                        "distributed_timeout_s": 30}}
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(base))
    cfg = load_train_config(path)
    assert (cfg.trainer.world_size, cfg.trainer.devices_per_node, cfg.trainer.distributed_timeout_s) == (2, 2, 30.0)
    path.write_text(yaml.safe_dump(base | {"model": {"device": "cuda:1"}}))
    with pytest.raises(LearnerConfigError, match=r"model.device: with trainer.world_size"):
        load_train_config(path)
    path.write_text(yaml.safe_dump(base | {"trainer": {"world_size": 0}}))
    with pytest.raises(LearnerConfigError, match=r"trainer.world_size"):
        load_train_config(path)
