"""The split-K decode attention (``rollout.engine_attention``) computes what SDPA computes, and the fused sampler
(``rollout.engine_sampling.sample_fused``) what ``sample_static`` computes: the kernels alone and inside the
engine's decode step, run on CPU through Triton's interpreter.

Triton reads ``TRITON_INTERPRET`` when it is imported, and the test session has imported it by then, so those
checks live in ``interpreted_engine_kernels.py`` and run here in a child pytest with the variable set."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from rollout.engine_model import SlotModel
from rollout.policy.models import tiny_model

pytestmark = pytest.mark.unit

INTERPRETED = Path(__file__).with_name("interpreted_engine_kernels.py")


@pytest.mark.slow
def test_the_kernels_under_tritons_interpreter() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(INTERPRETED)],
                          env=env, capture_output=True, text=True, timeout=600, cwd=Path(__file__).parents[3])
    tail = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 0, tail
    assert "34 passed" in tail and "skipped" not in tail and "deselected" not in tail, tail


def test_slot_model_refuses_an_unknown_attention_or_a_head_size_the_kernels_do_not_take(tiny: Any) -> None:
    model, tok = tiny_model(seed=0, tokenizer=tiny[1])
    with pytest.raises(ValueError, match="attention must be"):
        SlotModel(model, slots=2, length=64, attention="flash")
    odd, _ = tiny_model(seed=0, tokenizer=tiny[1], hidden_size=96, num_heads=4)  # head_dim 24
    with pytest.raises(ValueError, match="head_dim"):
        SlotModel(odd, slots=2, length=64, attention="triton")
    assert SlotModel(model, slots=2, length=64).attention == "sdpa"  # the CPU default


def test_fused_prefill_matches_the_modules(tiny: Any) -> None:
    model, tok = tiny_model(seed=0, tokenizer=tiny[1], sliding_window=4)
    prompts = [tok.encode(t) for t in ("List the files.", "hi", "Write the word blue to out.txt and stop now.")]
    plain = SlotModel(model, slots=3, length=64, fuse=False)
    fused = SlotModel(model, slots=3, length=64, fuse=True)
    a = plain.prefill([0, 1, 2], prompts)
    b = fused.prefill([0, 1, 2], prompts)
    assert (a - b).abs().max().item() < 1e-5
    for li in range(len(plain.k)):  # the same keys and values written into the cache
        for p, n in enumerate(len(x) for x in prompts):
            assert (plain.k[li][p, :, :n] - fused.k[li][p, :, :n]).abs().max().item() < 1e-5
            assert (plain.v[li][p, :, :n] - fused.v[li][p, :, :n]).abs().max().item() < 1e-5


class _Recorded:
    """A stand-in for a Triton kernel: records each launch's grid and constexprs (``kernel[grid](...)``)."""

    def __init__(self) -> None:
        self.launches: list[tuple[tuple[int, ...], dict[str, Any]]] = []

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        def launch(*args: Any, **constexprs: Any) -> None:
            self.launches.append((grid, constexprs))

        return launch


@pytest.mark.parametrize("rope, merge", [(False, False), (True, True)])
@pytest.mark.parametrize("prefix", [False, True])
def test_warm_splits_launches_every_chunk_count_with_the_steps_flags(rope: bool, merge: bool, prefix: bool) -> None:
    """A chunk count first met inside a wave would be a Triton compile there: every one is launched up front, for
    every window, with the flags of the decode step (the merge kernel too when the split kernel does not merge)."""
    from rollout.engine_attention import MAX_SPLITS, warm_splits

    split, merge_k = _Recorded(), _Recorded()
    n = warm_splits(2, 7, 64, torch.float32, torch.device("cpu"), 0.125, {None, 4}, rope, merge, kernels=(split, merge_k),
                    prefix=prefix)
    counts = [1 << i for i in range(MAX_SPLITS.bit_length())]
    assert counts[-1] == MAX_SPLITS and n == 2 * len(counts) == len(split.launches)
    seen = {(c["WINDOWED"], c["SPLITS"]) for _, c in split.launches}
    assert seen == {(w, s) for w in (False, True) for s in counts}
    assert all(c["ROPE"] is rope and c["MERGE"] is merge and c["PREFIX"] is prefix and c["STORE"] and c["G"] == 7
               for _, c in split.launches)
    assert all(grid == (1, 2, c["SPLITS"]) for grid, c in split.launches)
    assert len(merge_k.launches) == (0 if merge else n)
