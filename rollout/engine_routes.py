"""vLLM's RL serving routes on ``agentenv serve``'s engine: token-in/token-out generate, pause, resume.

Added to the app by ``rollout.serve.create_app`` (``add_engine_routes``); the
payloads follow vLLM's (0.22 and later; ``/pause?mode=`` from vLLM #32351, the
token route ``/inference/v1/generate`` as in vLLM's ``ServingTokens``), so a
client written for a vLLM server in an RL loop works against this one:

``POST /inference/v1/generate`` ``{"model"?, "token_ids": [int], "sampling_params": {"max_tokens", "temperature",
"top_p", "seed", "stop", "stop_token_ids", "ignore_eos", "logprobs", ...}, "request_id"?}`` returns ``{"request_id",
"choices": [{"index": 0, "token_ids", "logprobs": {"content": [{"token": "token_id:N", "logprob", "top_logprobs": []}]},
"finish_reason"}], "prompt_logprobs": null, "usage", "agentenv": {policy_version, token_versions, sampled_mask,
budget_closed, thinking_tokens}}``. Logprobs are always returned (the sampled token's only: ``HFPolicy``'s
definition, fp32 at the request's temperature before top-p); ``thinking_budget`` in ``sampling_params`` is ours.
Sampling fields this engine does not implement (``top_k``, ``min_p``, penalties, ``n`` > 1) are a 400 naming the
field when set to anything but their neutral value, never silently ignored.

``POST /pause?mode=abort|wait|keep`` (``abort``: requests in flight end now with finish reason ``abort``; ``wait``:
admission stops and the call returns once they finished; ``keep``: they freeze in their slots until ``/resume``, and a
weight update made meanwhile applies to their next tokens, each token keeping its version), ``POST /resume``, ``GET
/is_paused`` -> ``{"is_paused": bool}``. Requests that arrive while paused wait (they are not refused).

``POST /sleep?level=1|2`` (vLLM's sleep mode): the requests in flight finish, the KV cache and CUDA graphs are
freed and, on a GPU, the weights go to host memory (level 2 keeps them there too, rather than discarding them);
``POST /wake_up`` brings them back and resumes; ``GET /is_sleeping``. A weight update while asleep loads into the
host copy.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from fastapi import FastAPI, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rollout.engine import EngineError, EngineRequest, EngineRequestError, EngineTimeout
from rollout.policy.types import FinishReason, ThinkingBudget

__all__ = ["GenerateRequest", "TokenSamplingParams", "add_engine_routes", "error_response"]

_NEUTRAL: dict[str, Any] = {"top_k": (None, 0, -1), "min_p": (None, 0.0), "presence_penalty": (None, 0.0),
                            "frequency_penalty": (None, 0.0), "repetition_penalty": (None, 1.0), "n": (None, 1),
                            "best_of": (None, 1), "min_tokens": (None, 0)}


class TokenSamplingParams(BaseModel):
    """vLLM's ``SamplingParams`` fields this engine honours; others are accepted only at their neutral value."""

    model_config = ConfigDict(extra="allow")

    max_tokens: int = Field(default=16, ge=0)
    temperature: float = Field(default=1.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logprobs: int | None = None
    detokenize: bool = True
    thinking_budget: int | None = Field(default=None, ge=0)


class GenerateRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    token_ids: list[int]
    sampling_params: TokenSamplingParams = Field(default_factory=TokenSamplingParams)
    request_id: str | None = None
    stream: bool = False


def error_response(status: int, message: str, param: str | None = None) -> JSONResponse:
    """An error in OpenAI's shape (``param`` naming the field) with SGLang's ``success`` / ``message`` beside it."""
    error: dict[str, Any] = {"message": message, "type": "invalid_request_error" if status < 500 else "server_error",
                             "code": status}
    if param is not None:
        error["param"] = param
    return JSONResponse({"success": False, "message": message, "error": error}, status)


def add_engine_routes(app: FastAPI, policy: Any, model_name: str) -> None:
    """Register the routes above on ``app`` for ``policy`` (an ``HFPolicy`` whose engine serves them)."""

    @app.post("/inference/v1/generate")
    async def generate(body: dict[str, Any]) -> Any:
        try:
            req = GenerateRequest.model_validate(body)
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first["loc"])
            return error_response(400, f"{field}: {first['msg']}", field)
        if req.model is not None and req.model != model_name:
            return error_response(404, f"model {req.model!r} not found; this server serves {model_name!r}", "model")
        if req.stream:
            return error_response(400, "stream: only false is supported", "stream")
        sp = req.sampling_params
        for name, value in (sp.model_extra or {}).items():
            if name in _NEUTRAL and value not in _NEUTRAL[name]:
                return error_response(400, f"sampling_params.{name}: not supported by this engine (got {value!r})",
                              f"sampling_params.{name}")
        if not policy.use_engine:
            return error_response(501, "this server's model has no engine forward; use /v1/completions", "token_ids")
        engine = policy.engine
        stop_ids = set(sp.stop_token_ids or ())
        if not sp.ignore_eos:
            stop_ids |= set(policy.stop_token_ids)
        request_id = req.request_id or f"gen-{uuid.uuid4().hex}"
        try:
            out = await engine.generate(EngineRequest(
                prompt_ids=req.token_ids, max_new_tokens=sp.max_tokens, temperature=sp.temperature, top_p=sp.top_p,
                stop_token_ids=frozenset(stop_ids), stop=(sp.stop,) if isinstance(sp.stop, str) else tuple(sp.stop or ()),
                seed=sp.seed, budget=ThinkingBudget(sp.thinking_budget) if sp.thinking_budget is not None else None,
                request_id=request_id,
            ))
        except EngineRequestError as exc:
            text = str(exc)
            hit = next((f for f in ("prompt_ids", "max_new_tokens", "top_p", "temperature") if f in text), "")
            mapped = {"prompt_ids": "token_ids", "max_new_tokens": "sampling_params.max_tokens",
                      "top_p": "sampling_params.top_p", "temperature": "sampling_params.temperature"}.get(hit)
            return error_response(400, text.replace("prompt_ids", "token_ids"), mapped)
        except EngineError as exc:
            return error_response(500, str(exc))
        finish = {FinishReason.STOP: "stop", FinishReason.ABORT: "abort"}.get(out.finish_reason, "length")
        versions = list(out.versions)
        return {
            "request_id": request_id,
            "choices": [{
                "index": 0,
                "token_ids": list(out.token_ids),
                "text": policy._decode(out.token_ids) if sp.detokenize else None,
                "logprobs": {"content": [{"token": f"token_id:{t}", "logprob": lp, "top_logprobs": []}
                                         for t, lp in zip(out.token_ids, out.logprobs)]},
                "finish_reason": finish,
            }],
            "prompt_logprobs": None,
            "kv_transfer_params": None,
            "usage": {"prompt_tokens": out.prompt_tokens, "completion_tokens": len(out.token_ids),
                      "total_tokens": out.prompt_tokens + len(out.token_ids)},
            "agentenv": {
                "policy_version": min(versions) if versions else engine.version,
                "token_versions": versions,
                "sampled_mask": list(out.sampled_mask),
                "budget_closed": out.budget_closed,
                "thinking_tokens": out.thinking_tokens,
            },
        }

    @app.post("/pause")
    async def pause(mode: str = Query("abort"), timeout_s: float = Query(600.0, gt=0)) -> Any:
        if mode not in ("abort", "wait", "keep"):
            return error_response(400, f"mode: expected abort, wait or keep, got {mode!r}", "mode")
        try:
            await asyncio.to_thread(policy.engine.pause, mode, timeout_s)
        except EngineTimeout as exc:
            return error_response(503, str(exc), "timeout_s")
        return {"success": True, "is_paused": True, "mode": mode}

    @app.post("/resume")
    async def resume() -> Any:
        if policy.engine.sleeping:
            return error_response(409, "the engine is asleep: POST /wake_up resumes it", "sleep")
        policy.engine.resume()
        return {"success": True, "is_paused": False}

    @app.post("/sleep")
    async def sleep(level: int = Query(1)) -> Any:
        if level not in (1, 2):
            return error_response(400, f"level: expected 1 or 2, got {level}", "level")
        try:
            await asyncio.to_thread(policy.engine.sleep, level)
        except EngineTimeout as exc:
            return error_response(503, str(exc), "level")
        return {"success": True, "is_sleeping": True, "level": level}

    @app.post("/wake_up")
    async def wake_up() -> Any:
        await asyncio.to_thread(policy.engine.wake_up)
        return {"success": True, "is_sleeping": False}

    @app.get("/is_sleeping")
    async def is_sleeping() -> Any:
        return {"is_sleeping": bool(policy.engine.sleeping)}

    @app.get("/is_paused")
    async def is_paused() -> Any:
        return {"is_paused": policy.engine.is_paused}
