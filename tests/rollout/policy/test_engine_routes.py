"""vLLM's RL routes on ``agentenv serve``: token-in/token-out generate, pause (abort / keep) + weight update + resume."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from rollout.engine import EngineRequest
from rollout.policy.hf import HFPolicy
from rollout.policy.models import save_checkpoint, tiny_model
from rollout.serve import create_app, serve_in_thread

pytestmark = pytest.mark.unit


@pytest.fixture()
def served(tiny: Any) -> Iterator[tuple[str, HFPolicy]]:
    policy = HFPolicy(tiny_model(seed=0, tokenizer=tiny[1])[0], tiny[1], stop_token_ids=())
    with serve_in_thread(create_app(policy, "tiny")) as base:
        yield base.removesuffix("/v1"), policy
    policy.close()


def _generate(root: str, **body: Any) -> httpx.Response:
    return httpx.post(f"{root}/inference/v1/generate", json=body, timeout=60)


def test_token_in_token_out_matches_the_engine(served: tuple[str, HFPolicy], tiny: Any, recompute: Any) -> None:
    root, policy = served
    ids = tiny[1].encode("List the files.")
    r = _generate(root, model="tiny", token_ids=ids, sampling_params={"max_tokens": 12, "temperature": 0.7, "seed": 5})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    direct = policy.engine.generate_sync(EngineRequest(prompt_ids=ids, max_new_tokens=12, temperature=0.7, seed=5))
    assert choice["token_ids"] == list(direct.token_ids) and choice["finish_reason"] == "length"
    logprobs = [e["logprob"] for e in choice["logprobs"]["content"]]
    assert [e["token"] for e in choice["logprobs"]["content"]] == [f"token_id:{t}" for t in direct.token_ids]
    assert max(abs(a - b) for a, b in zip(logprobs, recompute(policy.model, ids, direct.token_ids, 0.7))) < 1e-5
    body = r.json()
    assert body["usage"]["prompt_tokens"] == len(ids) and body["agentenv"]["token_versions"] == [0] * 12


@pytest.mark.parametrize(("body", "param"), [
    ({"sampling_params": {"max_tokens": 2}}, "token_ids"),
    ({"token_ids": [1, 2], "sampling_params": {"top_k": 5}}, "sampling_params.top_k"),
    ({"token_ids": [1, 2], "sampling_params": {"max_tokens": -1}}, "sampling_params.max_tokens"),
    ({"token_ids": [1, 2], "sampling_params": {"top_p": 0}}, "sampling_params.top_p"),
    ({"token_ids": [10**7]}, "token_ids"),
    ({"token_ids": [1], "model": "other"}, "model"),
])
def test_malformed_generate_is_a_4xx_naming_the_field(served: tuple[str, HFPolicy], body: dict[str, Any], param: str) -> None:
    r = _generate(served[0], **body)
    assert 400 <= r.status_code < 500, r.text
    assert r.json()["error"]["param"] == param


def test_pause_keep_update_resume_splits_versions(served: tuple[str, HFPolicy], tiny: Any, tmp_path: Path) -> None:
    root, policy = served
    other, tok = tiny_model(seed=7, tokenizer=tiny[1])
    save_checkpoint(other, tok, tmp_path / "v1")
    result: dict[str, Any] = {}
    ids = tok.encode("List the files.")
    t = threading.Thread(target=lambda: result.update(r=_generate(root, token_ids=ids, sampling_params={"max_tokens": 400, "seed": 1})))
    t.start()
    deadline = time.monotonic() + 30
    while policy.engine.tokens_out < 3 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert httpx.post(f"{root}/pause", params={"mode": "keep"}, timeout=30).status_code == 200
    assert httpx.get(f"{root}/is_paused", timeout=30).json() == {"is_paused": True}
    up = httpx.post(f"{root}/update_weights_from_disk", json={"model_path": str(tmp_path / "v1"), "version": 1}, timeout=60)
    assert up.status_code == 200, up.text
    assert httpx.post(f"{root}/resume", timeout=30).json()["is_paused"] is False
    t.join(60)
    versions = result["r"].json()["agentenv"]["token_versions"]
    split = versions.index(1)
    assert len(versions) == 400 and 0 < split and versions == [0] * split + [1] * (400 - split)
    assert policy.version == 1


def test_pause_abort_ends_requests_in_flight(served: tuple[str, HFPolicy], tiny: Any) -> None:
    root, policy = served
    result: dict[str, Any] = {}
    ids = tiny[1].encode("hi")
    t = threading.Thread(target=lambda: result.update(r=_generate(root, token_ids=ids, sampling_params={"max_tokens": 500})))
    t.start()
    while policy.engine.tokens_out < 2:
        time.sleep(0.001)
    assert httpx.post(f"{root}/pause", params={"mode": "abort"}, timeout=30).status_code == 200
    t.join(60)
    choice = result["r"].json()["choices"][0]
    assert choice["finish_reason"] == "abort" and 0 < len(choice["token_ids"]) < 500
    assert httpx.post(f"{root}/pause", params={"mode": "later"}, timeout=30).json()["error"]["param"] == "mode"
    httpx.post(f"{root}/resume", timeout=30)
    assert _generate(root, token_ids=ids, sampling_params={"max_tokens": 3}).json()["usage"]["completion_tokens"] == 3


def test_sleep_frees_the_cache_and_wake_up_resumes(served: tuple[str, HFPolicy], tiny: Any) -> None:
    root, policy = served
    ids = tiny[1].encode("hi")
    first = _generate(root, token_ids=ids, sampling_params={"max_tokens": 5, "seed": 2}).json()["choices"][0]["token_ids"]
    assert httpx.post(f"{root}/sleep", params={"level": 1}, timeout=30).status_code == 200
    assert httpx.get(f"{root}/is_sleeping", timeout=30).json() == {"is_sleeping": True}
    assert policy.engine.slots.slots == 0 and policy.engine.slots.k == []
    assert httpx.post(f"{root}/resume", timeout=30).json()["error"]["param"] == "sleep"
    assert httpx.post(f"{root}/sleep", params={"level": 3}, timeout=30).json()["error"]["param"] == "level"
    result: dict[str, Any] = {}
    t = threading.Thread(target=lambda: result.update(r=_generate(root, token_ids=ids, sampling_params={"max_tokens": 5, "seed": 2})))
    t.start()
    time.sleep(0.3)
    assert "r" not in result  # held while asleep
    assert httpx.post(f"{root}/wake_up", timeout=30).json()["is_sleeping"] is False
    t.join(60)
    assert result["r"].json()["choices"][0]["token_ids"] == first
