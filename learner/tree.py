"""Groups as trees: tree-structured advantages and prefix-shared packing.

A branched group (``rollout`` forks an episode after turn t into N
continuations) is a tree of token sequences: its leaves share the exact token
prefix up to the branch turn. Sharing is found from the token ids alone
(``build_trie``), so a record's ``verifier["branch"]`` is never needed, and a
plain group is the special case whose only shared prefix is the prompt.

Advantages (``tree_advantages``), after TreeRL (Hou et al., 2025) and
Tree-GRPO (Ji et al., 2025). With ``V(s)`` the mean reward of the leaves
under segment ``s``, ``mu`` / ``sigma`` the mean / sample std of all leaf
rewards, and ``C(p)`` the children of ``s``'s parent ``p``:

    A(s) = (V(s) - mu) / (sigma + eps)                                   global: GRPO over the whole tree
         + (V(s) - mean_{c in C(p)} V(c)) / (sigma + eps)                local: s against its siblings

and every token of ``s`` gets ``A(s)``. Departures from the papers:
- no ``1 / sqrt(|L(s)|)`` scaling (TreeRL): a segment's tokens already enter
  the loss once per leaf under it (``pack_shared`` weights them so), which is
  the weight the unshared computation gives them;
- the local baseline is the mean of the siblings' subtree values (Tree-GRPO's
  intra-tree group), not ``V(p)``, which weights siblings by their leaf counts;
- the local term is 0 where ``p`` is part of the trunk (the prefix every leaf
  shares, e.g. the prompt): there ``C(p)`` is the whole tree and the local
  term would repeat the global one. So a group with no branching is GRPO
  exactly (``sigma``: unbiased, as ``learner.advantages.grpo``), and the trunk
  itself gets 0 (``V = mu``);
- ``estimator: dr_grpo`` divides by 1 instead of ``sigma + eps``;
- ``tree_local`` weights the local term (1 by default). At 0 a leaf's own
  segment gets its GRPO advantage ``(r - mu) / sigma`` and a shared segment
  the mean of its leaves' GRPO advantages: what the unshared GRPO loss gives
  a shared token (exactly at the first update of an iteration, where the
  ratio is 1, for token-mean aggregation), so branching then changes which
  episodes are sampled, not how a leaf is scored. At 1 a leaf's own tokens
  get the global and the sibling term, about twice plain GRPO's scale;
- ``tree_global`` weights the global term of a segment below a branch point
  (1 by default). At 0, with ``tree_local`` 1, such a segment is scored
  against its siblings only (the quality of the prefix it shares taken out
  of its advantage), while a segment hanging off the trunk (a root's shared
  turns) keeps the global term alone.

Prefix-shared packing (``pack_shared``): each group's trie goes into one row,
every segment once, parents first; ``tree_attention_mask`` lets a token see
only its own path, positions continue from the parent, and a token's logprob
comes from its path's previous token (``PolicyModel.logprobs_at``). A token
shared by k sequences is weighted by the sum of their loss coefficients, so
the loss, and its gradient, equal the per-sequence computation's (the test
checks it to ~1e-7 in fp32). Sharing keys on everything the loss reads
(token, loss mask and, on loss tokens, the rollout / ref logprobs and the
advantage), so a shared token is the same term in every sequence that has it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from learner.advantages import response_tokens, dynamic_sampling_keep, shaped_reward
from learner.errors import LearnerConfigError, ShapeError
from learner.packing import first_fit_decreasing
from learner.types import AdvantageConfig, AdvantageEstimator, SharedBatch, TrainItem, TreeSegment
from rollout.types import Trajectory

__all__ = ["SharedPlan", "build_trie", "pack_shared", "tree_advantages", "tree_attention_mask", "tree_items"]


def build_trie(seqs: Sequence[Sequence[Hashable]]) -> list[TreeSegment]:
    """The compressed trie (radix tree) of ``seqs``: segments whose members agree exactly, parents before children.

    A segment ends where its members diverge or one of them ends. Identical
    sequences share every segment. Empty sequences belong to no segment.
    """
    segments: list[TreeSegment] = []
    stack: list[tuple[int, int, tuple[int, ...]]] = [(-1, 0, tuple(i for i, s in enumerate(seqs) if len(s) > 0))]
    while stack:
        parent, depth, members = stack.pop()
        parts: dict[Hashable, list[int]] = {}
        for m in members:  # by the token at ``depth``, in order of first appearance
            parts.setdefault(seqs[m][depth], []).append(m)
        children: list[tuple[int, int, tuple[int, ...]]] = []
        for part in parts.values():
            first = seqs[part[0]]
            end = min(len(seqs[m]) for m in part)
            for pos in range(depth + 1, end):
                tok = first[pos]
                if any(seqs[m][pos] != tok for m in part[1:]):
                    end = pos
                    break
            segments.append(TreeSegment(parent=parent, start=depth, end=end, members=tuple(part)))
            rest = tuple(m for m in part if len(seqs[m]) > end)
            if rest:
                children.append((len(segments) - 1, end, rest))
        stack.extend(reversed(children))  # depth first, first child first
    return segments


def tree_advantages(
    segments: Sequence[TreeSegment], leaf_of: Sequence[int], reward_L: Sequence[float], cfg: AdvantageConfig,
) -> list[float]:
    """``A(s)`` for every segment (formula in the module docstring).

    ``leaf_of[m]``: the leaf (trajectory) index of sequence ``m``, so the
    samples of a split trajectory count as one leaf; ``reward_L``: shaped rewards.
    """
    if cfg.estimator not in (AdvantageEstimator.GRPO, AdvantageEstimator.DR_GRPO):
        raise LearnerConfigError(f"rl.advantage.estimator: the tree advantage (rl.advantage.tree) is GRPO-shaped; "
                                 f"expected grpo or dr_grpo, got {cfg.estimator.value}")
    n_leaves = len(reward_L)
    if n_leaves < 2:
        return [0.0] * len(segments)
    reward_t = torch.tensor(list(reward_L), dtype=torch.float64)
    mu = float(reward_t.mean())
    scale = float(reward_t.std(unbiased=True)) + cfg.eps if cfg.estimator is AdvantageEstimator.GRPO else 1.0
    leaves_S = [sorted({leaf_of[m] for m in s.members}) for s in segments]
    value_S = [sum(reward_L[leaf] for leaf in ls) / len(ls) for ls in leaves_S]
    trunk_S = [len(ls) == n_leaves for ls in leaves_S]
    children: dict[int, list[int]] = {}
    for i, s in enumerate(segments):
        children.setdefault(s.parent, []).append(i)
    adv_S = []
    for i, s in enumerate(segments):
        global_term = (value_S[i] - mu) / scale
        local_term = 0.0
        if s.parent >= 0 and not trunk_S[s.parent]:  # below a branch point
            sib = children[s.parent]
            local_term = cfg.tree_local * (value_S[i] - sum(value_S[c] for c in sib) / len(sib)) / scale
            global_term *= cfg.tree_global
        adv_S.append(global_term + local_term)
    return adv_S


def tree_items(
    groups: Sequence[Sequence[Trajectory]],
    cfg: AdvantageConfig,
    *,
    budget_of: Callable[[Trajectory], int | None] | None = None,
    tokens_of: Callable[[Trajectory], int] = response_tokens,
    tau_of: Callable[[Trajectory], float] | None = None,
) -> list[TrainItem]:
    """``learner.advantages.items_from_groups`` with tree advantages: the same items, one advantage per token.

    Rewards are shaped and groups dropped by dynamic sampling exactly as there.
    """
    items: list[TrainItem] = []
    for group in groups:
        rewards = [shaped_reward(t, cfg, budget_of=budget_of, tokens_of=tokens_of, tau_of=tau_of) for t in group]
        if cfg.dynamic_sampling and not dynamic_sampling_keep(rewards):
            continue
        samples = [(leaf, k, s) for leaf, t in enumerate(group) for k, s in enumerate(t.samples)]
        segments = build_trie([s.token_ids for _, _, s in samples])
        adv_S = tree_advantages(segments, [leaf for leaf, _, _ in samples], rewards, cfg)
        adv_M = [[0.0] * len(s.token_ids) for _, _, s in samples]
        for seg, a in zip(segments, adv_S):
            for m in seg.members:
                adv_M[m][seg.start:seg.end] = [a] * (seg.end - seg.start)
        for (leaf, k, s), adv in zip(samples, adv_M):
            t = group[leaf]
            tags = {"harness": t.harness, "effort": t.effort, "domain": t.domain, "task": t.task_id}
            items.append(TrainItem(
                token_ids=s.token_ids, rollout_logprobs=s.logprobs, loss_mask=s.loss_mask, advantage=tuple(adv),
                sample_id=f"{t.episode_id}/{k}", group_id=f"{t.task_id}/{t.seed}", tags=tags,
            ))
    return items


# ---------------------------------------------------------------- prefix-shared packing


def tree_attention_mask(segments: Sequence[TreeSegment]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(allowed_TT, seg_T)`` for the segments laid out in order: ``allowed[i, j]`` iff ``j <= i`` and ``j``'s
    segment is ``i``'s or one of its ancestors. Segments must come parents first (``build_trie``'s order)."""
    n = len(segments)
    anc_SS = torch.zeros(n, n, dtype=torch.bool)
    for i, s in enumerate(segments):
        if s.parent >= i:
            raise ShapeError(f"tree_attention_mask: segments: segment {i}'s parent {s.parent} comes after it; "
                             "expected parents first")
        anc_SS[i, i] = True
        if s.parent >= 0:
            anc_SS[i] |= anc_SS[s.parent]
    seg_T = torch.cat([torch.full((s.end - s.start,), i, dtype=torch.long) for i, s in enumerate(segments)]) \
        if segments else torch.zeros(0, dtype=torch.long)
    t = seg_T.numel()
    causal_TT = torch.ones(t, t, dtype=torch.bool).tril()
    return anc_SS[seg_T[:, None], seg_T[None, :]] & causal_TT, seg_T


def _token_keys(it: TrainItem) -> list[Hashable]:
    """What must agree for two sequences to share a position: the token, and on loss tokens all the loss reads."""
    adv = it.advantage if isinstance(it.advantage, tuple) else (it.advantage,) * len(it)
    ref = it.ref_logprobs
    return [
        (tok,) if k == 0 or not it.loss_mask[k] else
        (tok, it.rollout_logprobs[k], adv[k], None if ref is None else ref[k])
        for k, tok in enumerate(it.token_ids)
    ]


@dataclass(frozen=True)
class _Tree:
    items: tuple[TrainItem, ...]
    segments: tuple[TreeSegment, ...]

    @property
    def length(self) -> int:
        return sum(s.end - s.start for s in self.segments)


@dataclass(frozen=True)
class SharedPlan:
    """``pack_shared``'s answer: the shared micro-batches, the items left to the plain packer, and counts."""

    batches: list[SharedBatch]
    plain: list[TrainItem]
    fallback_groups: int
    forward_tokens: int


def _tree_row(trees: Sequence[_Tree]) -> SharedBatch:
    ids: list[int] = []
    pos: list[int] = []
    pred: list[int] = []
    mask: list[int] = []
    rollout: list[float] = []
    adv: list[float] = []
    ref: list[float] = []
    count: list[float] = []
    inv_len: list[float] = []
    blocks = []
    with_ref = any(it.ref_logprobs is not None for tr in trees for it in tr.items)
    for tree in trees:
        allowed_TT, _ = tree_attention_mask(tree.segments)
        blocks.append(allowed_TT)
        at: list[int] = []  # row index where each segment starts
        for s in tree.segments:
            at.append(len(ids))
            it = tree.items[s.members[0]]
            advs = it.advantage if isinstance(it.advantage, tuple) else (it.advantage,) * len(it)
            weight = sum(1.0 / max(tree.items[m].num_loss_tokens, 1) for m in s.members)
            for k in range(s.start, s.end):
                ids.append(it.token_ids[k])
                pos.append(k)
                if k == 0:
                    pred.append(-1)
                elif k == s.start:  # the parent's last token
                    parent = tree.segments[s.parent]
                    pred.append(at[s.parent] + parent.end - parent.start - 1)
                else:
                    pred.append(len(ids) - 2)
                on = k > 0 and it.loss_mask[k] > 0
                mask.append(int(on))
                rollout.append(it.rollout_logprobs[k])
                adv.append(advs[k])
                ref.append(it.ref_logprobs[k] if it.ref_logprobs is not None else 0.0)
                count.append(float(len(s.members)))
                inv_len.append(weight)
    if with_ref and not all(it.ref_logprobs is not None for tr in trees for it in tr.items):
        raise ShapeError("pack_shared: ref_logprobs: expected on every TrainItem or on none")
    t = len(ids)
    allowed_TT = torch.block_diag(*[b.to(torch.uint8) for b in blocks]).bool() if blocks else \
        torch.zeros(0, 0, dtype=torch.bool)
    row = lambda xs, dt: torch.from_numpy(np.array(xs, dtype=dt)).view(1, t)  # noqa: E731
    return SharedBatch(
        input_ids_BT=row(ids, np.int64), position_ids_BT=row(pos, np.int64), pred_BT=row(pred, np.int64),
        allowed_BTT=allowed_TT[None], loss_mask_BT=row(mask, np.float32), rollout_logp_BT=row(rollout, np.float32),
        adv_BT=row(adv, np.float32), ref_logp_BT=row(ref, np.float32) if with_ref else None,
        count_BT=row(count, np.float32), inv_len_BT=row(inv_len, np.float32),
        items=tuple(it for tr in trees for it in tr.items),
    )


def pack_shared(items: Sequence[TrainItem], max_tokens: int) -> SharedPlan:
    """Micro-batches with each group's (``group_id``'s) shared prefixes forwarded once.

    A group whose trie shares no position between two items goes to
    ``plain`` (counted in ``fallback_groups``), to be packed as usual; so
    does one whose tree is longer than ``max_tokens``. Trees are binned first-fit
    decreasing into rows of at most ``max_tokens`` tokens, one row (no padding) per micro-batch.
    """
    by_group: dict[str, list[TrainItem]] = {}
    for it in items:
        by_group.setdefault(it.group_id, []).append(it)
    trees: list[_Tree] = []
    plain: list[TrainItem] = []
    fallback = 0
    for group in by_group.values():
        segments = build_trie([_token_keys(it) for it in group])
        tree = _Tree(tuple(group), tuple(segments))
        if all(len(s.members) == 1 for s in segments) or tree.length > max_tokens:
            plain.extend(group)
            fallback += 1
            continue
        trees.append(tree)
    bins = first_fit_decreasing([tr.length for tr in trees], max_tokens) if trees else []
    batches = [_tree_row([trees[i] for i in b]) for b in bins]
    forward = sum(tr.length for tr in trees) + sum(len(it) for it in plain)
    return SharedPlan(batches=batches, plain=plain, fallback_groups=fallback, forward_tokens=forward)
