"""``agentenv serve``'s weight reload, for real: uvicorn on 127.0.0.1, the official ``openai`` client for
completions, httpx for ``/update_weights_from_disk`` and ``/get_model_info``, ``OpenAIPolicy`` turns."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from fastapi import Request
from fastapi.responses import JSONResponse
from transformers import PreTrainedTokenizerBase

from rollout.policy.hf import HFPolicy
from rollout.policy.models import save_checkpoint, tiny_model
from rollout.policy.openai_policy import OpenAIPolicy
from rollout.policy.types import Prompt, SamplingParams
from rollout.serve import VERSION_HEADER, create_app, serve_in_thread

pytestmark = pytest.mark.unit

PROMPT = [5, 6, 7, 8]


@pytest.fixture(scope="module")
def tok() -> PreTrainedTokenizerBase:
    return tiny_model(seed=0)[1]


@pytest.fixture(scope="module")
def ckpt(tok: PreTrainedTokenizerBase, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``ckpt(seed, **config)``: a saved checkpoint of tiny model ``seed`` (cached per argument set)."""
    made: dict[str, Path] = {}

    def make(seed: int, shard: bool = False, **config: Any) -> Path:
        key = json.dumps([seed, shard, config], sort_keys=True)
        if key not in made:
            model, _ = tiny_model(seed=seed, tokenizer=tok, **config)
            out = tmp_path_factory.mktemp(f"ckpt{seed}")
            if shard:
                out.mkdir(exist_ok=True)
                model.save_pretrained(str(out), max_shard_size="200KB")
                tok.save_pretrained(str(out))
            else:
                save_checkpoint(model, tok, out)
            made[key] = out
        return made[key]

    return make


@pytest.fixture()
def server(tok: PreTrainedTokenizerBase) -> Iterator[tuple[str, str, HFPolicy]]:
    """A fresh server of tiny model 0 that never stops at end-of-turn (so a long request stays long)."""
    policy = HFPolicy(tiny_model(seed=0, tokenizer=tok)[0], tok, stop_token_ids=())
    with serve_in_thread(create_app(policy, "tiny")) as base:
        yield base, base.removesuffix("/v1"), policy


def _logprobs(base: str, max_tokens: int = 6) -> tuple[list[float], dict[str, Any]]:
    c = openai.OpenAI(base_url=base, api_key="EMPTY", max_retries=0, timeout=30)
    r = c.completions.create(model="tiny", prompt=PROMPT, max_tokens=max_tokens, seed=1, logprobs=1)
    d = r.model_dump()
    assert r.choices[0].logprobs is not None
    return list(r.choices[0].logprobs.token_logprobs or []), d


def _in_process(tok: PreTrainedTokenizerBase, seed: int) -> list[float]:
    policy = HFPolicy(tiny_model(seed=seed, tokenizer=tok)[0], tok, stop_token_ids=())
    return list(policy.generate_sync(Prompt(token_ids=PROMPT), SamplingParams(max_new_tokens=6, seed=1)).logprobs)


def _update(root: str, **body: Any) -> httpx.Response:
    return httpx.post(f"{root}/update_weights_from_disk", json=body, timeout=60)


def _info(root: str) -> dict[str, Any]:
    r = httpx.get(f"{root}/get_model_info", timeout=10)
    assert r.status_code == 200 and r.headers[VERSION_HEADER] == str(r.json()["version"])
    return dict(r.json())


def test_update_loads_the_checkpoint_and_every_response_reports_its_version(
    server: tuple[str, str, HFPolicy], ckpt: Callable[..., Path], tok: PreTrainedTokenizerBase
) -> None:
    base, root, _ = server
    before, d0 = _logprobs(base)
    assert before == _in_process(tok, 0) and d0["agentenv"]["policy_version"] == 0
    assert _info(root)["version"] == 0

    r = _update(root, model_path=str(ckpt(1)), version=3)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["success"] is True and (body["version"], body["previous_version"]) == (3, 0)
    assert r.headers[VERSION_HEADER] == "3" and body["num_paused_requests"] == 0
    after, d1 = _logprobs(base)
    assert after == _in_process(tok, 1) != before and d1["agentenv"]["policy_version"] == 3
    info = _info(root)
    assert (info["version"], info["model_path"], info["num_running_requests"]) == (3, str(ckpt(1)), 0)

    # the header is on completions and chat alike (httpx sees what the openai client hides)
    comp = httpx.post(f"{base}/completions", json={"model": "tiny", "prompt": PROMPT, "max_tokens": 2}, timeout=30)
    chat = httpx.post(f"{base}/chat/completions", json={"model": "tiny", "max_tokens": 2,
                                                        "messages": [{"role": "user", "content": "hi"}]}, timeout=30)
    assert comp.headers[VERSION_HEADER] == chat.headers[VERSION_HEADER] == "3"
    assert chat.json()["agentenv"]["policy_version"] == 3

    # a sharded checkpoint (index + shards) loads the same way; the same version may load again (a retry)
    sharded = ckpt(2, shard=True)
    assert (sharded / "model.safetensors.index.json").is_file()
    assert _update(root, model_path=str(sharded), version=4).status_code == 200
    assert _logprobs(base)[0] == _in_process(tok, 2)
    again = _update(root, model_path=str(ckpt(1)), version=4)
    assert again.status_code == 200 and _logprobs(base)[0] == _in_process(tok, 1)


def test_bad_updates_are_4xx_naming_the_field_and_keep_the_old_weights(
    server: tuple[str, str, HFPolicy], ckpt: Callable[..., Path], tmp_path: Path
) -> None:
    base, root, _ = server
    assert _update(root, model_path=str(ckpt(1)), version=5).status_code == 200
    want, _ = _logprobs(base)

    no_config = tmp_path / "no_config"
    no_config.mkdir()
    no_weights = tmp_path / "no_weights"
    no_weights.mkdir()
    (no_weights / "config.json").write_text((ckpt(1) / "config.json").read_text())
    truncated = tmp_path / "truncated"
    truncated.mkdir()
    for f in ckpt(1).iterdir():
        (truncated / f.name).write_bytes(f.read_bytes())
    data = (truncated / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(data[: len(data) // 2])
    cases: list[tuple[dict[str, Any], int, str, str]] = [
        ({"model_path": str(tmp_path / "absent"), "version": 6}, 400, "model_path", "is not a directory"),
        ({"model_path": str(no_config), "version": 6}, 400, "model_path", "no config.json"),
        ({"model_path": str(no_weights), "version": 6}, 400, "model_path", "holds no weights"),
        ({"model_path": str(truncated), "version": 6}, 400, "model_path", "truncated"),
        ({"model_path": str(ckpt(3, hidden_size=32)), "version": 6}, 400, "model_path", "wrong shape"),
        ({"model_path": str(ckpt(3, num_layers=3)), "version": 6}, 400, "model_path", "unexpected"),
        ({"model_path": str(ckpt(1)), "version": 4}, 409, "version", "older than the loaded version 5"),
        ({"model_path": str(ckpt(1))}, 400, "version", "required"),
        ({"model_path": str(ckpt(1)), "version": 6, "abort_all_requests": True}, 400, "abort_all_requests", "only false"),
    ]
    for body, status, field, words in cases:
        r = _update(root, **body)
        assert r.status_code == status, (body, r.text)
        answer = r.json()
        assert answer["success"] is False and answer["error"]["param"] == field and words in answer["message"], answer
    for body in ({"model_path": str(ckpt(1)), "version": 6, "bogus": 1}, {"version": 6}, {"model_path": str(ckpt(1)), "version": -1}):
        r = _update(root, **body)
        assert r.status_code == 400 and r.json()["error"]["param"] in ("bogus", "model_path", "version"), r.text
    assert _info(root)["version"] == 5 and _info(root)["usable"] is True
    assert _logprobs(base)[0] == want


def test_requests_in_flight_finish_on_the_old_weights_and_new_ones_wait_for_the_new(
    server: tuple[str, str, HFPolicy], ckpt: Callable[..., Path], tok: PreTrainedTokenizerBase
) -> None:
    base, root, policy = server
    results: dict[str, Any] = {}
    # The order as the server saw it: when each client thread gets its response is up to the network
    # (a small update response can overtake a 1,500-token completion sent just before it).
    order: list[str] = []
    generate, load_state_dict = policy.generate, policy.load_state_dict

    async def recorded_generate(prompt: Prompt, sampling: SamplingParams, *args: Any) -> Any:
        key = "long" if sampling.max_new_tokens == 1500 else "short"
        order.append(f"{key} starts")
        g = await generate(prompt, sampling, *args)
        order.append(f"{key} ends")
        return g

    def recorded_load(*args: Any) -> None:
        order.append("update loads")
        load_state_dict(*args)

    policy.generate = recorded_generate  # type: ignore[method-assign]
    policy.load_state_dict = recorded_load  # type: ignore[method-assign]

    def call(key: str, fn: Callable[[], Any]) -> threading.Thread:
        def run() -> None:
            results[key] = fn()
        t = threading.Thread(target=run)
        t.start()
        return t

    def wait_for(pred: Callable[[dict[str, Any]], bool], what: str) -> None:
        deadline = time.monotonic() + 30
        while not pred(_info(root)):
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {_info(root)}"
            time.sleep(0.005)

    long_one = call("long", lambda: _logprobs(base, max_tokens=1500)[1])
    wait_for(lambda i: i["num_running_requests"] == 1, "the long request to start")
    # a drain deadline that the long request outlasts: refused, nothing changed, the long one goes on
    refused = _update(root, model_path=str(ckpt(1)), version=1, drain_timeout_s=0.05)
    assert refused.status_code == 503 and refused.json()["error"]["param"] == "drain_timeout_s"
    assert _info(root)["version"] == 0 and _info(root)["num_running_requests"] == 1
    update = call("update", lambda: _update(root, model_path=str(ckpt(1)), version=1))
    wait_for(lambda i: i["update_pending"], "the update to wait for the long request")
    short = call("short", lambda: _logprobs(base)[1])
    wait_for(lambda i: i["num_waiting_requests"] == 1, "the short request to be held back")
    for t in (long_one, update, short):
        t.join(60)
    assert results["long"]["agentenv"]["policy_version"] == 0 and len(results["long"]["choices"][0]["token_ids"]) == 1500
    assert results["update"].status_code == 200 and results["update"].json()["num_paused_requests"] == 1
    assert results["short"]["agentenv"]["policy_version"] == 1
    assert [e for e in results["short"]["choices"][0]["logprobs"]["token_logprobs"]] == _in_process(tok, 1)
    assert order == ["long starts", "long ends", "update loads", "short starts", "short ends"]


def test_openai_policy_records_the_server_version_on_every_turn(
    server: tuple[str, str, HFPolicy], ckpt: Callable[..., Path]
) -> None:
    base, root, _ = server
    remote = OpenAIPolicy(base, "tiny", version=0)
    turns = []
    prompt = list(PROMPT)
    for version in (None, 2, None, 7):
        if version is not None:
            assert _update(root, model_path=str(ckpt(version)), version=version).status_code == 200
        g = asyncio.run(remote.generate(Prompt(token_ids=prompt), SamplingParams(max_new_tokens=3, seed=0)))
        turns.append((g.policy_version, g.extra["version_source"]))
        prompt += list(g.token_ids)
    chat = asyncio.run(remote.generate(Prompt(messages=[{"role": "user", "content": "hi"}]), SamplingParams(max_new_tokens=2)))
    assert turns == [(0, "server"), (2, "server"), (2, "server"), (7, "server")]
    assert (chat.policy_version, chat.extra["version_source"]) == (7, "server")
    assert remote.last_server_version == 7 and remote.version == 0  # the caller's own version is left alone


def test_openai_policy_falls_back_to_its_own_version_when_the_server_reports_none(tok: PreTrainedTokenizerBase) -> None:
    app = create_app(HFPolicy(tiny_model(seed=0, tokenizer=tok)[0], tok), "tiny")

    @app.middleware("http")
    async def like_vllm(request: Request, call_next: Any) -> Any:  # a server without our extension field
        resp = await call_next(request)
        raw = b"".join([chunk async for chunk in resp.body_iterator])
        body = json.loads(raw)
        body.pop("agentenv", None)
        return JSONResponse(body, resp.status_code)

    with serve_in_thread(app) as base:
        remote = OpenAIPolicy(base, "tiny", version=4)
        g = asyncio.run(remote.generate(Prompt(token_ids=PROMPT), SamplingParams(max_new_tokens=2, seed=0)))
        remote.set_version(5)
        h = asyncio.run(remote.generate(Prompt(token_ids=PROMPT), SamplingParams(max_new_tokens=2, seed=0)))
    assert [(x.policy_version, x.extra["version_source"]) for x in (g, h)] == [(4, "policy"), (5, "policy")]
    assert remote.last_server_version is None
