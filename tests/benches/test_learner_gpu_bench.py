"""The GPU benchmark script runs end to end on a CPU with ``--tiny`` (the lead runs it for real on an H200)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benches.learner_gpu import main, matmul_params, model_config

pytestmark = pytest.mark.unit


def test_bench_tiny_on_cpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench.json"
    assert main(["--tiny", "--device", "cpu", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["model"] == "tiny" and result["dtype"] == "fp32"
    for name in ("packed", "padded"):
        assert result[name]["tokens_per_s"] > 0 and result[name]["tokens"] == result["packed"]["tokens"]
    assert result["padded"]["pad_fraction"] > 0.0
    assert result["loss_check"]["ok"] and result["loss_check"]["abs_diff"] < 1e-5  # CPU fp32 vs itself
    assert "tokens/s" in capsys.readouterr().out


def test_bench_plain_packed_only(tmp_path: Path) -> None:
    """The pre-optimisation configuration (one row, full logits, sdpa) stays runnable for comparisons."""
    out = tmp_path / "bench.json"
    argv = ["--tiny", "--device", "cpu", "--rows", "1", "--logprob-chunk", "0", "--attn", "sdpa",
            "--contenders", "packed", "--no-loss-check", "--out", str(out)]
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert "padded" not in result and "loss_check" not in result and result["rows"] == 1
    assert result["packed"]["tokens_per_s"] > 0


def test_qwen2_half_billion_shape() -> None:
    # Qwen2-0.5B: 494M parameters, 136M of them the (tied) embedding; all of them enter a matmul
    assert 0.49e9 < matmul_params(model_config(tiny=False)) < 0.50e9
