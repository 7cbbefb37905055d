"""One rank of a sharded learner: process group, device mesh, FSDP2 wrapping, weight broadcast and gather.

What every rank of ``learner.group.LearnerGroup`` runs, in order::

    init_distributed(rank, world, host, port, device_type)   # gloo on CPU, NCCL on GPU; a 1-D mesh
    shard_model(model, mesh)                                 # fully_shard per decoder layer, then the root
    broadcast_weights(model, state if rank == 0 else None)   # rank 0 loaded them; the others receive them
    ... ShardedTrainer steps ...
    full_state_dict(model)                                   # every rank gathers, rank 0 keeps the tensors

Every collective runs under the process group's timeout (``trainer.distributed_timeout_s``),
so a dead peer ends in an error, not a hang. Mixed precision on GPU: bf16 compute (the
trainer's autocast), fp32 gradient reduction, fp32 master weights (the optimizer's); with more
than one rank the gathered parameters are bf16 (half the bytes on the wire), at world size 1
they stay fp32 under autocast (nothing is sent; the fast path's graphs and numerics, 1.2 MFU
points faster on an H200 than bf16 ones). CPU ranks stay fp32.

The root FSDP unit is the ``PolicyModel`` itself, and its ``logprobs`` / ``logits`` /
``hidden_states`` methods are registered as forward methods: the trainer calls those, never
``forward``, and the root's parameters (embeddings, final norm, the tied LM head) must be
gathered around them.
"""

from __future__ import annotations

import datetime
import os
import socket
from collections.abc import Iterable, Mapping
from typing import Any, cast

import torch
import torch.distributed as dist

from learner.errors import DistributedError, LearnerConfigError, LearnerError, RendezvousTimeout, UnsupportedModel
from learner.model import PolicyModel

__all__ = [
    "DistributedError", "RendezvousTimeout", "backend_for", "broadcast_weights", "clip_grad_norm", "free_address",
    "full_grads", "full_state_dict", "init_distributed", "local_optimizer_step", "reshards_after_forward",
    "shard_model", "teardown",
]

#: the methods of ``PolicyModel`` the trainer calls instead of ``forward``
FORWARD_METHODS = ("logprobs", "logits", "hidden_states")

#: set on a model by ``shard_model``: whether its decoder layers free their gathered parameters after forward
_RESHARD_ATTR = "fsdp_reshard_after_forward"


def free_address() -> tuple[str, int]:
    """This node's address as the other nodes see it, and a free TCP port on it (rank 0 publishes both)."""
    try:
        import ray

        host = ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - outside Ray: the loopback address
        host = "127.0.0.1"
    with socket.socket() as s:
        s.bind(("", 0))
        port = int(s.getsockname()[1])
    return host, port


def backend_for(device_type: str) -> str:
    return "nccl" if device_type == "cuda" else "gloo"


def init_distributed(
    rank: int, world_size: int, host: str, port: int, *, device_type: str = "cpu", timeout_s: float = 600.0,
) -> Any:
    """Join the process group at ``host:port`` (rank 0's) and return a 1-D ``DeviceMesh`` over all ranks.

    A rendezvous that does not complete within ``timeout_s`` raises ``RendezvousTimeout``
    naming ``trainer.distributed_timeout_s`` and the address.
    """
    from torch.distributed.device_mesh import init_device_mesh

    if not 0 <= rank < world_size:
        raise LearnerConfigError(f"trainer.world_size: rank {rank} is not in 0..{world_size - 1}")
    if device_type == "cuda":
        torch.cuda.set_device(0)  # Ray gives each rank one GPU, as CUDA_VISIBLE_DEVICES
    timeout = datetime.timedelta(seconds=timeout_s)
    try:
        dist.init_process_group(backend_for(device_type), init_method=f"tcp://{host}:{port}", rank=rank,
                                world_size=world_size, timeout=timeout)
    except (RuntimeError, TimeoutError) as exc:  # torch raises DistStoreError (a RuntimeError) on a store timeout
        if dist.is_initialized():
            dist.destroy_process_group()
        raise RendezvousTimeout(
            f"trainer.distributed_timeout_s: rank {rank} of {world_size} could not meet the others at {host}:{port} "
            f"within {timeout_s:g}s ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
        ) from exc
    return init_device_mesh(device_type, (world_size,), mesh_dim_names=("fsdp",))


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def decoder_layers(model: PolicyModel) -> Any:
    layers = getattr(model.lm.base_model, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or len(layers) == 0:
        raise UnsupportedModel(
            f"trainer.world_size: a sharded learner wraps each decoder layer, but {type(model.lm).__name__}'s base "
            f"model ({type(model.lm.base_model).__name__}) has no non-empty .layers list to wrap"
        )
    return layers


def shard_model(
    model: PolicyModel, mesh: Any, *, mixed_precision: bool = False, activation_checkpointing: bool = False,
    compile_layers: bool = False, reshard_after_forward: bool | None = None, bf16_params: bool | None = None,
) -> None:
    """``fully_shard`` each decoder layer, then the root (``model``), in place.

    ``mixed_precision``: the GPU setting (the trainer computes under bf16
    autocast): fp32 gradient reduction, and bf16 gathered parameters where
    ``bf16_params`` (None: only when there is more than one rank; at world size
    1 fp32 parameters under autocast are the fast path's own graphs, and there
    is no gather to halve). ``compile_layers``: ``torch.compile`` each layer
    first (``PolicyModel.compile_layers``). ``reshard_after_forward``: free each
    layer's gathered parameters after its forward and gather them again in
    backward; ``None``: only when there is more than one rank (at world size 1
    there is nothing to save). The root (embeddings, final norm, LM head) is
    never resharded after forward: backward needs it first.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

    layers = decoder_layers(model)
    if activation_checkpointing:
        if hasattr(model.lm, "activation_checkpointing_enable"):  # transformers >= 5.2x
            model.lm.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if compile_layers and not model.compiled:
        model.compile_layers()
    bf16 = mixed_precision and (mesh.size() > 1 if bf16_params is None else bf16_params)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else \
        MixedPrecisionPolicy()  # fp32 parameters, gradients and reduction
    reshard = mesh.size() > 1 if reshard_after_forward is None else reshard_after_forward
    for layer in layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=False)
    for name in FORWARD_METHODS:
        register_fsdp_forward_method(model, name)
    setattr(model, _RESHARD_ATTR, reshard)


def reshards_after_forward(model: PolicyModel) -> bool:
    """Whether ``shard_model`` set ``model``'s layers to free their gathered parameters after forward (True if unknown).

    When they do not, every layer is gathered at the end of each forward anyway,
    so keeping them gathered from one micro-batch's backward to the next
    forward costs no memory and saves a gather per layer and micro-batch
    (``ShardedTrainer``).
    """
    return bool(getattr(model, _RESHARD_ATTR, True))


def _options(**kw: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(**kw)


def broadcast_weights(model: PolicyModel, state: Mapping[str, torch.Tensor] | None) -> None:
    """Rank 0 passes the full state dict (``lm``'s keys), the others ``None``; afterwards every shard holds it."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    full: dict[str, Any] = {f"lm.{k}": v for k, v in state.items()} if state is not None else {}
    if dist.get_rank() == 0 and not full:
        raise LearnerError("broadcast_weights: rank 0 must hold the weights, got none")
    set_model_state_dict(model, full, options=_options(full_state_dict=True, broadcast_from_rank0=True, strict=True))


def _full(t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    if dtype is not None and t.is_floating_point():
        t = t.to(dtype)  # cast before the gather: half the bytes on the wire in bf16
    return t.full_tensor() if isinstance(t, DTensor) else t


def full_state_dict(model: PolicyModel, *, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor] | None:
    """The full weights, gathered one tensor at a time (every rank calls it); rank 0 gets them on CPU, others None.

    Keys are the Hugging Face model's (``lm.`` stripped); tied weights stay one tensor under both names.
    """
    rank0 = dist.get_rank() == 0
    out: dict[str, torch.Tensor] = {}
    seen: dict[int, str] = {}
    with torch.no_grad():
        for key, t in model.lm.state_dict().items():
            if id(t) in seen:  # a tied weight: gathered once
                if rank0:
                    out[key] = out[seen[id(t)]]
                continue
            seen[id(t)] = key
            full = _full(t.detach(), dtype)
            if rank0:
                out[key] = full.cpu().clone()
            del full
    return out if rank0 else None


def full_grads(model: PolicyModel) -> dict[str, torch.Tensor] | None:
    """Every parameter's full gradient (rank 0; the others None), by parameter name without ``lm.``."""
    rank0 = dist.get_rank() == 0
    out: dict[str, torch.Tensor] = {}
    for name, p in model.lm.named_parameters():
        if p.grad is None:
            continue
        g = _full(p.grad, None)
        if rank0:
            out[name] = g.cpu().clone()
    return out if rank0 else None


def _sharded_dim0(t: Any) -> bool:
    """A DTensor split along dim 0 over a 1-D mesh (every FSDP2 parameter and gradient here)."""
    from torch.distributed.tensor import DTensor, Shard

    return isinstance(t, DTensor) and len(t.placements) == 1 and t.placements[0] == Shard(0)


def clip_grad_norm(params: Iterable[torch.nn.Parameter], max_norm: float, *, local: bool = True) -> float:
    """The global gradient norm over every shard of every rank, and the gradients scaled to at most ``max_norm``.

    ``local`` (when every gradient is a dim-0 shard, as FSDP2's are): the norm of
    this rank's shards as one process computes it (``get_total_norm``), squared,
    summed over the ranks (one all-reduce, none at world size 1), and the
    scaling done on the local shards -- the same arithmetic as through DTensor,
    without its dispatch per operation. ``local=False``: through DTensor.
    """
    from torch.distributed.tensor import DTensor

    params = [p for p in params if p.grad is not None]
    grads = [p.grad for p in params if p.grad is not None]
    if local and grads and all(_sharded_dim0(g) for g in grads):
        with torch.no_grad():
            shards = [cast(DTensor, g).to_local() for g in grads]
            norm = torch.nn.utils.get_total_norm(shards, 2.0)
            if dist.get_world_size() > 1:
                square = norm.square()
                dist.all_reduce(square, op=dist.ReduceOp.SUM)
                norm = square.sqrt()
            coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)  # as torch.nn.utils.clip_grads_with_norm_
            by_device: dict[torch.device, list[torch.Tensor]] = {}
            for s in shards:
                by_device.setdefault(s.device, []).append(s)
            for device, group in by_device.items():
                torch._foreach_mul_(group, coef.to(device))
        return float(norm)
    total = torch.nn.utils.get_total_norm(grads, 2.0)
    if isinstance(total, DTensor):
        total = total.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return float(total)


def local_optimizer_step(optimizer: torch.optim.Optimizer) -> bool:
    """``optimizer.step()`` on each DTensor parameter's local shard; False (nothing done) where it cannot.

    The same optimizer code and kernels (fused or foreach AdamW) run on the same
    local tensors that DTensor's dispatch would hand them, so the update is the
    same; what goes is DTensor's dispatch around each of the step's list
    operations. Each parameter, its gradient and its state (``exp_avg``,
    ``exp_avg_sq``: DTensors) are swapped for their local tensors for the step
    and back afterwards, so ``optimizer.state`` stays keyed by the sharded
    parameters (what distributed checkpoints read). Not for a first step: the
    state does not exist yet and must be created as DTensors (the caller then
    runs the plain ``optimizer.step()``), nor for parameters that are not dim-0
    shards.
    """
    from torch.distributed.tensor import DTensor

    groups = optimizer.param_groups
    params = [p for g in groups for p in g["params"]]
    if not params or not all(_sharded_dim0(p) for p in params):
        return False
    if any(p.grad is not None and not optimizer.state.get(p) for p in params):
        return False
    originals = [g["params"] for g in groups]
    kept: dict[Any, Any] = {}
    shards: list[torch.Tensor] = []
    try:
        with torch.no_grad():
            for g in groups:
                local = []
                for p in g["params"]:
                    shard = p.to_local()
                    shards.append(shard)
                    if p.grad is not None:
                        shard.grad = p.grad.to_local()
                    state = optimizer.state.pop(p, None)
                    if state is not None:
                        kept[p] = state
                        optimizer.state[shard] = {k: v.to_local() if isinstance(v, DTensor) else v
                                                  for k, v in state.items()}
                    local.append(shard)
                g["params"] = local
        optimizer.step()
    finally:
        for shard in shards:
            shard.grad = None  # the gradient's memory belongs to the DTensor's grad: no second reference
            optimizer.state.pop(shard, None)
        for g, ps in zip(groups, originals):
            g["params"] = ps
        optimizer.state.update(kept)
    return True


def rank_env() -> dict[str, str]:
    """What a rank process shows of its placement (for error messages)."""
    return {k: os.environ.get(k, "") for k in ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS")}
