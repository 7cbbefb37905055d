"""The sharded learner group: one Ray actor per device, FSDP2 over them, driven like a ``Trainer``.

>>> group = LearnerGroup(model, LossConfig.dapo(), TrainerConfig(lr=1e-5, world_size=2))   # doctest: +SKIP
>>> metrics = group.step(items)            # the same StepMetrics as Trainer.step     # doctest: +SKIP
>>> model.lm.load_state_dict(group.state_dict())   # full weights, gathered layer by layer  # doctest: +SKIP
>>> group.save("ckpt"); group.close()                                                  # doctest: +SKIP

Start-up: a placement group of ``world_size`` bundles (one device each: a GPU,
or a CPU for CPU ranks), packed onto as few nodes as possible; rank 0 is
created first and publishes its address and a free port through Ray; every
rank joins the process group there (gloo on CPU, NCCL on GPU) and builds the
model from its config; rank 0 alone receives the weights (``model``'s, through
the object store) and they reach the others by broadcast
(``learner.distributed``). Each rank then holds a ``ShardedTrainer``.

Failure: every call waits on all ranks at once and fails on the first rank
that fails (a dead actor, a collective timed out after
``trainer.distributed_timeout_s``), with ``LearnerGroupError`` naming the rank;
the group then stops every rank, so nothing is left hanging in a collective.
Resume: a new group ``load``s the last checkpoint (``ShardedTrainer.save``),
at the same world size or another.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from learner.errors import LearnerConfigError, LearnerGroupError
from learner.metrics import trajectory_splits
from learner.model import PolicyModel
from learner.publish import WeightPublisher, from_shareable, to_shareable
from learner.trainer import TrainerState
from learner.types import LossConfig, StepMetrics, TrainerConfig, TrainItem
from rollout.types import Trajectory

__all__ = ["LearnerGroup", "LearnerGroupError", "LearnerRank"]


class LearnerRank:
    """One rank (a Ray actor): a process group member holding one ``ShardedTrainer``."""

    def __init__(self, rank: int, world_size: int, device_type: str, threads: int | None) -> None:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # one "Writing model shards" bar per save, per rank, in the driver's log
        if threads is not None:
            torch.set_num_threads(threads)
        self.rank, self.world_size, self.device_type = rank, world_size, device_type
        self.trainer: Any = None

    def address(self) -> tuple[str, int]:
        from learner.distributed import free_address

        return free_address()

    def setup(
        self, host: str, port: int, config: Any, attn: str | None, weights: dict[str, Any] | None,
        loss_cfg: LossConfig, cfg: TrainerConfig, publisher: WeightPublisher | None, publishes: bool,
        ref_weights: dict[str, Any] | None, with_ref: bool,
    ) -> int:
        from learner.distributed import broadcast_weights, init_distributed, shard_model
        from learner.sharded_trainer import ShardedTrainer

        mesh = init_distributed(self.rank, self.world_size, host, port, device_type=self.device_type,
                                timeout_s=cfg.distributed_timeout_s)
        device = torch.device("cuda", 0) if self.device_type == "cuda" else torch.device("cpu")
        mixed = self.device_type == "cuda" and cfg.bf16 is not False

        def build(state: dict[str, Any] | None, trainable: bool) -> PolicyModel:
            kwargs: dict[str, Any] = {"attn_implementation": attn} if attn else {}
            model = PolicyModel.from_config(config, **kwargs).to(device)
            shard_model(model, mesh, mixed_precision=mixed, compile_layers=trainable and cfg.compile_layers,
                        activation_checkpointing=trainable and cfg.activation_checkpointing)
            broadcast_weights(model, from_shareable(state) if state is not None else None)
            if not trainable:
                model.requires_grad_(False)
            return model

        model = build(weights, True)
        ref = build(ref_weights, False) if with_ref else None
        self.trainer = ShardedTrainer(model, loss_cfg, cfg, publisher=publisher, publishes=publishes, ref_model=ref)
        return os.getpid()

    def step(self, items: Sequence[TrainItem], data_position: int | None) -> StepMetrics:
        return self.trainer.step(items, data_position=data_position)

    def save(self, path: str) -> str:
        return str(self.trainer.save(path))

    def load(self, path: str) -> TrainerState:
        self.trainer.load(path)
        return self.trainer.state

    def publish(self) -> str | None:
        return self.trainer.publish()

    def carry_moments(self, optimizer_state: dict[str, Any] | None) -> None:
        self.trainer.carry_moments(optimizer_state)

    def state_dict(self) -> dict[str, Any] | None:
        state = self.trainer.full_state_dict()
        return to_shareable(state) if state is not None else None

    def grads(self) -> dict[str, Any] | None:
        grads = self.trainer.full_grads()
        return to_shareable(grads) if grads is not None else None

    def close(self) -> None:
        from learner.distributed import teardown

        teardown()


def ensure_ray(num_cpus: int) -> bool:
    """Connect to the job's cluster (``RAY_ADDRESS``) or start an embedded one; True when this call started it."""
    import ray

    if ray.is_initialized():
        return False
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address="auto", log_to_driver=True)
    else:
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=True)
    return True


class LearnerGroup:
    """``trainer.world_size`` FSDP2 ranks on Ray, with ``Trainer``'s interface: step, save, load, publish.

    ``model``: the weights to start from (rank 0 gets them; the group never
    changes ``model``: read the trained weights with ``state_dict``).
    ``device``: ``cpu`` (CPU ranks, gloo) or ``cuda`` (one GPU per rank, NCCL).
    ``publisher``: runs on rank 0 after every ``publish_every`` steps (it is
    pickled there). ``threads``: torch threads per CPU rank.
    """

    def __init__(
        self, model: PolicyModel, loss_cfg: LossConfig, cfg: TrainerConfig, *, device: str | torch.device = "cpu",
        publisher: WeightPublisher | None = None, ref_model: PolicyModel | None = None, threads: int | None = None,
    ) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        world = cfg.world_size or 1
        device_type = torch.device(device).type
        if device_type not in ("cpu", "cuda"):
            raise LearnerConfigError(f"model.device: a sharded learner runs on cpu or cuda ranks, got {device!r}")
        self.cfg, self.loss_cfg, self.world_size = cfg, loss_cfg, world
        self.state = TrainerState()
        self.last_published: str | None = None
        self._started_ray = ensure_ray(num_cpus=world)
        self._actors: list[Any] = []
        self._pg: Any = None
        unit = "GPU" if device_type == "cuda" else "CPU"
        have = float(ray.cluster_resources().get(unit, 0.0))
        if have < world:
            self.close()
            raise LearnerConfigError(f"trainer.world_size: {world} ranks need {world} {unit}s, but the Ray cluster "
                                     f"has {have:g}")
        bundle = {"CPU": 1.0, "GPU": 1.0} if unit == "GPU" else {"CPU": 1.0}
        # PACK: as few nodes as possible, so ranks that can share a node's fast links do
        self._pg = placement_group([dict(bundle) for _ in range(world)], strategy="PACK")
        try:
            ray.get(self._pg.ready(), timeout=cfg.distributed_timeout_s)
        except ray.exceptions.GetTimeoutError:
            self.close()
            raise LearnerConfigError(
                f"trainer.world_size: no room for {world} bundles of {bundle} within trainer.distributed_timeout_s="
                f"{cfg.distributed_timeout_s:g}s (cluster: {ray.cluster_resources()})"
            ) from None
        remote = ray.remote(LearnerRank)
        for rank in range(world):
            strategy = PlacementGroupSchedulingStrategy(self._pg, placement_group_bundle_index=rank)
            self._actors.append(remote.options(
                num_cpus=1, num_gpus=1 if unit == "GPU" else 0, scheduling_strategy=strategy, max_restarts=0,
            ).remote(rank, world, device_type, threads))
        host, port = self._all([self._actors[0].address.remote()], "rendezvous address")[0]
        config = model.lm.config
        attn = getattr(config, "_attn_implementation", None)
        weights = ray.put(to_shareable(model.lm.state_dict()))
        ref = ray.put(to_shareable(ref_model.lm.state_dict())) if ref_model is not None else None
        self.pids = self._all([
            a.setup.remote(host, port, config, attn, weights if r == 0 else None, loss_cfg, cfg,
                           publisher if r == 0 else None, publisher is not None, ref if r == 0 else None,
                           ref_model is not None)
            for r, a in enumerate(self._actors)
        ], "setup", timeout=cfg.distributed_timeout_s + 120.0)
        del weights, ref

    @property
    def actors(self) -> list[Any]:
        return list(self._actors)

    @property
    def version(self) -> int:
        return self.state.step

    def _all(self, refs: list[Any], what: str, timeout: float | None = None) -> list[Any]:
        """Every rank's answer, in rank order; the first failure (or no answer in time) stops the group and raises."""
        import ray

        index = {ref: i for i, ref in enumerate(refs)}
        results: list[Any] = [None] * len(refs)
        pending = list(refs)
        deadline = None if timeout is None else time.monotonic() + timeout
        while pending:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            ready, pending = ray.wait(pending, num_returns=1, timeout=left)
            if not ready:
                ranks = sorted(index[r] for r in pending)
                self.close()
                raise LearnerGroupError(f"learner group: {what}: rank(s) {ranks} gave no answer within {timeout:g}s "
                                        "(trainer.distributed_timeout_s); the group is stopped")
            ref = ready[0]
            rank = index[ref]
            try:
                results[rank] = ray.get(ref)
            except ray.exceptions.RayActorError as exc:
                self.close()
                raise LearnerGroupError(
                    f"learner group: {what}: rank {rank} of {self.world_size} died ({type(exc).__name__}); the group "
                    "is stopped: start a new one and load the last checkpoint", rank) from exc
            except ray.exceptions.RayTaskError as exc:
                self.close()
                cause = exc.cause if getattr(exc, "cause", None) is not None else exc
                if isinstance(cause, LearnerConfigError):
                    raise cause from None
                first = str(cause).strip().splitlines()
                raise LearnerGroupError(
                    f"learner group: {what}: rank {rank} of {self.world_size} failed: {type(cause).__name__}: "
                    f"{first[0] if first else ''}; the group is stopped", rank) from exc
        return results

    def _call(self, method: str, *args: Any, timeout: float | None = None) -> list[Any]:
        if not self._actors:
            raise LearnerGroupError("learner group: it is stopped (a rank failed, or close() was called)")
        return self._all([getattr(a, method).remote(*args) for a in self._actors], method, timeout)

    def step(
        self, items: Sequence[TrainItem], *, trajectories: Sequence[Trajectory] = (), data_position: int | None = None,
    ) -> StepMetrics:
        """One optimizer step over ``items`` on every rank (``Trainer.step``'s contract and metrics)."""
        import ray

        ref = ray.put(list(items))
        metrics = self._call("step", ref, data_position)[0]
        self.state = TrainerState(step=metrics.step, data_position=self.state.data_position + len(items)
                                  if data_position is None else data_position)
        if trajectories:
            metrics = dataclasses.replace(metrics, splits=trajectory_splits(trajectories))
        return metrics

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The full weights (Hugging Face keys, CPU), gathered layer by layer on every rank, from rank 0."""
        shared = self._call("state_dict", timeout=self.cfg.distributed_timeout_s)[0]
        return {k: v.clone() for k, v in from_shareable(shared).items()}

    def grads(self) -> dict[str, torch.Tensor]:
        """The last step's full gradients by parameter name (for checks)."""
        return dict(from_shareable(self._call("grads", timeout=self.cfg.distributed_timeout_s)[0]))

    def carry_moments(self, optimizer: torch.optim.Optimizer, model: PolicyModel) -> None:
        """Start the ranks' AdamW from ``optimizer``'s moments (built over ``model.parameters()``, e.g. the warm
        start's), at the trainer's learning rate: ``learner.loop.carry_moments`` for the sharded learner."""
        import ray

        names = [f"{n}" for n, _ in model.named_parameters()]
        full = optimizer.state_dict()
        state = {
            "state": {names[i]: {k: v.detach().cpu() if torch.is_tensor(v) else v for k, v in st.items()}
                      for i, st in full["state"].items()},
            "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in full["param_groups"]],
        }
        ref = ray.put(state)
        self._all([a.carry_moments.remote(ref if r == 0 else None) for r, a in enumerate(self._actors)],
                  "carry_moments", timeout=self.cfg.distributed_timeout_s)

    def publish(self) -> str | None:
        self.last_published = self._call("publish", timeout=self.cfg.distributed_timeout_s)[0]
        return self.last_published

    def save(self, path: str | os.PathLike[str]) -> Path:
        """DCP shards, the Hugging Face export, scheduler, step and RNG under ``path`` (``ShardedTrainer.save``)."""
        return Path(self._call("save", str(Path(path).resolve()), timeout=self.cfg.distributed_timeout_s)[0])

    def load(self, path: str | os.PathLike[str]) -> None:
        self.state = self._call("load", str(Path(path).resolve()), timeout=self.cfg.distributed_timeout_s)[0]

    def close(self) -> None:
        """Stop every rank and free the placement group (idempotent)."""
        import ray

        actors, self._actors = self._actors, []
        for a in actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        if self._pg is not None:
            try:
                from ray.util.placement_group import remove_placement_group

                remove_placement_group(self._pg)
            except Exception:  # noqa: BLE001 - already removed
                pass
            self._pg = None
        if self._started_ray:
            self._started_ray = False
            ray.shutdown()

    def __enter__(self) -> LearnerGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
