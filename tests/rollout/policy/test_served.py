"""``ServedPolicy`` against a real ``agentenv serve`` app in a thread: the same turn as in process, the fleet's
routing, and a server that is gone raising ``ServerLost`` (an ``EpisodeLost``: the episode reruns)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from rollout.attempt import EpisodeLost
from rollout.policy.hf import HFPolicy
from rollout.policy.served import ServedPolicy, ServerFleet, ServerLost, server_root
from rollout.policy.types import PolicyError, Prompt, SamplingParams
from rollout.serve import create_app, serve_in_thread

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def url(tiny: Any) -> Iterator[str]:
    with serve_in_thread(create_app(HFPolicy(tiny[0], tiny[1]), "tiny")) as base:
        yield server_root(base)


def _down() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_a_served_turn_is_the_in_process_turn_token_for_token(url: str, tiny: Any) -> None:
    local = HFPolicy(tiny[0], tiny[1])
    ids = list(tiny[1].encode("List the files in /workspace.", add_special_tokens=False))
    sampling = SamplingParams(temperature=0.8, max_new_tokens=10, seed=7)
    served = ServedPolicy(ServerFleet([url + "/v1"]), model="tiny", tokenizer=tiny[1])

    async def both() -> Any:
        try:
            return await served.generate(Prompt(token_ids=ids), sampling), await local.generate(Prompt(token_ids=ids), sampling)
        finally:
            await served.aclose()

    got, want = asyncio.run(both())
    assert got.token_ids == want.token_ids and got.logprobs == pytest.approx(want.logprobs, abs=1e-6)
    assert got.policy_version == 0 and got.extra["server"] == url and got.extra["version_source"] == "server"


def test_the_fleet_sends_each_turn_to_the_least_loaded_live_server() -> None:
    fleet = ServerFleet(["http://a:1", "http://b:1/v1", "http://c:1/"])
    assert fleet.urls == ("http://a:1", "http://b:1", "http://c:1")
    first = [fleet.acquire() for _ in range(3)]
    assert sorted(first) == list(fleet.urls)  # one each before any gets a second
    fleet.release("http://b:1")
    assert fleet.acquire() == "http://b:1"  # the only one with a free slot
    fleet.mark_dead("http://a:1", "connection failed (gone)")
    assert "http://a:1" not in {fleet.acquire() for _ in range(4)}
    fleet.mark_dead("http://b:1", "connection failed (gone)")
    fleet.mark_dead("http://c:1", "connection failed (gone)")
    with pytest.raises(PolicyError, match=r"no live inference server left \(http://a:1: connection failed"):
        fleet.acquire()


def test_a_server_that_is_gone_loses_the_episode_and_gets_no_more_turns(url: str, tiny: Any) -> None:
    down = _down()
    fleet = ServerFleet([down, url])
    policy = ServedPolicy(fleet, tokenizer=tiny[1])
    prompt, sampling = Prompt(token_ids=[5, 6, 7]), SamplingParams(max_new_tokens=2, seed=0)

    async def turns() -> list[Any]:
        out: list[Any] = []
        try:
            for _ in range(3):
                try:
                    out.append(await policy.generate(prompt, sampling))
                except EpisodeLost as exc:
                    out.append(exc)
        finally:
            await policy.aclose()
        return out

    results = asyncio.run(turns())
    lost = [r for r in results if isinstance(r, ServerLost)]
    assert len(lost) == 1 and lost[0].url == down and down in str(lost[0]) and "connection failed" in str(lost[0])
    assert all(r.extra["server"] == url for r in results if not isinstance(r, ServerLost))
    assert list(fleet.dead) == [down]


def test_a_server_error_is_a_policy_error_naming_the_url(url: str) -> None:
    policy = ServedPolicy(ServerFleet([url]), model="not-served")

    async def one() -> Any:
        try:
            return await policy.generate(Prompt(token_ids=[5, 6]), SamplingParams(max_new_tokens=2))
        finally:
            await policy.aclose()

    with pytest.raises(PolicyError, match=rf"{url}/inference/v1/generate: HTTP 404"):
        asyncio.run(one())


def test_bad_fleets_are_refused_naming_the_argument() -> None:
    with pytest.raises(ValueError, match="urls: expected a non-empty list"):
        ServerFleet([])
    with pytest.raises(ValueError, match=r"urls\[1\]: expected an http"):
        ServerFleet(["http://a:1", "a:2"])
    with pytest.raises(ValueError, match="urls: each server once"):
        ServerFleet(["http://a:1", "http://a:1/v1"])


def test_the_bearer_token_reaches_a_server_that_needs_one(tiny: Any) -> None:
    async def one(policy: ServedPolicy) -> Any:
        try:
            return await policy.generate(Prompt(token_ids=[5, 6]), SamplingParams(max_new_tokens=2, seed=0))
        finally:
            await policy.aclose()

    with serve_in_thread(create_app(HFPolicy(tiny[0], tiny[1]), "tiny", api_key="sekrit")) as base:
        root = server_root(base)
        with pytest.raises(PolicyError, match="HTTP 401"):
            asyncio.run(one(ServedPolicy(ServerFleet([root]))))
        assert len(asyncio.run(one(ServedPolicy(ServerFleet([root]), api_key="sekrit"))).token_ids) == 2
