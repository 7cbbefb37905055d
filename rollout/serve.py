"""``agentenv serve MODEL``: a local HF model behind an OpenAI-compatible HTTP API.

Why: the production path talks to vLLM / SGLang over HTTP; serving the tiny
local model the same way lets the HTTP path (``OpenAIPolicy``, the official
``openai`` client) be tested for real, and lets local tools point at a model
under training. Sampling is ``HFPolicy``'s, so a request with a seed returns the
same tokens and logprobs as ``HFPolicy.generate`` in-process.

Endpoints: ``GET /v1/models``, ``POST /v1/chat/completions`` (messages + tools
rendered with the tokenizer's chat template; the reply carries parsed
``tool_calls``, ``reasoning_content``, ``logprobs.content``), ``POST
/v1/completions`` (prompt as text or token ids). Beyond OpenAI, as vLLM names
them: ``prompt_token_ids`` (response, and each completions choice) and
``token_ids`` (each choice); request flags ``return_tokens_as_token_ids``
(logprob ``token`` strings become ``"token_id:N"``) and ``return_token_ids``
(accepted; ids are always returned); ``prompt_logprobs`` (int k >= 0, on
``/v1/completions``): each choice carries ``prompt_logprobs``, a list with one
entry per prompt token, ``None`` first, then ``{str(token_id): {logprob, rank,
decoded_token}}`` holding the k most likely tokens and always the actual one,
at temperature 1 whatever the request's temperature (how teachers score a
student's tokens; ``teachers.scoring.EndpointScorer``). Ours: request ``thinking_budget`` (int:
thinking closed after that many tokens, the close tag inserted with ``sampled_mask`` 0), or
``reasoning_effort`` (OpenAI's name) mapped to a budget by the server's ``effort_budgets``
(``agentenv serve --effort-budget low=64``; an explicit ``thinking_budget`` wins, a level the
server has no budget for is a 400 naming the levels it has), and response ``agentenv`` = ``{policy_version, sampled_mask, budget_closed,
thinking_tokens}``.

**Weights and versions** (in the style of SGLang's ``update_weights_from_disk``):
``POST /update_weights_from_disk {"model_path": DIR, "version": N}`` loads a
Hugging Face checkpoint directory (``save_pretrained`` layout: safetensors,
sharded or not, or ``pytorch_model.bin``) strictly: every tensor of the model
must be there with its shape, nothing else may be (tied weights excepted). A
bad path, a mismatched state dict or a version older than the loaded one is a
4xx ``{"success": false, "message", "error": {..., "param"}}`` naming the field,
and the old weights stay loaded. The same version may be loaded again (a retry).
The checkpoint is checked from its headers *before* serving pauses; then the
swap waits for the requests in flight to finish **on the old weights** (as
SGLang does with ``abort_all_requests=false``; nothing is aborted) while new
requests wait and are sampled on the new weights. ``drain_timeout_s`` bounds
that wait: past it the update is refused (503) and nothing changed. Tensors are
memory-mapped, never held twice in memory. ``GET /get_model_info`` reports
``version``, ``model_path``, ``num_running_requests``, ``num_waiting_requests``
and ``update_pending``, ``weights_sha256`` (a hash of the served state dict);
weights also arrive without a disk over vLLM's weight-transfer routes
(``/init_weight_transfer_engine``, ``/start_weight_update``, ``/update_weights``,
``/finish_weight_update``: ``rollout.serve_transfer``);
every completion and chat response carries the version that sampled it in
``agentenv.policy_version`` and the ``X-Policy-Version`` header.

A request that does not fit a route (a missing or mistyped field, a value out of range, a body that is not
JSON) is a 400 in OpenAI's error shape, ``{"error": {"message", "type": "invalid_request_error", "param",
"code": 400}}``, ``param`` naming the field (dotted: ``messages.0.role``), as OpenAI and vLLM answer; the
official ``openai`` client raises it as ``BadRequestError`` with ``.param`` set.

Differences from OpenAI / vLLM, on purpose: stop strings stay in the returned
text (tool calls end with one; ``include_stop_str_in_output`` is accepted and
always true), ``n`` must be 1, no streaming, no ``echo``. The reported logprob
is ``HFPolicy``'s (fp32 log-softmax at the request's temperature, before top-p).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from typing import Any, cast

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from rollout.engine_routes import add_engine_routes, error_response
from rollout.errors import ServeError
from rollout.harnesses.parsing import extract_text
from rollout.policy.hf import HFPolicy
from rollout.policy.types import FinishReason, Generation, PolicyError, Prompt, SamplingParams, ThinkingBudget
from rollout.serve_transfer import add_transfer_routes
from rollout.serve_weights import CheckpointMismatch, UpdateGate, checked_version, read_checkpoint

VERSION_HEADER = "X-Policy-Version"


class _Sampling(BaseModel):
    """Fields both endpoints share. Unknown fields are ignored, like most servers do."""

    model_config = ConfigDict(extra="ignore")

    model: str
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    max_tokens: int | None = Field(default=None, ge=0)
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int = 1
    stream: bool = False
    return_tokens_as_token_ids: bool = False
    return_token_ids: bool = True
    include_stop_str_in_output: bool = True
    thinking_budget: int | None = None
    reasoning_effort: str | None = None

    def sampling(self, default_max: int) -> SamplingParams:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        return SamplingParams(
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            max_new_tokens=default_max if self.max_tokens is None else self.max_tokens,
            stop=stop,
            seed=self.seed,
        )

    def budget(self, effort_budgets: Mapping[str, int] | None = None) -> ThinkingBudget | None:
        """The request's thinking budget: ``thinking_budget``, else the server's budget for ``reasoning_effort``."""
        if self.thinking_budget is not None:
            return ThinkingBudget(self.thinking_budget)
        if self.reasoning_effort is None or effort_budgets is None:
            return None
        if self.reasoning_effort not in effort_budgets:
            raise ValueError(f"reasoning_effort: this server has thinking budgets for {', '.join(sorted(effort_budgets))}, "
                             f"got {self.reasoning_effort!r}")
        return ThinkingBudget(effort_budgets[self.reasoning_effort])


class ChatRequest(_Sampling):
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    chat_template_kwargs: dict[str, Any] | None = None


MAX_PROMPT_LOGPROBS = 20  # vLLM's default max_logprobs


class CompletionRequest(_Sampling):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    echo: bool = False


class UpdateWeightsRequest(BaseModel):
    """``POST /update_weights_from_disk``. SGLang's optional fields are accepted where they mean the same here."""

    model_config = ConfigDict(extra="forbid")

    model_path: str
    version: int | None = Field(default=None, ge=0)
    weight_version: str | None = None  # SGLang's name; used when ``version`` is not given
    load_format: str | None = None
    flush_cache: bool = True  # there is no cache across requests: nothing to flush
    abort_all_requests: bool = False
    drain_timeout_s: float = Field(default=600.0, gt=0)


class _HTTPError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param


def _validation_error(exc: RequestValidationError) -> JSONResponse:
    """A body or query that does not fit the route's model: a 400 in OpenAI's error shape naming the field
    (``error.param``, dotted: ``messages.0.role``), as OpenAI and vLLM answer, not FastAPI's 422 ``detail``."""
    first = exc.errors()[0] if exc.errors() else {"loc": ("body",), "msg": "invalid request", "type": ""}
    if first.get("type") == "json_invalid":
        field, why = "body", f"not valid JSON ({first.get('msg', '')})"
    else:
        where = [str(p) for p in first.get("loc", ()) if p not in ("body", "query")]
        field, why = ".".join(where) or "body", str(first.get("msg", "invalid"))
    return error_response(400, f"{field}: {why}", field)


def _finish(g: Generation, has_calls: bool) -> str:
    if g.finish_reason is FinishReason.STOP:
        return "tool_calls" if has_calls else "stop"
    return "length"


def _ext(g: Generation) -> dict[str, Any]:
    return {
        "policy_version": g.policy_version,
        "sampled_mask": list(g.loss_mask),
        "budget_closed": g.budget_closed,
        "thinking_tokens": g.thinking_tokens,
    }


def split_tool_calls(text: str) -> tuple[str | None, str | None, list[dict[str, Any]]]:
    """``(content, reasoning, tool_calls)`` from template text, as an OpenAI assistant message.

    When any call is malformed, the text goes back as ``content`` with no
    ``tool_calls``, so the client's harness parses it and reports the error in
    its own words (what a server without a tool parser would do).
    """
    ex = extract_text(text, "call_", 64)
    if ex.errors:
        rest = text.split("</think>", 1)[1].lstrip("\n") if ex.reasoning and "</think>" in text else text
        return rest or None, ex.reasoning or None, []
    calls = [
        {"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": json.dumps(dict(c.arguments))}}
        for c in ex.calls
    ]
    return ex.text or None, ex.reasoning or None, calls


API_KEY_ENV = "AGENTENV_SERVE_API_KEY"


def check_api_key(request: Request, api_key: str | None) -> JSONResponse | None:
    """A 401 unless ``api_key`` is None or the request presents it as ``Authorization: Bearer``."""
    if api_key is None:
        return None
    auth = request.headers.get("authorization", "")
    given = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
    if hmac.compare_digest(given.encode(), api_key.encode()):
        return None
    error = {"message": "missing or wrong bearer token (--api-key)", "type": "authentication_error", "code": 401}
    return JSONResponse({"success": False, "message": error["message"], "error": error}, 401)


def checked_weights_path(model_path: str, weights_root: str | None) -> str:
    """``model_path`` resolved, refused (400 naming the field) unless it lies beneath ``weights_root``."""
    if weights_root is None:
        return model_path
    root = os.path.realpath(weights_root)
    real = os.path.realpath(model_path)
    if os.path.commonpath([root, real]) != root:
        raise _HTTPError(400, f"model_path: {model_path!r} is outside the weights root {weights_root!r} (--weights-root)",
                         param="model_path")
    return real


def create_app(
    policy: HFPolicy, model_name: str, *, default_max_tokens: int = 256, model_path: str | None = None,
    effort_budgets: Mapping[str, int] | None = None, weights_root: str | None = None, api_key: str | None = None,
) -> FastAPI:
    """The FastAPI app serving ``policy`` under ``model_name``.

    ``effort_budgets`` maps a request's ``reasoning_effort`` to its thinking budget (tokens).

    ``model_path`` is what ``/get_model_info`` reports until the first weight
    update (default: ``model_name``); the loaded version is ``policy.version``.

    ``weights_root``: ``/update_weights_from_disk`` loads only paths beneath it
    (None: any path, for a loopback server of one user). ``api_key``: every
    route needs ``Authorization: Bearer API_KEY`` (401 otherwise).
    """
    app = FastAPI(title="agentenv serve", version="1")

    @app.middleware("http")
    async def _auth(request: Request, call_next: Any) -> Any:
        refused = check_api_key(request, api_key)
        return refused if refused is not None else await call_next(request)

    tok = policy.tokenizer
    started = int(time.time())
    gate = UpdateGate()
    swap_lock = asyncio.Lock()
    loaded = {"model_path": model_path or model_name, "loaded_at": time.time(), "broken": ""}

    def _transferred(version: int) -> None:
        loaded.update(model_path=f"weight_transfer:v{version}", loaded_at=time.time(), broken="")

    # vLLM's weight-transfer routes (rollout.serve_transfer): init / start / update / finish, /weights_sha256
    transfer = add_transfer_routes(app, policy, on_loaded=_transferred)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _validation_error(exc)

    @app.exception_handler(_HTTPError)
    async def _http_error(_: Request, exc: _HTTPError) -> JSONResponse:
        error: dict[str, Any] = {"message": exc.message, "type": exc.kind, "code": exc.status}
        if exc.param is not None:
            error["param"] = exc.param
        return JSONResponse({"success": False, "message": exc.message, "error": error}, exc.status)

    def _check(req: _Sampling) -> None:
        if req.model != model_name:
            raise _HTTPError(404, f"model {req.model!r} not found; this server serves {model_name!r}", "not_found_error")
        if req.n != 1:
            raise _HTTPError(400, f"n: only 1 is supported, got {req.n}", param="n")
        if req.stream:
            raise _HTTPError(400, "stream: only false is supported", param="stream")

    async def _run(ids: list[int], req: _Sampling, max_tokens: int | None = None,
                   first: Callable[[], None] | None = None) -> Generation:
        """Generate; ``first`` (prompt scoring) runs before, under the same weights version."""
        sampling = req.sampling(default_max_tokens)
        if max_tokens is not None:
            sampling = SamplingParams(sampling.temperature, sampling.top_p, max_tokens, sampling.stop, sampling.seed)
        try:
            async with gate.request():
                if loaded["broken"]:
                    raise _HTTPError(503, f"no usable weights: {loaded['broken']}; load a checkpoint again", "server_error")
                if first is not None:
                    await asyncio.to_thread(first)
                return await policy.generate(Prompt(token_ids=ids), sampling, req.budget(effort_budgets))
        except ValueError as exc:
            raise _HTTPError(400, str(exc)) from exc
        except PolicyError as exc:
            raise _HTTPError(500, str(exc), "server_error") from exc

    def _token_str(t: int, as_ids: bool) -> str:
        return f"token_id:{t}" if as_ids else str(tok.decode([t]))

    def _prompt_table(ids: list[int], k: int, as_ids: bool) -> list[dict[str, Any] | None]:
        """vLLM's ``prompt_logprobs``: ``None``, then per position the top ``k`` and the actual token (T = 1)."""
        import torch

        with torch.inference_mode():
            input_ids = torch.tensor([ids], dtype=torch.long, device=policy.device)
            logp_TV = torch.log_softmax(policy.model(input_ids=input_ids, use_cache=False).logits[0, :-1].float(), dim=-1)
            actual_T = torch.tensor(ids[1:], device=policy.device)
            logp_T = logp_TV.gather(1, actual_T.unsqueeze(1)).squeeze(1)
            rank_T = (logp_TV > logp_T.unsqueeze(1)).sum(dim=1) + 1
            top_v, top_i = logp_TV.topk(k, dim=-1) if k else (logp_TV[:, :0], logp_TV[:, :0].long())
        table: list[dict[str, Any] | None] = [None]
        for t, (token, lp, rank) in enumerate(zip(ids[1:], logp_T.tolist(), rank_T.tolist())):
            entry = {str(int(i)): {"logprob": v, "rank": r + 1, "decoded_token": _token_str(int(i), as_ids)}
                     for r, (v, i) in enumerate(zip(top_v[t].tolist(), top_i[t].tolist()))}
            entry[str(token)] = {"logprob": lp, "rank": int(rank), "decoded_token": _token_str(token, as_ids)}
            table.append(entry)
        return table

    @app.get("/get_model_info")
    async def model_info(response: Response) -> dict[str, Any]:
        response.headers[VERSION_HEADER] = str(policy.version)
        return {
            "model_path": loaded["model_path"], "served_model_name": model_name,
            "version": policy.version, "weight_version": str(policy.version),
            "loaded_at": loaded["loaded_at"], "num_running_requests": gate.running,
            "num_waiting_requests": gate.waiting, "update_pending": gate.swap_pending, "usable": not loaded["broken"],
            "weights_sha256": await asyncio.to_thread(transfer.sha256),
        }

    @app.post("/update_weights_from_disk")
    async def update_weights(req: UpdateWeightsRequest, response: Response) -> dict[str, Any]:
        if req.abort_all_requests:
            raise _HTTPError(400, "abort_all_requests: only false is supported (requests in flight finish on the old weights)",
                             param="abort_all_requests")
        if req.load_format not in (None, "auto", "safetensors", "pt"):
            raise _HTTPError(400, f"load_format: expected auto, safetensors or pt, got {req.load_format!r}", param="load_format")
        raw: object = req.version if req.version is not None else req.weight_version
        if raw is None:
            raise _HTTPError(400, "version: required (an int >= the loaded version)", param="version")
        path = checked_weights_path(req.model_path, weights_root)
        async with swap_lock:  # one update at a time; the version check and the swap belong together
            previous = policy.version
            start = time.monotonic()
            try:
                version = checked_version(raw, previous)
                # Checked from the headers before anything pauses: a bad checkpoint never stops serving.
                state = await asyncio.to_thread(read_checkpoint, path, policy.model)
            except CheckpointMismatch as exc:
                status = 409 if exc.field == "version" else 400
                raise _HTTPError(status, str(exc), param=exc.field) from exc
            try:
                keep = policy.use_engine and policy.engine.paused_mode == "keep"  # vLLM's pause(keep) -> update -> resume
                async with (nullcontext(0) if keep else gate.swap(req.drain_timeout_s)) as paused:
                    paused_at = time.monotonic()
                    try:
                        await asyncio.to_thread(policy.load_state_dict, state, version)
                    except Exception as exc:  # noqa: BLE001 - a failed copy leaves mixed weights: say so, serve nothing
                        broken = f"loading {req.model_path!r} failed midway ({type(exc).__name__}: {exc})"
                        loaded["broken"] = broken
                        raise _HTTPError(500, broken, "server_error", "model_path") from exc
                    pause_s = time.monotonic() - paused_at
            except TimeoutError as exc:
                raise _HTTPError(503, f"drain_timeout_s: requests in flight did not finish within {req.drain_timeout_s}s; "
                                 f"version {previous} stays loaded", "server_error", "drain_timeout_s") from exc
            finally:
                del state
            loaded.update(model_path=req.model_path, loaded_at=time.time(), broken="")
            transfer.invalidate()
        response.headers[VERSION_HEADER] = str(version)
        return {
            "success": True, "message": f"loaded version {version} from {req.model_path}",
            "version": version, "previous_version": previous, "model_path": req.model_path,
            "num_paused_requests": paused, "load_s": round(time.monotonic() - start, 4), "pause_s": round(pause_s, 4),
        }

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": started, "owned_by": "agentenv"}]}

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest, response: Response) -> dict[str, Any]:
        _check(req)
        try:
            text = tok.apply_chat_template(
                req.messages, tools=cast(Any, req.tools or None), tokenize=False, add_generation_prompt=True,
                **(req.chat_template_kwargs or {}),
            )
        except Exception as exc:  # noqa: BLE001 - a template error is the request's fault
            raise _HTTPError(400, f"messages could not be rendered with the chat template ({exc})") from exc
        ids = list(tok.encode(str(text), add_special_tokens=False))
        g = await _run(ids, req, req.max_completion_tokens or req.max_tokens)
        content, reasoning, calls = split_tool_calls(g.text)
        logprobs = None
        if req.logprobs:
            logprobs = {"content": [
                {"token": _token_str(t, req.return_tokens_as_token_ids), "logprob": lp,
                 "bytes": list(str(tok.decode([t])).encode()), "top_logprobs": []}
                for t, lp in zip(g.token_ids, g.logprobs)
            ]}
        response.headers[VERSION_HEADER] = str(g.policy_version)
        message: dict[str, Any] = {"role": "assistant", "content": content, "reasoning_content": reasoning}
        if calls:
            message["tool_calls"] = calls
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": model_name,
            "choices": [{"index": 0, "message": message, "logprobs": logprobs,
                         "finish_reason": _finish(g, bool(calls)), "token_ids": list(g.token_ids)}],
            "usage": {"prompt_tokens": len(ids), "completion_tokens": len(g.token_ids), "total_tokens": len(ids) + len(g.token_ids)},
            "prompt_token_ids": ids,
            "agentenv": _ext(g),
        }

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, response: Response) -> dict[str, Any]:
        _check(req)
        if req.echo:
            raise _HTTPError(400, "echo: only false is supported", param="echo")
        prompt: Any = req.prompt
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = list(tok.encode(prompt, add_special_tokens=False))
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            ids = [int(t) for t in prompt]
        else:
            raise _HTTPError(400, "prompt: must be one string or one non-empty list of token ids", param="prompt")
        if max(ids, default=0) >= len(tok) or min(ids, default=0) < 0:
            raise _HTTPError(400, f"prompt: token ids must be in [0, {len(tok)})", param="prompt")
        k = req.prompt_logprobs
        if k is not None and not 0 <= k <= MAX_PROMPT_LOGPROBS:
            raise _HTTPError(400, f"prompt_logprobs: expected an int in [0, {MAX_PROMPT_LOGPROBS}] or null, got {k}",
                             param="prompt_logprobs")
        scored: dict[str, Any] = {"table": None}

        def score_prompt() -> None:
            try:
                scored["table"] = _prompt_table(ids, int(k or 0), req.return_tokens_as_token_ids)
            except (RuntimeError, IndexError) as exc:  # a prompt past the model's positions, device OOM, ...
                raise PolicyError(f"prompt_logprobs: scoring the prompt failed ({type(exc).__name__}: {exc})") from exc

        g = await _run(ids, req, 16 if req.max_tokens is None else None, score_prompt if k is not None else None)
        prompt_table = scored["table"]
        response.headers[VERSION_HEADER] = str(g.policy_version)
        logprobs = None
        if req.logprobs is not None:
            pieces = [str(tok.decode([t])) for t in g.token_ids]
            offsets = [sum(len(p) for p in pieces[:i]) for i in range(len(pieces))]
            logprobs = {"tokens": [_token_str(t, req.return_tokens_as_token_ids) for t in g.token_ids],
                        "token_logprobs": list(g.logprobs), "top_logprobs": None, "text_offset": offsets}
        return {
            "id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": model_name,
            "choices": [{"index": 0, "text": g.text, "logprobs": logprobs, "finish_reason": _finish(g, False),
                         "token_ids": list(g.token_ids), "prompt_token_ids": ids, "prompt_logprobs": prompt_table}],
            "usage": {"prompt_tokens": len(ids), "completion_tokens": len(g.token_ids), "total_tokens": len(ids) + len(g.token_ids)},
            "prompt_token_ids": ids,
            "agentenv": _ext(g),
        }

    add_engine_routes(app, policy, model_name)  # vLLM's /inference/v1/generate, /pause, /resume, /is_paused
    return app


@contextmanager
def serve_in_thread(app: FastAPI, host: str = "127.0.0.1", port: int = 0, *, timeout_s: float = 30.0) -> Iterator[str]:
    """Run ``app`` with uvicorn in a daemon thread; yields the base URL (``http://host:port/v1``).

    ``port=0`` picks a free port. Used by tests and by tools that want a local
    endpoint next to a model under training.
    """
    import socket

    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound_port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True, name="agentenv-serve")
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            raise ServeError(f"agentenv serve: server on {host}:{bound_port} did not start within {timeout_s}s")
        time.sleep(0.01)
    try:
        yield f"http://{host}:{bound_port}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout_s)
        sock.close()


def serve(model: str, host: str = "127.0.0.1", port: int = 8000, *, device: str = "cpu", seed: int = 0,
          served_name: str | None = None, default_max_tokens: int = 256, version: int = 0,
          effort_budgets: Mapping[str, int] | None = None, weights_root: str | None = None,
          api_key: str | None = None) -> None:
    """Load ``model`` (a local checkpoint path, or ``"tiny"``) as ``version`` and serve it until interrupted.

    ``api_key`` defaults to the ``AGENTENV_SERVE_API_KEY`` environment variable (unset: no key)."""
    import uvicorn

    from rollout.policy.models import load_model

    if version < 0:
        raise ValueError(f"version: expected an int >= 0, got {version}")
    loaded, tok = load_model(model, device=device, seed=seed)
    name = served_name or model
    policy = HFPolicy(loaded, tok, device=device, name=f"hf:{name}", version=version)
    app = create_app(policy, name, default_max_tokens=default_max_tokens, model_path=model, effort_budgets=effort_budgets,
                     weights_root=weights_root, api_key=api_key or os.environ.get(API_KEY_ENV) or None)
    uvicorn.run(app, host=host, port=port, log_level="info")


__all__ = [
    "API_KEY_ENV", "MAX_PROMPT_LOGPROBS", "VERSION_HEADER", "check_api_key", "checked_weights_path", "ChatRequest", "CompletionRequest", "UpdateWeightsRequest",
    "create_app", "serve", "serve_in_thread", "split_tool_calls",
]
