"""Weight reloads for ``agentenv serve``: a strict, memory-mapped checkpoint reader and the pause gate.

Why a reader of our own: ``from_pretrained`` builds a second model (twice the
memory) and fills missing tensors with random values after a warning; a server
that reloads under training must instead refuse a checkpoint that does not
match, *before* it pauses, and never hold two copies. The safetensors format is
an 8-byte header length, a JSON header ``{name: {dtype, shape, data_offsets}}``
and the raw bytes; mapping the file copy-on-write and viewing each tensor in
place costs no memory until ``load_state_dict`` copies it into the model.

>>> state = read_checkpoint("runs/w/v00000003", model)      # doctest: +SKIP
>>> policy.load_state_dict(state, version=3)                # copies from the mapped files
"""

from __future__ import annotations

import asyncio
import json
import mmap
import os
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import torch

from rollout.errors import RolloutError

__all__ = ["CheckpointMismatch", "UpdateGate", "checked_version", "read_checkpoint"]

_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}


class CheckpointMismatch(RolloutError, ValueError):
    """A checkpoint directory that cannot be loaded into the served model; ``field`` names the request field."""

    def __init__(self, message: str, field: str = "model_path") -> None:
        super().__init__(message)
        self.field = field


def _safetensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of one safetensors file as a view of a private (copy-on-write) mapping."""
    size = path.stat().st_size
    with path.open("rb") as f:
        if size < 8:
            raise CheckpointMismatch(f"model_path: {str(path)!r} is not a safetensors file ({size} bytes)")
        (n,) = struct.unpack("<Q", f.read(8))
        if 8 + n > size:
            raise CheckpointMismatch(f"model_path: {str(path)!r} is truncated (header of {n} bytes, file of {size})")
        try:
            header = json.loads(f.read(n))
        except ValueError as exc:
            raise CheckpointMismatch(f"model_path: {str(path)!r} has an unreadable safetensors header ({exc})") from exc
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) if size > 8 + n else None
    out: dict[str, torch.Tensor] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES.get(str(info.get("dtype")))
        begin, end = (int(x) for x in info["data_offsets"])
        shape = [int(d) for d in info["shape"]]
        if dtype is None:
            raise CheckpointMismatch(f"model_path: tensor {name!r} in {path.name} has unsupported dtype {info.get('dtype')!r}")
        count = 1
        for d in shape:
            count *= d
        if end - begin != count * torch.empty((), dtype=dtype).element_size() or 8 + n + end > size:
            raise CheckpointMismatch(f"model_path: tensor {name!r} in {path.name} is truncated or inconsistent with its shape")
        if count == 0 or buf is None:
            out[name] = torch.empty(shape, dtype=dtype)
        else:
            out[name] = torch.frombuffer(buf, dtype=dtype, count=count, offset=8 + n + begin).view(shape)
    return out


def _weight_files(where: Path) -> list[Path]:
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index = where / index_name
        if index.is_file():
            try:
                names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            except (ValueError, KeyError) as exc:
                raise CheckpointMismatch(f"model_path: {str(index)!r} is not a weight index ({exc})") from exc
            files = [where / n for n in names]
            lost = [str(p.name) for p in files if not p.is_file()]
            if lost:
                raise CheckpointMismatch(f"model_path: {index_name} names shards that are missing: {lost[:5]}")
            return files
    for single in ("model.safetensors", "pytorch_model.bin"):
        if (where / single).is_file():
            return [where / single]
    raise CheckpointMismatch(
        f"model_path: {str(where)!r} holds no weights (expected model.safetensors, a sharded index, or pytorch_model.bin)"
    )


def read_checkpoint(model_path: str | os.PathLike[str], model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state dict of checkpoint directory ``model_path``, checked strictly against ``model``.

    Raises ``CheckpointMismatch`` (naming ``model_path``) when the directory is
    missing, is not a Hugging Face checkpoint, or its tensors do not match
    ``model``'s names and shapes (missing, unexpected, wrong shape; up to five of
    each are named). Tied weights (``lm_head`` sharing the embedding) may be
    absent from the files, as ``save_pretrained`` writes them once. The returned
    tensors are mapped from the files; pass them straight to ``load_state_dict``.
    """
    where = Path(model_path)
    if not where.is_dir():
        raise CheckpointMismatch(f"model_path: {str(where)!r} is not a directory")
    if not (where / "config.json").is_file():
        raise CheckpointMismatch(f"model_path: {str(where)!r} is not a Hugging Face checkpoint (no config.json)")
    state: dict[str, torch.Tensor] = {}
    for file in _weight_files(where):
        if file.suffix == ".safetensors":
            state.update(_safetensors(file))
        else:
            try:
                state.update(torch.load(file, map_location="cpu", mmap=True, weights_only=True))
            except Exception as exc:  # noqa: BLE001 - any unpickling failure is the file's fault
                raise CheckpointMismatch(f"model_path: {str(file)!r} could not be read ({type(exc).__name__}: {exc})") from exc
    expected = model.state_dict()
    by_storage: dict[int, list[str]] = {}
    for name, t in expected.items():
        by_storage.setdefault(t.untyped_storage().data_ptr(), []).append(name)
    missing: list[str] = []
    for name in expected:
        if name in state:
            continue
        alias = next((a for a in by_storage[expected[name].untyped_storage().data_ptr()] if a in state), None)
        if alias is None:
            missing.append(name)
        else:
            state[name] = state[alias]
    unexpected = [n for n in state if n not in expected]
    wrong = [f"{n} {list(state[n].shape)} (model: {list(expected[n].shape)})"
             for n in expected if n in state and state[n].shape != expected[n].shape]
    if missing or unexpected or wrong:
        parts = [f"{label} {len(items)}: {items[:5]}" for label, items in
                 (("missing", missing), ("unexpected", unexpected), ("wrong shape", wrong)) if items]
        raise CheckpointMismatch(f"model_path: {str(where)!r} does not match the served model ({'; '.join(parts)})")
    return state


class UpdateGate:
    """Requests share the model; a weight swap waits for them and holds new ones back (writer first).

    Lives on the server's event loop (every endpoint runs there), so the counts
    it reports are exact: ``running`` requests hold the model, ``waiting`` ones
    are paused behind a swap.
    """

    def __init__(self) -> None:
        self._cond = asyncio.Condition()
        self.running = 0
        self.waiting = 0
        self._swapping = False
        self._swaps_waiting = 0

    @property
    def swap_pending(self) -> bool:
        """A swap is waiting for the requests in flight, or under way."""
        return self._swapping or self._swaps_waiting > 0

    @asynccontextmanager
    async def request(self) -> AsyncIterator[None]:
        async with self._cond:
            if self._swapping or self._swaps_waiting:
                self.waiting += 1
                try:
                    await self._cond.wait_for(lambda: not (self._swapping or self._swaps_waiting))
                finally:
                    self.waiting -= 1
            self.running += 1
        try:
            yield
        finally:
            async with self._cond:
                self.running -= 1
                self._cond.notify_all()

    @asynccontextmanager
    async def swap(self, drain_timeout_s: float) -> AsyncIterator[int]:
        """Exclusive use of the model; yields how many requests were paused when it began.

        ``TimeoutError`` when the requests in flight do not finish within ``drain_timeout_s``
        (they go on, the paused ones resume, nothing was swapped).
        """
        async with self._cond:
            self._swaps_waiting += 1
            try:
                await asyncio.wait_for(self._cond.wait_for(lambda: not self._swapping and not self.running), drain_timeout_s)
            finally:
                self._swaps_waiting -= 1
                self._cond.notify_all()
            self._swapping = True
            paused = self.waiting
        try:
            yield paused
        finally:
            async with self._cond:
                self._swapping = False
                self._cond.notify_all()


def checked_version(value: object, loaded: int) -> int:
    """``value`` as a version that may replace ``loaded`` (versions never go back); else ``CheckpointMismatch``."""
    if isinstance(value, bool) or not isinstance(value, (int, str)) or (isinstance(value, str) and not value.isdigit()):
        raise CheckpointMismatch(f"version: expected an int >= 0, got {value!r}", "version")
    version = int(value)
    if version < loaded:
        raise CheckpointMismatch(
            f"version: {version} is older than the loaded version {loaded}; versions only grow", "version"
        )
    return version
