"""``agentenv rollout bench`` end to end on one task (no timing asserted: benchmarks print, tests check)."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.docker, pytest.mark.ray, pytest.mark.slow]


def test_bench_runs_both_sides_on_the_same_episodes(docker_client, base_image) -> None:  # noqa: ANN001
    from benches.rollout import run_bench

    result = run_bench(workers=1, concurrency=2, group_size=2, task_ids=["general/write_word"], log=lambda *_: None)
    base, ray = result["baseline"], result["ray"]
    assert base["episodes"] == ray["episodes"] == 2 and base["ok"] == ray["ok"] == 2, (base["failures"], ray["report"])
    assert ray["accounted"] and ray["report"]["tool_calls"] == 4
    assert result["ratio"] > 0 and 0 < result["ratio_with_startup"] < result["ratio"]
    assert set(result["split"]) == {"policy_s", "sandbox_s", "verifier_s", "store_s", "other_s", "total_s"}
