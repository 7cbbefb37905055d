"""Tree rollouts and resume from snapshots (``rollout.branching``): the plans and ids, then real Docker episodes.

Docker tests run the bench's ``Walker`` policy (exploratory shell turns, then the oracle or a wrong submit) on
``general/shell_script`` through ``EpisodeRunner`` with the real tokenizer. No mocks: a fork failure is a
snapshot blob really gone, a lost sandbox is a container really killed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from benches.branching import HARNESS, TASK, Killing, Walker
from learner.checkpoint import config_hash
from learner.train_config import load_train_config
from rollout.attempt import EpisodeRequest, SamplingParams
from rollout.branching import (
    BranchRole, EntropyTurns, FixedTurns, TreeRegistry, branch_requests, leaves_per_root, make_plan, tree_costs,
)
from rollout.config import ConfigError, RolloutSettings, parse_config
from rollout.episode import EpisodeRunner
from rollout.store import TrajectoryStore
from rollout.types import Sample, Status, Timings, Trajectory, Turn

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "branching"


# ---------------------------------------------------------------- unit: plans, ids, config


@pytest.mark.unit
def test_fixed_plan_names_leaves_by_turn_and_counts_them() -> None:
    plan = FixedTurns((1, 3), k=3)
    assert plan.points == 2 and leaves_per_root(plan) == 5  # the root + 2 points x 2 more
    assert [plan.leaf_name(0, 1), plan.leaf_name(1, 2)] == ["b1.1", "b3.2"]
    assert plan.online(3) == [1] and plan.online(2) == [] and plan.checkpoint_at(1) and not plan.checkpoint_at(2)
    assert plan.at_end({0: 9.0, 1: 1.0}, [0, 1]) == {}, "a fixed turn the root never passed stays failed"
    with pytest.raises(ValueError, match="FixedTurns.k"):
        FixedTurns((1,), k=1)
    with pytest.raises(ValueError, match="FixedTurns.turns"):
        FixedTurns((2, 2))


@pytest.mark.unit
def test_entropy_plan_takes_the_highest_surprisal_turns_within_its_budget() -> None:
    plan = EntropyTurns(budget=2, k=2, max_turn=4)
    assert leaves_per_root(plan) == 3 and plan.online(0) == [] and plan.checkpoint_at(3) and not plan.checkpoint_at(4)
    assert plan.at_end({0: 0.5, 1: 2.0, 2: 1.0, 3: 2.0}, [0, 1]) == {0: 1, 1: 3}  # ties: the earlier turn first
    assert plan.at_end({0: 0.5, 1: 2.0}, [1]) == {1: 1}, "points already decided keep theirs"
    assert plan.at_end({}, [0, 1]) == {}, "no checkpointed turn: nothing to branch from"
    assert plan.leaf_name(1, 1) == "e1.1"


@pytest.mark.unit
def test_branch_requests_make_roots_and_leaves_with_the_roots_prefix_fields() -> None:
    reqs = [EpisodeRequest(f"run/g/{j}", "run", f"t{j}", seed=j, harness=("bash", "codex")[j % 2], effort=("low", "high")[j % 2],
                           group_id="g", sampling=SamplingParams(seed=100 + j)) for j in range(6)]
    tree = branch_requests(reqs, BranchRole(root="", kind="fixed", turns=(2,), k=3))
    assert [r.episode_id for r in tree] == ["run/g/0", "run/g/0/b2.1", "run/g/0/b2.2", "run/g/3", "run/g/3/b2.1", "run/g/3/b2.2"]
    root, leaf = tree[3], tree[4]
    assert root.branch is not None and root.branch.is_root and root.branch.root == "run/g/3"
    assert leaf.branch is not None and (leaf.branch.root, leaf.branch.point, leaf.branch.index) == ("run/g/3", 0, 1)
    assert (leaf.task_id, leaf.seed, leaf.harness, leaf.effort) == (root.task_id, root.seed, root.harness, root.effort)
    assert leaf.sampling is not None and leaf.sampling.seed == 104, "each leaf samples with its own seed"
    assert len({r.episode_id for r in tree}) == len(tree) == len(reqs), "every planned leaf once"
    with pytest.raises(ValueError, match="group_size"):
        branch_requests(reqs[:4], BranchRole(root="", kind="fixed", turns=(2,), k=3))
    for r in tree:  # a checkpointed run keeps its pending groups as JSON (learner.loop): the role comes back
        data = json.loads(json.dumps(dataclasses.asdict(r)))
        assert EpisodeRequest(**{**data, "sampling": r.sampling}) == r


@pytest.mark.unit
def test_branching_config_checks_the_group_and_defaults_keep_the_hash() -> None:
    with pytest.raises(ConfigError, match="group_size"):
        parse_config({"run_id": "r", "group_size": 8, "branching": {"kind": "fixed", "turns": [0], "k": 3}})
    with pytest.raises(ConfigError, match="turns"):
        parse_config({"run_id": "r", "group_size": 2, "branching": {"kind": "fixed", "k": 2}})
    ok = RolloutSettings.model_validate({"group_size": 8, "branching": {"kind": "fixed", "turns": [0], "k": 4, "roots_per_group": 2}})
    assert ok.branching.leaves_per_root() == 4 and ok.branching.role().turns == (0,)
    assert make_plan("entropy", budget=2, k=3).points == 2
    plain, tree = load_train_config(EXAMPLES / "plain.yaml"), load_train_config(EXAMPLES / "tree.yaml")
    assert not plain.rollout.branching.on and tree.rollout.branching.on
    quick = load_train_config(EXAMPLES.parent / "quickstart.yaml")
    dumped = quick.model_dump(mode="json")
    old = {**dumped, "rollout": {k: v for k, v in dumped["rollout"].items() if k not in ("branching", "resume_from_snapshots")}}
    assert config_hash(dumped) == config_hash(old), "branching off: the config hash of existing runs is unchanged"
    assert config_hash(tree.model_dump(mode="json")) != config_hash({**plain.model_dump(mode="json"), "run_id": tree.run_id})


@pytest.mark.unit
def test_tree_costs_count_a_shared_prefix_once() -> None:
    def traj(eid: str, turns: int, tokens: int, sandbox_s: float, branch: dict[str, Any] | None = None) -> Trajectory:
        return Trajectory(eid, "r", "t", "", 0, "bash", "", 0, Status.OK, 1.0, verifier={"branch": branch} if branch else {},
                          samples=(Sample(tuple(range(tokens)), (0.0,) * tokens, (1,) * tokens),),
                          turns=tuple(Turn(i, 0, completion_tokens=10) for i in range(turns)), timings=Timings(sandbox_s=sandbox_s))

    root = traj("a", 4, 100, 2.0, {"prefix_turns": 0, "prefix_tokens": 0})
    leaf = traj("a/b1.1", 4, 110, 1.0, {"prefix_turns": 2, "prefix_tokens": 60})
    costs = tree_costs([root, leaf])
    assert (costs.leaves, costs.sandbox_s, costs.generated_tokens, costs.learner_tokens, costs.learner_tokens_flat) == (
        2, 3.0, 60, 150, 210)


@pytest.mark.unit
def test_registry_fails_open_points_when_the_root_ends_and_times_out_a_missing_root() -> None:
    async def go() -> tuple[Any, Any, Any]:
        trees = TreeRegistry()
        waiting = asyncio.ensure_future(trees.wait("r", 1, 5.0))
        trees.started("r")
        trees.finish("r", 2, "the root ended early")
        missing = await trees.wait("nobody", 0, 0.01)
        return await waiting, trees.summary("r"), missing

    got, (taken, failed), missing = asyncio.run(go())
    assert got == "the root ended early" and taken == [] and [f["point"] for f in failed] == [0, 1]
    assert "within" in missing


# ---------------------------------------------------------------- docker


@pytest.fixture(scope="module")
def backend(docker_client, base_image) -> Iterator[Any]:  # noqa: ANN001
    from sandboxes.docker_backend import DockerBackend

    backend = DockerBackend(docker_client)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def tok() -> Any:
    from rollout.tokenizer import build_tokenizer

    return build_tokenizer()


def _tree(name: str, k: int = 3, turn: int = 1, seeds: int = 0) -> list[EpisodeRequest]:
    reqs = [EpisodeRequest(f"{name}/{j}", "branch-test", TASK, seed=seeds, harness=HARNESS, effort="high", group_id=name,
                           sampling=SamplingParams(seed=10 * j + 1)) for j in range(k)]
    return branch_requests(reqs, BranchRole(root="", kind="fixed", turns=(turn,), k=k))


async def _all(runner: EpisodeRunner, reqs: list[EpisodeRequest]) -> list[Trajectory]:
    return list(await asyncio.gather(*(runner.run(r) for r in reqs)))


@pytest.mark.docker
def test_leaves_share_the_roots_prefix_tokens_exactly_and_are_graded_on_their_own(backend: Any, tok: Any, tmp_path: Path) -> None:
    store = TrajectoryStore(f"sqlite:///{tmp_path / 'runs.db'}")
    runner = EpisodeRunner(Walker(walk=3, wrong=0.5), backend=backend, tokenizer=tok, pool_size=3, store=store)
    reqs = _tree("share", k=3, turn=1)
    try:
        trajs = asyncio.run(_all(runner, reqs))
    finally:
        runner.close()
    root, *leaves = trajs
    assert all(t.status is Status.OK for t in trajs), [t.error for t in trajs]
    assert root.verifier["branch"]["points"] == [{"point": 0, "turn": 1, "snapshot": leaves[0].verifier["branch"]["snapshot"]}]
    for leaf in leaves:
        b = leaf.verifier["branch"]
        assert (b["root"], b["parent"], b["turn"], b["prefix_turns"], b["failed"], b["leaves"]) == (root.episode_id, root.episode_id, 1, 2, [], 3)
        n = b["prefix_tokens"]
        assert 0 < n < len(leaf.token_ids) and leaf.token_ids[:n] == root.token_ids[:n], "the prefix, token for token"
        assert leaf.loss_mask[:n] == root.loss_mask[:n] and leaf.logprobs[:n] == root.logprobs[:n]
        assert [t.index for t in leaf.turns][:2] == [0, 1] and leaf.turns[:2] == root.turns[:2]
        assert "details" in leaf.verifier and leaf.verifier["reason"] is not None, "graded on its own"
    # The walk after the branch is drawn from each leaf's own seed: the continuations differ.
    assert len({t.token_ids[t.verifier["branch"]["prefix_tokens"]:] for t in trajs}) == 3
    stored = store.query(run_id="branch-test")
    assert sorted(t.episode_id for t in stored) == sorted(r.episode_id for r in reqs), "every planned leaf stored once"
    assert all(store.get(t.episode_id) == t for t in trajs), "the branch record round-trips the store"
    costs = tree_costs(trajs)
    assert costs.learner_tokens < costs.learner_tokens_flat


@pytest.mark.docker
def test_a_fork_that_fails_is_recorded_and_the_leaf_runs_from_scratch(backend: Any, tok: Any) -> None:
    runner = EpisodeRunner(Walker(walk=3, wrong=0.0), backend=backend, tokenizer=tok, pool_size=2)
    root_req, leaf_req = _tree("forkfail", k=2, turn=1)

    async def go() -> tuple[Trajectory, Trajectory]:
        root = await runner.run(root_req)  # the root first: its checkpoint stays in the runner's trees
        snapshot = root.verifier["branch"]["points"][0]["snapshot"]
        cp = await runner.trees.wait(root_req.episode_id, 0, 1.0)
        assert not isinstance(cp, str) and cp.ref.id == snapshot
        os.remove(cp.ref.location)  # the snapshot's blob is gone: its restore really fails
        return root, await runner.run(leaf_req)

    try:
        root, leaf = asyncio.run(go())
    finally:
        runner.close()
    b = leaf.verifier["branch"]
    assert leaf.status is Status.OK and leaf.reward == 1.0, leaf.error
    assert b["prefix_turns"] == 0 and b["snapshot"] is None and "failed" in b["failed"][0], b
    assert leaf.turns[0].index == 0 and len(leaf.turns) == len(root.turns), "run from the pristine state, in full"


@pytest.mark.docker
def test_a_point_the_root_never_reaches_fails_its_leaves_without_raising(backend: Any, tok: Any) -> None:
    runner = EpisodeRunner(Walker(walk=1, wrong=0.0), backend=backend, tokenizer=tok, pool_size=2)
    reqs = _tree("unreached", k=2, turn=5)  # the walker submits at turn 2
    try:
        root, leaf = asyncio.run(_all(runner, reqs))
    finally:
        runner.close()
    assert root.status is Status.OK and leaf.status is Status.OK
    assert root.verifier["branch"]["failed"][0]["point"] == 0 and "before this point" in root.verifier["branch"]["failed"][0]["reason"]
    assert "before this point" in leaf.verifier["branch"]["failed"][0] and leaf.verifier["branch"]["prefix_turns"] == 0


@pytest.mark.docker
def test_a_killed_container_resumes_from_the_last_snapshot_in_a_new_sandbox(backend: Any, tok: Any, docker_client: Any) -> None:
    policy = Killing(Walker(walk=4, wrong=0.0), at=3, client=docker_client)  # kills each episode's container once
    runner = EpisodeRunner(policy, backend=backend, tokenizer=tok, pool_size=2, sandbox_retries=0)
    req = EpisodeRequest("resume/0", "branch-test", TASK, seed=0, harness=HARNESS, effort="high",
                         sampling=SamplingParams(seed=5), resume_from_snapshots=True)
    plain = dataclasses.replace(req, episode_id="resume/plain", resume_from_snapshots=False)
    try:
        traj = asyncio.run(runner.run(req))
        lost = asyncio.run(runner.run(plain))
    finally:
        runner.close()
    assert traj.status is Status.OK and traj.reward == 1.0, traj.error
    [resume] = traj.verifier["resumes"]
    assert resume["turn"] == 2 and resume["turns_saved"] == 3 and resume["snapshot"] and "Sandbox" in resume["reason"]
    assert [t.index for t in traj.turns] == list(range(len(traj.turns))), "each turn once: none replayed, none lost"
    assert traj.token_ids.count(tok.convert_tokens_to_ids("<|im_end|>")) >= len(traj.turns), "one sample, every turn in it"
    assert lost.status is Status.SANDBOX_LOST and "resumes" not in lost.verifier, "off: lost as before"


@pytest.mark.unit
def test_a_forked_renderer_is_independent_of_its_original(tok: Any) -> None:
    from rollout.harnesses.rendering import EpisodeRenderer

    r = EpisodeRenderer(tok, [{"role": "user", "content": "hi"}])
    r.add_completion(tok.encode("hello", add_special_tokens=False) + [r.eot_id], {"role": "assistant", "content": "hello"})
    twin = r.fork()
    before = (list(r.current.ids), list(r.history))
    twin.add_observations([{"role": "user", "content": "more"}])
    assert (r.current.ids, r.history) == before and len(twin.current.ids) > len(r.current.ids)
    assert twin.current.ids[: len(before[0])] == before[0]


@pytest.mark.docker
def test_an_entropy_leaf_starts_from_the_point_its_root_chose_at_the_end(backend: Any, tok: Any) -> None:
    runner = EpisodeRunner(Walker(walk=3, wrong=0.0), backend=backend, tokenizer=tok, pool_size=2)
    reqs = [EpisodeRequest(f"entropy/{j}", "branch-test", TASK, seed=0, harness=HARNESS, effort="high", group_id="entropy",
                           sampling=SamplingParams(seed=j + 7)) for j in range(2)]
    reqs = branch_requests(reqs, BranchRole(root="", kind="entropy", budget=1, k=2, max_turn=2))
    try:
        root, leaf = asyncio.run(_all(runner, reqs))
    finally:
        runner.close()
    assert leaf.episode_id == "entropy/0/e0.1" and root.status is Status.OK and leaf.status is Status.OK
    # The walker's text turns carry no logprobs: every turn scores 0, and the tie goes to the earliest.
    [point] = root.verifier["branch"]["points"]
    b = leaf.verifier["branch"]
    assert point["turn"] == b["turn"] == 0 and b["prefix_turns"] == 1 and not b["failed"]
    assert leaf.token_ids[: b["prefix_tokens"]] == root.token_ids[: b["prefix_tokens"]]


@pytest.mark.unit
def test_trees_across_processes_are_refused_before_anything_runs() -> None:
    from learner.errors import LearnerConfigError
    from learner.train_config import TrainConfig
    from rollout.scheduler import plan_episodes

    tree = {"group_size": 2, "branching": {"kind": "fixed", "turns": [0], "k": 2}}
    with pytest.raises((LearnerConfigError, ValueError), match="runner: inprocess"):
        TrainConfig.model_validate({"run_id": "r", "runner": "ray", "rollout": tree})
    assert TrainConfig.model_validate({"run_id": "r", "rollout": tree}).rollout.branching.on
    with pytest.raises(ConfigError, match="in-process runner only"):
        plan_episodes(parse_config({"run_id": "r", **tree}), ["general/answer_number"])
    resumed = plan_episodes(parse_config({"run_id": "r", "group_size": 2, "resume_from_snapshots": True}), ["t"])
    assert all(r.resume_from_snapshots for r in resumed), "a rollout job's episodes resume in any runner"


@pytest.mark.docker
def test_leaves_queued_before_their_root_wait_outside_the_runners_slots(base_image: Any, tok: Any, tmp_path: Path) -> None:
    """One slot, the leaves at the semaphore first: a leaf that waited *in* the slot would hold it until the wait
    timed out (the root queued behind it) and then run whole; waiting outside, the root runs and every leaf forks."""
    from rollout.runner import InProcessRunner

    store = TrajectoryStore(f"sqlite:///{tmp_path / 'runs.db'}")
    runner = InProcessRunner(Walker(walk=3, wrong=0.0), tokenizer=tok, backend="docker", run_id="branch-test", store=store,
                             concurrency=1, pool_size=2)
    runner.episodes.trees.wait_s = 20.0  # the old order fails within this, instead of after the task's wall time
    root_req, *leaf_reqs = _tree("slots", k=3, turn=1)

    async def go() -> list[Trajectory | None]:
        await runner.start([TASK])
        futures = [runner.submit(r) for r in leaf_reqs]
        await asyncio.sleep(1.0)  # the leaves' store lookups are done: they are at the slots before the root
        futures.append(runner.submit(root_req))
        try:
            return list(await asyncio.gather(*futures))
        finally:
            await runner.close()

    *leaves, root = asyncio.run(go())
    assert root is not None and root.status is Status.OK, root
    for leaf in leaves:
        assert leaf is not None and leaf.status is Status.OK, leaf
        b = leaf.verifier["branch"]
        assert b["failed"] == [] and b["prefix_turns"] == 2 and b["snapshot"] is not None, b
    assert sorted(t.episode_id for t in store.query(run_id="branch-test")) == sorted(r.episode_id for r in [root_req, *leaf_reqs])
