"""``BroadcastPublisher``: each new version broadcast from the learner into every inference server's engine.

The learner is rank 0 of a ``torch.distributed`` group (gloo on CPU, NCCL on
GPU; ``rollout.weight_transfer.TransferGroup``) whose other ranks are the
servers, which join it when told to over HTTP. The control plane is vLLM's
weight-transfer routes (``rollout.serve_transfer``; the same a vLLM >= 0.25
server speaks): once, ``POST /init_weight_transfer_engine`` to every server
while the learner joins as rank 0; then per version ``/start_weight_update``,
``/update_weights`` (metadata) to every server while the learner broadcasts
the packed tensors, and ``/finish_weight_update`` (every server copies the
staged tensors into its engine). Nothing is written to disk.

Every step has ``timeout_s``: a server that is down, never joins, dies or hangs
mid-broadcast makes the publish raise ``PublishError`` naming its URL within
about ``timeout_s`` (sooner when its HTTP call fails at once); the group is
then dropped and the next publish builds a new one. The servers that finished
before the failure hold the new version.

>>> pub = BroadcastPublisher(["http://127.0.0.1:8000/v1", "http://127.0.0.1:8001/v1"], "gloo")   # doctest: +SKIP
>>> pub(model, version=3)        # both servers now sample with version 3
>>> pub.close()
"""

from __future__ import annotations

import concurrent.futures
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import torch

from learner.errors import LearnerConfigError
from learner.publish import PublishError
from rollout.weight_transfer import (
    DEFAULT_BUCKET_BYTES,
    TensorMeta,
    TransferError,
    TransferGroup,
    plan,
    send_state,
)

__all__ = ["BroadcastPublisher", "free_port"]


def _root(url: str) -> str:
    """``http://host:port`` from a server URL given with or without the OpenAI ``/v1`` suffix."""
    base = url.rstrip("/")
    return base.removesuffix("/v1")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (for the group's store)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class BroadcastPublisher:
    """Publish a model's weights to every server in ``urls`` over a ``backend`` broadcast; see the module docstring.

    ``urls``: the servers (``http://host:port`` or the OpenAI base ``.../v1``).
    ``backend``: ``gloo`` (CPU tensors; the model may be anywhere) or ``nccl``
    (the model's CUDA device). ``master_address``: where the servers reach this
    process (default loopback); ``master_port``: the group's store port (default:
    a free one, new for each group). ``dtype``: cast floating tensors to it before
    sending (e.g. an fp32 learner feeding bf16 servers; default: as they are).
    ``api_key``: sent as ``Authorization: Bearer`` (``agentenv serve --api-key``).
    Callable as a ``learner.publish.WeightPublisher``; returns ``"broadcast:vN"``.
    ``last_publish`` holds the last call's timings.
    """

    def __init__(
        self,
        urls: Sequence[str],
        backend: Literal["gloo", "nccl"] = "gloo",
        timeout_s: float = 120.0,
        api_key: str | None = None,
        *,
        master_address: str = "127.0.0.1",
        master_port: int | None = None,
        dtype: torch.dtype | None = None,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    ) -> None:
        if isinstance(urls, str) or not urls:
            raise LearnerConfigError(f"BroadcastPublisher.urls: expected a non-empty list of URLs, got {urls!r}")
        for i, url in enumerate(urls):
            if not isinstance(url, str) or not url.startswith(("http://", "https://")):
                raise LearnerConfigError(f"BroadcastPublisher.urls[{i}]: expected an http(s):// URL, got {url!r}")
        if backend not in ("gloo", "nccl"):
            raise LearnerConfigError(f"BroadcastPublisher.backend: expected gloo or nccl, got {backend!r}")
        if timeout_s <= 0:
            raise LearnerConfigError(f"BroadcastPublisher.timeout_s: expected > 0, got {timeout_s}")
        self.urls = [_root(u) for u in urls]
        self.backend: Literal["gloo", "nccl"] = backend
        self.timeout_s = float(timeout_s)
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.master_address = master_address
        self.master_port = master_port
        self.dtype = dtype
        self.bucket_bytes = int(bucket_bytes)
        self.group: TransferGroup | None = None
        self.last_publish: dict[str, float] = {}
        import httpx

        # One client for every call: a fresh one per request costs ~70 ms (an SSL context), more than a tiny broadcast.
        self._http = httpx.Client(headers=self.headers, limits=httpx.Limits(max_connections=2 * len(self.urls) + 4))
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=min(32, len(self.urls) + 1),
                                                           thread_name_prefix="broadcast-publisher")

    # ------------------------------------------------------------ HTTP

    def _post(self, url: str, route: str, body: Mapping[str, Any], timeout_s: float) -> dict[str, Any]:
        """POST ``body`` to ``url/route``; the answer, or ``RuntimeError`` with why (raised in a pool thread)."""
        import httpx

        try:
            resp = self._http.post(f"{url}/{route}", json=dict(body), timeout=timeout_s)
        except httpx.TimeoutException as exc:
            raise RuntimeError(f"{route}: no answer within {timeout_s:.0f}s") from exc
        except httpx.HTTPError as exc:
            raise RuntimeError(f"{route}: connection failed ({type(exc).__name__}: {exc})") from exc
        try:
            answer = resp.json()
        except ValueError:
            answer = None
        if resp.status_code != 200 or not isinstance(answer, dict) or answer.get("success") is False:
            message = answer.get("message") if isinstance(answer, dict) else None
            raise RuntimeError(f"{route}: HTTP {resp.status_code}: {message or resp.text[:300]}")
        return answer

    def _all(self, route: str, body: Callable[[int], Mapping[str, Any]], timeout_s: float,
             local: Callable[[], None] | None = None) -> tuple[list[dict[str, Any] | None], dict[str, str]]:
        """``route`` on every server at once (``body(i)`` for server i) while ``local`` runs here.

        Returns the answers and ``{url: why}`` for each failure (``"learner"`` for ``local``'s). A server failing
        fast is reported without waiting for ``local`` (it would only time out: that server will not join).
        """
        futures = {self._pool.submit(self._post, u, route, body(i), timeout_s): u for i, u in enumerate(self.urls)}
        local_f = self._pool.submit(local) if local is not None else None
        failed: dict[str, str] = {}
        answers: dict[str, dict[str, Any]] = {}
        pending: set[concurrent.futures.Future[Any]] = set(futures) | ({local_f} if local_f is not None else set())
        while pending:
            done, pending = concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)
            for f in done:
                exc = f.exception()
                if f is local_f:
                    if exc is not None:
                        failed["learner"] = str(exc)
                    continue
                if exc is not None:
                    failed[futures[f]] = str(exc)
                else:
                    answers[futures[f]] = f.result()
            if failed and local_f is not None and local_f in pending:
                break  # a server that failed will not join or receive: the learner's side can only time out
        return [answers.get(u) for u in self.urls], failed

    def _raise(self, version: int, doing: str, failed: Mapping[str, str]) -> None:
        if self.group is not None:
            self.group.broken = True  # a broadcast may still be in flight on it: dropped, never shut down
        self.close()
        servers = {u: why for u, why in failed.items() if u != "learner"}
        causes = "; ".join(f"{u}: {why}" for u, why in failed.items())
        raise PublishError(
            f"BroadcastPublisher: version {version} not published ({doing}) to {len(servers) or 'all'} of "
            f"{len(self.urls)} server(s): {causes}",
            "", servers or {u: failed.get("learner", "?") for u in self.urls},
        )

    # ------------------------------------------------------------ publish

    def connect(self, device: torch.device | str | None = None) -> None:
        """Form the group now (``__call__`` does it on first use): every server joins, this process is rank 0."""
        port = self.master_port or free_port(self.master_address)
        world = len(self.urls) + 1
        dev = torch.device(device) if device is not None else torch.device("cuda" if self.backend == "nccl" else "cpu")
        made: dict[str, TransferGroup] = {}

        def join() -> None:
            made["group"] = TransferGroup(self.backend, self.master_address, port, rank=0, world_size=world,
                                          timeout_s=self.timeout_s, device=dev)

        def body(i: int) -> dict[str, Any]:
            return {"init_info": {"master_address": self.master_address, "master_port": port, "rank_offset": i + 1,
                                  "world_size": world, "backend": self.backend, "timeout_s": self.timeout_s}}

        _, failed = self._all("init_weight_transfer_engine", body, self.timeout_s + 10, local=join)
        if failed or "group" not in made:
            self._raise(-1, "joining the group", failed or {"learner": "the group was not formed"})
        self.group = made["group"]

    def __call__(self, model: torch.nn.Module, version: int) -> str:
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise LearnerConfigError(f"BroadcastPublisher: version must be an int >= 0, got {version!r}")
        lm = getattr(model, "lm", model)  # a learner.model.PolicyModel wraps the served model's state as .lm
        state = {k: v.detach() for k, v in lm.state_dict().items()}
        device = next(lm.parameters()).device
        start = time.monotonic()
        if self.group is None:
            try:
                self.connect(device if self.backend == "nccl" else None)
            except PublishError as exc:
                raise PublishError(str(exc).replace("version -1", f"version {version}"), "", exc.failed) from exc
        assert self.group is not None
        joined = time.monotonic()
        metas, _ = plan(state)
        if self.dtype is not None:
            metas = [TensorMeta(m.name, str(self.dtype).removeprefix("torch."), m.shape)
                     if state[m.name].is_floating_point() else m for m in metas]
        group = self.group
        _, failed = self._all("start_weight_update", lambda i: {"is_checkpoint_format": True, "version": version},
                              self.timeout_s)
        if failed:
            self._raise(version, "start_weight_update", failed)
        info = {"update_info": {"names": [m.name for m in metas], "dtype_names": [m.dtype for m in metas],
                                "shapes": [list(m.shape) for m in metas], "packed": True,
                                "bucket_bytes": self.bucket_bytes, "version": version}}

        def broadcast() -> None:
            try:
                send_state(group, metas, state, self.bucket_bytes)
            except TransferError as exc:
                raise RuntimeError(str(exc)) from exc

        _, failed = self._all("update_weights", lambda i: info, self.timeout_s + 10, local=broadcast)
        if failed:
            self._raise(version, "update_weights", failed)
        sent = time.monotonic()
        answers, failed = self._all("finish_weight_update", lambda i: {"version": version}, self.timeout_s + 10)
        if failed:
            self._raise(version, "finish_weight_update", failed)
        wrong = {u: f"finished as version {a.get('version') if a else None}, expected {version}"
                 for u, a in zip(self.urls, answers) if not a or a.get("version") != version}
        if wrong:
            self._raise(version, "finish_weight_update", wrong)
        end = time.monotonic()
        self.last_publish = {"join_s": joined - start, "send_s": sent - joined, "finish_s": end - sent,
                             "total_s": end - start}
        return f"broadcast:v{version}"

    def close(self) -> None:
        """Leave the group (the servers' sides fail their next transfer and re-join on the next ``connect``)."""
        if self.group is not None:
            self.group.close()
            self.group = None
