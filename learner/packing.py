"""Sequence packing: variable-length samples into fixed-token micro-batches, no padding waste.

Agent trajectories vary from a few hundred to tens of thousands of tokens.
Padding a batch to its longest sample spends most of the FLOPs on pad tokens;
packing puts several samples end to end in one row of at most
``max_tokens`` tokens instead. Bins are filled first-fit decreasing (sort by
length, put each sample in the first row with room, open a new row if none):
simple, deterministic, and within 11/9 of the optimal number of rows.

Each micro-batch is one row (``B = 1``) holding its samples back to back;
its length is the sum of theirs rounded up to ``pad_to_multiple`` (1 by
default: no padding at all). With ``rows = R`` a micro-batch stacks ``R`` such
rows (``B = R``, each padded to the longest), which on a GPU gives each
forward pass enough work: one 4k-token row of a 0.5B model is launch-bound.
``position_ids`` restart at 0 for every sample, which is what confines
attention to a sample (``learner.model`` says how), and ``seg_BT`` names each
token's sample for the loss's per-sequence terms.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from learner.errors import LearnerConfigError, ShapeError
from learner.types import TrainBatch, TrainItem

__all__ = ["first_fit_decreasing", "make_batch", "make_rows", "pack"]


def first_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Indices of ``lengths`` grouped into bins of total length ``<= capacity``.

    Ties keep input order (stable sort), so equal inputs give equal bins.
    Bins come out in the order they were opened (the longest sample's first).
    """
    if capacity < 1:
        raise LearnerConfigError(f"first_fit_decreasing: capacity must be >= 1, got {capacity}")
    too_long = [(i, n) for i, n in enumerate(lengths) if n > capacity]
    if too_long:
        i, n = too_long[0]
        raise ShapeError(
            f"packing: sample {i} has {n} tokens but a micro-batch holds {capacity} "
            f"(raise micro_batch_tokens to at least {max(n for _, n in too_long)}, or cap episode length)"
        )
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    bins: list[list[int]] = []
    room: list[int] = []
    for i in order:
        for b, free in enumerate(room):
            if lengths[i] <= free:
                bins[b].append(i)
                room[b] -= lengths[i]
                break
        else:
            bins.append([i])
            room.append(capacity - lengths[i])
    return bins


def make_batch(items: Sequence[TrainItem], pad_to_multiple: int = 1, pad_id: int = 0) -> TrainBatch:
    """One packed row of ``items`` end to end, as tensors (``B = 1``)."""
    return make_rows([items], pad_to_multiple, pad_id)


_Row = tuple[list[int], list[int], list[int], list[int], list[float], list[float], list[float]]


def _row(items: Sequence[TrainItem], first_seg: int, t: int, pad_id: int) -> _Row:
    """ids, positions, segments, loss mask, rollout logprobs, advantages, ref logprobs of one row of length ``t``."""
    ids: list[int] = []
    pos: list[int] = []
    seg: list[int] = []
    mask: list[int] = []
    rollout: list[float] = []
    adv: list[float] = []
    ref: list[float] = []
    for s, it in enumerate(items, start=first_seg):
        k = len(it)
        ids.extend(it.token_ids)
        pos.extend(range(k))
        seg.extend([s] * k)
        mask.append(0)  # the first token has no prediction
        mask.extend(it.loss_mask[1:])
        rollout.extend(it.rollout_logprobs)
        adv.extend(it.advantage if isinstance(it.advantage, tuple) else [it.advantage] * k)
        ref.extend(it.ref_logprobs or ())
    pad = t - len(ids)
    # Padding continues the last position so it forms no new "sample" for position-based detection.
    last = pos[-1] if pos else -1
    ids += [pad_id] * pad
    pos += list(range(last + 1, last + 1 + pad))
    seg += [-1] * pad
    mask += [0] * pad
    rollout += [0.0] * pad
    adv += [0.0] * pad
    ref += [0.0] * pad
    return ids, pos, seg, mask, rollout, adv, ref


def make_rows(rows: Sequence[Sequence[TrainItem]], pad_to_multiple: int = 1, pad_id: int = 0) -> TrainBatch:
    """Several packed rows stacked into one micro-batch (``B = len(rows)``), each padded to the same length.

    Segment ids count on across the rows (``items`` in that order), so the
    loss's per-sample sums see every sample once.
    """
    flat = [it for row in rows for it in row]
    with_ref = any(it.ref_logprobs is not None for it in flat)
    if with_ref and not all(it.ref_logprobs is not None for it in flat):
        n_ref = sum(it.ref_logprobs is not None for it in flat)
        raise ShapeError(f"make_batch: ref_logprobs: expected on every TrainItem or on none, got {n_ref} of {len(flat)}")
    longest = max((sum(len(it) for it in row) for row in rows), default=0)
    t = -(-longest // pad_to_multiple) * pad_to_multiple
    starts = [sum(len(r) for r in rows[:i]) for i in range(len(rows))]
    ids, pos, seg, mask, rollout, adv, ref = zip(*(_row(row, s, t, pad_id) for row, s in zip(rows, starts)))
    # Through numpy: ~3x faster than torch.tensor on nested lists, and this runs while the GPU waits.
    grid = lambda xs, dt: torch.from_numpy(np.array(xs, dtype=dt))  # noqa: E731
    return TrainBatch(
        input_ids_BT=grid(ids, np.int64),
        position_ids_BT=grid(pos, np.int64),
        seg_BT=grid(seg, np.int64),
        loss_mask_BT=grid(mask, np.float32),
        rollout_logp_BT=grid(rollout, np.float32),
        adv_BT=grid(adv, np.float32),
        ref_logp_BT=grid(ref, np.float32) if with_ref else None,
        items=tuple(flat),
    )


def pack(
    items: Sequence[TrainItem], max_tokens: int, *, pad_to_multiple: int = 1, pad_id: int = 0, rows: int = 1
) -> list[TrainBatch]:
    """Micro-batches of ``rows`` rows of at most ``max_tokens`` tokens each, first-fit decreasing.

    Every item lands in exactly one row, whole (a sample is never split, so
    per-sequence terms see all of it). An item longer than ``max_tokens`` is
    an error naming it. Rows go into micro-batches in the order they were
    opened, as evenly as ``rows`` allows (17 rows at ``rows=8``: 6, 6, 5), so
    no micro-batch is a lone leftover row (a new shape for compiled code).
    """
    if rows < 1:
        raise LearnerConfigError(f"pack: rows must be >= 1, got {rows}")
    bins = first_fit_decreasing([len(it) for it in items], max_tokens)
    if not bins:
        return []
    n_groups = -(-len(bins) // rows)
    sizes = [len(bins) // n_groups + (1 if g < len(bins) % n_groups else 0) for g in range(n_groups)]
    starts = [sum(sizes[:g]) for g in range(n_groups)]
    groups = [bins[at:at + size] for at, size in zip(starts, sizes)]
    return [make_rows([[items[i] for i in b] for b in group], pad_to_multiple, pad_id) for group in groups]
