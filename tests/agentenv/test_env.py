"""The single-env API on in-process fakes: gymnasium's checker, episode ends, rewards, cleanup."""

from __future__ import annotations

import pytest
from gymnasium.utils.env_checker import check_env

from agentenv.env import TaskEnv
from agentenv.errors import EpisodeStateError
from agentenv.task import PythonTask
from agentenv.types import Domain, Limits, Variant
from agentenv_fakes import FakeHarness, call
from sandboxes.testing import FakeBackend

pytestmark = pytest.mark.unit


class EchoNumber(PythonTask):
    """Read a number from a file and submit it (graded by the real answer verifier)."""

    id = "test/echo_number"
    domain = Domain.GENERAL
    instruction = "Submit the number in number.txt (it is between 1 and {{ high }})."
    params = {"n": {"type": "int", "low": 1, "high": 1000}, "high": {"type": "choice", "choices": [1000]}}
    verifiers = [{"type": "answer", "expected": "{{ n }}", "mode": "numeric"}]
    limits = Limits(max_turns=3, command_timeout_s=10)

    def setup(self, sandbox, variant: Variant) -> None:
        sandbox.write_file(f"{sandbox.spec.workdir}/number.txt", f"{variant.params['n']}\n")

    def oracle(self, sandbox, variant: Variant) -> str:
        return sandbox.read_file(f"{sandbox.spec.workdir}/number.txt").decode().strip()

    def hidden_paths(self) -> list[str]:
        return []

    def hidden_files(self, variant: Variant) -> dict[str, bytes]:
        return {}


@pytest.fixture
def env():
    backend = FakeBackend()
    env = TaskEnv(EchoNumber(), FakeHarness(), backend, owns_backend=True)
    yield env
    env.close()
    assert backend.open_count() == 0


def test_gymnasium_env_checker_passes(env: TaskEnv) -> None:
    check_env(env, skip_render_check=True)


def test_same_seed_same_prompt(env: TaskEnv) -> None:
    obs1, info1 = env.reset(seed=5)
    obs2, info2 = env.reset(seed=5)
    assert obs1 == obs2 and info1["params"] == info2["params"]
    assert "Submit the number" in obs1


def test_malformed_output_is_a_tool_error_observation(env: TaskEnv) -> None:
    env.reset(seed=1)
    obs, reward, terminated, truncated, _ = env.step("}{ not a call <tool_call>{oops</tool_call>")
    assert obs.startswith("ERROR:") and reward == 0.0 and not terminated and not truncated


def test_submit_right_answer_earns_full_reward(env: TaskEnv) -> None:
    env.reset(seed=2)
    obs, reward, terminated, truncated, info = env.step(call("sh", command="cat number.txt"))
    assert reward == 0.0 and not terminated
    n = obs.strip()
    _, reward, terminated, truncated, info = env.step(call("submit", answer=n))
    assert terminated and not truncated and reward == 1.0, info
    assert info["verifier"]["passed"] and info["status"] == "submitted"
    with pytest.raises(EpisodeStateError):
        env.step(call("sh", command="true"))


def test_wrong_answer_earns_zero(env: TaskEnv) -> None:
    env.reset(seed=2)
    _, reward, terminated, _, info = env.step(call("submit", answer="-1"))
    assert terminated and reward == 0.0 and not info["verifier"]["passed"]


def test_turn_limit_truncates_and_grades(env: TaskEnv) -> None:
    env.reset(seed=3)
    for _ in range(2):
        assert env.step(call("sh", command="true"))[3] is False
    _, reward, terminated, truncated, info = env.step(call("sh", command="true"))
    assert truncated and not terminated and reward == 0.0 and info["status"] == "truncated"
    assert "verifier" in info


def test_a_final_text_turn_submits_through_claude_code() -> None:
    """As in the rollout: Claude Code has no submit tool; a turn with no tool call ends the episode."""
    from agentenv.env import make

    backend = FakeBackend()
    env = make(EchoNumber(), harness="claude_code", backend=backend)
    try:
        env.reset(seed=2)
        root = env.sandbox.spec.workdir  # type: ignore[union-attr]
        action = {"role": "assistant", "content": "", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "Read", "arguments": f'{{"file_path": "{root}/number.txt"}}'}}]}
        obs, reward, terminated, truncated, _ = env.step(action)  # type: ignore[arg-type]
        assert not terminated and not truncated
        n = obs.split("\t", 1)[1].strip()  # cat -n style: "     1\t<n>"
        obs, reward, terminated, truncated, info = env.step(n)
        assert terminated and not truncated and info["status"] == "submitted", (obs, info)
        assert reward == 1.0 and info["verifier"]["passed"]
    finally:
        env.close()
    assert backend.open_count() == 0
