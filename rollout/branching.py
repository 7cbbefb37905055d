"""Tree rollouts: fork an in-flight episode at a turn boundary into continuations that share its prefix.

A group of G leaves is ``roots_per_group`` roots times ``leaves_per_root``
leaves each. The root episode runs as usual; at a *branch point* (the boundary
after turn ``t``) it takes a FAST snapshot of its sandbox and a copy of its
token state (``EpisodeRenderer.fork``), harness state (``EpisodeState``), chat
messages, per-episode policy state, effort and per-turn versions: a
``Checkpoint``. Each other leaf of the root is its own ``EpisodeRequest``
(``BranchRole.point >= 0``): it waits for its point's checkpoint, restores the
snapshot into a warm sandbox of its own, and continues from turn ``t + 1`` with
its own sampling seed; it is graded on its own. The root itself goes on past
every point, so it is one of the leaves.

Why a leaf is its own request (and not N trajectories returned by one): the
scheduler, the store, staleness and the learner's groups all count one
trajectory per request, so every planned leaf is stored exactly once and a
failed branch is still a leaf (run from the pristine state, its reason
recorded), never a missing or doubled one.

Where to branch is a ``BranchPlan``:

* ``FixedTurns(turns, k)``: after each turn in ``turns``, ``k`` continuations
  (the root and ``k - 1`` leaves); leaf ids ``<root>/b<t>.<j>``;
* ``EntropyTurns(budget, k, max_turn)``: after the ``budget`` turns (below
  ``max_turn``) whose sampled tokens had the highest mean surprisal
  (``-logprob``, the sampled-token entropy estimate), chosen once the root has
  ended; leaf ids ``<root>/e<i>.<j>`` (point ``i`` by rank; the record names its
  turn).

Trees live in one process (``TreeRegistry`` on the ``EpisodeRunner``): the
in-process runner only. A leaf whose root runs elsewhere (the Ray path) waits
``TreeRegistry.wait_s`` and then runs from scratch, recorded as failed.

``tree_costs`` counts what a group cost: sandbox-seconds (each trajectory
records only its own; a leaf's prefix was paid by its root), generated tokens
(a leaf's prefix turns were generated once, by the root) and learner tokens
(prefix-shared: the shared prefix once; independent: every sequence in full).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    from rollout.types import Trajectory, Turn
    from sandboxes.types import SnapshotRef

__all__ = [
    "MAX_RESUMES", "BranchPlan", "BranchRole", "Checkpoint", "EntropyTurns", "FixedTurns", "TreeCosts", "TreeRegistry",
    "branch_requests", "make_plan", "tree_costs",
]

#: Resumes of one episode from its snapshots after a lost sandbox; then the episode is lost (and retried whole).
MAX_RESUMES = 2
#: Trees one runner remembers (their checkpoints: snapshot refs and token state); the oldest are dropped first.
MAX_TREES = 256


# ---------------------------------------------------------------- the plan


@runtime_checkable
class BranchPlan(Protocol):
    """Where a root branches. Points are numbered ``0..points-1`` when the group is planned; each has
    ``k`` continuations (the root plus ``k - 1`` leaves)."""

    @property
    def k(self) -> int: ...

    @property
    def points(self) -> int: ...

    def leaf_name(self, point: int, index: int) -> str:
        """The id suffix of leaf ``index`` (``1..k-1``) of ``point``."""
        ...

    def checkpoint_at(self, turn: int) -> bool:
        """Whether the root keeps a checkpoint at the boundary after ``turn``."""
        ...

    def online(self, turn: int) -> list[int]:
        """The points decided at the boundary after ``turn``, as the root reaches it."""
        ...

    def at_end(self, surprisal: Mapping[int, float], open_points: Sequence[int]) -> dict[int, int]:
        """Once the root ended: the turn of each of ``open_points`` decidable from the root's per-turn
        surprisal (turns with a checkpoint only); the rest fail."""
        ...


@dataclass(frozen=True)
class FixedTurns:
    """Branch after each of ``turns`` (0-based turn indices) into ``k`` continuations."""

    turns: tuple[int, ...]
    k: int = 2

    def __post_init__(self) -> None:
        if not self.turns or any(t < 0 for t in self.turns) or len(set(self.turns)) != len(self.turns):
            raise ValueError(f"FixedTurns.turns: expected distinct turn indices >= 0, got {list(self.turns)}")
        if self.k < 2:
            raise ValueError(f"FixedTurns.k: expected >= 2 continuations per point, got {self.k}")

    @property
    def points(self) -> int:
        return len(self.turns)

    def leaf_name(self, point: int, index: int) -> str:
        return f"b{self.turns[point]}.{index}"

    def checkpoint_at(self, turn: int) -> bool:
        return turn in self.turns

    def online(self, turn: int) -> list[int]:
        return [p for p, t in enumerate(self.turns) if t == turn]

    def at_end(self, surprisal: Mapping[int, float], open_points: Sequence[int]) -> dict[int, int]:
        return {}  # a fixed turn the root never passed stays failed


@dataclass(frozen=True)
class EntropyTurns:
    """Branch after the ``budget`` highest-surprisal turns below ``max_turn`` into ``k`` continuations each."""

    budget: int = 1
    k: int = 2
    max_turn: int = 8

    def __post_init__(self) -> None:
        if self.budget < 1:
            raise ValueError(f"EntropyTurns.budget: expected >= 1 branch point per root, got {self.budget}")
        if self.k < 2:
            raise ValueError(f"EntropyTurns.k: expected >= 2 continuations per point, got {self.k}")
        if self.max_turn < 1:
            raise ValueError(f"EntropyTurns.max_turn: expected >= 1, got {self.max_turn}")

    @property
    def points(self) -> int:
        return self.budget

    def leaf_name(self, point: int, index: int) -> str:
        return f"e{point}.{index}"

    def checkpoint_at(self, turn: int) -> bool:
        return turn < self.max_turn

    def online(self, turn: int) -> list[int]:
        return []

    def at_end(self, surprisal: Mapping[int, float], open_points: Sequence[int]) -> dict[int, int]:
        # Highest surprisal first; ties go to the earlier turn (more of the episode left to explore).
        ranked = sorted(surprisal, key=lambda t: (-surprisal[t], t))
        return {p: t for p, t in zip(sorted(open_points), ranked, strict=False)}


def leaves_per_root(plan: BranchPlan) -> int:
    """The root plus ``k - 1`` leaves per point."""
    return 1 + plan.points * (plan.k - 1)


def make_plan(kind: Literal["fixed", "entropy"], *, turns: Sequence[int] = (), k: int = 2, budget: int = 1,
              max_turn: int = 8) -> BranchPlan:
    """The plan a config names (``rollout.config.BranchingConfig.plan``)."""
    if kind == "fixed":
        return FixedTurns(tuple(turns), k)
    if kind == "entropy":
        return EntropyTurns(budget, k, max_turn)
    raise ValueError(f"branching.kind: expected 'fixed' or 'entropy', got {kind!r}")


# ---------------------------------------------------------------- a request's place in a tree


@dataclass(frozen=True)
class BranchRole:
    """What an ``EpisodeRequest`` is in a tree. ``point == -1``: the root (it carries the plan's fields);
    otherwise leaf ``index`` (``1..k-1``) of ``point`` of root ``root``. Plain data: it pickles and
    round-trips JSON (``EpisodeRequest`` rebuilds it from a dict)."""

    root: str
    point: int = -1
    index: int = 0
    kind: Literal["fixed", "entropy"] = "fixed"
    turns: tuple[int, ...] = ()
    k: int = 2
    budget: int = 1
    max_turn: int = 8

    @property
    def is_root(self) -> bool:
        return self.point < 0

    def plan(self) -> BranchPlan:
        return make_plan(self.kind, turns=self.turns, k=self.k, budget=self.budget, max_turn=self.max_turn)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BranchRole:
        return cls(**{**data, "turns": tuple(data.get("turns", ()))})


def branch_requests(requests: Sequence[Any], role: BranchRole) -> list[Any]:
    """A planned group of independent requests as trees: each run of ``leaves_per_root`` requests becomes one
    root (the first, unchanged but for its role) and its leaves (renamed ``<root>/<leaf_name>``, with the root's
    task, seed, harness and effort, and their own sampling seeds). ``role`` carries the plan (``root`` unused).
    The requests are typed ``Any``: ``rollout.attempt`` imports this module, so this one does not import it back."""
    plan = role.plan()
    per = leaves_per_root(plan)
    if len(requests) % per:
        raise ValueError(f"group_size: {len(requests)} requests do not split into roots of {per} leaves "
                         f"({plan.points} points x {plan.k} continuations); use a multiple of {per}")
    out: list[Any] = []
    for at in range(0, len(requests), per):
        root, *rest = requests[at:at + per]
        out.append(dataclasses.replace(root, branch=dataclasses.replace(role, root=root.episode_id, point=-1, index=0)))
        names = [(p, j) for p in range(plan.points) for j in range(1, plan.k)]
        for req, (p, j) in zip(rest, names, strict=True):
            out.append(dataclasses.replace(
                req, episode_id=f"{root.episode_id}/{plan.leaf_name(p, j)}", task_id=root.task_id, seed=root.seed,
                harness=root.harness, effort=root.effort, thinking_budget=root.thinking_budget,
                show_effort=root.show_effort, policy=root.policy, group_id=root.group_id,
                branch=dataclasses.replace(role, root=root.episode_id, point=p, index=j),
            ))
    return out


# ---------------------------------------------------------------- checkpoints and trees (one process)


@dataclass(frozen=True)
class Checkpoint:
    """An episode at the boundary after turn ``turn``: all a continuation needs to go on from there.

    ``renderer`` is an ``EpisodeRenderer`` (or None without a tokenizer), ``state`` an ``EpisodeState``,
    ``policy`` the per-episode policy (copied with ``copy.copy``: its state lives in its attributes).
    Each consumer takes its own copies (``take``): a checkpoint is never mutated.
    """

    turn: int
    ref: SnapshotRef
    harness: str
    effort: str | None
    renderer: Any
    messages: tuple[Mapping[str, Any], ...]
    tools: tuple[Mapping[str, Any], ...]
    state: Any
    policy: Any
    turns: tuple[Turn, ...]
    tool_errors: int
    completion_tokens: int
    remaining_s: float
    surprisal: float
    prefix_tokens: int
    policy_is_base: bool = False  # the runner's shared policy (no per-episode state): never copied

    def take(self) -> tuple[Any, list[Mapping[str, Any]], Any, Any]:
        """Fresh copies of (renderer, messages, state, policy) for one continuation."""
        renderer = self.renderer.fork() if self.renderer is not None else None
        policy = self.policy if self.policy_is_base else copy.copy(self.policy)
        return renderer, [dict(m) for m in self.messages], copy.deepcopy(self.state), policy


@dataclass
class _Tree:
    points: dict[int, asyncio.Future[Checkpoint]] = field(default_factory=dict)
    reasons: dict[int, str] = field(default_factory=dict)
    taken: dict[int, dict[str, Any]] = field(default_factory=dict)
    root_done: bool = False

    def future(self, point: int) -> asyncio.Future[Checkpoint]:
        fut = self.points.get(point)
        if fut is None:
            fut = self.points[point] = asyncio.get_running_loop().create_future()
        return fut


class TreeRegistry:
    """The trees of one runner: a root publishes its points' checkpoints, leaves wait for theirs.

    All on the runner's event loop. A point is resolved once (a checkpoint) or failed once (a reason);
    when the root ends, its open points fail. ``wait_s``: how long a leaf waits for a root that has not
    started (its root runs elsewhere, or was never submitted) before it runs from scratch.
    """

    def __init__(self, wait_s: float = 900.0) -> None:
        self.wait_s = wait_s
        self._trees: OrderedDict[str, _Tree] = OrderedDict()

    def _tree(self, root: str) -> _Tree:
        tree = self._trees.get(root)
        if tree is None:
            tree = self._trees[root] = _Tree()
            while len(self._trees) > MAX_TREES:
                old_root, old = self._trees.popitem(last=False)
                for p, fut in old.points.items():
                    if not fut.done():
                        fut.set_exception(LookupError(f"tree of {old_root} dropped (over {MAX_TREES} trees)"))
                        fut.exception()  # retrieved: no "never retrieved" warning when no leaf waits
        self._trees.move_to_end(root)
        return tree

    def started(self, root: str) -> None:
        """The root runs (again: a retried attempt keeps what the first resolved)."""
        self._tree(root).root_done = False

    def resolve(self, root: str, point: int, checkpoint: Checkpoint) -> None:
        tree = self._tree(root)
        fut = tree.future(point)
        if not fut.done():
            fut.set_result(checkpoint)
            tree.taken[point] = {"point": point, "turn": checkpoint.turn, "snapshot": checkpoint.ref.id}

    def fail(self, root: str, point: int, reason: str) -> None:
        tree = self._tree(root)
        fut = tree.future(point)
        if not fut.done():
            tree.reasons[point] = reason
            fut.set_exception(LookupError(reason))
            fut.exception()

    def open_points(self, root: str, points: int) -> list[int]:
        tree = self._tree(root)
        return [p for p in range(points) if not tree.future(p).done()]

    def finish(self, root: str, points: int, reason: str) -> None:
        """The root ended: its open points fail with ``reason``."""
        for p in self.open_points(root, points):
            self.fail(root, p, reason)
        self._tree(root).root_done = True

    def summary(self, root: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(points taken: point, turn, snapshot; points failed: point, reason) of ``root``'s tree so far."""
        tree = self._tree(root)
        ok = [dict(tree.taken[p]) for p in sorted(tree.taken)]
        bad = [{"point": p, "reason": r} for p, r in sorted(tree.reasons.items())]
        return ok, bad

    async def wait(self, root: str, point: int, timeout_s: float) -> Checkpoint | str:
        """``point``'s checkpoint, or why there is none (failed, dropped, or not resolved in time)."""
        fut = self._tree(root).future(point)
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout=timeout_s)
        except TimeoutError:
            return f"no checkpoint for point {point} of {root} within {timeout_s:.0f}s (its root runs elsewhere?)"
        except LookupError as exc:
            return str(exc)


# ---------------------------------------------------------------- what a group cost


@dataclass(frozen=True)
class TreeCosts:
    """One group's costs: ``learner_tokens`` counts a shared prefix once, ``learner_tokens_flat`` per leaf."""

    leaves: int
    sandbox_s: float
    generated_tokens: int
    learner_tokens: int
    learner_tokens_flat: int


def tree_costs(trajectories: Sequence[Trajectory]) -> TreeCosts:
    """The costs of one group (a tree or independent episodes): see the module docstring.

    A leaf's prefix (``verifier["branch"]["prefix_turns"]`` turns, ``prefix_tokens`` tokens) was generated
    and paid for by its root, so it counts once; a leaf whose branch failed has no prefix.
    """
    sandbox_s = 0.0
    generated = learner = flat = 0
    for t in trajectories:
        branch = t.verifier.get("branch") or {}
        prefix_turns = int(branch.get("prefix_turns") or 0)
        prefix_tokens = int(branch.get("prefix_tokens") or 0)
        sandbox_s += t.timings.sandbox_s
        generated += sum(turn.completion_tokens for turn in t.turns[prefix_turns:])
        tokens = sum(len(s.token_ids) for s in t.samples)
        flat += tokens
        learner += tokens - prefix_tokens
    return TreeCosts(len(trajectories), sandbox_s, generated, learner, flat)
