"""The post-training engine: warm start, RL iterations, held-out evaluation (``agentenv train CONFIG``).

Phases, in order::

    warm start   oracle episodes (rotated harnesses, real sandboxes) -> SFT steps
    eval #0      held-out seeds                                  -> pass_rate_after_warm_start
    RL x N       the current weights sample G episodes per variant (rotated harness, drawn effort,
                 real sandboxes, verifier reward) -> advantages -> Trainer.step (the one policy
                 loss) -> weights published to the rollout runner with the next version
    eval #k      every ``eval.every`` iterations, and after the last -> pass_rate_after_rl

Every episode goes through one ``rollout.runner.RolloutRunner`` (``runner:
inprocess`` on this event loop, or ``runner: ray`` on Ray workers; with
``serving:`` the train turns are sampled on inference servers, ``learner.serving``); requests
say which policy acts (``oracle`` for the warm start, ``train`` after) and how
it samples, with a per-episode sampling seed derived from the run's seed and
the episode id. The learner never builds a sandbox backend.

Versions count published weights: one per RL iteration (however many
optimizer steps ``rl.updates_per_iter`` takes), so the staleness bound
K = ``rollout.staleness.max_lag`` is in iterations:

* K = 0: synchronous. Each iteration plans ``rl.groups_per_iter`` groups, waits
  for all of them, trains, publishes.
* K >= 1: asynchronous. Groups for the next K iterations are in flight while the
  learner trains; a batch is the first ``groups_per_iter`` groups to complete.
* K >= 1 and ``rl.partial_rollouts``: the batch is cut as soon as
  ``groups_per_iter`` groups are complete; the episodes still running are held
  at their next turn while the learner trains (``rollout.gate``) and continue
  under the new weights. Their turns carry the version that sampled them, and
  the loss's TIS / MIS weights use each token's own sampling logprob.

Where the learner reads, every batch is checked: a trajectory whose oldest turn
is more than K versions behind is dropped (counted), and a stale one reaching
the trainer raises ``StalenessError``. The check (``check_trained``) is made on
what the trainer is given, not on the filtered list: every training item is
traced by its ``sample_id`` back to the batch's planned trajectories (all of
them, before any filter) and must come from a trainable one within K; an item
from no planned episode raises too. So a filter or an advantage provider that
lets a stale sample through is caught, and ``max_lag`` in the metrics is the
worst lag actually trained on (``max_lag_seen`` the worst before the filter). After every ``checkpoint.every``
iterations the run is checkpointed (``learner.checkpoint``); ``--resume``
continues from the newest checkpoint to the same final iteration: pending
groups are submitted again and episodes already stored are read back, not
rerun, so no episode is stored or trained twice.

Advantages: outcome RL by default (``rl.advantage`` over each group's
rewards); an ``AdvantageProvider`` given to ``TrainLoop`` replaces that step
alone (``distill`` gives each token its MOPD teacher advantage), and everything
else -- rollouts, staleness, the one loss, publishing, checkpoints -- is the same.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import functools
import hashlib
import random
import secrets
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from learner.advantages import items_from_groups
from learner.checkpoint import EngineState, RunCheckpoints, config_hash
from learner.effort import request_fields, shaping_from
from learner.metrics import passed, trajectory_splits
from learner.model import PolicyModel
from learner.sft import batches, sft_items, sft_step
from learner.train_config import TrainConfig
from learner.trainer import Trainer, lr_factor
from learner.tree import tree_items
from learner.types import AdvantageConfig, TrainItem
from rollout.branching import branch_requests, tree_costs
from rollout.episode import EpisodeRequest
from rollout.errors import StalenessError
from rollout.harnesses.parsing import CALL_CLOSE
from rollout.policy.models import tiny_config
from rollout.policy.types import SamplingParams
from rollout.runner import RolloutRunner, run_all
from rollout.store import TrajectoryStore
from rollout.types import Status, Trajectory

if TYPE_CHECKING:
    from learner.group import LearnerGroup

__all__ = [
    "AdvantageProvider", "EvalResult", "Reporter", "RunHistory", "TrainLoop", "check_trained", "deal_updates", "eval_requests",
    "fresh_for_learner", "new_run_id", "split_pass_rates",
]


class Reporter(Protocol):
    """Where progress goes (the CLI draws rich bars; tests pass ``NullReporter``)."""

    def phase(self, name: str, total: int) -> None: ...
    def advance(self, detail: str = "") -> None: ...
    def log(self, line: str) -> None: ...


class AdvantageProvider(Protocol):
    """Turns one batch's groups of trajectories into ``TrainItem``s, plus metrics for the iteration's row.

    The default is outcome RL (``learner.advantages.items_from_groups`` with
    ``rl.advantage``). MOPD (``distill``) gives each token its teacher advantage
    instead; ``model`` is the learner's current policy (for the student's own
    logprobs), read only. Groups arrive in plan order, each as stored; a group
    may have lost members (infrastructure failures), so it may hold one.
    """

    def __call__(self, groups: Sequence[Sequence[Trajectory]], model: PolicyModel) -> tuple[list[TrainItem], dict[str, float]]: ...


class NullReporter:
    def phase(self, name: str, total: int) -> None:
        pass

    def advance(self, detail: str = "") -> None:
        pass

    def log(self, line: str) -> None:
        pass


@dataclass(frozen=True)
class EvalResult:
    """Held-out pass rate after ``iteration`` RL iterations (0 = right after the warm start)."""

    iteration: int
    version: int
    pass_rate: float
    by_harness: dict[str, float]
    by_effort: dict[str, float]
    n: int
    #: the same episodes at temperature 0, when ``eval.greedy_too`` and the eval samples (else None)
    greedy_pass_rate: float | None = None


@dataclass
class RunHistory:
    """Everything the report and the curve are drawn from."""

    sft: list[dict[str, float]] = field(default_factory=list)
    rl: list[dict[str, float]] = field(default_factory=list)
    evals: list[EvalResult] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"sft": self.sft, "rl": self.rl, "evals": [vars(e) for e in self.evals], "timings": self.timings}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunHistory:
        return cls(list(data["sft"]), list(data["rl"]), [EvalResult(**e) for e in data["evals"]], dict(data["timings"]))


def split_pass_rates(trajectories: Sequence[Trajectory], tag: str) -> dict[str, float]:
    """Pass rate per value of ``tag`` (harness, effort); an unscorable episode counts as a fail."""
    buckets: dict[str, list[bool]] = defaultdict(list)
    for t in trajectories:
        buckets[str(getattr(t, tag) or "-")].append(passed(t) and t.trainable)
    return {k: sum(v) / len(v) for k, v in sorted(buckets.items())}


def episode_seed(run_seed: int, episode_key: str) -> int:
    """The sampling seed of one episode: a pure function of the run's seed and the episode's key.

    The key is the episode id without the run id (``phase/task/seed/k``): the run id holds the start
    time, and the same config with the same seed must sample the same tokens whenever it starts.
    """
    digest = hashlib.sha256(f"sample:{run_seed}:{episode_key}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def eval_requests(
    cfg: TrainConfig, task_ids: Sequence[str], run_id: str, index: int, tag: str = "eval",
    sampling: SamplingParams | None = None,
) -> list[EpisodeRequest]:
    """The held-out episodes of evaluation ``index``: same tasks, seeds, harnesses and efforts every time.

    Harness and effort come from the rotation / effort draws at the episode's
    position in this fixed list, so evaluations differ only in the weights.
    """
    out = []
    pairs = [(t, s) for t in task_ids for s in cfg.eval.seeds]
    rollout = cfg.rollout
    for i, (task_id, seed) in enumerate(pairs):
        key = f"{tag}{index}/{task_id}/{seed}"
        effort = rollout.efforts.pick(i)
        out.append(EpisodeRequest(
            episode_id=f"{run_id}/{key}", run_id=run_id, task_id=task_id, seed=seed,
            harness=rollout.rotation.pick(i), effort=effort, group_id=f"eval/{task_id}/{seed}",
            policy="train", fixed_observations=cfg.trainer.deterministic, **request_fields(cfg.effort, effort),
            sampling=None if sampling is None else dataclasses.replace(sampling, seed=episode_seed(cfg.seed, key)),
        ))
    return out


def fresh_for_learner(trajectories: Sequence[Trajectory], version: int, max_lag: int) -> tuple[list[Trajectory], int]:
    """The trainable trajectories within K = ``max_lag`` versions of ``version``, and how many were too stale.

    A trajectory's ``policy_version`` is its oldest turn's, so a partial rollout
    continued under newer weights counts from where it started.
    """
    fresh = [t for t in trajectories if t.trainable and version - t.policy_version <= max_lag]
    stale = sum(t.trainable and version - t.policy_version > max_lag for t in trajectories)
    return fresh, stale


def check_staleness(trajectories: Sequence[Trajectory], version: int, max_lag: int) -> int:
    """The hard bound where the learner reads; returns the largest lag seen. Raises ``StalenessError``."""
    lags = [version - t.policy_version for t in trajectories]
    worst = max(lags, default=0)
    if worst > max_lag:
        bad = next(t for t in trajectories if version - t.policy_version > max_lag)
        raise StalenessError(
            f"learner at version {version}: episode {bad.episode_id} was sampled by version {bad.policy_version}, "
            f"{worst} behind, over the bound rollout.staleness.max_lag={max_lag}"
        )
    return worst


def _episode_of(sample_id: str, by_id: Mapping[str, Trajectory]) -> Trajectory | None:
    """The trajectory a ``TrainItem.sample_id`` (``EPISODE/K`` or ``EPISODE#K``) came from."""
    for sep in ("/", "#"):
        head, found, _ = sample_id.rpartition(sep)
        if found and head in by_id:
            return by_id[head]
    return None


def new_run_id(name: str) -> str:
    """``<name>-<YYYYmmdd-HHMMSS>-<6 hex>``: the start time, and a random tag so that two runs of one config started
    in the same second (a seed sweep launched in parallel) never share an id, and so never read each other's
    stored episodes as their own. Sampling seeds never depend on it (they key on the episode's place in the run)."""
    return f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def deal_updates(items: list[TrainItem], updates: int, rng: random.Random, *, whole_groups: bool = False) -> list[list[TrainItem]]:
    """``items`` shuffled by ``rng`` into at most ``updates`` parts of about equal size (empty parts left out).

    ``whole_groups`` (``trainer.prefix_sharing``): groups are shuffled and dealt whole, so a tree never straddles
    two updates (its shared prefix would be forwarded in each); without it, items are shuffled one by one."""
    chunk = -(-len(items) // updates)
    if not whole_groups:
        rng.shuffle(items)
        return [p for p in (items[u * chunk : (u + 1) * chunk] for u in range(updates)) if p]
    by_group: dict[str, list[TrainItem]] = {}
    for item in items:
        by_group.setdefault(item.group_id, []).append(item)
    groups = list(by_group.values())
    rng.shuffle(groups)
    parts: list[list[TrainItem]] = [[]]
    for g in groups:
        if parts[-1] and len(parts[-1]) + len(g) / 2 > chunk and len(parts) < updates:  # g fits better in the next
            parts.append([])
        parts[-1].extend(g)
    return [p for p in parts if p]


def check_trained(items: Sequence[TrainItem], planned: Sequence[Trajectory], version: int, max_lag: int) -> int:
    """The hard bound on what is trained: each item traced to one of ``planned`` (the batch before any filter),
    a trainable one at most ``max_lag`` versions behind. Returns the worst lag trained on; raises ``StalenessError``."""
    by_id = {t.episode_id: t for t in planned}
    trained: dict[str, Trajectory] = {}
    for item in items:
        traj = _episode_of(item.sample_id, by_id)
        if traj is None:
            raise StalenessError(
                f"learner at version {version}: training item {item.sample_id!r} comes from no episode of this batch "
                f"({len(planned)} planned): its staleness cannot be checked"
            )
        if not traj.trainable:
            raise StalenessError(
                f"learner at version {version}: training item {item.sample_id!r} comes from episode {traj.episode_id} "
                f"with status {traj.status.value}, which is never trained on"
            )
        trained[traj.episode_id] = traj
    return check_staleness(list(trained.values()), version, max_lag)


@dataclass
class _Group:
    """One variant's G episodes, in flight or done, in plan order."""

    index: int
    requests: list[EpisodeRequest]
    futures: list[asyncio.Future[Trajectory | None]]

    @property
    def done(self) -> bool:
        return all(f.done() for f in self.futures)

    def results(self) -> list[Trajectory]:
        return [t for t in (f.result() for f in self.futures) if t is not None]


def group_cost_metrics(groups: Sequence[Sequence[Trajectory]]) -> dict[str, float]:
    """Mean per group of what it cost (``rollout.branching.tree_costs``): leaves, sandbox-seconds, generated tokens
    and learner tokens (a tree's shared prefix once), so tree and independent groups compare on one scale."""
    costs = [tree_costs(g) for g in groups if g]
    if not costs:
        return {}
    n = len(costs)
    return {"leaves_per_group": sum(c.leaves for c in costs) / n, "per_group_sandbox_s": sum(c.sandbox_s for c in costs) / n,
            "gen_tokens_per_group": sum(c.generated_tokens for c in costs) / n,
            "learner_tokens_per_group": sum(c.learner_tokens for c in costs) / n}


def _request_json(req: EpisodeRequest) -> dict[str, Any]:
    return dataclasses.asdict(req)


def _request_from(data: Mapping[str, Any]) -> EpisodeRequest:
    sampling = data.get("sampling")
    fields = {**data, "sampling": SamplingParams(**{**sampling, "stop": tuple(sampling["stop"])}) if sampling else None}
    return EpisodeRequest(**fields)


class TrainLoop:
    """One training run; ``run()`` returns the summary dict (also written by the CLI's ``--json``).

    ``resume=True`` continues the run of this config from its newest checkpoint
    (or from its start, under the same run id, when it has none yet).
    """

    def __init__(
        self, cfg: TrainConfig, task_ids: Sequence[str] | Mapping[str, str], *, reporter: Reporter | None = None,
        resume: bool = False, advantages: AdvantageProvider | None = None,
    ) -> None:
        self.cfg = cfg
        self.advantages = advantages
        self.domains = dict(task_ids) if isinstance(task_ids, Mapping) else {t: "" for t in task_ids}
        self.task_ids = list(self.domains)
        self.effort = shaping_from(cfg.effort, self.task_ids)  # the effort reward (None: off); budgets checked now
        self.reporter: Reporter = reporter or NullReporter()
        self.history = RunHistory()
        self.rng = random.Random(cfg.seed)
        self._episode_index = 0
        self._planned_batches = 0
        self._trained: list[str] = []
        self._restored: EngineState | None = None
        self.checkpoints = RunCheckpoints(cfg.run_dir() / "checkpoints", keep=cfg.checkpoint.keep)
        # serving: says where the train turns are sampled, not what the run is: a run resumes on restarted servers
        # (new ports), and a config without it hashes as it did before the section existed
        self.config_hash = config_hash(cfg.model_dump(mode="json", exclude={"serving"}))
        if resume:
            self.run_id = self.checkpoints.read_run(self.config_hash)
            latest = self.checkpoints.latest()
            self._restored = self.checkpoints.read_state(latest) if latest is not None else None
        else:
            self.run_id = new_run_id(cfg.run_id)
        torch.set_num_threads(cfg.torch_threads)
        torch.manual_seed(cfg.seed)
        from rollout.policy.models import load_checkpoint
        from rollout.tokenizer import build_tokenizer

        m = cfg.model
        if m.checkpoint:
            lm, self.tokenizer = load_checkpoint(m.checkpoint)
            self.model = PolicyModel(lm)
        else:
            self.tokenizer = build_tokenizer()
            config = tiny_config(self.tokenizer, hidden_size=m.hidden_size, num_layers=m.num_layers,
                                 num_heads=m.num_heads, num_kv_heads=m.num_kv_heads, init_std=m.init_std,
                                 sliding_window=m.sliding_window, full_attention_layers=m.full_attention_layers)
            self.model = PolicyModel.from_config(config, seed=m.seed)
        self.model.to(m.device)
        self.store = TrajectoryStore(cfg.trajectory_store)
        self.store.ensure_run(self.run_id, cfg.model_dump(mode="json"))
        self.runner: RolloutRunner = self._make_runner()
        self.version = 0
        # Stopping at the end-of-call marker: a sampled turn is one call, never a call plus whatever the model
        # rambles after it (which a success would otherwise reinforce, since the call still runs).
        self._stop: tuple[str, ...] = (CALL_CLOSE,) if cfg.stop_at_call_end else ()

    # ------------------------------------------------------------ plumbing

    def _make_runner(self) -> RolloutRunner:
        rollout = self.cfg.rollout_job(self.run_id)
        if self.cfg.serving is not None:  # train turns on inference servers, each version published to them
            from learner.serving import make_served_runner

            return make_served_runner(self.cfg, self.model, self.tokenizer, self.store, self.run_id)
        if self.cfg.runner == "ray":
            from rollout.runner import RayRunner

            return RayRunner(rollout, store=self.store, domains=self.domains,
                             train_model=self.model.lm.config.to_dict(), tokenizer=self.cfg.model.checkpoint)
        from rollout.policy.hf import HFPolicy
        from rollout.runner import InProcessRunner

        # The rollout side's own copy: it changes only through publish(version, weights).
        rollout_lm: Any = copy.deepcopy(self.model.lm)  # transformers types .to() as unbound
        policy = HFPolicy(rollout_lm.to(self.cfg.model.rollout_device), self.tokenizer,
                          name="train-policy", version=0, device=self.cfg.model.rollout_device)
        return InProcessRunner(
            policy, tokenizer=self.tokenizer, backend=rollout.backend, run_id=self.run_id, store=self.store,
            concurrency=rollout.concurrency, pool_size=max(rollout.pool_size, 1),
            grade_in_place=rollout.grading == "in_place", sandbox_retries=rollout.retries.sandbox_acquire,
        )

    async def _publish(self, version: int) -> None:
        """New weights to every rollout policy, under ``version`` (versions only grow)."""
        await self.runner.publish(version, self.model.lm.state_dict())
        self.version = version

    def _sampling(self, temperature: float, top_p: float = 1.0) -> SamplingParams:
        return SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=self.cfg.rollout.sampling.max_new_tokens,
                              stop=self._stop)

    async def _run_all(self, requests: Sequence[EpisodeRequest], detail: str) -> list[Trajectory]:
        def done(req: EpisodeRequest, traj: Trajectory) -> None:
            self.reporter.advance(f"{detail} {req.harness}/{req.effort}: r={traj.reward:.0f}")

        return await run_all(self.runner, requests, done)

    def _next_meta(self) -> tuple[str, str | None]:
        i = self._episode_index
        self._episode_index += 1
        return self.cfg.rollout.rotation.pick(i), self.cfg.rollout.efforts.pick(i)

    def _train_requests(
        self, phase: str, seeds: Sequence[tuple[str, int]], per: int, *, policy: str = "train",
        sampling: SamplingParams | None = None,
    ) -> list[EpisodeRequest]:
        out = []
        for task_id, seed in seeds:
            for k in range(per):
                harness, effort = self._next_meta()
                key = f"{phase}/{task_id}/{seed}/{k}"
                out.append(EpisodeRequest(
                    episode_id=f"{self.run_id}/{key}", run_id=self.run_id, task_id=task_id,
                    seed=seed, harness=harness, effort=effort, group_id=f"{phase}/{task_id}/{seed}", policy=policy,
                    fixed_observations=self.cfg.trainer.deterministic, **request_fields(self.cfg.effort, effort, policy),
                    sampling=None if sampling is None else dataclasses.replace(
                        sampling, seed=episode_seed(self.cfg.seed, key)),
                ))
        return out

    def _draw_seeds(self, n: int) -> list[tuple[str, int]]:
        return [(self.rng.choice(self.task_ids), self.rng.randrange(self.cfg.train_seeds)) for _ in range(n)]

    # ------------------------------------------------------------ phases

    async def warm_start(self) -> None:
        cfg = self.cfg.sft
        if self.cfg.trainer.deterministic:  # before the first SFT step, not only when the RL trainer is built
            from learner.trainer import make_deterministic

            make_deterministic(self.cfg.torch_threads)
        if cfg.episodes == 0 or cfg.steps == 0:
            return
        t0 = time.monotonic()
        seeds = self._draw_seeds(cfg.episodes)
        if cfg.variant_seeds is not None:  # the warm start sees only the task's simpler family of variants
            seeds = [(task_id, seed % cfg.variant_seeds) for task_id, seed in seeds]
        # oracle_effort: each demonstration in its episode's effort style (low: the call; high: plan, call; max: + a check)
        requests = self._train_requests("sft", seeds, 1, policy="oracle_effort" if self.cfg.effort.oracle_styles else "oracle")
        self.reporter.phase("warm start: oracle episodes", len(requests))
        trajs = await self._run_all(requests, "oracle")
        items = sft_items(trajs)
        if not items:
            raise RuntimeError(f"warm start: none of the {len(trajs)} oracle episodes passed; check the tasks")
        self.reporter.log(f"warm start: {len(items)} samples from {sum(passed(t) for t in trajs)}/{len(trajs)} passing oracle episodes")
        opt = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, weight_decay=0.0)
        self._sft_optimizer = opt
        self.reporter.phase("warm start: SFT steps", cfg.steps)
        for step, batch in enumerate(batches(items, cfg.batch_size, cfg.steps, seed=self.cfg.seed), start=1):
            out = await asyncio.to_thread(sft_step, self.model, opt, batch, step)
            row = {"step": step, "loss": out.loss, "token_accuracy": out.token_accuracy}
            self.history.sft.append(row)
            self.store.log_metrics(self.run_id, {"sft/loss": out.loss, "sft/token_accuracy": out.token_accuracy},
                                   step=step, tags={"phase": "sft"})
            self.reporter.advance(f"loss {out.loss:.3f} acc {out.token_accuracy:.2f}")
        await self._publish(0)
        self.history.timings["warm_start_s"] = time.monotonic() - t0

    async def evaluate(self, index: int, iteration: int) -> EvalResult:
        t0 = time.monotonic()
        sampling = self._sampling(self.cfg.eval.temperature)
        requests = eval_requests(self.cfg, self.task_ids, self.run_id, index, sampling=sampling)
        self.reporter.phase(f"eval #{index} (held-out, v{self.version})", len(requests))
        trajs = await self._run_all(requests, "eval")
        ok = [passed(t) and t.trainable for t in trajs]
        greedy = None
        if self.cfg.eval.greedy_too and self.cfg.eval.temperature > 0:
            greedy_requests = eval_requests(self.cfg, self.task_ids, self.run_id, index, tag="eval_greedy",
                                            sampling=self._sampling(0.0))
            self.reporter.phase(f"eval #{index} greedy (held-out, v{self.version})", len(greedy_requests))
            g = [passed(t) and t.trainable for t in await self._run_all(greedy_requests, "eval greedy")]
            greedy = sum(g) / len(g)
        result = EvalResult(iteration, self.version, sum(ok) / len(ok), split_pass_rates(trajs, "harness"),
                            split_pass_rates(trajs, "effort"), len(trajs), greedy)
        self.history.evals.append(result)
        metrics = {"eval/pass_rate": result.pass_rate}
        if greedy is not None:
            metrics["eval/pass_rate_greedy"] = greedy
        metrics |= {f"eval/pass_rate/harness={k}": v for k, v in result.by_harness.items()}
        metrics |= {f"eval/pass_rate/effort={k}": v for k, v in result.by_effort.items()}
        self.store.log_metrics(self.run_id, metrics, step=iteration, tags={"phase": "eval"})
        self.reporter.log(f"eval #{index} after {iteration} RL iterations: pass rate {result.pass_rate:.2f} "
                          + (f"(greedy {greedy:.2f}) " if greedy is not None else "")
                          + f"by harness {_fmt(result.by_harness)} by effort {_fmt(result.by_effort)}")
        self.history.timings[f"eval{index}_s"] = time.monotonic() - t0
        return result

    # ------------------------------------------------------------ RL

    def _make_trainer(self) -> Trainer | LearnerGroup:
        loss_cfg = self.cfg.loss_config()
        # KL(pi || pi_ref) to the warm-started model keeps what SFT taught (the tool-call format)
        # while RL moves the decisions the verifier rewards; the reference is a frozen copy.
        ref = None
        if loss_cfg.kl_coef > 0:
            warm = self.checkpoints.warm_start_dir()
            ref = PolicyModel.from_pretrained(warm) if self._restored is not None else PolicyModel(copy.deepcopy(self.model.lm))
            ref.to(self.cfg.model.device)
            ref.lm.requires_grad_(False)
        if self.cfg.trainer.world_size is not None:  # the sharded learner: FSDP2 ranks on Ray, started from self.model
            from learner.group import LearnerGroup

            threads = max(1, self.cfg.torch_threads // self.cfg.trainer.world_size)
            group = LearnerGroup(self.model, loss_cfg, self.cfg.trainer, device=self.cfg.model.device, ref_model=ref,
                                 threads=threads)
            sft_opt = getattr(self, "_sft_optimizer", None)
            if self.cfg.rl.continue_sft_optimizer and sft_opt is not None:
                group.carry_moments(sft_opt, self.model)
            return group
        trainer = Trainer(self.model, loss_cfg, self.cfg.trainer, publisher=None, ref_model=ref)
        sft_opt = getattr(self, "_sft_optimizer", None)
        if self.cfg.rl.continue_sft_optimizer and sft_opt is not None:
            carry_moments(trainer, sft_opt)
        return trainer

    def _plan_group(self) -> list[EpisodeRequest]:
        """The next batch of groups' requests is planned a group at a time; ``rl{b}`` is its plan batch. With
        ``rollout.branching`` the group's G requests become roots x leaves (``rollout.branching.branch_requests``:
        the same draws, so turning it on changes nothing else of the plan)."""
        rollout = self.cfg.rollout
        reqs = self._train_requests(f"rl{self._planned_batches}", self._draw_seeds(1), rollout.group_size,
                                    sampling=self._sampling(rollout.sampling.temperature, rollout.sampling.top_p))
        if rollout.resume_from_snapshots:
            reqs = [dataclasses.replace(r, resume_from_snapshots=True) for r in reqs]
        return branch_requests(reqs, rollout.branching.role()) if rollout.branching.on else reqs

    def _submit(self, requests: Sequence[EpisodeRequest]) -> list[asyncio.Future[Trajectory | None]]:
        futures = [self.runner.submit(r) for r in requests]
        for req, fut in zip(requests, futures, strict=True):
            fut.add_done_callback(functools.partial(self._advance, req))
        return futures

    def _advance(self, req: EpisodeRequest, fut: asyncio.Future[Trajectory | None]) -> None:
        if not fut.cancelled() and fut.exception() is None and fut.result() is not None:
            traj = fut.result()
            assert traj is not None  # noqa: S101 - checked above
            self.reporter.advance(f"rl {req.harness}/{req.effort}: r={traj.reward:.0f} v{traj.policy_version}")

    def _capacity(self) -> int:
        cfg, k = self.cfg.rl, self.cfg.max_lag
        if cfg.partial_rollouts:
            return cfg.groups_per_iter + cfg.partial_oversample
        return cfg.groups_per_iter * (1 + k)

    async def _take(self, pending: list[_Group], n: int) -> list[_Group]:
        """Wait until ``n`` groups are complete (or every pending one, when fewer are left); plan order."""
        while True:
            done = [g for g in pending if g.done]
            if len(done) >= n or len(done) == len(pending):
                taken = sorted(done, key=lambda g: g.index)[:n]
                for g in taken:
                    pending.remove(g)
                return taken
            waiting = [f for g in pending for f in g.futures if not f.done()]
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)

    async def rl(self) -> None:
        trainer = self._make_trainer()
        try:
            await self._rl(trainer)
        finally:
            if not isinstance(trainer, Trainer):
                trainer.close()

    async def _rl(self, trainer: Trainer | LearnerGroup) -> None:
        cfg = self.cfg.rl
        pending: list[_Group] = []
        total_groups = cfg.iterations * cfg.groups_per_iter
        planned = 0
        first_it = 1
        restored = self._restored
        if restored is not None:  # resume: the trainer's state, the draws, and the groups in flight
            latest = self.checkpoints.latest()
            assert latest is not None  # noqa: S101 - restored implies a checkpoint
            trainer.load(latest / "trainer")
            first_it = restored.iteration + 1
            planned = restored.planned_batches
            for i, group in enumerate(restored.pending):  # submitted again: stored ones are read back, not rerun
                reqs = [_request_from(r) for r in group]
                pending.append(_Group(planned - len(restored.pending) + 1 + i, reqs, self._submit(reqs)))
        for it in range(first_it, cfg.iterations + 1):
            t0 = time.monotonic()
            while len(pending) < self._capacity() and planned < total_groups:
                planned += 1
                self._planned_batches = planned
                reqs = self._plan_group()
                pending.append(_Group(planned, reqs, self._submit(reqs)))
            self.reporter.phase(f"RL {it}/{cfg.iterations}: rollouts (v{self.version}, {len(pending)} groups in flight)",
                                cfg.groups_per_iter * self.cfg.rollout.group_size)
            # the last iteration takes whatever is left, so every planned episode is trained or counted
            want = cfg.groups_per_iter if it < cfg.iterations else len(pending)
            taken = await self._take(pending, want)
            if cfg.partial_rollouts and pending:
                await self.runner.pause()  # the rest wait at their next turn while the learner trains
            trajs = [t for g in taken for t in g.results()]
            t1 = time.monotonic()
            row = await self._learn(trainer, it, trajs, len(pending))
            row |= group_cost_metrics([g.results() for g in taken])
            if not isinstance(trainer, Trainer):  # the sharded learner's weights, gathered, become this process's copy
                self.model.lm.load_state_dict(await asyncio.to_thread(trainer.state_dict))
            await self._publish(self.version + 1)
            if cfg.partial_rollouts:
                await self.runner.resume()
            t2 = time.monotonic()
            row |= {"version": self.version, "rollout_s": t1 - t0, "learner_s": t2 - t1}
            self.history.rl.append(row)
            self.store.log_metrics(self.run_id, {f"rl/{k}": float(v) for k, v in row.items()}, step=it, tags={"phase": "rl"})
            self.reporter.log(f"RL {it}: pass {row['pass_rate']:.2f} reward {row['reward']:.2f} "
                              f"entropy {row.get('entropy', float('nan')):.3f} v{self.version} "
                              f"(max lag {row['max_lag']:.0f}, stale {row['dropped_stale']:.0f})")
            if self.cfg.eval.every and it % self.cfg.eval.every == 0 and it != cfg.iterations:
                await self.evaluate(len(self.history.evals), it)
            self.history.timings["rl_rollout_s"] = self.history.timings.get("rl_rollout_s", 0.0) + (t1 - t0)
            self.history.timings["rl_learner_s"] = self.history.timings.get("rl_learner_s", 0.0) + (t2 - t1)
            if self.cfg.checkpoint.every and (it % self.cfg.checkpoint.every == 0 or it == cfg.iterations):
                self._checkpoint(trainer, it, pending)
        if pending:  # iterations: 0, or nothing left to train: still stored, exactly once
            await asyncio.gather(*(f for g in pending for f in g.futures), return_exceptions=True)

    async def _learn(self, trainer: Trainer | LearnerGroup, it: int, trajs: list[Trajectory], in_flight: int) -> dict[str, float]:
        cfg = self.cfg.rl
        # An agent-caused invalid (the agent's code hung the tests, exited, skipped them all) is recorded under
        # the episode's own trainable status with reward 0 and stays in: a failure, not a free pass. Only the
        # grader's invalids (status ``invalid``, kept only with evidence the agent could not produce: see
        # agentenv.grading) and infrastructure failures are dropped, and counted; so is a policy_error only
        # when the endpoint failed (a context flood is a truncated episode, trained on).
        fresh, stale = fresh_for_learner(trajs, self.version, self.cfg.max_lag)
        seen = max((self.version - t.policy_version for t in trajs if t.trainable), default=0)
        graded_invalid = sum(t.status is Status.INVALID for t in trajs)
        infra = sum(t.status in (Status.SANDBOX_LOST, Status.WORKER_LOST, Status.ERROR, Status.POLICY_ERROR) for t in trajs)
        agent_invalid = sum(bool(t.verifier.get("agent_invalid")) for t in fresh)
        groups: dict[str, list[Trajectory]] = defaultdict(list)
        for t in fresh:
            groups[t.verifier.get("group_id", "")].append(t)
        extra: dict[str, float] = {}
        if self.advantages is None:
            items = advantage_items(cfg.advantage)([tuple(g) for g in groups.values() if len(g) >= 2], cfg.advantage,
                                                   **(self.effort.kwargs() if self.effort is not None else {}))
        else:
            items, extra = await asyncio.to_thread(self.advantages, [tuple(g) for g in groups.values()], self.model)
        # A sample longer than one micro-batch (a model looping to the turn limit) is not trained on, and counted.
        limit = self.cfg.trainer.micro_batch_tokens
        overlong = sum(len(i) > limit for i in items)
        items = [i for i in items if i.num_loss_tokens > 0 and len(i) <= limit]
        worst = check_trained(items, trajs, self.version, self.cfg.max_lag)  # the hard bound, on what is trained
        mixed = sum(len({turn.policy_version for turn in t.turns}) > 1 for t in fresh)
        row: dict[str, float] = {"iteration": it, **trajectory_splits(trajs),
                                "dropped_stale": stale, "dropped_invalid": graded_invalid, "infra_failed": infra,
                                "agent_invalid": agent_invalid, "dropped_overlong": overlong, "max_lag": worst, "max_lag_seen": seen,
                                "mixed_version_episodes": mixed, "in_flight_groups": in_flight, **extra}
        if self.effort is not None:  # the share the effort rule set to -1
            row["over_budget"] = self.effort.over_budget(fresh)
        if items and any(_nonzero(i.advantage) for i in items):
            for part in deal_updates(items, cfg.updates_per_iter, self.rng, whole_groups=self.cfg.trainer.prefix_sharing):
                m = await asyncio.to_thread(trainer.step, part, trajectories=trajs)
            row |= {k: v for k, v in m.as_dict().items() if "/" not in k}
        self._trained.extend(t.episode_id for t in fresh)
        return row

    def _checkpoint(self, trainer: Trainer | LearnerGroup, it: int, pending: Sequence[_Group]) -> None:
        state = EngineState(
            run_id=self.run_id, config_hash=self.config_hash, iteration=it, version=self.version,
            episode_index=self._episode_index, planned_batches=self._planned_batches,
            rng=_rng_json(self.rng.getstate()), pending=[[_request_json(r) for r in g.requests] for g in pending],
            trained=list(self._trained), history=self.history.to_json(), evals_done=len(self.history.evals),
        )
        self.checkpoints.write(it, state, trainer.save, self.tokenizer)

    def _restore(self, state: EngineState) -> None:
        self.version = state.version
        self._episode_index = state.episode_index
        self._planned_batches = state.planned_batches
        self.rng.setstate(_rng_from_json(state.rng))
        self._trained = list(state.trained)
        self.history = RunHistory.from_json(state.history)

    async def run(self) -> dict[str, Any]:
        t0 = time.monotonic()
        try:
            await self.runner.start(self.task_ids)
            restored = self._restored
            if restored is None:
                self.checkpoints.write_run(self.run_id, self.config_hash)
                await self.warm_start()
                if self.version == 0 and not self.history.sft:
                    await self._publish(0)  # no warm start: the initial weights are version 0
                if self.cfg.rl.loss.kl_coef > 0:  # the KL reference, read back by a resumed run
                    self.checkpoints.write_warm_start(self.model.save)
                first = await self.evaluate(0, 0)
            else:
                self._restore(restored)
                self.model.to(self.cfg.model.device)
                await self._publish_restored()
                first = self.history.evals[0]
                self.reporter.log(f"resumed {self.run_id} after iteration {restored.iteration} (version {self.version}, "
                                  f"{len(restored.pending)} groups pending, {len(restored.trained)} episodes trained)")
            await self.rl()
            last = await self.evaluate(len(self.history.evals), self.cfg.rl.iterations)
        finally:
            await self.runner.close()
        self.history.timings["total_s"] = self.history.timings.get("total_s", 0.0) + time.monotonic() - t0
        return self.summary(first, last)

    async def _publish_restored(self) -> None:
        latest = self.checkpoints.latest()
        assert latest is not None  # noqa: S101 - restored implies a checkpoint
        if self.cfg.trainer.world_size is not None:  # a sharded checkpoint: its Hugging Face export holds the weights
            saved = PolicyModel.from_pretrained(latest / "trainer" / "model")
            self.model.lm.load_state_dict(saved.lm.state_dict())
            await self.runner.publish(self.version, self.model.lm.state_dict())
            return
        trainer = Trainer(self.model, self.cfg.loss_config(), self.cfg.trainer)
        trainer.load(latest / "trainer")  # the weights now, so the runner samples the checkpoint's version
        await self.runner.publish(self.version, self.model.lm.state_dict())

    def summary(self, first: EvalResult, last: EvalResult) -> dict[str, Any]:
        return {
            "run_id": self.run_id, "config": self.cfg.run_id, "seed": self.cfg.seed, "tasks": self.task_ids,
            "eval_seeds": list(self.cfg.eval.seeds), "eval_temperature": self.cfg.eval.temperature,
            "pass_rate_after_warm_start": first.pass_rate, "pass_rate_after_rl": last.pass_rate,
            "improvement_points": round(100 * (last.pass_rate - first.pass_rate), 1),
            "pass_rate_greedy_after_warm_start": first.greedy_pass_rate,
            "pass_rate_greedy_after_rl": last.greedy_pass_rate,
            "after_warm_start": {"by_harness": first.by_harness, "by_effort": first.by_effort, "n": first.n},
            "after_rl": {"by_harness": last.by_harness, "by_effort": last.by_effort, "n": last.n},
            "evals": [vars(e) for e in self.history.evals], "rl": list(self.history.rl),
            "final_version": self.version, "rollout": self.runner.describe(),
            "max_lag": self.cfg.max_lag, "trained_episodes": len(self._trained),
            "trained_unique": len(set(self._trained)),
            "timings_s": {k: round(v, 1) for k, v in self.history.timings.items()},
            "store": self.store.url,
        }


def carry_moments(trainer: Trainer, optimizer: torch.optim.Optimizer) -> None:
    """Start ``trainer``'s AdamW from ``optimizer``'s moments (the warm start's), at the trainer's own learning
    rate and the schedule's current point: a warmup still warms up."""
    lr = trainer.cfg.lr
    trainer.optimizer.load_state_dict(optimizer.state_dict())
    factor = lr_factor(trainer.cfg, trainer.scheduler.last_epoch)
    for group in trainer.optimizer.param_groups:
        group["initial_lr"] = lr
        group["lr"] = lr * factor
    trainer.scheduler.base_lrs = [lr for _ in trainer.optimizer.param_groups]


def _rng_json(state: tuple[Any, ...]) -> list[Any]:
    version, internal, gauss = state
    return [version, list(internal), gauss]


def _rng_from_json(data: Sequence[Any]) -> tuple[Any, ...]:
    return (data[0], tuple(data[1]), data[2])


def _nonzero(advantage: float | tuple[float, ...]) -> bool:
    """Whether an item's advantage (one per sequence, or one per token) moves anything."""
    return any(a != 0 for a in advantage) if isinstance(advantage, tuple) else advantage != 0


def _fmt(d: dict[str, float]) -> str:
    return "{" + ", ".join(f"{k}: {v:.2f}" for k, v in d.items()) + "}"


def advantage_items(cfg: AdvantageConfig) -> Callable[..., list[TrainItem]]:
    """The outcome-RL item builder ``rl.advantage`` names: tree advantages (``rl.advantage.tree``) or per-group."""
    return tree_items if cfg.tree else items_from_groups
