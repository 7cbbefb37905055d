"""Pure logic of the training run: SFT samples from oracle trajectories, batches, held-out seed split."""

from __future__ import annotations

import pytest

from learner.loop import eval_requests, split_pass_rates
from learner.sft import batches, sft_items
from learner.train_config import TrainConfig
from rollout.types import Sample, Status, Timings, Trajectory


def _traj(eid: str, *, reward: float, status: Status = Status.OK, harness: str = "codex", effort: str = "low",
          samples: tuple[Sample, ...] | None = None) -> Trajectory:
    samples = samples if samples is not None else (Sample((1, 2, 3, 4, 5), (0.0,) * 5, (0, 0, 1, 1, 0)),)
    return Trajectory(
        episode_id=eid, run_id="r", task_id="general/answer_number", domain="general", seed=1, harness=harness,
        effort=effort, policy_version=0, status=status, reward=reward, error="",
        verifier={"passed": reward >= 1.0}, samples=samples, turns=(), tool_errors=0, timings=Timings(0, 0, 0, 0),
    )


def test_sft_items_keep_the_assistant_mask_and_skip_failures() -> None:
    good = _traj("a", reward=1.0)
    items = sft_items([good, _traj("b", reward=0.0), _traj("c", reward=1.0, status=Status.INVALID)])
    assert [it.sample_id for it in items] == ["a/0"]
    assert items[0].token_ids == good.samples[0].token_ids
    assert items[0].loss_mask == (0, 0, 1, 1, 0)  # only the assistant's tokens are targets
    assert items[0].tags["harness"] == "codex"


def test_sft_items_drop_samples_without_targets() -> None:
    t = _traj("a", reward=1.0, samples=(Sample((1, 2), (0.0, 0.0), (1, 0)),))  # token 0 never has a prediction
    assert sft_items([t]) == []


def test_batches_cover_every_item_each_epoch() -> None:
    items = sft_items([_traj(str(i), reward=1.0) for i in range(5)])
    out = batches(items, batch_size=2, steps=5, seed=0)
    assert [len(b) for b in out] == [2] * 5
    first_epoch = [it.sample_id for b in out for it in b][:5]
    assert sorted(first_epoch) == sorted(it.sample_id for it in items)
    assert batches(items, 8, 1)[0] and len(batches(items, 8, 1)[0]) == 5  # never more than there is


def test_eval_seeds_must_be_disjoint_from_training_seeds() -> None:
    with pytest.raises(ValueError, match="overlap"):
        TrainConfig(run_id="x", train_seeds=100, eval={"seeds": [5, 500]})
    cfg = TrainConfig(run_id="x", train_seeds=100, eval={"seeds": {"start": 100, "count": 4}})
    assert cfg.eval.seeds == (100, 101, 102, 103)


def test_eval_requests_are_identical_across_evaluations() -> None:
    cfg = TrainConfig(run_id="x", train_seeds=100, eval={"seeds": {"start": 1000, "count": 6}})
    a = eval_requests(cfg, ["t1", "t2"], "run", 0)
    b = eval_requests(cfg, ["t1", "t2"], "run", 3)
    strip = lambda rs: [(r.task_id, r.seed, r.harness, r.effort) for r in rs]  # noqa: E731
    assert strip(a) == strip(b) and len(a) == 12
    assert all(r.seed >= cfg.train_seeds for r in a)
    assert len({r.episode_id for r in a + b}) == 24  # stored apart, evaluation by evaluation
    assert {r.harness for r in a} == set(cfg.rollout.rotation.harnesses)  # round-robin covers every harness


def test_split_pass_rates_count_unscorable_as_fail() -> None:
    ts = [_traj("a", reward=1.0), _traj("b", reward=1.0, status=Status.INVALID), _traj("c", reward=0.0, harness="kimi_code")]
    assert split_pass_rates(ts, "harness") == {"codex": 0.5, "kimi_code": 0.0}
