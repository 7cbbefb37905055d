"""The episode runner end to end, in Docker: every way an episode ends is a trajectory, never an exception.

Docker tests share one backend and run their episodes concurrently on one
event loop, which is also what the Ray worker does. Kept few: 2 cores.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from agentenv.intents import Intent, IntentResult
from rollout.attempt import EpisodeContext, EpisodeRequest
from rollout.episode import EpisodeRunner
from rollout.harnesses import get_harness, list_harnesses
from rollout.harnesses.base import BaseHarness
from rollout.policy.scripted import ScriptedPolicy, answer_from_observation, oracle_command
from rollout.policy.types import FinishReason, Generation, Policy, PolicyError, Prompt, SamplingParams
from rollout.store import TrajectoryStore
from rollout.types import Status, Trajectory

HARNESSES = list_harnesses()
QUICK = ("general/answer_number", "general/shell_script", "coding/fix_bug")


# ---------------------------------------------------------------- unit


@pytest.mark.unit
@pytest.mark.parametrize("name", HARNESSES)
def test_answer_is_read_back_from_every_harness_shell_result(name: str) -> None:
    harness = get_harness(name)
    assert isinstance(harness, BaseHarness)
    call = harness.from_intent(__import__("agentenv.intents").intents.Intent("exec_shell", {"command": "x", "timeout_s": 5}))
    intent = harness.to_intent(call)
    result = IntentResult(intent, ok=True, output="working\n 41.50 \n", exit_code=0, data={"stdout": "working\n 41.50 \n", "duration_s": 0.2})
    assert answer_from_observation(str(harness.format_result(result)["content"])) == "41.50"


@pytest.mark.unit
def test_oracle_command_quotes_the_script_whatever_it_holds() -> None:
    script = "cat <<'AGENTENV_ORACLE'\n$HOME `x`\nAGENTENV_ORACLE\necho 1\n"
    command = oracle_command(script)
    first, *_, last = command.splitlines()
    assert first == "bash -s <<'AGENTENV_ORACLE_'" and last == "AGENTENV_ORACLE_"
    assert oracle_command("echo 42 > /workspace/answer.txt\n") == "echo 42 > /workspace/answer.txt", "one line goes as is"


@pytest.mark.unit
def test_scripted_policy_without_its_episode_is_a_policy_error() -> None:
    with pytest.raises(PolicyError, match="EpisodeRunner"):
        asyncio.run(ScriptedPolicy().generate(Prompt(), SamplingParams()))


# ---------------------------------------------------------------- fakes


def _text_gen(text: str, version: int = 0, **kw: Any) -> Generation:
    return Generation(text=text, token_ids=(), logprobs=(), finish_reason=FinishReason.STOP, policy_version=version, **kw)


class Idle(Policy):
    """Talks, never acts: a do-nothing agent under a harness whose text turns do not submit."""

    name, version = "idle", 3

    async def generate(self, prompt: Prompt, sampling: SamplingParams, budget: Any = None) -> Generation:
        return _text_gen("Let me think about it.", 3)


class Broken(Policy):
    name, version = "broken", 0

    def __init__(self, why: str = "broken: chat request failed after 4 attempt(s): HTTP 503: unavailable") -> None:
        self.why = why

    async def generate(self, prompt: Prompt, sampling: SamplingParams, budget: Any = None) -> Generation:
        raise PolicyError(self.why)


class Wrapped:
    """The oracle, with a hook run before each turn (kill the container, garble a turn, emit tokens)."""

    def __init__(self, hook: Any = None, tokenizer: Any = None) -> None:
        self.name, self.version = "wrapped", 7
        self.hook, self.tok = hook, tokenizer
        self.attempts: list[int] = []
        self.prompts: list[tuple[int, ...]] = []
        self.completions: list[tuple[tuple[int, ...], tuple[float, ...], tuple[int, ...]]] = []

    def for_episode(self, ctx: EpisodeContext) -> Policy:
        self.attempts.append(ctx.request.attempt)
        inner = ScriptedPolicy(version=self.version).for_episode(ctx)
        outer = self

        class Episode:
            name, version, turn = "wrapped", outer.version, 0

            async def generate(self, prompt: Prompt, sampling: SamplingParams, budget: Any = None) -> Generation:
                self.turn += 1
                if outer.hook is not None:
                    garbled = outer.hook(ctx, self.turn)
                    if garbled:
                        return _text_gen(garbled, outer.version)
                gen = await inner.generate(prompt, sampling, budget)
                if outer.tok is None:
                    return gen
                outer.prompts.append(tuple(prompt.token_ids))
                ids = tuple(outer.tok.encode(gen.text, add_special_tokens=False)) + (outer.tok.convert_tokens_to_ids("<|im_end|>"),)
                lps = tuple(-0.25 - 0.001 * i for i in range(len(ids)))
                mask = (0,) + (1,) * (len(ids) - 1)  # pretend the first token was inserted by the policy
                outer.completions.append((ids, lps, mask))
                return Generation(gen.text, ids, lps, FinishReason.STOP, outer.version, sampled_mask=mask)

        return Episode()


# ---------------------------------------------------------------- docker


@pytest.fixture(scope="module")
def backend(docker_client, base_image) -> Iterator[Any]:  # noqa: ANN001
    from sandboxes.docker_backend import DockerBackend

    backend = DockerBackend(docker_client)
    yield backend
    backend.close()


def _run(policy: Any, backend: Any, reqs: list[EpisodeRequest], **kw: Any) -> list[Trajectory]:
    runner = EpisodeRunner(policy, backend=backend, pool_size=1, **kw)

    async def go() -> list[Trajectory]:
        return list(await asyncio.gather(*(runner.run(r) for r in reqs)))

    try:
        return asyncio.run(go())
    finally:
        runner.close()


def _req(task: str, harness: str, tag: str, seed: int = 2, **kw: Any) -> EpisodeRequest:
    return EpisodeRequest(f"{tag}-{task}-{harness}-{seed}", "test-episode", task, seed, harness, **kw)


@pytest.mark.docker
@pytest.mark.slow
def test_oracle_through_every_harness_earns_full_reward(backend: Any) -> None:
    reqs = [_req(t, h, "oracle", effort="high") for t in QUICK for h in HARNESSES]
    for traj in _run(ScriptedPolicy(version=5), backend, reqs):
        assert (traj.status, traj.reward, traj.error) == (Status.OK, 1.0, ""), (traj.task_id, traj.harness, traj.verifier)
        assert len(traj.turns) == 2 and traj.turns[0].tool_calls == 1 and traj.tool_errors == 0
        assert traj.policy_version == 5 and traj.effort == "high" and traj.domain in ("general", "coding")
        assert traj.timings.total_s >= traj.timings.sandbox_s + traj.timings.verifier_s > 0
        assert traj.verifier["graded_in"] == "place", "the runner grades in the quiesced agent sandbox"


class SleepsFirst:
    """Runs ``sleep 0.3`` as its first call, then plays the oracle; keeps the observation it was shown."""

    name, version = "sleeps-first", 0

    def __init__(self) -> None:
        self.seen: dict[str, str] = {}

    def for_episode(self, ctx: EpisodeContext) -> Policy:
        inner, outer = ScriptedPolicy().for_episode(ctx), self

        class Episode:
            name, version, turn = "sleeps-first", 0, 0

            async def generate(self, prompt: Prompt, sampling: SamplingParams, budget: Any = None) -> Generation:
                self.turn += 1
                if self.turn == 1:
                    return _text_gen(ctx.harness.render_turn([Intent("exec_shell", {"command": "sleep 0.3", "timeout_s": 10})]))
                outer.seen.setdefault(ctx.request.episode_id, str(prompt.messages[-1]))
                return await inner.generate(prompt, sampling, budget)

        return Episode()


@pytest.mark.docker
def test_fixed_observations_render_no_measured_wall_time(backend: Any) -> None:
    """codex shows a command's measured wall time; a deterministic run must not (the same seed would
    tokenize differently on every run): with ``fixed_observations`` it reads 0.0."""
    policy = SleepsFirst()
    measured, fixed = _req("general/answer_number", "codex", "timed"), _req("general/answer_number", "codex", "fixed", fixed_observations=True)
    for traj in _run(policy, backend, [measured, fixed]):
        assert (traj.status, traj.reward) == (Status.OK, 1.0), traj.verifier
    assert "Wall time: 0.0 seconds" in policy.seen[fixed.episode_id]
    shown = float(policy.seen[measured.episode_id].split("Wall time: ")[1].split(" ")[0])
    assert shown >= 0.3, policy.seen[measured.episode_id]


@pytest.mark.docker
def test_warm_starts_every_pool_before_the_first_episode(backend: Any) -> None:
    runner = EpisodeRunner(ScriptedPolicy(), backend=backend, pool_size=0)
    try:
        assert runner.warm(["general/answer_number", "general/shell_script"], 2) == 1  # one image
        [pool] = runner.sandboxes._pools.values()
        assert pool.counts()["ready"] == 2

        async def go() -> list[Trajectory]:
            return list(await asyncio.gather(*(runner.run(_req("general/answer_number", h, "warm")) for h in ("codex", "bash"))))

        assert [t.status for t in asyncio.run(go())] == [Status.OK, Status.OK]
        assert pool.stats["started"] == 2 and pool.stats["misses"] == 0, "no episode waited on a container start"
    finally:
        runner.close()


@pytest.mark.docker
def test_failures_are_trajectories(backend: Any) -> None:
    """Do-nothing -> truncated with 0; PolicyError -> policy_error; garbled output -> tool errors, then ok."""
    [idle] = _run(Idle(), backend, [_req("general/answer_number", "bash", "idle")])
    assert (idle.status, idle.reward, idle.policy_version) == (Status.TRUNCATED, 0.0, 3)
    assert len(idle.turns) == 4 and not idle.verifier["invalid"]

    [broken] = _run(Broken(), backend, [_req("general/answer_number", "codex", "broken")])
    assert broken.status is Status.POLICY_ERROR and "503" in broken.error and broken.reward == 0.0

    # A context flood is the policy's failure, not the endpoint's: graded and trained on, never excluded.
    flood = Broken("m: chat request failed after 1 attempt(s): HTTP 400: maximum context length is 8192 tokens")
    [flooded] = _run(flood, backend, [_req("general/answer_number", "codex", "flooded")])
    assert (flooded.status, flooded.reward) == (Status.TRUNCATED, 0.0) and "context length" in flooded.error
    assert flooded.trainable and not flooded.verifier["invalid"]

    garble = Wrapped(lambda ctx, turn: '<tool_call>{"name": "shell", "arguments": {oops</tool_call>' if turn == 1 else None)
    [messy] = _run(garble, backend, [_req("general/answer_number", "codex", "messy")])
    assert (messy.status, messy.reward, messy.tool_errors) == (Status.OK, 1.0, 1)
    assert [t.tool_errors for t in messy.turns] == [1, 0, 0]


@pytest.mark.docker
def test_container_killed_mid_episode_is_retried_once(backend: Any, docker_client: Any) -> None:
    def kill(ctx: EpisodeContext, turn: int) -> None:
        if turn == 1 and (ctx.request.attempt == 0 or "always" in ctx.request.episode_id):
            docker_client.containers.get(ctx.sandbox.container_id).kill()  # type: ignore[attr-defined]

    policy = Wrapped(kill)
    once, always = _run(policy, backend, [_req("general/answer_number", "kimi_code", "once"), _req("general/answer_number", "bash", "always")])
    assert (once.status, once.reward, once.verifier["attempt"]) == (Status.OK, 1.0, 1), once.error
    assert len(once.verifier["retries"]) == 1
    assert always.status is Status.SANDBOX_LOST and always.error.count("attempt") == 2
    assert sorted(policy.attempts) == [0, 0, 1, 1]


@pytest.mark.docker
def test_token_exact_trajectory_and_idempotent_store(backend: Any, tmp_path: Any) -> None:
    from rollout.tokenizer import build_tokenizer

    tok = build_tokenizer()
    policy = Wrapped(tokenizer=tok)
    store = TrajectoryStore(f"sqlite:///{tmp_path / 'runs.db'}")
    req = _req("general/answer_number", "claude_code", "tokens")
    [traj] = _run(policy, backend, [req], tokenizer=tok, store=store)
    assert traj.status is Status.OK and traj.reward == 1.0
    ids, mask, lps = traj.token_ids, traj.loss_mask, traj.logprobs
    # Every prompt the policy saw is a prefix of the final sequence, followed by exactly what it produced.
    assert len(policy.prompts) == len(policy.completions) == 2
    for prompt, (gen_ids, gen_lps, gen_mask) in zip(policy.prompts, policy.completions):
        at = len(prompt)
        assert ids[:at] == prompt
        assert ids[at : at + len(gen_ids)] == gen_ids
        assert mask[at : at + len(gen_ids)] == gen_mask
        assert all(abs(a - (b if m else 0.0)) < 1e-6 for a, b, m in zip(lps[at:], gen_lps, gen_mask))
    assert sum(mask) == sum(sum(m) for *_, m in policy.completions)  # mask 1 only on sampled ids
    assert all(lp == 0.0 for lp, m in zip(lps, mask) if not m)
    assert tok.decode(ids[: len(policy.prompts[0])]).startswith("<|im_start|>system")

    # Idempotent: a rerun of the same episode id leaves the first record.
    [again] = _run(ScriptedPolicy(), backend, [req], store=store)
    stored = store.get(req.episode_id)
    assert stored is not None and again.samples == () and stored.samples == traj.samples
    assert stored.token_ids == traj.token_ids and stored.turns == traj.turns
    assert len(store.query(run_id="test-episode")) == 1
    store.close()
