"""The learner's contract: what goes into an optimizer step and what comes out.

Everything the trainer needs from rollout is in ``TrainItem`` (one training
sequence with its advantage and the tags to split metrics by); ``TrainBatch``
is one packed micro-batch of those, as tensors; ``LossConfig`` and
``AdvantageConfig`` name every knob of the one policy-gradient loss and the
advantage estimators; ``StepMetrics`` is what one optimizer step reports.

Token alignment, used everywhere in ``learner``: position ``t`` of a ``_BT``
tensor is about token ``t`` of the row -- its id, the rollout logprob of
sampling it, its loss mask, its advantage. The trainer's logprob of token ``t``
comes from the logits at ``t - 1``; the first token of each packed sample has
no prediction and is always masked out (it is prompt anyway).

Config knobs are pydantic (users write them in YAML); records are frozen
dataclasses; batches hold tensors and are built only by ``learner.packing``.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from learner.errors import LearnerConfigError, ShapeError

__all__ = [
    "ServingConfig",
    "ServingTransport",
    "AdvantageConfig",
    "AdvantageEstimator",
    "Aggregation",
    "ISCorrection",
    "LossConfig",
    "LossOutput",
    "LossVariant",
    "SharedBatch",
    "StepMetrics",
    "TrainBatch",
    "TrainItem",
    "TrainerConfig",
    "TreeSegment",
]


class LossVariant(str, enum.Enum):
    """How the per-token objective treats the policy ratio ``r = pi_theta / pi_old``.

    ``clip``: PPO/GRPO/DAPO clipped surrogate ``-min(r A, clip(r) A)``.
    ``cispo``: ``-sg(clip(r)) A log pi``: clipping bounds the weight but never
    removes a token's gradient. ``gspo``: the ratio is the length-normalised
    sequence ratio (GSPO-token form, so per-token advantages still work).
    """

    CLIP = "clip"
    CISPO = "cispo"
    GSPO = "gspo"


class Aggregation(str, enum.Enum):
    """How per-token losses become one number.

    ``token_mean``: sum over all loss tokens / their count (DAPO): long answers
    weigh in proportion to their length. ``seq_mean_token_mean``: mean over
    sequences of each sequence's token mean (original GRPO): every sequence
    weighs the same, so a long wrong answer is penalised less per token.
    ``constant``: sum / (num sequences x ``norm_length``) (Dr. GRPO): no length
    bias, and the scale does not move with the batch's lengths.
    """

    TOKEN_MEAN = "token_mean"
    SEQ_MEAN_TOKEN_MEAN = "seq_mean_token_mean"
    CONSTANT = "constant"


class ISCorrection(str, enum.Enum):
    """Rollout-vs-trainer mismatch correction with ``rho = pi_train / mu`` per token.

    ``tis``: truncated, ``w = min(rho, cap)``. ``mis``: masked, ``w = rho`` inside
    ``[mis_low, mis_high]`` and 0 outside (the token is dropped). ``none``: w = 1.
    """

    NONE = "none"
    TIS = "tis"
    MIS = "mis"


class AdvantageEstimator(str, enum.Enum):
    GRPO = "grpo"
    DR_GRPO = "dr_grpo"
    RLOO = "rloo"
    REINFORCE_PP = "reinforce_pp"
    REINFORCE = "reinforce"


class LossConfig(BaseModel):
    """Every knob of ``learner.losses.policy_loss``. Presets: ``grpo()``, ``dapo()``, ``cispo()``, ``gspo()``.

    ``eps_low`` / ``eps_high`` bound the ratio to ``[1 - eps_low, 1 + eps_high]``
    (for ``gspo`` the *sequence* ratio, which lives much closer to 1, hence
    its tiny preset values). ``temperature`` is the sampling temperature: the
    trainer divides logits by it so its logprobs are of the distribution the
    rollout sampled from.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    variant: LossVariant = LossVariant.CLIP
    eps_low: float = Field(default=0.2, ge=0.0)
    eps_high: float = Field(default=0.2, ge=0.0)
    aggregation: Aggregation = Aggregation.TOKEN_MEAN
    norm_length: int | None = Field(default=None, ge=1, description="the fixed length L of aggregation=constant")
    temperature: float = Field(default=1.0, gt=0.0)
    kl_coef: float = Field(default=0.0, ge=0.0, description="weight of KL(pi_theta || pi_ref); 0 disables it")
    kl_estimator: Literal["k1", "k3"] = "k3"
    is_correction: ISCorrection = ISCorrection.TIS
    tis_cap: float = Field(default=2.0, gt=0.0)
    mis_low: float = Field(default=0.5, ge=0.0)
    mis_high: float = Field(default=2.0, gt=0.0)

    @model_validator(mode="after")
    def _check(self) -> LossConfig:
        if self.aggregation is Aggregation.CONSTANT and self.norm_length is None:
            raise LearnerConfigError("LossConfig.norm_length: aggregation='constant' needs a fixed length, got None")
        if self.mis_low >= self.mis_high:
            raise LearnerConfigError(f"LossConfig: expected mis_low < mis_high, got {self.mis_low} >= {self.mis_high}")
        return self

    @classmethod
    def grpo(cls, **kw: object) -> LossConfig:
        """DeepSeekMath GRPO: symmetric clip 0.2, sequence-mean of token-means."""
        return cls.model_validate({"aggregation": Aggregation.SEQ_MEAN_TOKEN_MEAN} | kw)

    @classmethod
    def dapo(cls, **kw: object) -> LossConfig:
        """DAPO: clip-higher (0.2 / 0.28) and token-level aggregation."""
        return cls.model_validate({"eps_low": 0.2, "eps_high": 0.28, "aggregation": Aggregation.TOKEN_MEAN} | kw)

    @classmethod
    def cispo(cls, **kw: object) -> LossConfig:
        """MiniMax-M1 CISPO: no lower bound on the IS weight (eps_low=1), only an upper one."""
        return cls.model_validate(
            {"variant": LossVariant.CISPO, "eps_low": 1.0, "eps_high": 4.0, "aggregation": Aggregation.TOKEN_MEAN}
            | kw
        )

    @classmethod
    def gspo(cls, **kw: object) -> LossConfig:
        """Qwen GSPO: sequence ratio clipped to [1 - 3e-4, 1 + 4e-4], sequence-level mean."""
        return cls.model_validate(
            {"variant": LossVariant.GSPO, "eps_low": 3e-4, "eps_high": 4e-4,
             "aggregation": Aggregation.SEQ_MEAN_TOKEN_MEAN} | kw
        )


class TrainerConfig(BaseModel):
    """Optimizer, schedule, micro-batching and precision of ``learner.trainer.Trainer``.

    ``micro_batch_tokens`` bounds one packed micro-batch (activation memory);
    the optimizer step covers every item given to ``Trainer.step`` whatever the
    number of micro-batches (gradient accumulation with global normalisers, so
    the result does not depend on how the items were packed). ``bf16``:
    autocast the forward pass to bf16; ``None`` = on CUDA only (CPU stays fp32).
    ``pad_to_multiple``: on a GPU set it to ``micro_batch_tokens`` so every
    packed row has one shape (cuDNN builds an attention plan per sequence
    length; on an H200 this took a 0.5B model from 18k to 29k tokens/s).
    ``schedule``: linear warmup over ``warmup_steps``, then constant, or linear /
    cosine decay to ``min_lr_ratio x lr`` at ``total_steps``.

    GPU throughput options, all off by default (``benches.learner_gpu`` measures
    them): ``rows_per_micro_batch`` stacks that many packed rows into one
    forward pass (a single 4k row of a 0.5B model leaves an H200 idle between
    kernel launches); ``logprob_chunk_tokens`` runs the LM head and fp32
    log-softmax that many tokens at a time instead of materialising full-vocab
    fp32 logits, recomputing them in backward unless ``logprob_keep_logits``
    (then they are kept in bf16: 2 bytes x vocab a token, one LM-head matmul
    less); ``logprobs_at_loss_tokens`` runs the LM head only at the loss
    mask's positions (exact: the loss reads no others; agent episodes sample a
    few tens of tokens after a 1-2k-token prompt, and the learner's CPU train
    loop turns it on); ``compile_layers`` applies ``torch.compile`` to each decoder layer
    (the first steps pay the compile); ``fused_optimizer`` uses AdamW's fused
    kernel. Weights stay fp32 under bf16 autocast: at lr ~1e-6 a bf16 weight
    would round most updates away.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    lr: float = Field(default=1e-6, gt=0.0)
    weight_decay: float = Field(default=0.0, ge=0.0)
    betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = Field(default=1e-8, gt=0.0)
    grad_clip: float | None = Field(default=1.0, gt=0.0)
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    warmup_steps: int = Field(default=0, ge=0)
    total_steps: int | None = Field(default=None, ge=1)
    min_lr_ratio: float = Field(default=0.0, ge=0.0, le=1.0)
    micro_batch_tokens: int = Field(default=4096, ge=1)
    pad_to_multiple: int = Field(default=1, ge=1)
    bf16: bool | None = None
    publish_every: int = Field(default=1, ge=0, description="publish weights every N steps; 0 never")
    rows_per_micro_batch: int = Field(default=1, ge=1)
    logprob_chunk_tokens: int | None = Field(default=None, ge=1)
    logprob_keep_logits: bool = False
    logprobs_at_loss_tokens: bool = False
    prefix_sharing: bool = Field(
        default=False, description="forward a group's shared token prefix once (learner.tree.pack_shared, a tree "
        "attention mask; sdpa / eager attention, single-process Trainer only); exact against the unshared step")
    compile_layers: bool = False
    fused_optimizer: bool = False
    deterministic: bool = Field(
        default=False, description="same seed, same run: torch.use_deterministic_algorithms(True) for the process "
        "(learner.trainer.make_deterministic); measured cost on CPU in docs/training.md",
    )
    # The sharded learner (learner.group.LearnerGroup): FSDP2 ranks as Ray actors.
    world_size: int | None = Field(
        default=None, ge=1, description="train on this many FSDP2-sharded ranks (Ray actors, one device each; "
        "1 = the sharded path on one device); None: the single-process trainer",
    )
    devices_per_node: int | None = Field(
        default=None, ge=1, description="devices (GPUs, or CPU ranks) one node gives the group; world_size must be "
        "at most this or a multiple of it; None: world_size (one node)",
    )
    activation_checkpointing: bool = Field(
        default=False, description="sharded learner: recompute each decoder layer's activations in backward",
    )
    distributed_timeout_s: float = Field(
        default=600.0, gt=0.0, description="sharded learner: the bound on the rendezvous, every collective and a "
        "publish; a dead or stuck rank fails the group after this",
    )

    @model_validator(mode="after")
    def _check(self) -> TrainerConfig:
        if self.schedule != "constant" and self.total_steps is None:
            raise LearnerConfigError(f"TrainerConfig.total_steps: schedule={self.schedule!r} needs total_steps, got None")
        per_node, world = self.devices_per_node, self.world_size
        if per_node is not None and world is not None and world > per_node and world % per_node:
            raise LearnerConfigError(f"TrainerConfig.world_size: {world} ranks do not fill whole nodes of "
                                     f"devices_per_node={per_node}; use a multiple of it (or at most {per_node})")
        return self


class AdvantageConfig(BaseModel):
    """Which estimator and which reward shaping run before it.

    ``effort_tau``: the Kimi K3 effort rule, reward := -1 when a trajectory's
    counted tokens exceed ``effort_tau x b0`` (its task's budget); ``None``
    disables it. ``overlong_max_len`` / ``overlong_cache_len``: DAPO's soft
    overlong punishment (``None`` disables it). ``dynamic_sampling``: drop
    groups whose rewards are all equal (they carry no group-relative signal).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    estimator: AdvantageEstimator = AdvantageEstimator.GRPO
    eps: float = Field(default=1e-6, gt=0.0, description="added to a std before dividing by it")
    effort_tau: float | None = Field(default=None, gt=0.0)
    overlong_max_len: int | None = Field(default=None, ge=1)
    overlong_cache_len: int = Field(default=0, ge=0)
    dynamic_sampling: bool = False
    tree: bool = Field(default=False, description="tree-structured advantages (learner.tree.tree_items): a segment "
                       "shared by branched episodes is compared with its siblings, not once per leaf")
    tree_local: float = Field(default=1.0, ge=0.0, description="the weight of a segment's local term (against its "
                              "siblings) in the tree advantage; 0 leaves the global term alone, which trains every "
                              "leaf as plain GRPO would")
    tree_global: float = Field(default=1.0, ge=0.0, description="the weight of the global term (against the whole "
                               "tree) for a segment below a branch point (its parent not the trunk); 0 with "
                               "tree_local 1 scores such a segment against its siblings only, while a root's shared "
                               "segment keeps the whole tree as its baseline")

    @model_validator(mode="after")
    def _check(self) -> AdvantageConfig:
        if self.overlong_max_len is not None and self.overlong_cache_len > self.overlong_max_len:
            raise LearnerConfigError(
                f"AdvantageConfig: overlong_cache_len ({self.overlong_cache_len}) must not exceed "
                f"overlong_max_len ({self.overlong_max_len})"
            )
        return self


@dataclass(frozen=True)
class TrainItem:
    """One training sequence with its advantage: what the trainer consumes.

    ``advantage`` is a float (one value for the whole sequence: outcome RL) or
    one value per token (MOPD's per-token teacher advantage).
    ``rollout_logprobs[i]`` is mu's logprob of token ``i`` where ``loss_mask[i]``
    is 1. ``ref_logprobs`` (optional) are a reference policy's, for the KL term.
    ``tags`` (harness, effort, domain, ...) only split metrics.
    """

    token_ids: tuple[int, ...]
    rollout_logprobs: tuple[float, ...]
    loss_mask: tuple[int, ...]
    advantage: float | tuple[float, ...]
    sample_id: str = ""
    group_id: str = ""
    ref_logprobs: tuple[float, ...] | None = None
    tags: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        sizes = {"rollout_logprobs": len(self.rollout_logprobs), "loss_mask": len(self.loss_mask)}
        if isinstance(self.advantage, tuple):
            sizes["advantage"] = len(self.advantage)
        if self.ref_logprobs is not None:
            sizes["ref_logprobs"] = len(self.ref_logprobs)
        bad = {k: v for k, v in sizes.items() if v != n}
        if bad:
            raise ShapeError(f"TrainItem {self.sample_id!r}: expected {n} entries (one per token id), got lengths {bad}")
        if n < 1:
            raise ShapeError(f"TrainItem {self.sample_id!r}: token_ids: expected at least one token, got 0")

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_loss_tokens(self) -> int:
        # token 0 never has a prediction, so it never counts
        return sum(self.loss_mask[1:])


@dataclass(frozen=True)
class TrainBatch:
    """One packed micro-batch: ``B`` rows of ``T`` tokens, each row several samples end to end.

    ``seg_BT`` is the sample index ``s`` in ``[0, S)`` of every token (``-1`` on
    padding); ``position_ids_BT`` restart at 0 for each sample, which is how the
    model confines attention to a sample (see ``learner.packing``).
    ``items`` are the ``S`` samples in segment order. ``loss_mask_BT`` is 0 on
    each sample's first token and on padding.
    """

    input_ids_BT: torch.Tensor  # int64
    position_ids_BT: torch.Tensor  # int64
    seg_BT: torch.Tensor  # int64, -1 = padding
    loss_mask_BT: torch.Tensor  # float32 0/1
    rollout_logp_BT: torch.Tensor  # float32
    adv_BT: torch.Tensor  # float32
    ref_logp_BT: torch.Tensor | None
    items: tuple[TrainItem, ...]

    @property
    def num_samples(self) -> int:
        return len(self.items)

    @property
    def num_tokens(self) -> int:
        return int((self.seg_BT >= 0).sum())

    def to(self, device: torch.device | str) -> TrainBatch:
        def move(x: torch.Tensor) -> torch.Tensor:
            return x.to(device, non_blocking=True)

        return TrainBatch(
            move(self.input_ids_BT), move(self.position_ids_BT), move(self.seg_BT), move(self.loss_mask_BT),
            move(self.rollout_logp_BT), move(self.adv_BT),
            None if self.ref_logp_BT is None else move(self.ref_logp_BT), self.items,
        )


@dataclass(frozen=True)
class TreeSegment:
    """One edge of a group's token trie (``learner.tree.build_trie``): positions ``[start, end)`` that the
    sequences ``members`` (indices into the group) share exactly; ``parent`` is the segment before it (-1: none)."""

    parent: int
    start: int
    end: int
    members: tuple[int, ...]


@dataclass(frozen=True)
class SharedBatch:
    """One micro-batch of prefix-shared trees (``learner.tree.pack_shared``): ``B = 1`` row of ``T`` tokens.

    Each tree's segments go in once, parents before children. ``pred_BT``
    is the row index of the token that predicts each token (its path's
    previous token; -1 for a sequence's first token and padding).
    ``allowed_BTT[b, i, j]``: token ``i`` attends to ``j`` (``j`` on ``i``'s
    own path, at or before it). ``count_BT``: how many of ``items`` contain
    the token (its weight under token-mean and constant aggregation);
    ``inv_len_BT``: the sum of ``1 / num_loss_tokens`` over them (seq-mean-token-mean).
    """

    input_ids_BT: torch.Tensor  # int64
    position_ids_BT: torch.Tensor  # int64, the token's index in its own sequence
    pred_BT: torch.Tensor  # int64, -1 = no prediction
    allowed_BTT: torch.Tensor  # bool
    loss_mask_BT: torch.Tensor  # float32 0/1
    rollout_logp_BT: torch.Tensor  # float32
    adv_BT: torch.Tensor  # float32
    ref_logp_BT: torch.Tensor | None
    count_BT: torch.Tensor  # float32
    inv_len_BT: torch.Tensor  # float32
    items: tuple[TrainItem, ...]

    @property
    def num_tokens(self) -> int:
        return int((self.count_BT > 0).sum())

    def to(self, device: torch.device | str) -> SharedBatch:
        def move(x: torch.Tensor) -> torch.Tensor:
            return x.to(device, non_blocking=True)

        return SharedBatch(
            move(self.input_ids_BT), move(self.position_ids_BT), move(self.pred_BT), move(self.allowed_BTT),
            move(self.loss_mask_BT), move(self.rollout_logp_BT), move(self.adv_BT),
            None if self.ref_logp_BT is None else move(self.ref_logp_BT), move(self.count_BT),
            move(self.inv_len_BT), self.items,
        )


@dataclass(frozen=True)
class LossOutput:
    """The loss (a scalar with grad) and detached statistics over the loss tokens.

    Sums, not means, for the statistics that add across micro-batches
    (``*_sum``; divide by ``num_tokens``); extrema for the rest.
    """

    loss: torch.Tensor
    num_tokens: int
    clipped_sum: float
    is_weight_sum: float
    is_weight_min: float
    is_weight_max: float
    is_masked_sum: float
    kl_sum: float
    pg_loss_sum: float


@dataclass(frozen=True)
class StepMetrics:
    """What one optimizer step reports. ``splits`` holds reward / pass rate by
    tag, keyed like ``"reward/harness=codex"`` or ``"pass_rate/effort=low"``."""

    step: int
    loss: float
    pg_loss: float
    kl: float
    clip_frac: float
    is_weight_mean: float
    is_weight_min: float
    is_weight_max: float
    is_masked_frac: float
    entropy: float
    grad_norm: float
    lr: float
    num_samples: int
    num_tokens: int
    num_loss_tokens: int
    num_micro_batches: int
    seq_len_mean: float
    seq_len_max: int
    response_len_mean: float
    pack_s: float
    forward_backward_s: float
    optimizer_s: float
    total_s: float
    splits: Mapping[str, float] = field(default_factory=dict)
    forward_tokens: int = 0  # tokens the model ran on (num_tokens unless trainer.prefix_sharing shared some)
    shared_fallback_groups: int = 0  # prefix_sharing: groups with no shared prefix, trained unshared

    def as_dict(self) -> dict[str, float]:
        """Flat name -> number, for the trajectory store's ``log_metric`` and JSON."""
        out: dict[str, float] = {k: float(v) for k, v in vars(self).items() if k != "splits"}
        out.update({k: float(v) for k, v in self.splits.items()})
        return out


ServingTransport = Literal["disk", "gloo", "nccl"]  # CUDA IPC handles never travel over HTTP


class ServingConfig(BaseModel):
    """``serving:`` in a train or distill config: the servers training samples on, and how weights reach them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    urls: list[str] = Field(min_length=1, description="each server's base URL (http://host:port, with or without /v1)")
    model: str | None = Field(default=None, description="the served model name sent with each request (None: any)")
    api_key_env: str | None = Field(
        default=None, description="environment variable holding the servers' bearer token (agentenv serve --api-key)")
    timeout_s: float = Field(default=120.0, gt=0, description="one turn's deadline on a server; past it the episode reruns")
    publish_timeout_s: float = Field(default=300.0, gt=0, description="one server's deadline to load a published version")
    transport: ServingTransport = Field(default="disk", description="how weights reach the servers (see learner.serving)")
    weights_dir: str | None = Field(
        default=None, description="disk: where versions are written, seen by every server at this path "
        "(default RUN_DIR/served_weights); each run writes into its own RUN_ID folder there")

    @field_validator("urls")
    @classmethod
    def _urls(cls, v: list[str]) -> list[str]:
        roots = [u.rstrip("/").removesuffix("/v1") for u in v]
        for i, root in enumerate(roots):
            if not root.startswith(("http://", "https://")):
                raise ValueError(f"urls[{i}]: expected an http(s):// URL, got {v[i]!r}")
        if len(set(roots)) != len(roots):
            raise ValueError(f"urls: each server once, got {v}")
        return v

    def api_key(self) -> str | None:
        """The bearer token from ``api_key_env`` (None when no variable is named); a named but unset one is an error."""
        if self.api_key_env is None:
            return None
        key = os.environ.get(self.api_key_env)
        if not key:
            raise LearnerConfigError(f"serving.api_key_env: the environment variable {self.api_key_env!r} is not set")
        return key
