"""vLLM's weight-transfer routes on ``agentenv serve``: a learner broadcasts new weights into the server's engine.

Added by ``rollout.serve.create_app`` (``add_transfer_routes``). The routes and
payloads are vLLM's RL weight-sync control plane (``vllm/entrypoints/serve/dev/rlhf``,
driven by ``HTTPVLLMWeightSyncClient``): the two-phase protocol of vLLM 0.22-0.24
(init, then ``update_weights`` applies at once) and the four-phase one of vLLM
>= 0.25 (init / start / update / finish). The data travels over a
``torch.distributed`` group (``rollout.weight_transfer.TransferGroup``), never
over HTTP; HTTP carries the metadata.

``GET /get_world_size`` -> ``{"world_size": 1}`` (the ranks this server adds to a group).

``POST /init_weight_transfer_engine {"init_info": {"master_address", "master_port", "rank_offset", "world_size",
"backend"?, "timeout_s"?}}``: join the learner's group as rank ``rank_offset`` (the learner is rank 0 and hosts
the store). ``backend`` (ours): ``gloo`` (default on CPU) or ``nccl`` (default on CUDA); ``timeout_s`` (ours,
default 120) bounds the join and every later broadcast. Returns once every rank met; a learner that never comes
is a 504 after ``timeout_s``. Calling it again replaces the group.

``POST /start_weight_update {"is_checkpoint_format"?: bool, "version"?: int}``: begin staging an update.

``POST /update_weights {"update_info": {"names": [...], "dtype_names": [...], "shapes": [[...]], "packed"?,
"bucket_bytes"?, "version"?}}``: checked against the served model first (a 400 naming the field and the tensor:
an unknown name, a wrong shape or dtype, lists of different lengths), then received from the broadcast into
staging buffers (packed into buckets of ``bucket_bytes``, default 256 MiB; ``packed: false`` is refused: packing
is how this server receives). Serving goes on meanwhile. Without a ``start`` it is applied at once (vLLM 0.22).

``POST /finish_weight_update {"version"?: int}``: the staged tensors are copied into the engine's (``copy_``:
captured CUDA graphs stay valid) as ``version`` (default: the loaded one + 1; older than the loaded one is a
409). Requests in flight finish on the old weights first, unless the server is paused with ``mode=keep``: then
they resume on the new weights after ``/resume``, their tokens' versions split at the update.

``GET /weights_sha256`` -> ``{"weights_sha256", "version"}``: a SHA-256 of the served state dict
(``rollout.weight_transfer.weights_sha256``; also in ``/get_model_info``), to check that servers hold the
learner's weights.

IPC (vLLM's ``backend: "ipc"``) is not served over HTTP: its handles are pickles, which this server does not
unpickle from the network. A colocated process uses ``rollout.weight_transfer.ipc_handles`` over a local pipe.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rollout.engine_routes import error_response
from rollout.weight_transfer import (
    DEFAULT_BUCKET_BYTES,
    InitInfo,
    TransferError,
    TransferRequestError,
    TransferTimeout,
    WeightReceiver,
)

__all__ = ["InitRequest", "UpdateInfo", "add_transfer_routes"]


class _InitInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")

    master_address: str
    master_port: int = Field(ge=1, le=65535)
    rank_offset: int = Field(ge=1)
    world_size: int = Field(ge=2)
    backend: str | None = None
    timeout_s: float = Field(default=120.0, gt=0)


class InitRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    init_info: _InitInfo


class StartRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    is_checkpoint_format: bool = True
    version: int | None = Field(default=None, ge=0)


class UpdateInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]
    packed: bool = True
    bucket_bytes: int = Field(default=DEFAULT_BUCKET_BYTES, ge=1 << 10)
    version: int | None = Field(default=None, ge=0)
    is_checkpoint_format: bool = True


class UpdateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    update_info: UpdateInfo


class FinishRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int | None = Field(default=None, ge=0)


def _parse(model: type[BaseModel], body: Any) -> BaseModel | JSONResponse:
    try:
        return model.model_validate(body if body is not None else {})
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "body"
        return error_response(400, f"{field}: {first['msg']}", field)


def _failed(exc: TransferError) -> JSONResponse:
    if isinstance(exc, TransferRequestError):
        return error_response(409 if exc.field == "version" else 400, str(exc), exc.field)
    if isinstance(exc, TransferTimeout):
        return error_response(504, str(exc), "init_info.timeout_s")
    return error_response(502, str(exc))


def add_transfer_routes(app: FastAPI, policy: Any, on_loaded: Callable[[int], None] | None = None) -> WeightReceiver:
    """Register the routes above for ``policy`` (an ``HFPolicy``); returns its ``WeightReceiver``.

    ``on_loaded(version)`` runs after each applied update (the server records where its weights came from).
    """
    device = next(policy.model.parameters()).device
    receiver = WeightReceiver(policy.model, policy.load_state_dict, lambda: int(policy.version), device)

    @app.get("/get_world_size")
    async def world_size() -> Any:
        return {"world_size": 1}

    @app.post("/init_weight_transfer_engine")
    async def init(body: dict[str, Any] | None = None) -> Any:
        req = _parse(InitRequest, body)
        if isinstance(req, JSONResponse):
            return req
        assert isinstance(req, InitRequest)
        i = req.init_info
        backend = i.backend or ("nccl" if device.type == "cuda" else "gloo")
        if backend == "ipc":
            return error_response(400, "init_info.backend: ipc is not served over HTTP (its handles are pickles); use nccl or "
                               "gloo, or rollout.weight_transfer.ipc_handles from a colocated process",
                          "init_info.backend")
        if backend not in ("gloo", "nccl") or (backend == "nccl" and device.type != "cuda"):
            return error_response(400, f"init_info.backend: expected gloo{' or nccl' if device.type == 'cuda' else ''} for a "
                               f"model on {device.type}, got {backend!r}", "init_info.backend")
        if i.rank_offset >= i.world_size:
            return error_response(400, f"init_info.rank_offset: {i.rank_offset} must be below world_size {i.world_size}",
                          "init_info.rank_offset")
        info = InitInfo(i.master_address, i.master_port, i.rank_offset, i.world_size, backend,  # type: ignore[arg-type]
                        i.timeout_s)
        try:
            await asyncio.to_thread(receiver.init, info)
        except TransferError as exc:
            return _failed(exc)
        return {"success": True, "rank": i.rank_offset, "world_size": i.world_size, "backend": backend}

    @app.post("/start_weight_update")
    async def start(body: dict[str, Any] | None = None) -> Any:
        req = _parse(StartRequest, body)
        if isinstance(req, JSONResponse):
            return req
        assert isinstance(req, StartRequest)
        if req.version is not None and req.version < policy.version:
            return error_response(409, f"version: {req.version} is older than the loaded version {policy.version}; versions "
                               "only grow", "version")
        receiver.start(req.version)
        return {"success": True}

    @app.post("/update_weights")
    async def update(body: dict[str, Any] | None = None) -> Any:
        req = _parse(UpdateRequest, body)
        if isinstance(req, JSONResponse):
            return req
        assert isinstance(req, UpdateRequest)
        u = req.update_info
        if not u.packed:
            return error_response(400, "update_info.packed: only packed transfers are received (true)", "update_info.packed")
        try:
            n = await asyncio.to_thread(receiver.update, u.names, u.dtype_names, u.shapes, bucket_bytes=u.bucket_bytes,
                                        version=u.version)
        except TransferError as exc:
            return _failed(exc)
        if on_loaded is not None and not receiver.staging:
            on_loaded(policy.version)
        return {"success": True, "received": n, "version": policy.version}

    @app.post("/finish_weight_update")
    async def finish(body: dict[str, Any] | None = None) -> Any:
        req = _parse(FinishRequest, body)
        if isinstance(req, JSONResponse):
            return req
        assert isinstance(req, FinishRequest)
        previous = policy.version
        try:
            version = await asyncio.to_thread(receiver.finish, req.version)
        except TransferError as exc:
            return _failed(exc)
        if on_loaded is not None:
            on_loaded(version)
        return {"success": True, "version": version, "previous_version": previous}

    @app.get("/weights_sha256")
    async def sha256() -> Any:
        digest = await asyncio.to_thread(receiver.sha256)
        return {"weights_sha256": digest, "version": policy.version}

    return receiver
