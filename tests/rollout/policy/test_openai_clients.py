"""``OpenAIPolicy`` closes every ``AsyncOpenAI`` client it opens, each in its own event loop.

A stdlib HTTP server with keep-alive answers, so each client really holds a pooled connection.
"""

from __future__ import annotations

import asyncio
import gc
import json
import threading
import time
import warnings
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rollout.policy.openai_policy import OpenAIPolicy
from rollout.policy.types import Prompt, SamplingParams

pytestmark = pytest.mark.unit


class _Completions(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the client keeps the connection in its pool

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers["content-length"]))
        choice = {"index": 0, "text": "hi", "finish_reason": "stop", "token_ids": [5, 6],
                  "logprobs": {"tokens": ["h", "i"], "token_logprobs": [-0.5, -0.25]}}
        body = json.dumps({"id": "c", "object": "text_completion", "created": 0, "model": "m", "choices": [choice]}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Completions)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/v1"
    server.shutdown()
    server.server_close()


async def _generate(policy: OpenAIPolicy) -> object:
    g = await policy.generate(Prompt(token_ids=[1, 2]), SamplingParams(max_new_tokens=2))
    assert list(g.token_ids) == [5, 6]
    return policy._client()


def _unclosed(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, ResourceWarning) and "unclosed" in str(w.message)]


def test_each_asyncio_run_gets_a_client_and_closes_it_with_its_loop(url: str) -> None:
    policy = OpenAIPolicy(url, "m", max_retries=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = asyncio.run(_generate(policy))
        assert first.is_closed(), "the client outlived the loop that owned its connections"  # type: ignore[attr-defined]
        second = asyncio.run(_generate(policy))
        assert second is not first and second.is_closed()  # type: ignore[attr-defined]
        del first, second
        gc.collect()
    assert _unclosed(caught) == []


def test_a_client_replaced_on_a_loop_change_is_closed_in_its_own_loop(url: str) -> None:
    policy = OpenAIPolicy(url, "m", max_retries=0)
    other = asyncio.new_event_loop()
    thread = threading.Thread(target=other.run_forever, daemon=True)
    thread.start()
    try:
        old = asyncio.run_coroutine_threadsafe(_generate(policy), other).result(timeout=30)
        assert not old.is_closed()  # type: ignore[attr-defined]
        new = asyncio.run(_generate(policy))  # a second loop, while the first still runs
        assert new is not old
        deadline = time.monotonic() + 10
        while not old.is_closed() and time.monotonic() < deadline:  # type: ignore[attr-defined]
            time.sleep(0.01)
        assert old.is_closed(), "the replaced client was never closed"  # type: ignore[attr-defined]
    finally:
        other.call_soon_threadsafe(other.stop)
        thread.join(timeout=10)
        other.close()


def test_aclose_closes_the_current_client_and_a_later_call_opens_another(url: str) -> None:
    policy = OpenAIPolicy(url, "m", max_retries=0)

    async def main() -> None:
        client = await _generate(policy)
        await policy.aclose()
        assert client.is_closed()  # type: ignore[attr-defined]
        again = await _generate(policy)
        assert again is not client and not again.is_closed()  # type: ignore[attr-defined]
        await policy.aclose()
        assert again.is_closed()  # type: ignore[attr-defined]

    asyncio.run(main())
