"""Rollout workers: an async Ray actor per Docker daemon slot, and the driver-side client that survives its death.

``RolloutWorker`` owns a sandbox backend and an ``EpisodeRunner`` (whose warm
pools therefore live on the worker's node, next to their Docker daemon) and
runs many episodes at once on one event loop: an episode spends nearly all its
time waiting on a container or a model server, so concurrency inside one
process is what fills a node, not more processes. It is placed by a custom
resource (``RayConfig.worker_resource``, e.g. ``{"docker_daemon": 1}``) that
only nodes with a Docker daemon declare.

Weights: ``set_policy_version(version, weights)`` only records the new version;
it is applied when the next episode starts, so an episode's first turn never
races a swap. Episodes already running see the new weights from their next
turn on, which the runner records per turn (``Turn.policy_version``).
``weights`` is a state dict, or ``[ObjectRef]`` of one: the learner ``ray.put``s
each version once and every worker fetches it from the object store (the list
keeps Ray from fetching it at call time, so a broadcast returns at once and a
worker pays the fetch only before its next episode).

Training workers (``WorkerSpec.train_model`` set) hold two policies: ``train``,
the learner's model architecture built from its config (weights arrive as
version 0 before any episode), and ``oracle``, the scripted policy of the warm
start; ``EpisodeRequest.policy`` picks one. ``pause()`` / ``resume()`` hold
episodes at their next turn boundary while the learner trains (``rollout.gate``).

``RayWorkerClient`` is what the scheduler talks to. When the actor dies under
an episode (``ray.kill``, OOM, node lost: ``RayActorError``) it waits for Ray's
restart (``max_restarts``) or, restarts spent, creates a new actor, then raises
``WorkerLost`` so the scheduler reruns the episode. The new actor's pool sweeps
the containers the dead one left (they carry its pid, see ``sandboxes.labels``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import Any, Literal

from rollout.attempt import EpisodeRequest, SamplingParams
from rollout.config import PolicyConfig, RolloutConfig, SamplingConfig
from rollout.episode import EpisodeRunner
from rollout.errors import UnsupportedPolicy, WorkerClosed, WorkerLost
from rollout.gate import TurnGate
from rollout.policy.scripted import ScriptedPolicy
from rollout.policy.types import Policy, VersionedPolicy, WeightSwappingPolicy
from rollout.types import Trajectory
from sandboxes.backends import make_backend

log = logging.getLogger(__name__)

__all__ = [
    "RayWorkerClient", "RolloutWorker", "WorkerSpec", "apply_version", "build_policy", "build_train_policy", "start_worker",
]


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs to build itself on its node. Plain data: it pickles."""

    run_id: str
    policy: PolicyConfig
    sampling: SamplingConfig
    backend: Literal["docker", "local"] = "docker"
    pool_size: int = 2
    sandbox_retries: int = 1
    grading: Literal["in_place", "fork"] = "in_place"
    #: training workers: the learner model's Hugging Face config (``config.to_dict()``); None for rollout jobs
    train_model: dict[str, Any] | None = None
    #: the tokenizer of ``train_model``: a local directory, or None for the project tokenizer
    tokenizer: str | None = None
    #: torch threads of the worker process (None: torch's default, every core)
    torch_threads: int | None = None

    @classmethod
    def from_config(cls, cfg: RolloutConfig) -> WorkerSpec:
        return cls(
            cfg.run_id, cfg.policy, cfg.sampling, cfg.backend, cfg.pool_size, cfg.retries.sandbox_acquire, cfg.grading
        )


def apply_version(policy: Any, version: int, weights: Any = None) -> Any:
    """The policy to run the next episodes with, at weights ``version``.

    A model policy swaps its weights in place (``set_weights``, between its own
    turns) and keeps its identity; without weights its version stays, since a
    number alone must not relabel old weights as new. A policy with no weights
    (the scripted oracle) is replaced by one reporting the new version, so
    episodes already running keep the one they were bound to.
    """
    if isinstance(policy, WeightSwappingPolicy):
        if weights is not None:
            policy.set_weights(weights, version)
        return policy
    if isinstance(policy, VersionedPolicy):
        policy.set_version(version)
        return policy
    if isinstance(policy, ScriptedPolicy):
        return ScriptedPolicy(version=version, styled=policy.styled)
    raise UnsupportedPolicy(f"policy: expected an object with set_weights or set_version, got {type(policy).__name__}")


def build_policy(cfg: PolicyConfig) -> tuple[Policy, Any]:
    """The worker's policy and tokenizer (None when the runner needs none). Imports lazily: a scripted
    run never imports torch."""
    if cfg.kind == "scripted":
        return ScriptedPolicy(), None
    if cfg.kind == "hf":
        from rollout.policy.hf import HFPolicy

        policy = HFPolicy(str(cfg.checkpoint), device=cfg.device)
        return policy, policy.tokenizer
    from rollout.policy.openai_policy import OpenAIPolicy

    assert cfg.url is not None and cfg.model is not None  # PolicyConfig validates kind "openai" has both
    key = os.environ.get(cfg.api_key_env, "EMPTY")
    return OpenAIPolicy(cfg.url, cfg.model, api_key=key, timeout_s=cfg.timeout_s), None


def build_train_policy(model_config: dict[str, Any], tokenizer_dir: str | None) -> tuple[Policy, Any]:
    """The learner's architecture with fresh weights (the real ones arrive as version 0) and its tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from rollout.policy.hf import HFPolicy

    if tokenizer_dir:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    else:
        from rollout.tokenizer import build_tokenizer

        tokenizer = build_tokenizer()
    data = dict(model_config)
    config = AutoConfig.for_model(data.pop("model_type"), **data)
    with torch.device("cpu"):
        model = AutoModelForCausalLM.from_config(config)
    return HFPolicy(model, tokenizer, name="train-policy", version=-1), tokenizer


class RolloutWorker:
    """The body of the worker actor (``start_worker`` wraps it with ``ray.remote``).

    Usable without Ray too (tests, a debugger): ``await RolloutWorker(spec).run(request)``.
    """

    def __init__(self, spec: WorkerSpec, index: int = 0) -> None:
        self.spec = spec
        self.index = index
        if spec.torch_threads:
            import torch

            torch.set_num_threads(spec.torch_threads)
        self.backend = make_backend(spec.backend, run_id=spec.run_id)
        policies: dict[str, Policy] = {}
        if spec.train_model is not None:
            policy, tokenizer = build_train_policy(spec.train_model, spec.tokenizer)
            policies = {"train": policy, "oracle": ScriptedPolicy(), "oracle_effort": ScriptedPolicy(styled=True)}
        else:
            policy, tokenizer = build_policy(spec.policy)
        s = spec.sampling
        self.gate = TurnGate()
        self.runner = EpisodeRunner(
            policy,
            backend=self.backend,
            tokenizer=tokenizer,
            sampling=SamplingParams(temperature=s.temperature, top_p=s.top_p, max_new_tokens=s.max_new_tokens),
            pool_size=spec.pool_size,
            store=None,  # the scheduler writes, after the staleness check
            sandbox_retries=spec.sandbox_retries,
            grade_in_place=spec.grading == "in_place",
            policies=policies,
            gate=self.gate,
        )
        self._pending: tuple[int, Any] | None = None
        self._identity: dict[str, Any] | None = None
        self.running = 0
        self.finished = 0
        self._closed = False

    async def run(self, request: EpisodeRequest) -> Trajectory:
        """One episode; never raises for an episode failure (the trajectory's status says it)."""
        if self._closed:
            raise WorkerClosed(f"worker {self.index}: closed, cannot run episode {request.episode_id}")
        if self._pending is not None:  # between episodes: the new weights start with this one
            version, weights = self._pending
            self._pending = None
            if isinstance(weights, list) and weights:  # [ObjectRef]: fetched from the object store now
                weights = await weights[0]
            self.runner.policy = await asyncio.to_thread(apply_version, self.runner.policy, version, weights)
            if "train" in self.runner.policies:
                self.runner.policies["train"] = self.runner.policy
        self.running += 1
        try:
            traj = await self.runner.run(request)
        finally:
            self.running -= 1
            self.finished += 1
        # where it ran, for the record (a node's episodes can be told apart after the fact)
        return dataclasses.replace(traj, verifier={**dict(traj.verifier), "worker": self._where()})

    def _where(self) -> dict[str, Any]:
        if self._identity is None:
            info = self.info()
            self._identity = {"index": self.index, "pid": info["pid"], "host": info["host"], "node_id": info["node_id"]}
        return self._identity

    async def warm(self, task_ids: list[str], per_image: int) -> dict[str, Any]:
        """Start ``per_image`` warm sandboxes of every image the run's tasks use; returns what it did."""
        t0 = time.monotonic()
        loop = asyncio.get_running_loop()
        images = await loop.run_in_executor(None, self.runner.warm, list(task_ids), per_image)
        return {"index": self.index, "images": images, "per_image": per_image, "seconds": time.monotonic() - t0}

    def set_policy_version(self, version: int, weights: Any = None) -> None:
        """Take weights ``version`` (and the weights, for a model policy) before the next episode."""
        if version < self.runner.policy.version or (self._pending is not None and version < self._pending[0]):
            return  # a late broadcast of an older version must not roll the worker back
        self._pending = (version, weights)

    async def load_now(self) -> int:
        """Apply pending weights at once (the first version, before any episode); returns the version held."""
        if self._pending is not None:
            version, weights = self._pending
            self._pending = None
            if isinstance(weights, list) and weights:
                weights = await weights[0]
            self.runner.policy = await asyncio.to_thread(apply_version, self.runner.policy, version, weights)
            if "train" in self.runner.policies:
                self.runner.policies["train"] = self.runner.policy
        return int(self.runner.policy.version)

    def pause(self) -> None:
        """Hold every episode at its next turn boundary (the learner is training)."""
        self.gate.close()

    def resume(self) -> None:
        self.gate.open()

    def info(self) -> dict[str, Any]:
        """Where the worker lives and what it is doing (also the liveness ping of the client)."""
        node = ""
        try:
            import ray

            if ray.is_initialized():
                node = ray.get_runtime_context().get_node_id()
        except Exception:  # noqa: BLE001 - outside Ray (tests, a debugger)
            node = ""
        return {
            "index": self.index,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "node_id": node,
            "version": self.runner.policy.version,
            "running": self.running,
            "finished": self.finished,
        }

    def close(self) -> None:
        """Release every sandbox (pools and the backend's containers); later ``run`` calls fail."""
        if self._closed:
            return
        self._closed = True
        try:
            self.runner.close()
        finally:
            self.backend.close()


def start_worker(cfg: RolloutConfig, index: int, spec: WorkerSpec | None = None) -> Any:
    """A new ``RolloutWorker`` actor for ``cfg``: async, ``concurrency`` episodes at once, placed by
    ``cfg.ray.worker_resource``, restarted by Ray up to ``retries.worker_restarts`` times. ``spec``
    defaults to ``WorkerSpec.from_config(cfg)`` (the training engine passes its own)."""
    import ray

    options: dict[str, Any] = {
        "max_concurrency": cfg.concurrency + 4,  # + room for info / set_policy_version / close
        "max_restarts": cfg.retries.worker_restarts,
        "max_task_retries": 0,  # the scheduler reruns episodes itself, counted
        "num_cpus": cfg.ray.worker_cpus,
    }
    if cfg.ray.worker_resource:
        options["resources"] = {cfg.ray.worker_resource: 1}
    if cfg.ray.spread:  # one worker per node (per Docker daemon) before two on one
        options["scheduling_strategy"] = "SPREAD"
    actor_cls = ray.remote(RolloutWorker)
    return actor_cls.options(**options).remote(spec or WorkerSpec.from_config(cfg), index)  # type: ignore[attr-defined]


class RayWorkerClient:
    """The scheduler's handle on one worker actor; replaces the actor when it dies.

    ``make`` creates a fresh actor (``lambda: start_worker(cfg, i)``).
    """

    def __init__(self, make: Any, slots: int, *, ping_timeout_s: float = 120.0) -> None:
        self._make = make
        self.actor = make()
        self.slots = slots
        self.generation = 0
        self.restarts = 0
        self.ping_timeout_s = ping_timeout_s
        self._lock: asyncio.Lock | None = None
        self._latest: tuple[int, Any] | None = None  # pushed again to a restarted or new actor

    async def run(self, request: EpisodeRequest) -> Trajectory:
        import ray
        from ray.exceptions import RayActorError

        generation = self.generation
        ref = self.actor.run.remote(request)
        try:
            return await ref
        except asyncio.CancelledError:
            ray.cancel(ref)  # abort the episode on the worker too (its sandbox is released there)
            raise
        except RayActorError as exc:
            await self._recover(generation)
            raise WorkerLost(f"worker died running {request.episode_id}: {type(exc).__name__}") from exc

    async def _recover(self, generation: int) -> None:
        """Once per death (many episodes fail together): wait for Ray's restart, else re-create."""
        import ray
        from ray.exceptions import ActorUnavailableError, RayActorError

        self._lock = self._lock or asyncio.Lock()
        async with self._lock:
            if generation != self.generation:
                return  # another episode of the same death already recovered
            self.generation += 1
            self.restarts += 1
            deadline = asyncio.get_running_loop().time() + self.ping_timeout_s
            while True:
                try:
                    await asyncio.wait_for(self.actor.info.remote(), timeout=self.ping_timeout_s)
                    await self._catch_up()
                    return  # Ray restarted it (max_restarts)
                except ActorUnavailableError:
                    if asyncio.get_running_loop().time() > deadline:
                        break
                    await asyncio.sleep(0.5)  # restarting
                except (RayActorError, asyncio.TimeoutError):
                    break  # dead for good
            try:
                ray.kill(self.actor, no_restart=True)
            except Exception as exc:  # already gone
                log.debug("kill of a dead worker: %r", exc)
            self.actor = self._make()
            await self._catch_up()

    async def _catch_up(self) -> None:
        # a restarted actor runs __init__ again, at version 0: give it the learner's latest
        if self._latest is not None:
            await self.set_policy_version(*self._latest)

    async def set_policy_version(self, version: int, weights: Any = None) -> None:
        from ray.exceptions import RayActorError

        self._latest = (version, weights)
        try:
            await self.actor.set_policy_version.remote(version, weights)
        except RayActorError:
            pass  # a dead worker's replacement starts at the version the scheduler dispatches with

    async def info(self) -> dict[str, Any]:
        return await self.actor.info.remote()  # type: ignore[no-any-return]

    async def load_now(self) -> int:
        return await self.actor.load_now.remote()  # type: ignore[no-any-return]

    async def pause(self) -> None:
        await self._quietly(self.actor.pause)

    async def resume(self) -> None:
        await self._quietly(self.actor.resume)

    async def _quietly(self, method: Any) -> None:
        from ray.exceptions import RayActorError

        try:
            await method.remote()
        except RayActorError:
            pass  # dead: its episodes are rerun elsewhere, and a replacement starts with the gate open

    async def warm(self, task_ids: list[str], per_image: int) -> dict[str, Any]:
        return await self.actor.warm.remote(task_ids, per_image)  # type: ignore[no-any-return]

    async def close(self, timeout_s: float = 60.0) -> None:
        """Release the worker's sandboxes, then end the actor."""
        import ray

        try:
            await asyncio.wait_for(self.actor.close.remote(), timeout=timeout_s)
        except Exception as exc:  # dead or stuck: the reaper removes what it left
            log.warning("worker close failed: %r", exc)
        ray.kill(self.actor, no_restart=True)
