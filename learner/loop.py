"""The main job: warm start, RL iterations, held-out evaluation (``agentenv train CONFIG``).

Phases, in order::

    warm start   ScriptedPolicy episodes (oracle, rotated harnesses, real sandboxes) -> SFT steps
    eval #0      held-out seeds, greedy                        -> pass_rate_after_warm_start
    RL x N       HFPolicy on the current weights samples G episodes per variant (rotated harness,
                 drawn effort, real sandboxes, verifier reward) -> advantages -> Trainer.step
                 (the one policy loss) -> weights published to the rollout policy with a version
    eval #k      every ``eval.every`` iterations, and after the last -> pass_rate_after_rl

Rollouts run in-process through ``rollout.episode.EpisodeRunner`` (asyncio, a
thread pool for sandbox calls), not on Ray workers. Why: on the 2-core machine
this is built for, a Ray worker process holds its own copy of the model and
competes with the learner for the same two cores, Ray start-up costs ~10 s of a
20-minute budget, and weights would travel through the object store to reach a
policy living one process away. The contract is the one the Ray path uses:
``EpisodeRequest`` in, ``Trajectory`` (stored once, by episode id) out, and
weights reach the policy only through ``HFPolicy.set_weights(state, version)``
(what ``RolloutWorker.set_policy_version`` calls). Sampling is synchronous, so
the lag is 0; trajectories older than ``rl.max_lag`` versions would be dropped
(the check is kept so an asynchronous variant inherits it).

The learner never talks to Docker: sandboxes belong to the runner (rollout).
"""

from __future__ import annotations

import asyncio
import copy
import random
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from learner.advantages import items_from_groups
from learner.metrics import passed, trajectory_splits
from learner.model import PolicyModel
from learner.sft import batches, sft_items, sft_step
from learner.train_config import TrainConfig
from learner.trainer import Trainer
from learner.types import TrainerConfig
from rollout.episode import EpisodeRequest, EpisodeRunner
from rollout.harnesses.parsing import CALL_CLOSE
from rollout.policy.hf import HFPolicy
from rollout.policy.models import tiny_config
from rollout.policy.scripted import ScriptedPolicy
from rollout.policy.types import SamplingParams
from rollout.store import TrajectoryStore
from rollout.types import Status, Trajectory

#: Micro-batch size of the RL learner; packs two typical episodes (1-2k tokens) per row on CPU.
MAX_TRAIN_TOKENS = 4096

__all__ = ["EvalResult", "Reporter", "RunHistory", "TrainLoop", "eval_requests", "split_pass_rates"]


class Reporter(Protocol):
    """Where progress goes (the CLI draws rich bars; tests pass ``NullReporter``)."""

    def phase(self, name: str, total: int) -> None: ...
    def advance(self, detail: str = "") -> None: ...
    def log(self, line: str) -> None: ...


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


def split_pass_rates(trajectories: Sequence[Trajectory], tag: str) -> dict[str, float]:
    """Pass rate per value of ``tag`` (harness, effort); an unscorable episode counts as a fail."""
    buckets: dict[str, list[bool]] = defaultdict(list)
    for t in trajectories:
        buckets[str(getattr(t, tag) or "-")].append(passed(t) and t.trainable)
    return {k: sum(v) / len(v) for k, v in sorted(buckets.items())}


def eval_requests(
    cfg: TrainConfig, task_ids: Sequence[str], run_id: str, index: int, tag: str = "eval"
) -> list[EpisodeRequest]:
    """The held-out episodes of evaluation ``index``: same tasks, seeds, harnesses and efforts every time.

    Harness and effort come from the rotation / effort draws at the episode's
    position in this fixed list, so evaluations differ only in the weights.
    """
    out = []
    pairs = [(t, s) for t in task_ids for s in cfg.eval.seeds]
    for i, (task_id, seed) in enumerate(pairs):
        out.append(EpisodeRequest(
            episode_id=f"{run_id}/{tag}{index}/{task_id}/{seed}", run_id=run_id, task_id=task_id, seed=seed,
            harness=cfg.rotation.pick(i), effort=cfg.efforts.pick(i), group_id=f"eval/{task_id}/{seed}",
        ))
    return out


class TrainLoop:
    """One training run; ``run()`` returns the summary dict (also written by the CLI's ``--json``)."""

    def __init__(self, cfg: TrainConfig, task_ids: Sequence[str], *, reporter: Reporter | None = None) -> None:
        self.cfg = cfg
        self.task_ids = list(task_ids)
        self.reporter: Reporter = reporter or NullReporter()
        self.run_id = f"{cfg.run_id}-{time.strftime('%Y%m%d-%H%M%S')}"
        self.history = RunHistory()
        self.rng = random.Random(cfg.seed)
        self._episode_index = 0
        torch.set_num_threads(cfg.torch_threads)
        torch.manual_seed(cfg.seed)
        from rollout.tokenizer import build_tokenizer
        from rollout.policy.models import load_checkpoint

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
        # The rollout side's own copy: it changes only through set_weights(state, version).
        self.policy = HFPolicy(copy.deepcopy(self.model.lm), self.tokenizer, name="train-policy", version=0)
        self.store = TrajectoryStore(cfg.store)
        self.store.ensure_run(self.run_id, cfg.model_dump(mode="json"))
        from rollout.worker import make_backend

        self.backend = make_backend(cfg.backend, self.run_id)
        self.runner = EpisodeRunner(ScriptedPolicy(), backend=self.backend, tokenizer=self.tokenizer,
                                    pool_size=cfg.pool_size, store=self.store)
        self.version = 0
        # Stopping at the end-of-call marker: a sampled turn is one call, never a call plus whatever the model
        # rambles after it (which a success would otherwise reinforce, since the call still runs).
        self._stop: tuple[str, ...] = (CALL_CLOSE,) if cfg.stop_at_call_end else ()

    # ------------------------------------------------------------ plumbing

    def _publish(self, model: PolicyModel, version: int) -> str:
        """The trainer's publisher: copy the weights into the rollout policy under ``version``."""
        self.policy.set_weights(model.lm.state_dict(), version)
        self.version = version
        return f"in-process:v{version}"

    async def _run_all(self, requests: Sequence[EpisodeRequest], detail: str) -> list[Trajectory]:
        sem = asyncio.Semaphore(self.cfg.concurrency)

        async def one(req: EpisodeRequest) -> Trajectory:
            async with sem:
                traj = await self.runner.run(req)
            self.reporter.advance(f"{detail} {req.harness}/{req.effort}: r={traj.reward:.0f}")
            return traj

        return list(await asyncio.gather(*(one(r) for r in requests)))

    def _next_meta(self) -> tuple[str, str | None]:
        i = self._episode_index
        self._episode_index += 1
        return self.cfg.rotation.pick(i), self.cfg.efforts.pick(i)

    def _train_requests(self, phase: str, seeds: Sequence[tuple[str, int]], per: int) -> list[EpisodeRequest]:
        out = []
        for task_id, seed in seeds:
            for k in range(per):
                harness, effort = self._next_meta()
                out.append(EpisodeRequest(
                    episode_id=f"{self.run_id}/{phase}/{task_id}/{seed}/{k}", run_id=self.run_id, task_id=task_id,
                    seed=seed, harness=harness, effort=effort, group_id=f"{phase}/{task_id}/{seed}",
                ))
        return out

    def _draw_seeds(self, n: int) -> list[tuple[str, int]]:
        return [(self.rng.choice(self.task_ids), self.rng.randrange(self.cfg.train_seeds)) for _ in range(n)]

    # ------------------------------------------------------------ phases

    async def warm_start(self) -> None:
        cfg = self.cfg.sft
        if cfg.episodes == 0 or cfg.steps == 0:
            return
        t0 = time.monotonic()
        self.runner.policy = ScriptedPolicy()
        requests = self._train_requests("sft", self._draw_seeds(cfg.episodes), 1)
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
        self._publish(self.model, 0)
        self.history.timings["warm_start_s"] = time.monotonic() - t0

    async def evaluate(self, index: int, iteration: int) -> EvalResult:
        t0 = time.monotonic()
        self.runner.policy = self.policy
        self.runner.sampling = SamplingParams(temperature=self.cfg.eval.temperature, max_new_tokens=self.cfg.max_new_tokens,
                                              stop=self._stop)
        requests = eval_requests(self.cfg, self.task_ids, self.run_id, index)
        self.reporter.phase(f"eval #{index} (held-out, v{self.version})", len(requests))
        trajs = await self._run_all(requests, "eval")
        ok = [passed(t) and t.trainable for t in trajs]
        greedy = None
        if self.cfg.eval.greedy_too and self.cfg.eval.temperature > 0:
            self.runner.sampling = SamplingParams(temperature=0.0, max_new_tokens=self.cfg.max_new_tokens, stop=self._stop)
            greedy_requests = eval_requests(self.cfg, self.task_ids, self.run_id, index, tag="eval_greedy")
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

    async def rl(self) -> None:
        cfg = self.cfg.rl
        loss_cfg = cfg.loss.model_copy(update={"temperature": cfg.temperature})
        # KL(pi || pi_ref) to the warm-started model keeps what SFT taught (the tool-call format)
        # while RL moves the decisions the verifier rewards; the reference is a frozen copy.
        ref = None
        if loss_cfg.kl_coef > 0:
            ref = PolicyModel(copy.deepcopy(self.model.lm))
            ref.lm.requires_grad_(False)
        # The LM head only at sampled tokens: exact, and most of the step on 1-2k-token prompts.
        tcfg = TrainerConfig(lr=cfg.lr, micro_batch_tokens=MAX_TRAIN_TOKENS, logprobs_at_loss_tokens=True)
        trainer = Trainer(self.model, loss_cfg, tcfg, publisher=self._publish, ref_model=ref)
        trainer.state.step = self.version
        sft_opt = getattr(self, "_sft_optimizer", None)
        if cfg.continue_sft_optimizer and sft_opt is not None:
            trainer.optimizer.load_state_dict(sft_opt.state_dict())
            for group in trainer.optimizer.param_groups:  # keep the moments, take RL's learning rate
                group["lr"] = group["initial_lr"] = cfg.lr
            trainer.scheduler.base_lrs = [cfg.lr for _ in trainer.optimizer.param_groups]
        t_roll = t_learn = 0.0
        for it in range(1, cfg.iterations + 1):
            t0 = time.monotonic()
            self.runner.policy = self.policy
            self.runner.sampling = SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p,
                                                  max_new_tokens=self.cfg.max_new_tokens, stop=self._stop)
            requests = self._train_requests(f"rl{it}", self._draw_seeds(cfg.groups_per_iter), cfg.group_size)
            self.reporter.phase(f"RL {it}/{cfg.iterations}: rollouts (v{self.version})", len(requests))
            trajs = await self._run_all(requests, "rl")
            t1 = time.monotonic()
            # An agent-caused invalid (the agent's code hung the tests, exited, skipped them all) is recorded under
            # the episode's own trainable status with reward 0 and stays in: a failure, not a free pass. Only the
            # grader's invalids (status ``invalid``) are dropped, and counted.
            fresh = [t for t in trajs if t.trainable and trainer.version - t.policy_version <= cfg.max_lag]
            graded_invalid = sum(t.status is Status.INVALID for t in trajs)
            agent_invalid = sum(bool(t.verifier.get("agent_invalid")) for t in fresh)
            groups: dict[str, list[Trajectory]] = defaultdict(list)
            for t in fresh:
                groups[t.verifier.get("group_id", "")].append(t)
            items = items_from_groups([tuple(g) for g in groups.values() if len(g) >= 2], cfg.advantage)
            # A sample longer than one micro-batch (a model looping to the turn limit) is not trained on, and counted.
            overlong = sum(len(i) > MAX_TRAIN_TOKENS for i in items)
            items = [i for i in items if i.num_loss_tokens > 0 and len(i) <= MAX_TRAIN_TOKENS]
            row: dict[str, float] = {"iteration": it, **trajectory_splits(trajs),
                                    "dropped_stale": len(trajs) - len(fresh),
                                    "dropped_invalid": graded_invalid, "agent_invalid": agent_invalid,
                                    "dropped_overlong": overlong}
            if items and any(i.advantage != 0 for i in items):
                self.rng.shuffle(items)
                chunk = -(-len(items) // cfg.updates_per_iter)
                for u in range(cfg.updates_per_iter):
                    part = items[u * chunk : (u + 1) * chunk]
                    if part:
                        m = await asyncio.to_thread(trainer.step, part, trajectories=trajs)
                row |= {k: v for k, v in m.as_dict().items() if "/" not in k}
            t2 = time.monotonic()
            t_roll, t_learn = t_roll + (t1 - t0), t_learn + (t2 - t1)
            row |= {"version": self.version, "rollout_s": t1 - t0, "learner_s": t2 - t1}
            self.history.rl.append(row)
            self.store.log_metrics(self.run_id, {f"rl/{k}": float(v) for k, v in row.items()}, step=it, tags={"phase": "rl"})
            self.reporter.log(f"RL {it}: pass {row['pass_rate']:.2f} reward {row['reward']:.2f} "
                              f"entropy {row.get('entropy', float('nan')):.3f} v{self.version}")
            if self.cfg.eval.every and it % self.cfg.eval.every == 0 and it != cfg.iterations:
                await self.evaluate(len(self.history.evals), it)
        self.history.timings |= {"rl_rollout_s": t_roll, "rl_learner_s": t_learn}

    async def run(self) -> dict[str, Any]:
        t0 = time.monotonic()
        try:
            await self.warm_start()
            first = await self.evaluate(0, 0)
            await self.rl()
            last = await self.evaluate(len(self.history.evals), self.cfg.rl.iterations)
        finally:
            self.runner.close()
            close = getattr(self.backend, "close", None)
            if callable(close):
                close()
        self.history.timings["total_s"] = time.monotonic() - t0
        return self.summary(first, last)

    def summary(self, first: EvalResult, last: EvalResult) -> dict[str, Any]:
        return {
            "run_id": self.run_id, "config": self.cfg.run_id, "tasks": self.task_ids,
            "eval_seeds": list(self.cfg.eval.seeds), "eval_temperature": self.cfg.eval.temperature,
            "pass_rate_after_warm_start": first.pass_rate, "pass_rate_after_rl": last.pass_rate,
            "improvement_points": round(100 * (last.pass_rate - first.pass_rate), 1),
            "pass_rate_greedy_after_warm_start": first.greedy_pass_rate,
            "pass_rate_greedy_after_rl": last.greedy_pass_rate,
            "after_warm_start": {"by_harness": first.by_harness, "by_effort": first.by_effort, "n": first.n},
            "after_rl": {"by_harness": last.by_harness, "by_effort": last.by_effort, "n": last.n},
            "evals": [vars(e) for e in self.history.evals],
            "final_version": self.version, "rollout": "in-process EpisodeRunner (see learner/loop.py)",
            "timings_s": {k: round(v, 1) for k, v in self.history.timings.items()},
            "store": self.store.url,
        }


def _fmt(d: dict[str, float]) -> str:
    return "{" + ", ".join(f"{k}: {v:.2f}" for k, v in d.items()) + "}"
