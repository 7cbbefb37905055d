"""``benches.rollout_baseline``: the benchmark's sequential plain-docker baseline really solves and grades what it runs."""

from __future__ import annotations

import pytest

from benches.rollout_baseline import TOOL_CALLS_PER_EPISODE, run_baseline, suite_task_ids


@pytest.mark.unit
def test_suite_is_the_builtin_folder_tasks() -> None:
    ids = suite_task_ids()
    assert len(ids) >= 9 and "general/answer_number" in ids and ids == sorted(ids)


@pytest.mark.docker
def test_baseline_oracle_episodes_pass_their_checks(docker_client, base_image) -> None:  # noqa: ANN001
    result = run_baseline(["general/answer_number", "general/shell_script"], episodes_per_task=1, client=docker_client)
    assert (result.episodes, result.ok, result.failures) == (2, 2, ())
    assert result.tool_calls == 2 * TOOL_CALLS_PER_EPISODE and result.episodes_per_s > 0
    assert set(result.split) == {"start", "setup", "oracle", "grade", "remove"}
