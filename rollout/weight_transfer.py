"""Weight transfer into a running engine: in process, over CUDA IPC, or broadcast over ``torch.distributed``.

Whatever the transport, new weights end as ``copy_`` into the tensors the
engine already holds (``Engine.update_weights`` / ``HFPolicy.load_state_dict``):
the KV cache and any captured CUDA graph keep pointing at valid memory. Every
transfer is checked against the receiving model first: each name must be one
of its tensors, each shape its shape, each dtype its dtype (a floating dtype
may arrive as another floating dtype and is cast by the copy); an error names
the tensor and says what was expected. Tied tensors (``lm_head`` sharing the
embedding) travel once.

Transports:

* **in process** (``load_in_process``): the learner's model or state dict,
  copied straight into the engine's parameters (device to device when both are
  on one GPU).
* **CUDA IPC** (``ipc_handles`` / ``open_ipc_handles``): for a process
  colocated on the same GPU. The sender packs its tensors into one flat buffer
  per version (``pack``) and hands over the buffer's IPC handle
  (``torch.multiprocessing.reductions.reduce_tensor``, the handle ``torch.multiprocessing``
  pickles); the receiver opens it, views each tensor in it (``unpack``) and
  copies into its engine. Nothing crosses the PCIe bus.
* **broadcast** (``TransferGroup``, ``send_state`` / ``receive_state``): a
  process group of the learner (rank 0) and every server (ranks 1..n), gloo on
  CPU, NCCL on GPU, built on its own ``TCPStore`` so it never touches a default
  group the learner may already use. Tensors are packed into buckets of at most
  ``bucket_bytes`` (one broadcast each; every offset 16-byte aligned), received
  into staging buffers and copied into the engine only once all arrived, so a
  transfer that breaks halfway leaves the served weights whole. The group is
  created and every collective waited for under ``timeout_s``: a peer that
  never joins, dies or hangs is a ``TransferTimeout`` / ``TransferError``
  within that time, never a hang. (NCCL caveat: torch's NCCL watchdog may
  abort a process whose collective timed out; gloo raises.)

``WeightReceiver`` is the engine side of vLLM's four-phase protocol
(init / start / update / finish) that ``rollout.serve_transfer`` exposes over
HTTP. ``weights_sha256`` hashes a state dict (names, dtypes, shapes, bytes) so
two processes can show they hold the same weights.

>>> load_in_process(policy, learner.lm, version=3)                 # doctest: +SKIP
>>> group = TransferGroup("gloo", "127.0.0.1", 29500, rank=1, world_size=2, timeout_s=60)  # doctest: +SKIP
"""

from __future__ import annotations

import datetime
import hashlib
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from rollout.errors import RolloutError

__all__ = [
    "ALIGN",
    "DEFAULT_BUCKET_BYTES",
    "TensorMeta",
    "TransferError",
    "TransferGroup",
    "TransferRequestError",
    "TransferTimeout",
    "InitInfo",
    "WeightReceiver",
    "check_metadata",
    "dtype_name",
    "ipc_handles",
    "load_in_process",
    "open_ipc_handles",
    "pack",
    "plan",
    "plan_buckets",
    "receive_state",
    "send_state",
    "unpack",
    "weights_sha256",
]

Backend = Literal["gloo", "nccl"]
ALIGN = 16  # every packed tensor starts at a multiple of this many bytes, so its bytes view as its dtype
DEFAULT_BUCKET_BYTES = 256 << 20


class TransferError(RolloutError, RuntimeError):
    """A weight transfer failed (a peer gone, a broken group, a transfer in the wrong phase); nothing was loaded."""


class TransferRequestError(TransferError, ValueError):
    """A malformed transfer: ``field`` names the request field (``update_info.names`` ...), the message the tensor."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


class TransferTimeout(TransferError, TimeoutError):
    """A peer did not join the group, or a collective did not complete, within ``timeout_s``."""


@dataclass(frozen=True)
class TensorMeta:
    """One tensor on the wire: its state-dict name, dtype name (``"bfloat16"``, vLLM's ``dtype_names``) and shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * self.torch_dtype.itemsize


_DTYPES: dict[str, torch.dtype] = {
    name: getattr(torch, name)
    for name in ("float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool")
}


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"`` (the spelling vLLM's ``dtype_names`` use)."""
    return str(dtype).removeprefix("torch.")


def _storage_key(t: torch.Tensor) -> tuple[int, int, tuple[int, ...]]:
    return t.untyped_storage().data_ptr(), int(t.storage_offset()), tuple(int(d) for d in t.shape)


def plan(state: Mapping[str, torch.Tensor]) -> tuple[list[TensorMeta], dict[str, str]]:
    """The tensors of ``state`` to send (each storage once, in state order) and ``{alias: source}`` for tied ones."""
    metas: list[TensorMeta] = []
    aliases: dict[str, str] = {}
    seen: dict[tuple[int, int, tuple[int, ...]], str] = {}
    for name, t in state.items():
        key = _storage_key(t)
        if key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        metas.append(TensorMeta(name, dtype_name(t.dtype), tuple(int(d) for d in t.shape)))
    return metas, aliases


def check_metadata(
    model: torch.nn.Module, names: Sequence[Any], dtype_names: Sequence[Any], shapes: Sequence[Any], *,
    prefix: str = "update_info", complete: bool = True,
) -> list[TensorMeta]:
    """``names`` / ``dtype_names`` / ``shapes`` checked against ``model``; ``TransferRequestError`` naming the tensor.

    Every name must be a tensor of ``model`` (each at most once), with its shape;
    the dtype must be the model's, or both floating (cast on copy). Every tensor
    of ``model`` must arrive, under its own name or a tied alias's (unless
    ``complete`` is false: one chunk of an update).
    """
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise TransferRequestError(f"{prefix}.names: expected a list of tensor names", f"{prefix}.names")
    for field, values in (("dtype_names", dtype_names), ("shapes", shapes)):
        if not isinstance(values, (list, tuple)) or len(values) != len(names):
            got = len(values) if isinstance(values, (list, tuple)) else type(values).__name__
            raise TransferRequestError(f"{prefix}.{field}: expected a list of {len(names)} entries (one per name), got {got}",
                                       f"{prefix}.{field}")
    expected = model.state_dict()
    _, model_aliases = plan(expected)
    metas: list[TensorMeta] = []
    seen: set[str] = set()
    for i, (name, dt, shape) in enumerate(zip(names, dtype_names, shapes)):
        if name not in expected:
            close = [n for n in expected if n.endswith(name.split(".")[-1])][:3]
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise TransferRequestError(f"{prefix}.names[{i}]: {name!r} is not a tensor of the served model{hint}",
                                       f"{prefix}.names")
        if name in seen:
            raise TransferRequestError(f"{prefix}.names[{i}]: {name!r} is sent twice", f"{prefix}.names")
        seen.add(name)
        if dt not in _DTYPES:
            raise TransferRequestError(f"{prefix}.dtype_names[{i}]: {dt!r} for {name!r} is not one of {sorted(_DTYPES)}",
                                       f"{prefix}.dtype_names")
        want = expected[name]
        if dt != dtype_name(want.dtype) and not (_DTYPES[dt].is_floating_point and want.dtype.is_floating_point):
            raise TransferRequestError(
                f"{prefix}.dtype_names[{i}]: {name!r} is {dtype_name(want.dtype)} in the served model, got {dt}",
                f"{prefix}.dtype_names")
        if not isinstance(shape, (list, tuple)) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise TransferRequestError(f"{prefix}.shapes[{i}]: expected a list of ints >= 0 for {name!r}, got {shape!r}",
                                       f"{prefix}.shapes")
        if tuple(shape) != tuple(want.shape):
            raise TransferRequestError(
                f"{prefix}.shapes[{i}]: {name!r} is {list(want.shape)} in the served model, got {list(shape)}",
                f"{prefix}.shapes")
        metas.append(TensorMeta(name, dt, tuple(int(d) for d in shape)))
    covered = seen | {a for a, src in model_aliases.items() if src in seen} | {
        src for a, src in model_aliases.items() if a in seen}
    missing = [n for n in expected if n not in covered]
    if missing and complete:
        raise TransferRequestError(f"{prefix}.names: {len(missing)} tensor(s) of the served model not sent: {missing[:5]}",
                                   f"{prefix}.names")
    return metas


def _complete(model: torch.nn.Module, staged: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``staged`` with every tied alias of ``model`` filled in, as a strict ``load_state_dict`` wants."""
    expected = model.state_dict()
    _, aliases = plan(expected)
    full = dict(staged)
    for alias, source in aliases.items():
        if alias not in full and source in full:
            full[alias] = full[source]
        elif source not in full and alias in full:
            full[source] = full[alias]
    return full


def load_in_process(
    target: Any, source: torch.nn.Module | Mapping[str, torch.Tensor], version: int, *, timeout_s: float = 600.0
) -> None:
    """Copy ``source`` (the learner's model or its state dict) into ``target``'s tensors and set ``version``.

    ``target``: an ``HFPolicy`` (``load_state_dict``: in-flight turns finish first,
    or, under a ``keep`` pause, resume on the new weights) or an ``Engine``
    (``update_weights``). ``source`` is checked first (``TransferRequestError``
    naming the tensor); nothing is copied when it does not fit.
    """
    state = source.state_dict() if isinstance(source, torch.nn.Module) else dict(source)
    model = target.model
    metas, _ = plan(state)
    check_metadata(model, [m.name for m in metas], [m.dtype for m in metas], [list(m.shape) for m in metas],
                   prefix="state")
    full = _complete(model, {m.name: state[m.name] for m in metas})
    if hasattr(target, "update_weights"):
        target.update_weights(full, int(version), timeout_s=timeout_s)
    else:
        target.load_state_dict(full, int(version))


# ---------------------------------------------------------------- packing


def _offsets(metas: Sequence[TensorMeta]) -> tuple[list[int], int]:
    offsets, total = [], 0
    for m in metas:
        offsets.append(total)
        total += -(-m.nbytes // ALIGN) * ALIGN
    return offsets, total


def plan_buckets(metas: Sequence[TensorMeta], bucket_bytes: int) -> list[list[TensorMeta]]:
    """Consecutive tensors grouped into buckets of at most ``bucket_bytes`` (a larger tensor goes alone)."""
    buckets: list[list[TensorMeta]] = [[]]
    size = 0
    for m in metas:
        padded = -(-m.nbytes // ALIGN) * ALIGN
        if buckets[-1] and size + padded > bucket_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append(m)
        size += padded
    return [b for b in buckets if b]


def pack(metas: Sequence[TensorMeta], state: Mapping[str, torch.Tensor], device: torch.device | str,
         out: torch.Tensor | None = None) -> torch.Tensor:
    """The tensors ``metas`` names, as one flat uint8 buffer on ``device`` (``out`` reused when given and big enough)."""
    offsets, total = _offsets(metas)
    want = torch.device(device)
    fits = out is not None and out.numel() >= total and out.device.type == want.type and (
        want.index is None or out.device.index == want.index)  # "cuda" is the buffer's "cuda:0"
    buf = out if fits and out is not None else torch.empty(total, dtype=torch.uint8, device=device)
    with torch.no_grad():
        for m, off in zip(metas, offsets):
            t = state[m.name].detach()
            if dtype_name(t.dtype) != m.dtype:
                t = t.to(m.torch_dtype)
            buf[off: off + m.nbytes].view(m.torch_dtype).view(m.shape).copy_(t)
    return buf


def unpack(metas: Sequence[TensorMeta], buf: torch.Tensor) -> dict[str, torch.Tensor]:
    """Views of ``buf`` (``pack``'s layout), one per tensor of ``metas``: no copy."""
    offsets, total = _offsets(metas)
    if buf.numel() < total:
        raise TransferRequestError(f"packed buffer holds {buf.numel()} bytes, the tensors need {total}", "update_info")
    return {m.name: buf[off: off + m.nbytes].view(m.torch_dtype).view(m.shape) for m, off in zip(metas, offsets)}


# ---------------------------------------------------------------- CUDA IPC


def ipc_handles(buf: torch.Tensor) -> tuple[Callable[..., torch.Tensor], tuple[Any, ...]]:
    """A picklable handle to ``buf`` (a CUDA tensor) for another process on the same GPU.

    Send it through a ``multiprocessing`` pipe or queue; the sender keeps ``buf``
    alive and unchanged until the receiver says it has copied out of it.
    """
    from torch.multiprocessing.reductions import reduce_tensor

    if buf.device.type != "cuda":
        raise TransferRequestError(f"ipc_handles: CUDA IPC needs a CUDA tensor, got one on {buf.device}", "buf")
    torch.cuda.current_stream(buf.device).synchronize()  # the bytes are written before the peer reads them
    rebuild, args = reduce_tensor(buf)
    return rebuild, tuple(args)


def open_ipc_handles(handle: tuple[Callable[..., torch.Tensor], tuple[Any, ...]]) -> torch.Tensor:
    """The tensor ``ipc_handles`` shared (the same GPU memory, mapped into this process)."""
    rebuild, args = handle
    return rebuild(*args)


# ---------------------------------------------------------------- broadcast


_ABANDONED: list[Any] = []  # failed NCCL groups, kept alive on purpose (``TransferGroup.close``)


class TransferGroup:
    """A process group for weight broadcasts: rank 0 the learner, ranks 1..n the engines.

    Built on its own ``TCPStore`` at ``master_address:master_port`` (rank 0 hosts
    it), so it coexists with any default group. Raises ``TransferTimeout`` when
    the ranks do not all meet within ``timeout_s``; every ``broadcast`` waits at
    most ``timeout_s`` too.
    """

    def __init__(self, backend: Backend, master_address: str, master_port: int, *, rank: int, world_size: int,
                 timeout_s: float, device: torch.device | str | None = None, name: str = "weights") -> None:
        import torch.distributed as dist

        if backend not in ("gloo", "nccl"):
            raise TransferRequestError(f"backend: expected gloo or nccl, got {backend!r}", "backend")
        if not 0 <= rank < world_size:
            raise TransferRequestError(f"rank: expected 0 <= rank < world_size ({world_size}), got {rank}", "rank_offset")
        if timeout_s <= 0:
            raise TransferRequestError(f"timeout_s: expected > 0, got {timeout_s}", "timeout_s")
        self.backend: Backend = backend
        self.rank, self.world_size, self.timeout_s = rank, world_size, float(timeout_s)
        self.device = torch.device(device if device is not None else ("cuda" if backend == "nccl" else "cpu"))
        timeout = datetime.timedelta(seconds=timeout_s)
        where = f"{backend} group {master_address}:{master_port} (rank {rank} of {world_size})"
        self.where = where
        self.broken = False
        try:
            store = dist.TCPStore(master_address, int(master_port), world_size, rank == 0, timeout=timeout,
                                  wait_for_workers=False)
            prefixed = dist.PrefixStore(name, store)
            if backend == "gloo":
                self.pg: Any = dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)
            else:
                options = dist.ProcessGroupNCCL.Options()
                options._timeout = timeout
                self.pg = dist.ProcessGroupNCCL(prefixed, rank, world_size, options)
        except Exception as exc:  # noqa: BLE001 - the store's and the group's errors both mean: no group
            raise self._failure("joining", exc) from exc
        self._store = store

    def _failure(self, doing: str, exc: BaseException) -> TransferError:
        self.broken = True
        text = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
        if "timeout" in str(exc).lower() or "timed out" in str(exc).lower():
            return TransferTimeout(f"{self.where}: {doing} did not complete within {self.timeout_s}s "
                                   f"(a peer never joined or stopped answering; {text})")
        return TransferError(f"{self.where}: {doing} failed ({text}); a peer died or left the group")

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> None:
        """``tensor`` from rank ``src`` into every rank's ``tensor``, waited for at most ``timeout_s``."""
        import torch.distributed as dist

        opts = dist.BroadcastOptions()
        opts.rootRank = src
        opts.timeout = datetime.timedelta(seconds=self.timeout_s)
        try:
            work = self.pg.broadcast([tensor], opts)
            if not work.wait(datetime.timedelta(seconds=self.timeout_s)):
                raise TimeoutError(f"broadcast timed out after {self.timeout_s}s")
            if tensor.device.type == "cuda":
                torch.cuda.current_stream(tensor.device).synchronize()
        except Exception as exc:  # noqa: BLE001 - gloo / NCCL raise RuntimeError for a dead or hung peer
            raise self._failure("a broadcast", exc) from exc

    def close(self) -> None:
        pg, self.pg = self.pg, None
        if pg is None or self.backend != "nccl":
            return
        if self.broken:
            # Shutting down (or destroying) an NCCL communicator whose peer failed can block on it; keep it
            # referenced and unused instead: a leak per failed transfer, never a hang.
            _ABANDONED.append(pg)
            return
        try:
            pg.shutdown()
        except Exception:  # noqa: BLE001 - it is dropped either way
            pass


def send_state(group: TransferGroup, metas: Sequence[TensorMeta], state: Mapping[str, torch.Tensor],
               bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
    """Rank 0's side: broadcast ``metas``' tensors from ``state``, packed bucket by bucket."""
    buf: torch.Tensor | None = None
    for bucket in plan_buckets(metas, bucket_bytes):
        buf = pack(bucket, state, group.device, out=buf)
        _, total = _offsets(bucket)
        group.broadcast(buf[:total] if buf.numel() > total else buf)


def receive_state(group: TransferGroup, metas: Sequence[TensorMeta],
                  bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> dict[str, torch.Tensor]:
    """A receiving rank's side of ``send_state``: the tensors, as views of freshly received staging buffers."""
    staged: dict[str, torch.Tensor] = {}
    for bucket in plan_buckets(metas, bucket_bytes):
        _, total = _offsets(bucket)
        buf = torch.empty(total, dtype=torch.uint8, device=group.device)
        group.broadcast(buf)
        staged.update(unpack(bucket, buf))
    return staged


# ---------------------------------------------------------------- the engine side of the protocol


def weights_sha256(state: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 over ``state`` sorted by name: each name, dtype, shape and the tensor's bytes (CPU, contiguous)."""
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach()
        h.update(f"{name}|{dtype_name(t.dtype)}|{list(t.shape)}|".encode())
        h.update(t.to("cpu").contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


@dataclass(frozen=True)
class InitInfo:
    """vLLM's ``NCCLWeightTransferInitInfo`` (``master_address``, ``master_port``, ``rank_offset``,
    ``world_size``) plus ours: ``backend`` and ``timeout_s``."""

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    backend: Backend
    timeout_s: float


class WeightReceiver:
    """One engine's side of a weight transfer: join a group, stage what arrives, apply it at ``finish``.

    ``model``: the served model (the metadata is checked against it).
    ``apply(state, version)``: copies a full state dict in place (``HFPolicy.load_state_dict``).
    ``version()``: the loaded version. Phases (vLLM's): ``init`` once, then per
    update ``start`` -> ``update`` (once or more: chunks) -> ``finish``. An
    ``update`` without ``start`` (vLLM 0.22's two-phase protocol) is applied at once.
    """

    def __init__(self, model: torch.nn.Module, apply: Callable[[Mapping[str, torch.Tensor], int], None],
                 version: Callable[[], int], device: torch.device | str) -> None:
        self.model, self._apply, self._version = model, apply, version
        self.device = torch.device(device)
        self.group: TransferGroup | None = None
        self._staged: dict[str, torch.Tensor] | None = None
        self._target: int | None = None
        self._lock = threading.Lock()  # one phase at a time
        self._hash: tuple[tuple[int, int], str] | None = None
        self.loads = 0  # bumped on every load, transfer or not (the hash cache's key)

    @property
    def staging(self) -> bool:
        """An update is started and not finished."""
        return self._staged is not None

    def init(self, info: InitInfo) -> None:
        """Join (or re-join) the broadcast group as rank ``rank_offset``; blocks until all ranks met or ``timeout_s``."""
        with self._lock:
            if self.group is not None:
                self.group.close()
                self.group = None
            self.group = TransferGroup(info.backend, info.master_address, info.master_port, rank=info.rank_offset,
                                       world_size=info.world_size, timeout_s=info.timeout_s,
                                       device=self.device if info.backend == "nccl" else "cpu")

    def start(self, version: int | None) -> None:
        with self._lock:
            self._staged = {}
            self._target = version

    def update(self, names: Sequence[Any], dtype_names: Sequence[Any], shapes: Sequence[Any], *,
               bucket_bytes: int = DEFAULT_BUCKET_BYTES, version: int | None = None) -> int:
        """Receive the named tensors over the group; staged until ``finish`` (applied now without ``start``).

        Returns how many tensors arrived. Malformed metadata: ``TransferRequestError``
        before anything is received (the sender's broadcast then fails on its side too).
        """
        with self._lock:
            metas = check_metadata(self.model, names, dtype_names, shapes, complete=self._staged is None)
            if self.group is None:
                raise TransferRequestError("no transfer group: POST /init_weight_transfer_engine first", "init_info")
            try:
                received = receive_state(self.group, metas, bucket_bytes)
            except TransferError:
                self.group.close()  # a broken group cannot be reused: the next transfer starts with init
                self.group = None
                self._staged = None
                raise
            if self._staged is None:  # two-phase (vLLM 0.22): this call is the whole update
                self._load(received, version)
            else:
                self._staged.update(received)
                if version is not None:
                    self._target = version
            return len(metas)

    def finish(self, version: int | None) -> int:
        """Copy the staged tensors into the engine (``apply``); returns the version now loaded."""
        with self._lock:
            if self._staged is None:
                raise TransferRequestError("no update in progress: POST /start_weight_update first", "start")
            staged, self._staged = self._staged, None
            return self._load(staged, version if version is not None else self._target)

    def abort(self) -> None:
        with self._lock:
            self._staged = None

    def _load(self, staged: Mapping[str, torch.Tensor], version: int | None) -> int:
        metas, _ = plan(staged)
        check_metadata(self.model, [m.name for m in metas], [m.dtype for m in metas], [list(m.shape) for m in metas],
                       prefix="update_info")
        current = self._version()
        target = current + 1 if version is None else int(version)
        if target < current:
            raise TransferRequestError(f"version: {target} is older than the loaded version {current}; versions only grow",
                                       "version")
        self._apply(_complete(self.model, dict(staged)), target)
        self.loads += 1
        return target

    def sha256(self) -> str:
        """``weights_sha256`` of the served model, cached until the next load."""
        key = (self._version(), self.loads)
        if self._hash is None or self._hash[0] != key:
            self._hash = (key, weights_sha256(self.model.state_dict()))
        return self._hash[1]

    def invalidate(self) -> None:
        """The weights changed by another path (``/update_weights_from_disk``)."""
        self.loads += 1

    def close(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None
