"""The MOPD GPU benchmark runs end to end on a CPU with ``--tiny`` (the lead runs it for real on an H200).

A fake clock whose intervals all differ (its k-th reading is k squared) makes
every measured duration known to the script and different from the others, so
each derived number (tokens/s, MFU, ratios, points, shares) is checked against
the durations it must come from, not against a timing threshold.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import pytest
from transformers import Qwen2Config

from benches.distill_gpu import CELLS, H200_BF16_TFLOPS, main, score_flops
from benches.learner_gpu import matmul_params, model_config, train_flops
from teachers.types import ScoreRequest

pytestmark = pytest.mark.unit


def squares() -> float:
    return float(next(_COUNTER) ** 2)


_COUNTER = itertools.count()


def test_tiny_run_on_cpu_derives_every_number_from_the_measured_durations(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench.json"
    # --group 2: the samples come two to a prompt, and the rollout is timed with the shared prefill off as well;
    # --serial: and with overlap off (the CPU default already), its share beside the others'
    assert main(["--tiny", "--device", "cpu", "--group", "2", "--serial", "--json", str(out)], clock=squares) == 0
    r = json.loads(out.read_text())
    peak = r["peak_tflops"] * 1e12
    assert r["shape"] == "tiny" and r["device"] == "cpu" and r["peak_tflops"] == H200_BF16_TFLOPS
    w = r["workload"]
    assert w["cells"] == list(CELLS) and w["sequences"] == 9 * w["per_cell"]
    assert w["scored_tokens"] == w["sequences"] * w["response_len"]
    assert w["group"] == 2 and w["lengths"][0::2] == w["lengths"][1::2]  # pairs share a prompt (no stops: equal lengths)
    assert 0 < r["iteration"]["rl_rollout_share_serial"] < 1
    for label, shared in (("engine", 9), ("unshared", 0), ("serial", 9)):  # the timed wave: every sample once, 9 copies
        paid = r["rollout"]["timed_wave"][label]
        assert sum(paid["admissions"]) == w["sequences"] and paid["shared_prefills"] == shared and paid["captures"] == 0

    s = r["teacher_scoring"]
    assert s["tokens"] == w["tokens"] and s["scored_tokens"] == w["scored_tokens"]
    for kind, backends in (("copies", 9), ("lora", 1)):
        x = s[kind]
        assert x["backends"] == backends and x["seconds"] > 0 and x["pass_s"] == x["seconds"] / x["passes"]
        assert x["tokens_per_s"] == pytest.approx(s["tokens"] * x["passes"] / x["seconds"])
        assert x["mfu"] == pytest.approx(s["flops_per_pass"] * x["passes"] / x["seconds"] / peak)
        assert x["peak_mem_gib"] is None  # CPU: no GPU memory to report
    assert s["copies"]["seconds"] != s["lora"]["seconds"]  # the fake clock's intervals differ, so a swap shows
    assert s["ratio"]["tokens_per_s"] == pytest.approx(s["lora"]["tokens_per_s"] / s["copies"]["tokens_per_s"])
    a = s["agreement"]  # fp32 on CPU: the adapters and their merged copies are the same teachers
    assert a["ok"] and a["lora_vs_copies_max"] < 1e-4 < 1e-2 < a["between_cells_mean"]

    learn = r["learner"]
    assert sum(w["lengths"]) == w["tokens"] == learn["tokens"]
    assert learn["train_flops"] == train_flops(model_config(tiny=True), w["lengths"])
    rl = learn["rl"]
    assert rl["mfu"] == pytest.approx(learn["train_flops"] / rl["step_s"] / peak)
    for kind in ("mopd", "mopd_bf16"):
        x = learn[kind]
        assert x["step_s"] == pytest.approx(x["score_s"] + x["advantages_s"] + x["train_s"])
        assert x["mfu_forward_counted"] == pytest.approx((learn["train_flops"] + learn["score_flops"]) / x["step_s"] / peak)
        assert x["mfu_forward_not_counted"] == pytest.approx(learn["train_flops"] / x["step_s"] / peak)
        assert x["mfu_train_only"] == pytest.approx(learn["train_flops"] / x["train_s"] / peak)
        for name, points in x["points_vs_rl"].items():
            assert points == pytest.approx(100 * (x[f"mfu_{name}"] - rl["mfu"]))
        assert x["within_goal"] == (abs(x["points_vs_rl"]["forward_counted"]) <= 5.0)

    it = r["iteration"]
    mopd = learn["mopd"]
    assert it["phases_s"] == pytest.approx({
        "rollout": r["rollout"]["seconds"], "teacher_prefill": s["lora"]["pass_s"],
        "student_scoring": mopd["score_s"], "training": mopd["advantages_s"] + mopd["train_s"]})
    assert it["total_s"] == pytest.approx(sum(it["phases_s"].values()))
    assert sum(it["share"].values()) == pytest.approx(1.0)
    assert it["rl_iteration_s"] == pytest.approx(r["rollout"]["seconds"] + rl["step_s"])
    assert it["vs_rl_iteration"] == pytest.approx(it["total_s"] / it["rl_iteration_s"])
    roll = r["rollout"]  # the engine's rollout, with HF generate's beside it as the baseline
    assert roll["new_tokens"] == w["sequences"] * w["response_len"]  # no stop tokens: every request runs to the end
    assert roll["seconds"] != roll["generate_seconds"]
    assert roll["engine_vs_generate"] == pytest.approx(roll["generate_seconds"] / roll["seconds"])
    assert it["rl_rollout_share"] == pytest.approx(roll["seconds"] / it["rl_iteration_s"])
    before = it["total_s"] - roll["seconds"] + roll["generate_seconds"]
    assert it["rollout_share_with_generate"] == pytest.approx(roll["generate_seconds"] / before)
    assert it["rl_rollout_share_with_generate"] == pytest.approx(
        roll["generate_seconds"] / (roll["generate_seconds"] + rl["step_s"]))
    un = roll["unshared_seconds"]  # every prompt computed: the same iteration's shares with that rollout
    assert un != roll["seconds"] and roll["unshared_new_tokens_per_s"] == pytest.approx(roll["new_tokens"] / un)
    assert it["rl_rollout_share_unshared"] == pytest.approx(un / (un + rl["step_s"]))
    assert it["rollout_share_unshared"] == pytest.approx(un / (it["total_s"] - roll["seconds"] + un))

    printed = capsys.readouterr().out
    for title in ("1. teacher scoring", "2. learner step MFU", "3. one MOPD iteration"):
        assert title in printed


def test_score_flops_by_hand() -> None:
    # hidden 8, 2 layers, 4 heads of 2 with 2 kv heads (kv width 4), MLP 16, vocab 10
    cfg = Qwen2Config(hidden_size=8, intermediate_size=16, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=10)
    per_layer = 8 * 8 + 2 * 8 * 4 + 8 * 8 + 3 * 8 * 16  # q, k, v, o, gate/up/down = 576
    assert matmul_params(cfg) == 2 * per_layer + 10 * 8
    reqs = [ScoreRequest("general/low", (1, 2, 3, 4, 5), (3, 4)), ScoreRequest("agent/max", (1, 2, 3), (2,))]
    body = 2 * (2 * per_layer) * 8  # 2 (N - V d) per token, 8 tokens
    head = 2 * 10 * 8 * (2 + 1 + 1 + 1)  # 3 scored positions + one row end per request
    attn = 2 * 8 * 2 * (25 + 9)  # 2 d L n^2 per request
    assert score_flops(cfg, reqs) == body + head + attn


def test_missing_peft_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "peft", None)  # import peft -> ImportError
    with pytest.raises(SystemExit, match="need peft"):
        main(["--tiny", "--device", "cpu"])


def test_a_run_cut_off_in_the_learner_phase_keeps_the_phases_already_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first H200 run lost its rollout and teacher-scoring numbers to the device's time limit: never again."""
    import benches.distill_gpu as bench

    def killed(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt("the device's time limit")

    monkeypatch.setattr(bench, "learner_steps", killed)
    out = tmp_path / "bench.json"
    with pytest.raises(KeyboardInterrupt):
        main(["--tiny", "--device", "cpu", "--json", str(out)])
    r = json.loads(out.read_text())
    assert r["partial"] is True and set(r) == {"partial", "rollout", "teacher_scoring"}
    assert r["rollout"]["sequences"] == 9 * 2 and r["teacher_scoring"]["agreement"]["ok"]
    printed = capsys.readouterr().out
    assert printed.startswith("rollout: {") and "\nteacher_scoring: {" in printed
