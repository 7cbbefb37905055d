"""Weight publishing: how new weights and their version number reach the rollout workers.

The trainer only calls a ``WeightPublisher``; where the weights go is the
caller's choice:

* ``CheckpointPublisher``: one ``save_pretrained`` directory per version under a
  root, plus a ``LATEST`` file naming the newest. Atomic: the new version is
  written under a temporary name, flushed, renamed into place, and only then is
  ``LATEST`` replaced (itself written to a temporary file and renamed); old
  versions are removed last. A reader that follows ``LATEST`` never sees half a
  checkpoint, and a crash mid-write leaves the previous version published.
* ``ServerReloadPublisher``: a ``CheckpointPublisher`` whose every version is then
  loaded by inference servers (``agentenv serve``'s ``POST
  /update_weights_from_disk``, SGLang's shape), all at once, each under a deadline.
* For ``hf`` workers on Ray, the object store: ``to_shareable`` turns a state dict
  into numpy arrays that ``ray.get`` maps without copying (torch tensors would be
  pickled and copied into every worker); ``from_shareable`` turns them back.

Versions only grow: publishing a version older than ``LATEST`` is refused
(the same version again is allowed: a retry, or a resumed run).
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from learner.errors import CheckpointError, LearnerConfigError, LearnerError
from learner.model import PolicyModel

__all__ = [
    "CheckpointPublisher",
    "PublishError",
    "ServerReloadPublisher",
    "WeightPublisher",
    "from_shareable",
    "latest_version",
    "to_shareable",
    "version_dir",
]

LATEST = "LATEST"
_VERSION_GLOB = "v" + "[0-9]" * 8


class PublishError(LearnerError, ConnectionError):
    """Weights were written but not every server loaded them; ``failed`` maps each server URL to its cause."""

    def __init__(self, message: str, path: str, failed: Mapping[str, str]) -> None:
        super().__init__(message)
        self.path = path
        self.failed = dict(failed)


@runtime_checkable
class WeightPublisher(Protocol):
    """Make ``model``'s current weights available as ``version``; return where (a path, an object ref id)."""

    def __call__(self, model: PolicyModel, version: int) -> str: ...


def version_dir(root: str | os.PathLike[str], version: int) -> Path:
    return Path(root) / f"v{version:08d}"


def latest_version(root: str | os.PathLike[str]) -> tuple[int, Path] | None:
    """The newest published ``(version, directory)`` under ``root``, or ``None`` if nothing is published yet."""
    marker = Path(root) / LATEST
    if not marker.is_file():
        return None
    text = marker.read_text().strip()
    if not text.isdigit():
        raise CheckpointError(f"{str(marker)!r}: expected a version number, got {text[:40]!r}")
    version = int(text)
    return version, version_dir(root, version)


def _fsync_tree(path: Path) -> None:
    for item in sorted(path.rglob("*")):
        if item.is_file():
            fd = os.open(item, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    _fsync_dir(path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class CheckpointPublisher:
    """Publish each version as ``root/vNNNNNNNN/`` (model, and the tokenizer if given); keep the newest ``keep``.

    ``fsync`` (default on) flushes files and directories before each rename, so
    the guarantee holds across a power loss too, not only a killed process.

    >>> pub = CheckpointPublisher("runs/r1/weights", tokenizer=tok)   # doctest: +SKIP
    >>> trainer = Trainer(model, loss_cfg, cfg, publisher=pub)         # doctest: +SKIP
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        tokenizer: PreTrainedTokenizerBase | None = None,
        keep: int = 2,
        fsync: bool = True,
    ) -> None:
        if keep < 1:
            raise LearnerConfigError(f"CheckpointPublisher.keep: expected >= 1, got {keep}")
        self.root = Path(root)
        self.tokenizer = tokenizer
        self.keep = keep
        self.fsync = fsync

    def __call__(self, model: PolicyModel, version: int) -> str:
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise LearnerConfigError(f"CheckpointPublisher: version must be an int >= 0, got {version!r}")
        current = latest_version(self.root)
        if current is not None and version < current[0]:
            raise LearnerConfigError(
                f"CheckpointPublisher: version {version} is older than LATEST {current[0]} in {str(self.root)!r}; "
                "versions only grow (continue from LATEST, or publish into a fresh root)"
            )
        self.root.mkdir(parents=True, exist_ok=True)
        final = version_dir(self.root, version)
        tmp = final.with_name(final.name + ".tmp")
        old = final.with_name(final.name + ".old")
        shutil.rmtree(tmp, ignore_errors=True)
        model.save(tmp)
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(str(tmp))
        if self.fsync:
            _fsync_tree(tmp)
        if final.exists():  # the same version again: move the old copy aside, never delete it first
            shutil.rmtree(old, ignore_errors=True)
            final.rename(old)
        tmp.rename(final)
        marker_tmp = self.root / (LATEST + ".tmp")
        with marker_tmp.open("w") as f:
            f.write(f"{version}\n")
            if self.fsync:
                f.flush()
                os.fsync(f.fileno())
        marker_tmp.replace(self.root / LATEST)
        if self.fsync:
            _fsync_dir(self.root)
        # Last: what is no longer published (older versions, leftovers of a crashed write).
        versions = sorted(p for p in self.root.glob(_VERSION_GLOB) if p.is_dir())
        for stale in versions[: -self.keep]:
            shutil.rmtree(stale, ignore_errors=True)
        for leftover in [*self.root.glob(_VERSION_GLOB + ".tmp"), *self.root.glob(_VERSION_GLOB + ".old")]:
            shutil.rmtree(leftover, ignore_errors=True)
        return str(final)


def _server_root(url: str) -> str:
    """``http://host:port`` from a server URL given with or without the OpenAI ``/v1`` suffix."""
    base = url.rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


class ServerReloadPublisher:
    """Write each version with a ``CheckpointPublisher``, then have every server in ``servers`` load it.

    Each server gets ``POST {server}/update_weights_from_disk {"model_path", "version"}``
    (``servers`` may be given as the OpenAI base URLs, ``http://host:port/v1``),
    all at once, each within ``timeout_s``. Returns the checkpoint path once all
    have loaded it; otherwise raises ``PublishError`` naming every server that
    did not and why (connection refused, no answer in time, its HTTP error);
    the others are on the new version. The servers must see ``root`` at the
    same path (one machine, or a shared filesystem). ``last_reloads`` holds each
    server's answer to the last call (its ``load_s``, ``pause_s``...).

    >>> pub = ServerReloadPublisher("runs/r1/weights", ["http://127.0.0.1:8000/v1"], tokenizer=tok)  # doctest: +SKIP
    >>> pub(model, version=3)   # every server now samples with version 3
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        servers: Sequence[str],
        *,
        tokenizer: PreTrainedTokenizerBase | None = None,
        keep: int = 2,
        timeout_s: float = 300.0,
        fsync: bool = True,
    ) -> None:
        if isinstance(servers, str) or not servers:
            raise LearnerConfigError(f"ServerReloadPublisher.servers: expected a non-empty list of URLs, got {servers!r}")
        for i, url in enumerate(servers):
            if not isinstance(url, str) or not url.startswith(("http://", "https://")):
                raise LearnerConfigError(f"ServerReloadPublisher.servers[{i}]: expected an http(s):// URL, got {url!r}")
        if timeout_s <= 0:
            raise LearnerConfigError(f"ServerReloadPublisher.timeout_s: expected > 0, got {timeout_s}")
        self.checkpoint = CheckpointPublisher(root, tokenizer=tokenizer, keep=keep, fsync=fsync)
        self.servers = [_server_root(u) for u in servers]
        self.timeout_s = float(timeout_s)
        self.last_reloads: dict[str, dict[str, Any]] = {}

    def __call__(self, model: PolicyModel, version: int) -> str:
        path = self.checkpoint(model, version)
        model_path = str(Path(path).resolve())
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(16, len(self.servers))) as pool:
            outcomes = list(pool.map(lambda s: self._reload(s, model_path, version), self.servers))
        self.last_reloads = {s: body for s, (body, _) in zip(self.servers, outcomes) if body is not None}
        failed = {s: why for s, (_, why) in zip(self.servers, outcomes) if why is not None}
        if failed:
            causes = "; ".join(f"{s}: {why}" for s, why in failed.items())
            raise PublishError(
                f"ServerReloadPublisher: version {version} is written to {path}, but {len(failed)} of "
                f"{len(self.servers)} server(s) did not load it: {causes}",
                path, failed,
            )
        return path

    def _reload(self, server: str, model_path: str, version: int) -> tuple[dict[str, Any] | None, str | None]:
        answer, why, _ = reload_from_disk(server, model_path, version, self.timeout_s)
        return answer, why


def reload_from_disk(
    url: str, model_path: str, version: int, timeout_s: float, headers: Mapping[str, str] | None = None,
) -> tuple[dict[str, Any] | None, str | None, bool]:
    """``POST /update_weights_from_disk`` (SGLang's route) to the server at ``url``: ``(answer, None, False)`` when it
    loaded ``version`` from ``model_path``, else ``(None, why, unreachable)``; ``unreachable``: the connection failed
    (refused, reset), not the server's answer."""
    import httpx

    # The server gives up draining before this client gives up waiting, so its answer (503) arrives.
    body = {"model_path": model_path, "version": version, "drain_timeout_s": timeout_s * 0.9}
    start = time.monotonic()
    try:
        resp = httpx.post(f"{url}/update_weights_from_disk", json=body, timeout=timeout_s, headers=dict(headers or {}))
    except httpx.TimeoutException:
        return None, f"no answer within {timeout_s}s", False
    except httpx.HTTPError as exc:
        return None, f"connection failed ({type(exc).__name__}: {exc})", True
    try:
        answer = resp.json()
    except ValueError:
        answer = None
    if resp.status_code != 200:
        message = answer.get("message") if isinstance(answer, dict) else None
        return None, f"HTTP {resp.status_code}: {message or resp.text[:300]}", False
    if not isinstance(answer, dict) or answer.get("success") is not True or answer.get("version") != version:
        return None, f"unexpected answer {resp.text[:300]!r} (expected success and version {version})", False
    answer["request_s"] = round(time.monotonic() - start, 4)
    return answer, None, False


_TO_NUMPY = {torch.bfloat16: torch.int16}  # numpy has no bfloat16: carried bit for bit as int16


def to_shareable(state: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """A state dict as numpy arrays (``ray.put`` it once; each ``ray.get`` maps it without a copy).

    Tensors sharing storage (tied embeddings) are carried once.
    """
    arrays: dict[str, np.ndarray] = {}
    dtypes: dict[str, str] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple[int, int, tuple[int, ...]], str] = {}
    for name, t in state.items():
        key = (t.untyped_storage().data_ptr(), int(t.storage_offset()), tuple(int(d) for d in t.shape))
        if key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        flat = t.detach().to("cpu").contiguous()
        carrier = _TO_NUMPY.get(flat.dtype)
        arrays[name] = (flat.view(carrier) if carrier is not None else flat).numpy()
        dtypes[name] = str(flat.dtype).removeprefix("torch.")
    return {"arrays": arrays, "dtypes": dtypes, "aliases": aliases}


def from_shareable(shared: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The state dict ``to_shareable`` made, as tensors viewing the (read-only) arrays: load it, do not write it."""
    out: dict[str, torch.Tensor] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # read-only arrays from the object store: only read here
        for name, arr in shared["arrays"].items():
            t = torch.from_numpy(arr)
            dtype = getattr(torch, shared["dtypes"][name])
            out[name] = t.view(dtype) if t.dtype != dtype else t
    for name, source in shared["aliases"].items():
        out[name] = out[source]
    return out
