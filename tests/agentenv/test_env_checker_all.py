"""Gymnasium's env checker on every registered task, in Docker, through the bash harness."""

from __future__ import annotations

import pytest
from gymnasium.utils.env_checker import check_env

from agentenv.env import make, resolve_harness
from agentenv.registry import default_registry

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.mark.parametrize("task_id", default_registry().ids())
def test_check_env_on_registered_task(task_id: str, base_image: str) -> None:
    # The real bash harness, found through the agentenv.harnesses entry points: a broken
    # entry point must fail here, not be papered over by a fake.
    env = make(task_id, harness=resolve_harness("bash"), backend="docker", seed=0)
    try:
        check_env(env, skip_render_check=True)
        obs, _, terminated, truncated, _ = env.step("random words, no tool call")
        assert isinstance(obs, str) and not terminated and not truncated
    finally:
        env.close()
