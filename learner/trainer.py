"""One optimizer step from a list of samples with advantages, and exact checkpoint / resume.

``Trainer.step(items)`` packs the items into micro-batches
(``learner.packing``), runs forward + backward on each with the loss
normalised by the *whole* step's token / sequence counts (so the gradient does
not depend on the packing), clips the gradient norm, takes one AdamW step and
one LR-schedule step, publishes the weights with the new version number
(``learner.publish``), and returns ``StepMetrics``.

Synchronous by design for now: the proximal policy of the clip ratio is the
current one (one optimizer step per batch of rollouts); staleness of the
rollouts is corrected by the importance weights. The asynchronous mode of the
RL loop feeds the same ``step``.

Exact resume: ``save`` writes the model (``save_pretrained``), the optimizer
and scheduler states, the step and data position the caller tracks, and every
RNG state (python, numpy, torch CPU and CUDA); ``Trainer.resume`` restores all
of it, so "train 4 steps" and "train 2, save, resume in a new object, train 2"
end with bit-identical weights (tested on CPU).
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file

from learner.errors import CheckpointMismatch, CheckpointNotFound, EmptyBatch, LearnerConfigError
from learner.losses import policy_loss
from learner.metrics import trajectory_splits
from learner.model import PolicyModel
from learner.packing import pack
from learner.publish import WeightPublisher
from learner.tree import pack_shared
from learner.types import (
    Aggregation, LossConfig, LossOutput, LossVariant, SharedBatch, StepMetrics, TrainBatch, TrainerConfig, TrainItem,
)
from rollout.types import Trajectory

__all__ = ["CONFIG_FILE", "STATE_FILE", "Trainer", "TrainerState", "lr_factor", "make_deterministic", "rng_state", "set_rng_state"]

STATE_FILE = "trainer_state.pt"
CONFIG_FILE = "trainer_config.json"


def make_deterministic(threads: int | None = None) -> None:
    """Deterministic kernels for this process (``TrainerConfig.deterministic``), and a fixed thread count.

    On CPU, with a fixed number of intra-op threads, PyTorch's reductions are
    already bitwise repeatable; ``use_deterministic_algorithms`` makes an op
    that has no deterministic implementation raise instead of silently varying
    (and picks the deterministic CUDA kernels on a GPU, where it costs speed).
    """
    if threads is not None:
        torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    if torch.cuda.is_available():
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.benchmark = False


def lr_factor(cfg: TrainerConfig, step: int) -> float:
    """LR multiplier after ``step`` scheduler steps: linear warmup, then constant / linear / cosine decay."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant" or cfg.total_steps is None:
        return 1.0
    span = max(cfg.total_steps - cfg.warmup_steps, 1)
    progress = min((step - cfg.warmup_steps) / span, 1.0)
    if cfg.schedule == "linear":
        decay = 1.0 - progress
    else:
        decay = 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * decay


@dataclass
class TrainerState:
    """What a resume must restore besides tensors: steps taken and where the caller's data stream stands."""

    step: int = 0
    data_position: int = 0


def rng_state() -> dict[str, Any]:
    np_state: dict[str, Any] = dict(np.random.get_state(legacy=False))  # type: ignore[arg-type]
    np_state["state"] = {"key": np_state["state"]["key"].tolist(), "pos": int(np_state["state"]["pos"])}
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np_state,
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np_state = dict(state["numpy"])
    np_state["state"] = {"key": np.asarray(np_state["state"]["key"], dtype=np.uint32), "pos": np_state["state"]["pos"]}
    np.random.set_state(np_state)
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _tied_to_loaded(lm: torch.nn.Module, key: str, loaded: set[str]) -> bool:
    """Whether parameter ``key`` shares its storage with a parameter that was loaded (tied embeddings)."""
    params = dict(lm.named_parameters(remove_duplicate=False))
    mine = params.get(key)
    if mine is None:
        return False
    return any(other.data_ptr() == mine.data_ptr() for name, other in params.items() if name in loaded and name != key)


class Trainer:
    """Takes optimizer steps on ``model`` with the one policy-gradient loss.

    >>> trainer = Trainer(PolicyModel.from_config(cfg), LossConfig.dapo(), TrainerConfig(lr=1e-5))  # doctest: +SKIP
    >>> metrics = trainer.step(items_from_groups(store.groups(run, size=8), AdvantageConfig()))  # doctest: +SKIP

    ``ref_model``: a frozen reference for the KL term, used when
    ``loss_cfg.kl_coef > 0`` and the items carry no ``ref_logprobs``.
    """

    def __init__(
        self,
        model: PolicyModel,
        loss_cfg: LossConfig,
        cfg: TrainerConfig | None = None,
        *,
        publisher: WeightPublisher | None = None,
        ref_model: PolicyModel | None = None,
    ) -> None:
        self.model = model
        self.loss_cfg = loss_cfg
        self.cfg = cfg or TrainerConfig()
        self.publisher = publisher
        self.ref_model = ref_model
        self.state = TrainerState()
        self.device = model.device
        if self.cfg.prefix_sharing and loss_cfg.variant is LossVariant.GSPO:
            raise LearnerConfigError("trainer.prefix_sharing: loss.variant gspo's ratio is per sequence, so a shared "
                                     "token cannot stand for its copies; use clip or cispo, or turn prefix_sharing off")
        if self.cfg.deterministic:
            make_deterministic()
        self.bf16 = self.cfg.bf16 if self.cfg.bf16 is not None else self.device.type == "cuda"
        if self.cfg.compile_layers and not model.compiled:
            model.compile_layers()
        self.optimizer = torch.optim.AdamW(
            model.parameters(), lr=self.cfg.lr, betas=self.cfg.betas, eps=self.cfg.adam_eps,
            weight_decay=self.cfg.weight_decay, fused=True if self.cfg.fused_optimizer else None,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, partial(lr_factor, self.cfg))
        self.last_published: str | None = None

    @property
    def version(self) -> int:
        """The weights' version: the number of optimizer steps taken."""
        return self.state.step

    def _autocast(self) -> Any:
        if not self.bf16:
            return nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)

    def _sync(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    # ------------------------------------------------------------ what a sharded trainer replaces

    def _local_micro_batches(self, micro: list[TrainBatch]) -> list[tuple[TrainBatch, bool]]:
        """The micro-batches this process runs, each with whether it counts (one process: all, all counting)."""
        return [(mb, True) for mb in micro]

    def _backward(self, loss: torch.Tensor, index: int, count: int, counts: bool) -> None:
        loss.backward()

    def _reduce_stats(
        self, acc: dict[str, float], w_min: float, w_max: float
    ) -> tuple[dict[str, float], float, float]:
        return acc, w_min, w_max

    def _clip_grad_norm(self, max_norm: float) -> float:
        return float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))

    def _optimizer_step(self) -> None:
        self.optimizer.step()

    def step(
        self,
        items: Sequence[TrainItem],
        *,
        trajectories: Sequence[Trajectory] = (),
        data_position: int | None = None,
    ) -> StepMetrics:
        """One optimizer step over all ``items``; ``trajectories`` only feed the reward / pass-rate splits.

        ``data_position``: where the caller's data stream stands after this
        batch (saved with checkpoints); default: advanced by ``len(items)``.
        """
        if not items:
            raise EmptyBatch("Trainer.step: items: expected at least one TrainItem, got none")
        n_tok = sum(it.num_loss_tokens for it in items)
        n_seq = sum(1 for it in items if it.num_loss_tokens > 0)
        if n_tok == 0:
            raise EmptyBatch(f"Trainer.step: items: the {len(items)} items have no loss tokens (all masked)")
        t_start = self._sync()
        plan = pack_shared(items, self.cfg.micro_batch_tokens) if self.cfg.prefix_sharing else None
        plain = plan.plain if plan is not None else items
        micro = pack(plain, self.cfg.micro_batch_tokens, pad_to_multiple=self.cfg.pad_to_multiple,
                     rows=self.cfg.rows_per_micro_batch) if plain else []
        t_packed = time.perf_counter()

        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        acc = {"loss": 0.0, "pg": 0.0, "kl": 0.0, "clip": 0.0, "w": 0.0, "masked": 0.0, "ent": 0.0}
        w_min, w_max = math.inf, -math.inf
        mine = self._local_micro_batches(micro)
        for k, (mb, counts) in enumerate(mine):
            mb = mb.to(self.device)
            only_BT = mb.loss_mask_BT.bool() if self.cfg.logprobs_at_loss_tokens else None
            with self._autocast():
                logp_BT, ent_BT = self.model.logprobs(
                    mb.input_ids_BT, mb.position_ids_BT, temperature=self.loss_cfg.temperature, with_entropy=True,
                    chunk_tokens=self.cfg.logprob_chunk_tokens, keep_logits=self.cfg.logprob_keep_logits,
                    only_BT=only_BT,
                )
            ref_BT = mb.ref_logp_BT
            if self.loss_cfg.kl_coef > 0 and ref_BT is None:
                ref_BT = self._ref_logprobs(mb.input_ids_BT, mb.position_ids_BT, only_BT)
            out = policy_loss(
                logp_BT, mb.rollout_logp_BT, mb.adv_BT, mb.loss_mask_BT, mb.seg_BT, self.loss_cfg,
                ref_logp_BT=ref_BT, num_tokens=n_tok, num_seqs=n_seq,
            )
            self._backward(out.loss, k, len(mine), counts)
            if not counts:  # a stand-in that keeps a rank's collectives in step with the others (ShardedTrainer)
                continue
            assert ent_BT is not None  # noqa: S101 - asked for with_entropy
            w_min, w_max = _accumulate(acc, out, float((ent_BT * mb.loss_mask_BT).sum()), w_min, w_max)
        for sb in plan.batches if plan is not None else ():
            w_min, w_max = self._shared_micro_batch(sb.to(self.device), n_tok, n_seq, acc, w_min, w_max)
        acc, w_min, w_max = self._reduce_stats(acc, w_min, w_max)
        t_backward = self._sync()

        clip = self.cfg.grad_clip if self.cfg.grad_clip is not None else math.inf
        grad_norm = self._clip_grad_norm(clip)
        lr = float(self.scheduler.get_last_lr()[0])
        self._optimizer_step()
        self.scheduler.step()
        self.state.step += 1
        self.state.data_position = (
            data_position if data_position is not None else self.state.data_position + len(items)
        )
        if self.publisher is not None and self.cfg.publish_every and self.state.step % self.cfg.publish_every == 0:
            self.publish()
        t_end = self._sync()

        lengths = [len(it) for it in items]
        return StepMetrics(
            step=self.state.step, loss=acc["loss"], pg_loss=acc["pg"] / n_tok, kl=acc["kl"] / n_tok,
            clip_frac=acc["clip"] / n_tok, is_weight_mean=acc["w"] / n_tok, is_weight_min=w_min,
            is_weight_max=w_max, is_masked_frac=acc["masked"] / n_tok, entropy=acc["ent"] / n_tok,
            grad_norm=grad_norm, lr=lr, num_samples=len(items), num_tokens=sum(lengths),
            num_loss_tokens=n_tok, num_micro_batches=len(micro) + (len(plan.batches) if plan is not None else 0),
            seq_len_mean=sum(lengths) / len(lengths),
            seq_len_max=max(lengths), response_len_mean=n_tok / len(items),
            pack_s=t_packed - t_start, forward_backward_s=t_backward - t_packed, optimizer_s=t_end - t_backward,
            total_s=t_end - t_start, splits=trajectory_splits(trajectories) if trajectories else {},
            forward_tokens=plan.forward_tokens if plan is not None else sum(lengths),
            shared_fallback_groups=plan.fallback_groups if plan is not None else 0,
        )

    def _shared_micro_batch(
        self, sb: SharedBatch, n_tok: int, n_seq: int, acc: dict[str, float], w_min: float, w_max: float,
    ) -> tuple[float, float]:
        """Forward + backward of one prefix-shared micro-batch; each shared token weighted as all its copies."""
        only_BT = sb.loss_mask_BT.bool() if self.cfg.logprobs_at_loss_tokens else None
        with self._autocast():
            logp_BT, ent_BT = self.model.logprobs_at(
                sb.input_ids_BT, sb.position_ids_BT, sb.pred_BT, sb.allowed_BTT,
                temperature=self.loss_cfg.temperature, with_entropy=True, only_BT=only_BT,
            )
        ref_BT = sb.ref_logp_BT
        if self.loss_cfg.kl_coef > 0 and ref_BT is None:
            if self.ref_model is None:
                raise LearnerConfigError(f"Trainer: ref_model: LossConfig.kl_coef={self.loss_cfg.kl_coef} > 0 needs "
                                         "ref_logprobs on the items or a ref_model, got neither")
            self.ref_model.eval()
            with torch.no_grad(), self._autocast():
                ref_BT, _ = self.ref_model.logprobs_at(sb.input_ids_BT, sb.position_ids_BT, sb.pred_BT,
                                                       sb.allowed_BTT, temperature=self.loss_cfg.temperature,
                                                       only_BT=only_BT)
        agg = self.loss_cfg.aggregation
        if agg is Aggregation.TOKEN_MEAN:
            coef_BT = sb.count_BT / max(n_tok, 1)
        elif agg is Aggregation.SEQ_MEAN_TOKEN_MEAN:
            coef_BT = sb.inv_len_BT / max(n_seq, 1)
        else:
            assert self.loss_cfg.norm_length is not None  # noqa: S101 - LossConfig validates it
            coef_BT = sb.count_BT / (max(n_seq, 1) * self.loss_cfg.norm_length)
        out = policy_loss(
            logp_BT, sb.rollout_logp_BT, sb.adv_BT, sb.loss_mask_BT, torch.zeros_like(sb.input_ids_BT), self.loss_cfg,
            ref_logp_BT=ref_BT, num_tokens=n_tok, num_seqs=n_seq, coef_BT=coef_BT, count_BT=sb.count_BT,
        )
        self._backward(out.loss, 0, 1, True)
        assert ent_BT is not None  # noqa: S101 - asked for with_entropy
        return _accumulate(acc, out, float((ent_BT * sb.loss_mask_BT * sb.count_BT).sum()), w_min, w_max)

    @torch.no_grad()
    def _ref_logprobs(
        self, input_ids_BT: torch.Tensor, position_ids_BT: torch.Tensor, only_BT: torch.Tensor | None
    ) -> torch.Tensor:
        if self.ref_model is None:
            raise LearnerConfigError(
                f"Trainer: ref_model: LossConfig.kl_coef={self.loss_cfg.kl_coef} > 0 needs ref_logprobs on the items "
                "or a ref_model, got neither"
            )
        self.ref_model.eval()
        with self._autocast():
            ref_BT, _ = self.ref_model.logprobs(
                input_ids_BT, position_ids_BT, temperature=self.loss_cfg.temperature,
                chunk_tokens=self.cfg.logprob_chunk_tokens, only_BT=only_BT,
            )
        return ref_BT

    def publish(self) -> str | None:
        """Hand the current weights to the publisher as version ``self.version``; returns where they went."""
        if self.publisher is None:
            return None
        self.last_published = self.publisher(self.model, self.version)
        return self.last_published

    # ------------------------------------------------------------ checkpoints

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Everything ``resume`` needs, written to ``path.tmp`` and renamed (a crash leaves no half checkpoint)."""
        final = Path(path)
        tmp = final.with_name(final.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        self.model.save(tmp / "model")
        torch.save(
            {
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "state": vars(self.state).copy(),
                "rng": rng_state(),
            },
            tmp / STATE_FILE,
        )
        configs = {"trainer": self.cfg.model_dump(mode="json"), "loss": self.loss_cfg.model_dump(mode="json")}
        (tmp / CONFIG_FILE).write_text(json.dumps(configs, indent=2))
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        return final

    def load(self, path: str | os.PathLike[str]) -> None:
        """Restore weights, optimizer, scheduler, step, data position and RNG states from ``save(path)``."""
        where = Path(path)
        if not (where / STATE_FILE).is_file():
            raise CheckpointNotFound(f"Trainer.load: {str(where)!r} has no {STATE_FILE}; expected a Trainer.save dir")
        shards = sorted((where / "model").glob("*.safetensors"))
        if not shards:
            raise CheckpointNotFound(f"Trainer.load: no *.safetensors in {str(where / 'model')!r}")
        expected = set(self.model.lm.state_dict())
        loaded: set[str] = set()
        with torch.no_grad():
            for shard in shards:  # in place, so tied weights stay tied
                part = load_file(str(shard), device=str(self.device))
                unexpected = sorted(set(part) - expected)
                if unexpected:
                    raise CheckpointMismatch(
                        f"Trainer.load: {str(where / 'model')!r} holds tensors this model does not have: {unexpected[:5]}"
                    )
                self.model.lm.load_state_dict(part, strict=False)
                loaded |= set(part)
        # Strict, except for what save_pretrained leaves out on purpose: a weight tied to one that was loaded.
        missing = sorted(k for k in expected - loaded if not _tied_to_loaded(self.model.lm, k, loaded))
        if missing:
            raise CheckpointMismatch(f"Trainer.load: {str(where / 'model')!r} lacks tensors of this model: {missing[:5]}")
        blob = torch.load(where / STATE_FILE, map_location="cpu", weights_only=True)
        if "optimizer" not in blob:
            raise CheckpointMismatch(f"Trainer.load: {str(where)!r} was saved by a sharded learner (world size "
                                     f"{blob.get('world_size')}); set trainer.world_size to load it")
        self.optimizer.load_state_dict(blob["optimizer"])
        self.scheduler.load_state_dict(blob["scheduler"])
        self.state = TrainerState(**blob["state"])
        set_rng_state(blob["rng"])

    @classmethod
    def resume(
        cls,
        path: str | os.PathLike[str],
        *,
        device: str | torch.device = "cpu",
        publisher: WeightPublisher | None = None,
        ref_model: PolicyModel | None = None,
        **model_kwargs: Any,
    ) -> Trainer:
        """A new trainer continuing exactly where ``save(path)`` left off (configs read from the checkpoint)."""
        where = Path(path)
        configs = json.loads((where / CONFIG_FILE).read_text())
        model = PolicyModel.from_pretrained(where / "model", **model_kwargs).to(device)
        trainer = cls(
            model, LossConfig.model_validate(configs["loss"]), TrainerConfig.model_validate(configs["trainer"]),
            publisher=publisher, ref_model=ref_model,
        )
        trainer.load(where)
        return trainer


def _accumulate(acc: dict[str, float], out: LossOutput, entropy_sum: float, w_min: float, w_max: float) -> tuple[float, float]:
    """Add one micro-batch's loss statistics to the step's sums; the importance weights' running min and max."""
    acc["loss"] += float(out.loss.detach())
    acc["pg"] += out.pg_loss_sum
    acc["kl"] += out.kl_sum
    acc["clip"] += out.clipped_sum
    acc["w"] += out.is_weight_sum
    acc["masked"] += out.is_masked_sum
    acc["ent"] += entropy_sum
    return min(w_min, out.is_weight_min), max(w_max, out.is_weight_max)
