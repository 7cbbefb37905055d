"""Model wrapper (fp32 logprobs at a temperature, entropy, no downloads) and sequence packing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import Qwen2Config

from learner.model import (
    VARLEN_ATTENTION,
    PolicyModel,
    block_causal_mask,
    cu_seqlens_from_positions,
    linear_token_logprobs,
    token_logprobs,
)
from learner.packing import first_fit_decreasing, make_batch, make_rows, pack
from learner_fakes import random_items

pytestmark = pytest.mark.unit


def test_first_fit_decreasing_hand_case() -> None:
    # sorted 5,4,3,3,2 into capacity 7: 5 -> A, 4 -> B, 3 -> B (full), 3 -> C, 2 -> A (full)
    assert first_fit_decreasing([5, 4, 3, 3, 2], 7) == [[0, 4], [1, 2], [3]]


def test_first_fit_decreasing_rejects_oversize_sample() -> None:
    with pytest.raises(ValueError, match="sample 1 has 9 tokens but a micro-batch holds 8"):
        first_fit_decreasing([3, 9], 8)


def test_pack_covers_every_item_without_padding(vocab_size: int) -> None:
    items = random_items(13, vocab_size, seed=3)
    batches = pack(items, max_tokens=64)
    assert sorted(it.sample_id for b in batches for it in b.items) == sorted(it.sample_id for it in items)
    assert all(b.input_ids_BT.shape[1] == sum(len(it) for it in b.items) <= 64 for b in batches)
    assert sum(b.num_tokens for b in batches) == sum(len(it) for it in items)


def test_make_batch_layout() -> None:
    from learner.types import TrainItem

    a = TrainItem((5, 6, 7), (0.0, -1.0, -2.0), (1, 1, 1), 0.5)
    b = TrainItem((8, 9), (0.0, -3.0), (0, 1), (0.1, 0.2))
    batch = make_batch([a, b], pad_to_multiple=8)
    assert batch.input_ids_BT.tolist() == [[5, 6, 7, 8, 9, 0, 0, 0]]
    assert batch.position_ids_BT.tolist() == [[0, 1, 2, 0, 1, 2, 3, 4]]
    assert batch.seg_BT.tolist() == [[0, 0, 0, 1, 1, -1, -1, -1]]
    assert batch.loss_mask_BT.tolist() == [[0, 1, 1, 0, 1, 0, 0, 0]]  # first token of a sample never counts
    assert batch.adv_BT[0].tolist() == pytest.approx([0.5, 0.5, 0.5, 0.1, 0.2, 0, 0, 0])


def test_make_rows_stacks_rows_with_global_segments() -> None:
    from learner.types import TrainItem

    a = TrainItem((5, 6, 7), (0.0, -1.0, -2.0), (1, 1, 1), 0.5)
    b = TrainItem((8, 9), (0.0, -3.0), (0, 1), 1.0)
    c = TrainItem((1, 2, 3, 4, 5), (0.0,) * 5, (1,) * 5, -1.0)
    batch = make_rows([[a, b], [c]], pad_to_multiple=4)
    assert batch.input_ids_BT.tolist() == [[5, 6, 7, 8, 9, 0, 0, 0], [1, 2, 3, 4, 5, 0, 0, 0]]
    assert batch.position_ids_BT.tolist() == [[0, 1, 2, 0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5, 6, 7]]
    assert batch.seg_BT.tolist() == [[0, 0, 0, 1, 1, -1, -1, -1], [2, 2, 2, 2, 2, -1, -1, -1]]
    assert batch.items == (a, b, c) and batch.num_tokens == 10


def test_pack_rows_groups_whole_rows(vocab_size: int) -> None:
    items = random_items(13, vocab_size, seed=3)
    one = pack(items, max_tokens=64, pad_to_multiple=64)
    three = pack(items, max_tokens=64, pad_to_multiple=64, rows=3)
    sizes = [b.input_ids_BT.shape[0] for b in three]
    assert len(sizes) == -(-len(one) // 3) and max(sizes) - min(sizes) <= 1 and sum(sizes) == len(one)
    torch.testing.assert_close(torch.cat([b.input_ids_BT for b in three]), torch.cat([b.input_ids_BT for b in one]))
    assert [it.sample_id for b in three for it in b.items] == [it.sample_id for b in one for it in b.items]


def test_cu_seqlens_from_positions_hand_case() -> None:
    # row 0: samples of 3 and 2, then 2 padding tokens continuing the last; row 1: one sample of 4
    pos = torch.tensor([[0, 1, 2, 0, 1, 2, 3], [0, 1, 2, 3, 0, 1, 2]])
    cu, longest = cu_seqlens_from_positions(pos)
    assert cu.tolist() == [0, 3, 7, 11, 14] and cu.dtype == torch.int32 and longest == 4


def test_varlen_attention_equals_default_on_stacked_rows(tiny_config: Qwen2Config, vocab_size: int) -> None:
    """The packed_varlen path (its CPU reference here) gives the default path's logprobs and gradients."""
    items = random_items(9, vocab_size, seed=2)
    batch = pack(items, max_tokens=96, pad_to_multiple=96, rows=4)[0]
    plain = PolicyModel.from_config(tiny_config, seed=0)
    varlen = PolicyModel.from_config(tiny_config, seed=0, attn_implementation=VARLEN_ATTENTION)
    w_BT = torch.randn(batch.input_ids_BT.shape, generator=torch.Generator().manual_seed(0)) * batch.loss_mask_BT
    for m in (plain, varlen):
        logp_BT, _ = m.logprobs(batch.input_ids_BT, batch.position_ids_BT, temperature=0.7)
        (logp_BT * w_BT).sum().backward()
    a, _ = plain.logprobs(batch.input_ids_BT, batch.position_ids_BT)
    b, _ = varlen.logprobs(batch.input_ids_BT, batch.position_ids_BT)
    on = batch.loss_mask_BT > 0
    torch.testing.assert_close(a[on], b[on], rtol=0, atol=1e-5)
    for (name, p), q in zip(plain.named_parameters(), varlen.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)
    with pytest.raises(ValueError, match="takes no attention_mask"):
        varlen.logprobs(batch.input_ids_BT, batch.position_ids_BT, attention_mask=torch.ones_like(batch.seg_BT))


@pytest.mark.parametrize("keep_logits", [False, True])
def test_chunked_logprobs_equal_full_logits(keep_logits: bool) -> None:
    """Values, entropy and both gradients (hidden, weight) of the chunked LM head match the full-logits path."""
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 9, 16, generator=g, requires_grad=True)
    weight = torch.randn(37, 16, generator=g, requires_grad=True)
    ids = torch.randint(0, 37, (2, 9), generator=g)
    w_BT = torch.randn(2, 9, generator=g)
    ref, ref_ent = token_logprobs(hidden @ weight.T, ids, temperature=0.7, with_entropy=True)
    (ref * w_BT).sum().backward()
    ref_grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    got, got_ent = linear_token_logprobs(hidden, weight, ids, 0.7, chunk_tokens=5, with_entropy=True,
                                         keep_logits=keep_logits)
    (got * w_BT).sum().backward()
    torch.testing.assert_close(got, ref)
    assert got_ent is not None and ref_ent is not None and not got_ent.requires_grad
    torch.testing.assert_close(got_ent, ref_ent, rtol=1e-4, atol=1e-4)  # lse - E[z]: cancellation near 0
    torch.testing.assert_close(hidden.grad, ref_grads[0])
    torch.testing.assert_close(weight.grad, ref_grads[1])


@pytest.mark.parametrize("explicit_mask", [False, True])
def test_packed_logprobs_equal_unpacked(tiny_model: PolicyModel, vocab_size: int, explicit_mask: bool) -> None:
    items = random_items(7, vocab_size, seed=1)
    with torch.no_grad():
        for batch in pack(items, max_tokens=96, pad_to_multiple=16):
            mask = block_causal_mask(batch.seg_BT) if explicit_mask else None
            logp_BT, _ = tiny_model.logprobs(batch.input_ids_BT, batch.position_ids_BT, temperature=0.7,
                                             attention_mask=mask)
            at = 0
            for it in batch.items:
                ids = torch.tensor([it.token_ids])
                alone, _ = tiny_model.logprobs(ids, torch.arange(len(it))[None], temperature=0.7)
                torch.testing.assert_close(logp_BT[:, at:at + len(it)], alone, rtol=0, atol=1e-5)
                at += len(it)


def test_logprobs_only_at_selected_positions(tiny_model: PolicyModel, vocab_size: int) -> None:
    """``only_BT``: the full path's values (and entropy) where selected, 0 elsewhere and at sample starts."""
    batch = pack(random_items(5, vocab_size, seed=3), max_tokens=96)[0]
    sel_BT = batch.loss_mask_BT.bool()
    with torch.no_grad():
        full, full_ent = tiny_model.logprobs(batch.input_ids_BT, batch.position_ids_BT, temperature=0.7, with_entropy=True)
        got, got_ent = tiny_model.logprobs(batch.input_ids_BT, batch.position_ids_BT, temperature=0.7,
                                           with_entropy=True, only_BT=sel_BT)
    keep_BT = sel_BT & (batch.position_ids_BT != 0)
    assert keep_BT.any() and (~keep_BT).any()
    torch.testing.assert_close(got[keep_BT], full[keep_BT], rtol=0, atol=1e-5)
    torch.testing.assert_close(got_ent[keep_BT], full_ent[keep_BT], rtol=0, atol=1e-5)
    assert torch.all(got[~keep_BT] == 0) and torch.all(got_ent[~keep_BT] == 0)


def test_logprobs_are_fp32_at_the_temperature() -> None:
    logits = torch.randn(1, 4, 11, dtype=torch.bfloat16)
    ids = torch.tensor([[1, 2, 3, 4]])
    logp, ent = token_logprobs(logits, ids, temperature=0.5, with_entropy=True)
    ref = torch.log_softmax(logits.float() / 0.5, -1)
    assert logp.dtype == torch.float32 and logp[0, 0] == 0.0
    torch.testing.assert_close(logp[0, 1:], ref[0, :-1].gather(-1, ids[0, 1:, None])[:, 0])
    assert ent is not None
    torch.testing.assert_close(ent[0, 1:], -(ref.exp() * ref).sum(-1)[0, :-1])


def test_from_config_is_seeded_and_leaves_global_rng(tiny_config: Qwen2Config) -> None:
    before = torch.get_rng_state()
    a, b = PolicyModel.from_config(tiny_config, seed=3), PolicyModel.from_config(tiny_config, seed=3)
    c = PolicyModel.from_config(tiny_config, seed=4)
    assert torch.equal(before, torch.get_rng_state())
    pa, pb, pc = (next(m.parameters()) for m in (a, b, c))
    assert torch.equal(pa, pb) and not torch.equal(pa, pc)


def test_save_and_load_local_checkpoint(tiny_model: PolicyModel, tmp_path: Path) -> None:
    tiny_model.save(tmp_path / "ckpt")
    again = PolicyModel.from_pretrained(tmp_path / "ckpt")
    for (name, p), q in zip(tiny_model.named_parameters(), again.parameters()):
        assert torch.equal(p, q), name


def test_from_pretrained_never_downloads(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="never downloads"):
        PolicyModel.from_pretrained("Qwen/Qwen2-0.5B")
