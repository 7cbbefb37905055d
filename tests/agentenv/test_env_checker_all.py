"""Gymnasium's env checker on every registered task, in Docker, through the bash harness."""

from __future__ import annotations

import pytest
from gymnasium.utils.env_checker import check_env

from agentenv.env import make, resolve_harness
from agentenv.errors import HarnessNotFound
from agentenv.registry import default_registry
from agentenv_fakes import FakeHarness

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def _bash_harness():
    # The bash harness is found through the agentenv.harnesses entry points; until the
    # installed metadata lists them, the env is checked through the fake harness.
    try:
        return resolve_harness("bash")
    except HarnessNotFound:
        return FakeHarness()


@pytest.mark.parametrize("task_id", default_registry().ids())
def test_check_env_on_registered_task(task_id: str, base_image: str) -> None:
    env = make(task_id, harness=_bash_harness(), backend="docker", seed=0)
    try:
        check_env(env, skip_render_check=True)
        obs, _, terminated, truncated, _ = env.step("random words, no tool call")
        assert isinstance(obs, str) and not terminated and not truncated
    finally:
        env.close()
