"""The HTTP path for real: ``agentenv serve``'s app under uvicorn on 127.0.0.1, the official
``openai`` client, and ``OpenAIPolicy`` against it (same seed -> same tokens as in-process)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from fastapi import Request
from fastapi.responses import JSONResponse

from rollout.policy.hf import HFPolicy
from rollout.policy.models import tiny_model
from rollout.policy.openai_policy import OpenAIPolicy
from rollout.policy.types import FinishReason, Policy, PolicyError, Prompt, SamplingParams, ThinkingBudget
from rollout.serve import create_app, serve_in_thread, split_tool_calls

pytestmark = pytest.mark.unit

TOOLS = [{"type": "function", "function": {"name": "bash", "description": "Run a command.",
                                           "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}]
MESSAGES = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "List the files."}]


@pytest.fixture(scope="module")
def local(tiny: Any) -> HFPolicy:
    return HFPolicy(tiny[0], tiny[1], name="in-process")


@pytest.fixture(scope="module")
def url(tiny: Any) -> Iterator[str]:
    served = HFPolicy(tiny[0], tiny[1])  # same weights object, its own policy (version, locks)
    with serve_in_thread(create_app(served, "tiny")) as base:
        yield base


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="EMPTY", max_retries=0, timeout=30)


def test_official_client_chat_with_tools_logprobs_and_token_ids(url: str, local: HFPolicy) -> None:
    c = _client(url)
    assert [m.id for m in c.models.list()] == ["tiny"]
    r = c.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS, max_tokens=12, seed=3,
                                  temperature=0.8, logprobs=True, extra_body={"return_token_ids": True})
    d = r.model_dump()
    ids = local.prompt_ids(Prompt(messages=MESSAGES, tools=TOOLS))
    assert d["prompt_token_ids"] == ids and r.usage is not None and r.usage.prompt_tokens == len(ids)
    choice = d["choices"][0]
    want = local.generate_sync(Prompt(token_ids=ids), SamplingParams(temperature=0.8, max_new_tokens=12, seed=3))
    assert tuple(choice["token_ids"]) == want.token_ids and choice["finish_reason"] == "length"
    assert [e["logprob"] for e in choice["logprobs"]["content"]] == list(want.logprobs)
    assert r.choices[0].message.role == "assistant"


def test_official_client_completions_text_and_token_prompt(url: str, local: HFPolicy) -> None:
    c = _client(url)
    ids = local.tokenizer.encode("def main():", add_special_tokens=False)
    by_ids = c.completions.create(model="tiny", prompt=ids, max_tokens=6, seed=1, logprobs=1,
                                  extra_body={"return_tokens_as_token_ids": True}).model_dump()
    by_text = c.completions.create(model="tiny", prompt="def main():", max_tokens=6, seed=1, logprobs=1).model_dump()
    want = local.generate_sync(Prompt(token_ids=ids), SamplingParams(max_new_tokens=6, seed=1))
    for d in (by_ids, by_text):
        assert tuple(d["choices"][0]["token_ids"]) == want.token_ids
        assert d["choices"][0]["logprobs"]["token_logprobs"] == list(want.logprobs)
        assert d["choices"][0]["text"] == want.text
    assert by_ids["choices"][0]["logprobs"]["tokens"] == [f"token_id:{t}" for t in want.token_ids]
    with pytest.raises(openai.NotFoundError, match="serves 'tiny'"):
        c.completions.create(model="other", prompt="x")
    with pytest.raises(openai.BadRequestError, match="token ids"):
        c.completions.create(model="tiny", prompt=[10**6])


def test_server_parses_tool_calls_and_thinking() -> None:
    text = '<think>look first</think>\nI will list.<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
    content, reasoning, calls = split_tool_calls(text)
    assert content == "I will list." and reasoning == "look first"
    assert calls[0]["function"]["name"] == "bash" and json.loads(calls[0]["function"]["arguments"]) == {"command": "ls"}
    broken = "x<tool_call>{not json}</tool_call>"
    assert split_tool_calls(broken) == (broken, None, [])  # left for the harness to report


def test_openai_policy_matches_in_process_hf_policy(url: str, local: HFPolicy) -> None:
    remote = OpenAIPolicy(url, "tiny", timeout_s=30)
    assert isinstance(remote, Policy)
    ids = local.prompt_ids(Prompt(messages=MESSAGES, tools=TOOLS))
    for sampling in (SamplingParams(max_new_tokens=16, seed=11), SamplingParams(temperature=0.6, top_p=0.8, max_new_tokens=16, seed=2)):
        got = asyncio.run(remote.generate(Prompt(token_ids=ids), sampling))
        want = local.generate_sync(Prompt(token_ids=ids), sampling)
        assert got.token_ids == want.token_ids and got.logprobs == want.logprobs and got.text == want.text
        assert got.finish_reason is want.finish_reason and got.policy_version == 0
    chat = asyncio.run(remote.generate(Prompt(messages=MESSAGES, tools=TOOLS), SamplingParams(max_new_tokens=16, seed=11)))
    assert chat.token_ids == local.generate_sync(Prompt(token_ids=ids), SamplingParams(max_new_tokens=16, seed=11)).token_ids
    assert chat.extra["prompt_token_ids"] == ids


def test_openai_policy_stop_string(url: str, local: HFPolicy) -> None:
    ids = local.tokenizer.encode("hello", add_special_tokens=False)
    free = local.generate_sync(Prompt(token_ids=ids), SamplingParams(max_new_tokens=20, seed=5))
    stop = local.tokenizer.decode(list(free.token_ids[8:10]))[1:]
    sampling = SamplingParams(max_new_tokens=20, seed=5, stop=(stop,))
    got = asyncio.run(OpenAIPolicy(url, "tiny").generate(Prompt(token_ids=ids), sampling))
    assert got.finish_reason is FinishReason.STOP and got.token_ids == local.generate_sync(Prompt(token_ids=ids), sampling).token_ids
    assert got.text.endswith(stop)


def test_openai_policy_enforces_thinking_budget_client_side(url: str, local: HFPolicy, recompute: Any) -> None:
    tok = local.tokenizer
    ids = local.prompt_ids(Prompt(messages=MESSAGES)) + tok.encode("<think>", add_special_tokens=False)
    remote = OpenAIPolicy(url, "tiny", tokenizer=tok)
    g = asyncio.run(remote.generate(Prompt(token_ids=ids), SamplingParams(max_new_tokens=10, seed=4), ThinkingBudget(4)))
    close_id = tok.convert_tokens_to_ids("</think>")
    assert close_id not in g.token_ids[:4] and g.token_ids[4] == close_id
    assert g.loss_mask == (1, 1, 1, 1, 0, 1, 1, 1, 1, 1) and g.budget_closed and g.thinking_tokens == 4
    assert g.extra["requests"] == 2
    expected = recompute(local.model, ids, g.token_ids, 1.0)
    assert all(abs(a - b) < 1e-5 for a, b, m in zip(g.logprobs, expected, g.loss_mask) if m)
    with pytest.raises(PolicyError, match="tokenizer"):
        asyncio.run(OpenAIPolicy(url, "tiny").generate(Prompt(token_ids=ids), SamplingParams(), ThinkingBudget(4)))


def test_policy_version_comes_from_the_server(tiny: Any) -> None:
    model, tok = tiny_model(seed=0, tokenizer=tiny[1])
    served = HFPolicy(model, tok)
    with serve_in_thread(create_app(served, "tiny")) as base:
        remote = OpenAIPolicy(base, "tiny")
        p = Prompt(token_ids=tok.encode("hi", add_special_tokens=False))
        before = asyncio.run(remote.generate(p, SamplingParams(max_new_tokens=8, seed=1)))
        served.set_weights(tiny_model(seed=1, tokenizer=tok)[0], version=2)
        after = asyncio.run(remote.generate(p, SamplingParams(max_new_tokens=8, seed=1)))
    assert (before.policy_version, after.policy_version) == (0, 2)
    assert before.token_ids != after.token_ids and before.logprobs != after.logprobs


# ---------------------------------------------------------------- failures: never hang, retry, then PolicyError


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_nothing_listening_gives_policy_error_after_retries() -> None:
    remote = OpenAIPolicy(f"http://127.0.0.1:{_free_port()}/v1", "tiny", timeout_s=2, max_retries=2, backoff_s=0.01)
    with pytest.raises(PolicyError, match="3 attempt.*connection failed"):
        asyncio.run(remote.generate(Prompt(token_ids=[1, 2]), SamplingParams(max_new_tokens=2)))
    assert remote.attempts == 3


def test_a_server_that_never_answers_times_out_per_attempt() -> None:
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # accepts connections (kernel backlog), never reads or answers
    try:
        remote = OpenAIPolicy(f"http://127.0.0.1:{silent.getsockname()[1]}/v1", "tiny", timeout_s=0.3, max_retries=1, backoff_s=0.01)
        start = time.monotonic()
        with pytest.raises(PolicyError, match="2 attempt.*no response within 0.3s"):
            asyncio.run(remote.generate(Prompt(token_ids=[1]), SamplingParams(max_new_tokens=2)))
        assert time.monotonic() - start < 3 and remote.attempts == 2
    finally:
        silent.close()


def test_retries_5xx_then_succeeds_and_does_not_retry_4xx(tiny: Any) -> None:
    app = create_app(HFPolicy(tiny[0], tiny[1]), "tiny")
    seen = {"n": 0}
    lock = threading.Lock()

    @app.middleware("http")
    async def flaky(request: Request, call_next: Any) -> Any:
        with lock:
            seen["n"] += 1
            n = seen["n"]
        if n <= 2:
            return JSONResponse({"error": {"message": "warming up"}}, status_code=503)
        return await call_next(request)

    with serve_in_thread(app) as base:
        remote = OpenAIPolicy(base, "tiny", max_retries=3, backoff_s=0.01)
        g = asyncio.run(remote.generate(Prompt(token_ids=[5, 6]), SamplingParams(max_new_tokens=3, seed=0)))
        assert len(g.token_ids) == 3 and remote.attempts == 3
        wrong = OpenAIPolicy(base, "not-served", max_retries=3, backoff_s=0.01)
        with pytest.raises(PolicyError, match="1 attempt.*HTTP 404"):
            asyncio.run(wrong.generate(Prompt(token_ids=[5]), SamplingParams(max_new_tokens=3)))
        assert wrong.attempts == 1


def test_openai_policy_pickles_for_ray_workers(url: str) -> None:
    import pickle

    remote = OpenAIPolicy(url, "tiny", timeout_s=5)
    asyncio.run(remote.generate(Prompt(token_ids=[1, 2]), SamplingParams(max_new_tokens=2, seed=0)))
    copy = pickle.loads(pickle.dumps(remote))
    assert copy.base_url == remote.base_url and copy.timeout_s == 5
    assert len(asyncio.run(copy.generate(Prompt(token_ids=[1, 2]), SamplingParams(max_new_tokens=2, seed=0))).token_ids) == 2


@pytest.mark.slow
def test_agentenv_serve_cli_in_a_subprocess(tmp_path: Any) -> None:
    import subprocess
    import sys

    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentenv.cli", "serve", "tiny", "--port", str(port), "--served-name", "t"],
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "serve.log", "w"),
    )
    try:
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="EMPTY", max_retries=0, timeout=5)
        deadline = time.monotonic() + 120
        while True:
            try:
                assert [m.id for m in c.models.list()] == ["t"]
                break
            except openai.APIConnectionError:
                assert proc.poll() is None, (tmp_path / "serve.log").read_text()
                assert time.monotonic() < deadline, "agentenv serve did not come up within 120s"
                time.sleep(0.2)
        r = c.chat.completions.create(model="t", messages=MESSAGES, max_tokens=4, seed=0, logprobs=True)
        assert r.choices[0].logprobs is not None and len(r.choices[0].logprobs.content or []) == 4
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.mark.parametrize(("call", "param"), [
    (lambda c: c.chat.completions.create(model="tiny", messages="not a list"), "messages"),  # type: ignore[arg-type]
    (lambda c: c.chat.completions.create(model="tiny", messages=MESSAGES, temperature=-1), "temperature"),
    (lambda c: c.chat.completions.create(model="tiny", messages=MESSAGES, top_p=1.5), "top_p"),
    (lambda c: c.chat.completions.create(model="tiny", messages=MESSAGES, n=2), "n"),
    (lambda c: c.completions.create(model="tiny", prompt=[[1, 2], [3]], max_tokens=2), "prompt"),
    (lambda c: c.completions.create(model="tiny", prompt="hi", max_tokens=-3), "max_tokens"),
    (lambda c: c.completions.create(model="tiny", prompt="hi", echo=True), "echo"),
])
def test_a_malformed_request_is_a_400_naming_the_field_to_the_official_client(url: str, call: Any, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        call(_client(url))
    err = caught.value
    assert err.status_code == 400 and err.param == param and param in err.message, (err.body, err.message)
    assert isinstance(err.body, dict) and err.body.get("type") == "invalid_request_error"


def test_a_body_that_is_not_json_is_a_400(url: str) -> None:
    import httpx

    r = httpx.post(f"{url}/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "body", r.text
