"""Tree groups: the trie, tree advantages (hand case, GRPO reduction), the tree mask, and prefix-shared training
exact against the unshared step."""

from __future__ import annotations

import copy
import random

import pytest
import torch
from transformers import Qwen2Config

from learner.advantages import grpo, items_from_groups
from learner.errors import LearnerConfigError, UnsupportedModel
from learner.model import PolicyModel
from learner.train_config import TrainConfig
from learner.trainer import Trainer
from learner.tree import build_trie, pack_shared, tree_advantages, tree_attention_mask, tree_items
from learner.types import AdvantageConfig, AdvantageEstimator, LossConfig, TrainerConfig, TreeSegment
from rollout.types import Sample, Status, Trajectory

pytestmark = pytest.mark.unit


def _traj(eid: str, tokens: list[int], mask: list[int], reward: float, task: str = "t") -> Trajectory:
    # near the tiny model's own logprobs (~ -log 2206), off by a token-dependent amount: weights near 1, some clipped
    lps = tuple(-7.6 - 0.02 * (tok % 20) if m else 0.0 for tok, m in zip(tokens, mask))
    return Trajectory(episode_id=eid, run_id="r", task_id=task, domain="coding", seed=0, harness="codex",
                      effort="low", policy_version=0, status=Status.OK, reward=reward,
                      samples=(Sample(tuple(tokens), lps, tuple(mask)),))


def _hand_tree() -> list[Trajectory]:
    """Prompt [1, 2]; turn 1 branches into [3, 4] / [5, 6]; each branch into two one-token leaves."""
    prompt, m = [1, 2], [0, 0, 1, 1, 1]
    return [
        _traj("a1", prompt + [3, 4, 7], m, 1.0), _traj("a2", prompt + [3, 4, 8], m, 1.0),
        _traj("b1", prompt + [5, 6, 9], m, 1.0), _traj("b2", prompt + [5, 6, 10], m, 0.0),
    ]


def test_build_trie_hand_case() -> None:
    segs = build_trie([(1, 2, 3), (1, 2, 4, 5), (1, 2), (9,)])
    assert segs == [
        TreeSegment(-1, 0, 2, (0, 1, 2)), TreeSegment(-1, 0, 1, (3,)),  # siblings first, then their children
        TreeSegment(0, 2, 3, (0,)), TreeSegment(0, 2, 4, (1,)),
    ]


def test_tree_advantages_hand_case() -> None:
    # dr_grpo (scale 1): mu = 0.75, V(A) = 1, V(B) = 0.5. The prompt is the trunk: 0. A, B hang off the trunk:
    # global only, +-0.25. Leaves: global r - 0.75 plus local r - mean(siblings): a 0.25 + 0, b1 0.25 + 0.5,
    # b2 -0.75 - 0.5.
    items = tree_items([_hand_tree()], AdvantageConfig(estimator=AdvantageEstimator.DR_GRPO))
    assert [it.advantage for it in items] == [
        (0.0, 0.0, 0.25, 0.25, 0.25), (0.0, 0.0, 0.25, 0.25, 0.25),
        (0.0, 0.0, -0.25, -0.25, 0.75), (0.0, 0.0, -0.25, -0.25, -1.25),
    ]
    assert items[0].sample_id == "a1/0" and items[0].group_id == "t/0"


def test_tree_local_weights_the_sibling_term() -> None:
    # the hand case: at 0 the leaves get r - mu alone (a 0.25, b1 0.25, b2 -0.75); at 0.5 half the sibling term
    for weight, b1, b2 in ((0.0, 0.25, -0.75), (0.5, 0.5, -1.0)):
        items = tree_items([_hand_tree()], AdvantageConfig(estimator=AdvantageEstimator.DR_GRPO, tree_local=weight))
        assert [it.advantage for it in items] == [
            (0.0, 0.0, 0.25, 0.25, 0.25), (0.0, 0.0, 0.25, 0.25, 0.25),
            (0.0, 0.0, -0.25, -0.25, b1), (0.0, 0.0, -0.25, -0.25, b2),
        ]


def test_tree_global_weights_the_whole_tree_term_below_a_branch_only() -> None:
    # the hand case at tree_global 0: A and B hang off the trunk and keep their global term (+-0.25); the leaves
    # get r - mean(siblings) alone: a 0, b1 0.5, b2 -0.5. At 0.5: half of r - mu on top (a 0.125, b1 0.625, b2 -0.875)
    for weight, a, b1, b2 in ((0.0, 0.0, 0.5, -0.5), (0.5, 0.125, 0.625, -0.875)):
        items = tree_items([_hand_tree()], AdvantageConfig(estimator=AdvantageEstimator.DR_GRPO, tree_global=weight))
        assert [it.advantage for it in items] == [
            (0.0, 0.0, 0.25, 0.25, a), (0.0, 0.0, 0.25, 0.25, a),
            (0.0, 0.0, -0.25, -0.25, b1), (0.0, 0.0, -0.25, -0.25, b2),
        ]
    # a group without branching: every response hangs off the trunk, so tree_global changes nothing (GRPO)
    group = [_traj(f"e{i}", [5, 6, 100 + i], [0, 0, 1], r) for i, r in enumerate([1.0, 0.0, 0.0])]
    at0 = tree_items([group], AdvantageConfig(tree_global=0.0))
    assert [it.advantage for it in at0] == [it.advantage for it in tree_items([group], AdvantageConfig())]
    assert at0[0].advantage[-1] > 0 > at0[1].advantage[-1]


def test_a_group_without_branching_is_grpo() -> None:
    rng = random.Random(0)
    rewards = [1.0, 0.0, 0.0, 1.0, 0.5]
    # a shared prompt (the trunk), then independent responses; and a group sharing nothing at all
    for prompt in ([5, 6, 7], []):
        group = [_traj(f"e{i}", prompt + [100 + i] + [rng.randrange(99) for _ in range(4)],
                       [0] * len(prompt) + [1] * 5, r) for i, r in enumerate(rewards)]
        cfg = AdvantageConfig()
        tree = tree_items([group], cfg)
        plain = items_from_groups([group], cfg)
        expected = grpo(torch.tensor(rewards, dtype=torch.float64)).tolist()
        for t_it, p_it, a in zip(tree, plain, expected):
            assert isinstance(t_it.advantage, tuple)
            assert t_it.advantage[len(prompt):] == pytest.approx([a] * 5, abs=1e-12)
            assert p_it.advantage == pytest.approx(a, abs=1e-12)
            assert t_it.token_ids == p_it.token_ids and t_it.loss_mask == p_it.loss_mask


def test_tree_advantages_refuse_other_estimators() -> None:
    with pytest.raises(LearnerConfigError, match="rl.advantage.estimator"):
        tree_advantages([TreeSegment(-1, 0, 1, (0, 1))], [0, 1], [1.0, 0.0], AdvantageConfig(estimator=AdvantageEstimator.RLOO))


def test_tree_attention_mask_sees_only_its_own_path() -> None:
    # trunk [0, 2) -> A [2, 4) and B [2, 3); laid out as trunk(0, 1) A(2, 3) B(4)
    segs = [TreeSegment(-1, 0, 2, (0, 1)), TreeSegment(0, 2, 4, (0,)), TreeSegment(0, 2, 3, (1,))]
    allowed_TT, seg_T = tree_attention_mask(segs)
    assert seg_T.tolist() == [0, 0, 1, 1, 2]
    assert allowed_TT.shape == (5, 5)
    assert allowed_TT.int().tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [1, 1, 1, 1, 0],
        [1, 1, 0, 0, 1],  # B's token sees the trunk and itself, not A
    ]


def test_pack_shared_layout_positions_and_predecessors() -> None:
    items = tree_items([_hand_tree()], AdvantageConfig(estimator=AdvantageEstimator.DR_GRPO))
    plan = pack_shared(items, max_tokens=64)
    assert plan.fallback_groups == 0 and not plan.plain
    (sb,) = plan.batches
    # trunk 1 2 | A 3 4 | B 5 6 | a1 7 | a2 8 | b1 9 | b2 10: 10 tokens forwarded instead of 20
    assert plan.forward_tokens == sb.num_tokens == 10
    assert sb.input_ids_BT.tolist() == [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]]
    assert sb.position_ids_BT.tolist() == [[0, 1, 2, 3, 2, 3, 4, 4, 4, 4]]
    assert sb.pred_BT.tolist() == [[-1, 0, 1, 2, 1, 4, 3, 3, 5, 5]]
    assert sb.count_BT.tolist() == [[4, 4, 2, 2, 2, 2, 1, 1, 1, 1]]
    assert sb.allowed_BTT.shape == (1, 10, 10)
    assert not sb.allowed_BTT[0, 7, 6] and sb.allowed_BTT[0, 7, 3] and not sb.allowed_BTT[0, 7, 4]  # a2: not a1, not B
    assert sb.inv_len_BT[0, 2].item() == pytest.approx(2 / 3)  # A's tokens: two sequences of 3 loss tokens


def _branched_groups(vocab: int, *, prefix: int, suffix: int, seed: int) -> list[list[Trajectory]]:
    """One tree group (two levels of branching after a long prefix) and one plain group that shares nothing."""
    rng = random.Random(seed)
    tok = lambda n: [rng.randrange(1, vocab) for _ in range(n)]  # noqa: E731
    p, mp = tok(prefix), [0] * 4 + [1] * (prefix - 4)
    tree = []
    for b in range(2):
        mid = tok(6)
        for leaf in range(2):
            tail = tok(suffix + leaf)
            tree.append(_traj(f"t{b}{leaf}", p + mid + tail, mp + [1, 1, 1, 0, 1, 1] + [1] * len(tail),
                              float((b + leaf) % 2) + 0.25 * b, task="tree"))
    plain = [_traj(f"p{i}", [vocab - 1 - i] + tok(suffix), [0] + [1] * suffix, float(i % 2), task="plain")
             for i in range(3)]
    return [tree, plain]


@pytest.mark.parametrize("loss_cfg", [LossConfig.dapo(), LossConfig.grpo(), LossConfig.cispo()],
                         ids=["dapo-token-mean", "grpo-seq-mean", "cispo"])
def test_prefix_shared_step_equals_unshared(tiny_model: PolicyModel, vocab_size: int, loss_cfg: LossConfig) -> None:
    items = tree_items(_branched_groups(vocab_size, prefix=40, suffix=7, seed=1), AdvantageConfig())
    metrics, grads = {}, {}
    for shared in (False, True):
        model = copy.deepcopy(tiny_model)
        trainer = Trainer(model, loss_cfg, TrainerConfig(lr=1e-3, micro_batch_tokens=512, prefix_sharing=shared,
                                                         grad_clip=None))
        metrics[shared] = trainer.step(items)
        grads[shared] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    off, on = metrics[False], metrics[True]
    assert on.shared_fallback_groups == 1 and off.shared_fallback_groups == 0
    assert on.forward_tokens < off.forward_tokens == off.num_tokens
    assert on.loss == pytest.approx(off.loss, abs=1e-6)
    for field in ("pg_loss", "clip_frac", "is_weight_mean", "entropy", "num_loss_tokens"):
        assert getattr(on, field) == pytest.approx(getattr(off, field), abs=1e-6), field
    assert grads[True].keys() == grads[False].keys()
    worst = max(float((grads[True][n] - grads[False][n]).abs().max()) for n in grads[False])
    scale = max(float(g.abs().max()) for g in grads[False].values())
    assert scale > 1e-3  # the gradients are not trivially 0
    assert worst < 1e-6, (worst, scale)


def test_prefix_sharing_refuses_varlen_attention_and_gspo(tiny_config: Qwen2Config, vocab_size: int) -> None:
    items = tree_items(_branched_groups(vocab_size, prefix=12, suffix=3, seed=2), AdvantageConfig())
    model = PolicyModel.from_config(tiny_config, seed=0, attn_implementation="packed_varlen")
    trainer = Trainer(model, LossConfig.dapo(), TrainerConfig(prefix_sharing=True))
    with pytest.raises(UnsupportedModel, match="sdpa or eager"):
        trainer.step(items)
    with pytest.raises(LearnerConfigError, match="gspo"):
        Trainer(PolicyModel.from_config(tiny_config, seed=0), LossConfig.gspo(), TrainerConfig(prefix_sharing=True))


def test_eager_attention_matches_sdpa(tiny_config: Qwen2Config, vocab_size: int) -> None:
    items = tree_items(_branched_groups(vocab_size, prefix=12, suffix=3, seed=3), AdvantageConfig())
    (sb,) = pack_shared(items, 256).batches
    out = {}
    for impl in ("sdpa", "eager"):
        model = PolicyModel.from_config(tiny_config, seed=0, attn_implementation=impl)
        out[impl] = model.logprobs_at(sb.input_ids_BT, sb.position_ids_BT, sb.pred_BT, sb.allowed_BTT)[0]
    assert torch.allclose(out["sdpa"], out["eager"], atol=1e-5)


def test_config_defaults_leave_runs_unchanged_and_the_loop_switch_reads_them() -> None:
    cfg = TrainConfig(run_id="r")
    assert cfg.rl.advantage.tree is False and cfg.trainer.prefix_sharing is False
    on = TrainConfig.model_validate({"run_id": "r", "rl": {"advantage": {"tree": True}},
                                     "trainer": {"prefix_sharing": True}})
    assert on.rl.advantage.tree and on.trainer.prefix_sharing
    from learner import loop

    assert loop.advantage_items(on.rl.advantage) is tree_items
    assert loop.advantage_items(cfg.rl.advantage) is items_from_groups


def test_plain_groups_share_their_prompt_exactly_with_a_kl_reference(tiny_config: Qwen2Config,
                                                                      vocab_size: int) -> None:
    # per-group GRPO items: a scalar advantage per leaf, so sharing stops at the first loss token (the prompt)
    items = items_from_groups(_branched_groups(vocab_size, prefix=30, suffix=5, seed=4), AdvantageConfig())
    loss_cfg = LossConfig.dapo(kl_coef=0.1)
    metrics, grads = {}, {}
    for shared in (False, True):
        model = PolicyModel.from_config(tiny_config, seed=0)
        trainer = Trainer(model, loss_cfg, TrainerConfig(lr=1e-3, micro_batch_tokens=512, prefix_sharing=shared),
                          ref_model=PolicyModel.from_config(tiny_config, seed=1))
        metrics[shared] = trainer.step(items)
        grads[shared] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert metrics[True].forward_tokens < metrics[False].forward_tokens  # the tree group's 4-token prompt, thrice
    assert metrics[True].kl == pytest.approx(metrics[False].kl, abs=1e-7) and metrics[False].kl > 0
    assert metrics[True].loss == pytest.approx(metrics[False].loss, abs=1e-6)
    assert max(float((grads[True][n] - grads[False][n]).abs().max()) for n in grads[False]) < 1e-6


def test_the_sharded_trainer_refuses_prefix_sharing(tiny_model: PolicyModel) -> None:
    from learner.sharded_trainer import ShardedTrainer

    with pytest.raises(LearnerConfigError, match="trainer.prefix_sharing"):
        ShardedTrainer(tiny_model, LossConfig.dapo(), TrainerConfig(prefix_sharing=True))
