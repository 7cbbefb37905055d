"""``Trainer`` on one rank of an FSDP2-sharded group: the same step, split across ranks by micro-batches.

Every rank packs the step's items exactly as the single-process trainer does
(``learner.packing``, deterministic), then runs micro-batches ``rank, rank + W,
rank + 2W ...``; a rank with fewer than the others runs a stand-in (its loss
times 0) so every rank takes part in the same collectives. The loss keeps the
*whole* step's normalisers, so the sum of every rank's gradients is the
single-process gradient; FSDP averages over the W ranks, hence each backward
is of ``W x loss``. Gradients are reduced once per step (on the last
micro-batch), clipped by the global norm over every shard, and AdamW (fused
where the device has it) steps on the shards.

Checkpoints (``save`` / ``load``, every rank calls them): ``dcp/`` (torch
distributed checkpoint of the model and optimizer shards: saved at world size
N, loadable at M), ``model/`` (the full weights as a Hugging Face directory,
rank 0, what ``from_pretrained`` and the inference servers load), the
scheduler, step, data position and every rank's RNG states.
"""

from __future__ import annotations

import concurrent.futures
import copy
import json
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from learner.distributed import (
    clip_grad_norm, full_grads, full_state_dict, local_optimizer_step, reshards_after_forward,
)
from learner.errors import CheckpointNotFound, DistributedError, LearnerConfigError
from learner.model import PolicyModel
from learner.publish import WeightPublisher
from learner.trainer import CONFIG_FILE, STATE_FILE, Trainer, TrainerState, rng_state, set_rng_state
from learner.types import LossConfig, TrainBatch, TrainerConfig

__all__ = ["DCP_DIR", "ShardedTrainer"]

DCP_DIR = "dcp"


class ShardedTrainer(Trainer):
    """The trainer of one rank; ``model`` is already sharded (``learner.distributed.shard_model``) and loaded.

    ``publisher`` is called on rank 0 only, with a CPU copy of the full weights
    gathered from every rank (``publish_timeout_s`` bounds it); the other ranks
    pass ``publishes=True`` so they join the gather.

    ``local_optimizer``: clip and step AdamW on each rank's local shards
    (``learner.distributed.clip_grad_norm`` / ``local_optimizer_step``: the same
    arithmetic without DTensor's dispatch per operation; False: through DTensor).
    ``keep_gathered``: keep every layer's gathered parameters from one
    micro-batch's backward to the next forward, resharding after the step's
    last backward only; None: when the layers are not resharded after forward
    (world size 1 by default), where it costs no memory.
    """

    def __init__(
        self, model: PolicyModel, loss_cfg: LossConfig, cfg: TrainerConfig | None = None, *,
        publisher: WeightPublisher | None = None, publishes: bool = False, ref_model: PolicyModel | None = None,
        local_optimizer: bool = True, keep_gathered: bool | None = None,
    ) -> None:
        if cfg is not None and cfg.prefix_sharing:
            raise LearnerConfigError("trainer.prefix_sharing: the sharded learner (trainer.world_size) does not share "
                                     "prefixes yet; turn prefix_sharing off or use the single-process Trainer")
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.local_optimizer = local_optimizer
        self.keep_gathered = not reshards_after_forward(model) if keep_gathered is None else keep_gathered
        self._sink = publisher if self.rank == 0 else None
        self._host: PolicyModel | None = None
        super().__init__(model, loss_cfg, cfg, publisher=publisher if publisher is not None else
                         (_Gather() if publishes else None), ref_model=ref_model)

    # ------------------------------------------------------------ the step's hooks

    def _local_micro_batches(self, micro: list[TrainBatch]) -> list[tuple[TrainBatch, bool]]:
        mine = [(mb, True) for mb in micro[self.rank::self.world_size]]
        rounds = -(-len(micro) // self.world_size)
        return mine + [(micro[0], False)] * (rounds - len(mine))

    def _backward(self, loss: torch.Tensor, index: int, count: int, counts: bool) -> None:
        last = index == count - 1
        self.model.set_requires_gradient_sync(last)  # type: ignore[operator]
        if self.keep_gathered:  # gathered until the step's last backward: the weights do not change before it
            self.model.set_reshard_after_backward(last)  # type: ignore[operator]
        scale = self.world_size if counts else 0.0
        (loss if scale == 1 else loss * scale).backward()  # x 1 is exact: no extra kernel at world size 1

    def _reduce_stats(
        self, acc: dict[str, float], w_min: float, w_max: float
    ) -> tuple[dict[str, float], float, float]:
        if self.world_size == 1:  # nothing to add: skip the two collectives and the device round trip
            return acc, w_min, w_max
        keys = sorted(acc)
        sums = torch.tensor([acc[k] for k in keys], dtype=torch.float64)
        ext = torch.tensor([w_min, -w_max], dtype=torch.float64)
        if self.device.type == "cuda":
            sums, ext = sums.to(self.device), ext.to(self.device)
        dist.all_reduce(sums, op=dist.ReduceOp.SUM)
        dist.all_reduce(ext, op=dist.ReduceOp.MIN)
        return dict(zip(keys, sums.tolist())), float(ext[0]), -float(ext[1])

    def _clip_grad_norm(self, max_norm: float) -> float:
        return clip_grad_norm(self.model.parameters(), max_norm, local=self.local_optimizer)

    def _optimizer_step(self) -> None:
        if not (self.local_optimizer and local_optimizer_step(self.optimizer)):
            self.optimizer.step()  # the first step (creates the state as DTensors), or local_optimizer=False

    def carry_moments(self, optimizer_state: dict[str, Any] | None) -> None:
        """Start AdamW from another optimizer's full state (rank 0 passes it, keyed by parameter name; the others
        None), at this trainer's learning rate and the schedule's current point (``learner.loop.carry_moments``)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        from learner.trainer import lr_factor

        set_optimizer_state_dict(self.model, self.optimizer, optimizer_state or {},
                                 options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
        lr = self.cfg.lr
        factor = lr_factor(self.cfg, self.scheduler.last_epoch)
        for group in self.optimizer.param_groups:
            group["initial_lr"] = lr
            group["lr"] = lr * factor
        self.scheduler.base_lrs = [lr for _ in self.optimizer.param_groups]

    # ------------------------------------------------------------ weights out

    def full_state_dict(self, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor] | None:
        """Every rank calls it; rank 0 gets the full weights (CPU), the others None."""
        return full_state_dict(self.model, dtype=dtype)

    def full_grads(self) -> dict[str, torch.Tensor] | None:
        return full_grads(self.model)

    def host_model(self, state: dict[str, torch.Tensor]) -> PolicyModel:
        """Rank 0's CPU copy of the model holding ``state`` (built once, reused): what is saved and published."""
        if self._host is None:
            config = copy.deepcopy(self.model.lm.config)
            self._host = PolicyModel.from_config(config)
        self._host.lm.load_state_dict(state)
        return self._host

    def publish(self) -> str | None:
        """Gather first on every rank, then (rank 0) hand the weights to the publisher, within the timeout."""
        if self.publisher is None:
            return None
        state = self.full_state_dict()
        if self.rank != 0 or self._sink is None or state is None:
            return None
        host = self.host_model(state)
        timeout = self.cfg.distributed_timeout_s
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        try:
            self.last_published = pool.submit(self._sink, host, self.version).result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            raise DistributedError(
                f"publish: version {self.version} was not published within trainer.distributed_timeout_s={timeout:g}s"
            ) from None
        finally:
            pool.shutdown(wait=False)
        return self.last_published

    # ------------------------------------------------------------ checkpoints

    def save(self, path: str | Path) -> Path:  # type: ignore[override]
        """Every rank calls it. ``path.tmp`` is written, then renamed by rank 0 (no half checkpoint)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        final = Path(path)
        tmp = final.with_name(final.name + ".tmp")
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            (tmp / "rng").mkdir(parents=True)
        dist.barrier()
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp / DCP_DIR))
        torch.save(rng_state(), tmp / "rng" / f"rank{self.rank}.pt")
        state = self.full_state_dict()
        if self.rank == 0:
            assert state is not None  # noqa: S101 - rank 0 gathers
            self.host_model(state).save(tmp / "model")
            torch.save({"scheduler": self.scheduler.state_dict(), "state": vars(self.state).copy(),
                        "rng": rng_state(), "world_size": self.world_size}, tmp / STATE_FILE)
            configs = {"trainer": self.cfg.model_dump(mode="json"), "loss": self.loss_cfg.model_dump(mode="json")}
            (tmp / CONFIG_FILE).write_text(json.dumps(configs, indent=2))
        dist.barrier()
        if self.rank == 0:
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)
        dist.barrier()
        return final

    def load(self, path: str | Path) -> None:  # type: ignore[override]
        """Restore shards, optimizer, scheduler, step, data position and RNG from ``save`` at any world size."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        where = Path(path)
        if not (where / DCP_DIR / ".metadata").is_file() or not (where / STATE_FILE).is_file():
            raise CheckpointNotFound(
                f"ShardedTrainer.load: {str(where)!r} has no {DCP_DIR}/.metadata and {STATE_FILE}; expected a "
                "sharded learner's checkpoint (ShardedTrainer.save)"
            )
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        state: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=str(where / DCP_DIR))
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        blob = torch.load(where / STATE_FILE, map_location="cpu", weights_only=True)
        self.scheduler.load_state_dict(blob["scheduler"])
        self.state = TrainerState(**blob["state"])
        own = where / "rng" / f"rank{self.rank}.pt"
        set_rng_state(torch.load(own, weights_only=True) if own.is_file() else blob["rng"])


class _Gather:
    """The publisher of ranks other than 0: they only take part in the gather."""

    def __call__(self, model: PolicyModel, version: int) -> str:  # pragma: no cover - never called
        return ""

