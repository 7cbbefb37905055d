"""The gateway's HTTP server: three model APIs in front of any ``Policy``, one session per listener.

Each episode gets its own listener -- a Unix socket that is mounted into that
episode's sandbox only (or a loopback port in tests) -- bound to its own
``Session``. No route names a session, so a sandbox can reach its own episode's
record and nothing else. Routes::

    POST /v1/messages                 Anthropic Messages (stream or not); ?beta=true accepted
    POST /v1/messages/count_tokens    Anthropic token count (not recorded)
    POST /v1/responses                OpenAI Responses (stream or not)
    POST /v1/chat/completions         OpenAI chat completions (stream or not)
    GET  /v1/models                   the one model name served
    HEAD|GET /                        liveness (Claude Code probes HEAD /api/hello without the offline flags)

Bounds (issue 26): a body over ``MAX_BODY_BYTES`` is a 413 naming the limit,
refused on its declared length before it is read, or as soon as the stream
passes it; at most ``MAX_CONNECTIONS`` connections and requests at a time
(uvicorn's ``limit_concurrency``: past it, 503); token counting runs in a
worker thread, never on the event loop; with ``token=``, every request must
present it (``Authorization: Bearer`` or ``x-api-key``), else 401; with
``owner=`` (the sandbox user's uid and gid), the socket (0600) and its folder
(0700) belong to that user alone.

Bad input never crashes the server: a malformed body is a 400 in the API's own
error shape, a policy failure a 500 (``api_error`` / ``server_error``), a spent
turn budget a 429, and the session keeps every record it had.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from rollout.gateway import replies
from rollout.gateway.session import BudgetSpent, PromptTooLong, Session
from rollout.gateway.types import Api, GatewayError
from rollout.gateway.wire import READERS, Conversation
from rollout.policy.types import PolicyError

log = logging.getLogger(__name__)


MAX_BODY_BYTES = 32 << 20  # a request body past this is refused (413) before it is read in full
_CLOSE = {"Connection": "close"}  # after a 413: the rest of the body is never read
MAX_CONNECTIONS = 32  # concurrent connections and requests of one episode's listener; past it, 503


class BodyTooLarge(ValueError):
    """A request body over ``MAX_BODY_BYTES``."""


async def read_body(request: Request, limit: int = MAX_BODY_BYTES) -> bytes:
    """The request body, refused as soon as it is known to exceed ``limit`` (never read in full)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"request body of {declared} bytes is over the gateway's limit of {limit} bytes (MAX_BODY_BYTES)")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"request body is over the gateway's limit of {limit} bytes (MAX_BODY_BYTES)")
        chunks.append(chunk)
    return b"".join(chunks)


def _presented_token(request: Request) -> str:
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return request.headers.get("x-api-key", "")


def make_app(session: Session, model_name: str = "agentenv-policy", token: str | None = None) -> FastAPI:
    """The ASGI app of one session; with ``token``, every request must present it (401 otherwise)."""
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

    @app.middleware("http")
    async def bounds(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if token is not None and not hmac.compare_digest(_presented_token(request).encode(), token.encode()):
            return JSONResponse(replies.anthropic_error("authentication_error", "missing or wrong gateway token"), status_code=401)
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            msg = f"request body of {declared} bytes is over the gateway's limit of {MAX_BODY_BYTES} bytes (MAX_BODY_BYTES)"
            return JSONResponse(replies.anthropic_error("request_too_large", msg), status_code=413, headers=_CLOSE)
        return await call_next(request)

    async def handle(request: Request, api: Api, write: Callable[[Conversation, Any], Response]) -> Response:
        anthropic = api is Api.ANTHROPIC
        t0 = time.monotonic()
        try:
            body = json.loads(await read_body(request))
            conv = READERS[api](body)
        except BodyTooLarge as exc:
            err = replies.anthropic_error("request_too_large", str(exc)) if anthropic else replies.openai_error("invalid_request_error", str(exc))
            return JSONResponse(err, status_code=413, headers=_CLOSE)
        except (ValueError, RecursionError) as exc:  # JSON errors, GatewayError
            param = getattr(exc, "param", "")
            log.warning("session %s: %s request refused (400): %s", session.id, api.value, exc)
            err = replies.anthropic_error("invalid_request_error", str(exc)) if anthropic else replies.openai_error("invalid_request_error", str(exc), param)
            return JSONResponse(err, status_code=400)
        try:
            reply, record = await session.call(conv)
        except BudgetSpent as exc:
            err = replies.anthropic_error("rate_limit_error", str(exc)) if anthropic else replies.openai_error("rate_limit_exceeded", str(exc))
            return JSONResponse(err, status_code=429)
        except PromptTooLong as exc:
            log.warning("session %s: %s", session.id, exc)
            err = replies.anthropic_error("invalid_request_error", str(exc)) if anthropic else replies.openai_error("context_length_exceeded", str(exc))
            return JSONResponse(err, status_code=400)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - PolicyError or a policy bug: the API's 500, the server lives on
            why = str(exc) if isinstance(exc, PolicyError) else f"{type(exc).__name__}: {exc}"
            log.warning("session %s: policy failed: %s", session.id, why)
            err = replies.anthropic_error("api_error", why) if anthropic else replies.openai_error("server_error", why)
            return JSONResponse(err, status_code=500)
        response = write(conv, reply)
        record.extra["gateway_s"] = time.monotonic() - t0  # read, splice, policy, reply: the gateway's share is this less latency_s
        return response

    def _stream(chunks: Any) -> StreamingResponse:
        return StreamingResponse(chunks, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    @app.post("/v1/messages")
    async def messages(request: Request) -> Response:
        def write(conv: Conversation, reply: Any) -> Response:
            model = conv.model or model_name
            if conv.stream:
                return _stream(replies.anthropic_stream(reply, model))
            return JSONResponse(replies.anthropic_body(reply, model))

        return await handle(request, Api.ANTHROPIC, write)

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request) -> Response:
        try:
            conv = READERS[Api.ANTHROPIC](json.loads(await read_body(request)))

            def count() -> int:  # seconds for a multi-megatoken prompt: off the event loop every session shares
                text = session.tok.apply_chat_template(conv.messages, tools=conv.tools or None, tokenize=False, add_generation_prompt=True)
                return len(session.tok.encode(text, add_special_tokens=False))

            return JSONResponse({"input_tokens": await asyncio.to_thread(count)})
        except BodyTooLarge as exc:
            return JSONResponse(replies.anthropic_error("request_too_large", str(exc)), status_code=413, headers=_CLOSE)
        except (ValueError, RecursionError) as exc:
            return JSONResponse(replies.anthropic_error("invalid_request_error", str(exc)), status_code=400)

    @app.post("/v1/responses")
    async def responses(request: Request) -> Response:
        def write(conv: Conversation, reply: Any) -> Response:
            model, rid = conv.model or model_name, "resp_" + reply.message_id[4:]
            if conv.stream:
                return _stream(replies.responses_stream(reply, model, rid))
            return JSONResponse(replies.responses_body(reply, model, rid))

        return await handle(request, Api.RESPONSES, write)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        def write(conv: Conversation, reply: Any) -> Response:
            model, cid = conv.model or model_name, "chatcmpl-" + reply.message_id[4:]
            if conv.stream:
                return _stream(replies.chat_stream(reply, model, cid, conv.include_usage))
            return JSONResponse(replies.chat_body(reply, model, cid))

        return await handle(request, Api.CHAT, write)

    @app.get("/v1/models")
    async def models() -> Response:
        return JSONResponse({"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "agentenv"}]})

    @app.api_route("/", methods=["GET", "HEAD"])
    @app.api_route("/api/hello", methods=["GET", "HEAD"])
    async def hello() -> Response:
        return Response(status_code=200)

    return app


class GatewayServer:
    """Serves one session's app on a Unix socket (``uds``) or a loopback port, in the caller's event loop.

    >>> server = GatewayServer(session, uds="/tmp/ep/gw.sock")          # doctest: +SKIP
    >>> await server.start(); ...; await server.stop()
    """

    def __init__(
        self, session: Session, *, uds: str | os.PathLike[str] | None = None, port: int | None = None,
        model_name: str = "agentenv-policy", token: str | None = None, owner: tuple[int, int] | None = None,
    ) -> None:
        import uvicorn

        if (uds is None) == (port is None):
            raise GatewayError("GatewayServer: give exactly one of uds= or port=", "uds")
        self.session = session
        self.owner = owner
        self.uds = str(uds) if uds is not None else None
        self.port = port
        self._sock: socket.socket | None = None
        if self.uds is None:
            self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._sock.bind(("127.0.0.1", port or 0))
            self.port = self._sock.getsockname()[1]
        config = uvicorn.Config(make_app(session, model_name, token), uds=self.uds, log_level="warning", lifespan="off",
                                access_log=False, timeout_keep_alive=30, limit_concurrency=MAX_CONNECTIONS)
        self._server = uvicorn.Server(config)
        self._task: asyncio.Task[None] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        if self.uds is not None:
            Path(self.uds).unlink(missing_ok=True)
        sockets = [self._sock] if self._sock is not None else None
        self._task = asyncio.create_task(self._server.serve(sockets=sockets))
        while not self._server.started:
            if self._task.done():
                self._task.result()
                raise GatewayError("gateway server stopped while starting")
            await asyncio.sleep(0.005)
        if self.uds is not None:
            self._private()

    def _private(self) -> None:
        """With ``owner`` (the sandbox user's uid, gid): the socket and its folder are that user's alone
        (0600 / 0700), so no other host user reaches them; without, the socket is 0666 in its folder."""
        assert self.uds is not None
        if self.owner is None:
            os.chmod(self.uds, 0o666)
            return
        folder = os.path.dirname(self.uds)
        uid, gid = self.owner
        for path, mode in ((self.uds, 0o600), (folder, 0o700)):
            os.chown(path, uid, gid, follow_symlinks=False)
            os.chmod(path, mode, follow_symlinks=False)

    async def stop(self) -> None:
        self._server.should_exit = True
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, timeout=10)
            except (TimeoutError, asyncio.CancelledError):
                self._task.cancel()
        if self.uds is not None:
            Path(self.uds).unlink(missing_ok=True)


class ThreadedGateway:
    """A ``GatewayServer`` on its own event loop in a thread: for synchronous callers (tests, scripts)."""

    def __init__(self, session: Session, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="gateway", daemon=True)
        self._thread.start()
        self.server = self._run(self._make(session, kwargs))
        self._run(self.server.start())

    async def _make(self, session: Session, kwargs: dict[str, Any]) -> GatewayServer:
        return GatewayServer(session, **kwargs)

    def _run(self, coro: Awaitable[Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=60)  # type: ignore[arg-type]

    @property
    def base_url(self) -> str:
        return self.server.base_url

    def close(self) -> None:
        try:
            self._run(self.server.stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()

    def __enter__(self) -> ThreadedGateway:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


__all__ = ["MAX_BODY_BYTES", "MAX_CONNECTIONS", "BodyTooLarge", "GatewayServer", "ThreadedGateway", "make_app", "read_body"]
