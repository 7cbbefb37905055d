"""``agentenv serve``'s bounds (issue 26): a weights root for ``/update_weights_from_disk`` and an optional
bearer token on every route, over real HTTP (uvicorn on 127.0.0.1, httpx)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from transformers import PreTrainedTokenizerBase

from rollout.policy.hf import HFPolicy
from rollout.policy.models import save_checkpoint, tiny_model
from rollout.serve import create_app, serve_in_thread

pytestmark = pytest.mark.unit
KEY = "serve-key-for-this-test"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def tok() -> PreTrainedTokenizerBase:
    return tiny_model(seed=0)[1]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory, tok: PreTrainedTokenizerBase) -> Path:
    base = tmp_path_factory.mktemp("serve-bounds")
    (base / "weights").mkdir()
    model, _ = tiny_model(seed=1, tokenizer=tok)
    save_checkpoint(model, tok, base / "weights" / "v1")
    save_checkpoint(model, tok, base / "outside")
    os.symlink(base / "outside", base / "weights" / "escape")
    return base


@pytest.fixture()
def server(tok: PreTrainedTokenizerBase, root: Path) -> Iterator[str]:
    policy = HFPolicy(tiny_model(seed=0, tokenizer=tok)[0], tok)
    app = create_app(policy, "tiny", weights_root=str(root / "weights"), api_key=KEY)
    with serve_in_thread(app) as base:
        yield base.removesuffix("/v1")


ROUTES = [
    ("GET", "/get_model_info", None),
    ("GET", "/v1/models", None),
    ("POST", "/v1/completions", {"model": "tiny", "prompt": [5, 6], "max_tokens": 2}),
    ("POST", "/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
    ("POST", "/update_weights_from_disk", {"model_path": "/", "version": 1}),
]


@pytest.mark.parametrize(("method", "route", "body"), ROUTES, ids=[r[1] for r in ROUTES])
def test_every_route_needs_the_bearer_token(server: str, method: str, route: str, body: dict | None) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"X-Api-Key": KEY}):
        r = httpx.request(method, server + route, json=body, headers=headers, timeout=30)
        assert r.status_code == 401, (route, headers, r.text)
    if route != "/update_weights_from_disk":
        assert httpx.request(method, server + route, json=body, headers=AUTH, timeout=60).status_code == 200


def test_a_weights_path_outside_the_root_is_refused_naming_the_field(server: str, root: Path) -> None:
    for path in ("/etc", str(root / "outside"), str(root / "weights" / "escape"), str(root / "weights" / ".." / "outside")):
        r = httpx.post(f"{server}/update_weights_from_disk", json={"model_path": path, "version": 1}, headers=AUTH, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "model_path", (path, r.text)
        assert "weights root" in r.json()["message"]
    info = httpx.get(f"{server}/get_model_info", headers=AUTH, timeout=10).json()
    assert info["version"] == 0


def test_a_weights_path_beneath_the_root_loads(server: str, root: Path) -> None:
    path = str(root / "weights" / "v1")
    r = httpx.post(f"{server}/update_weights_from_disk", json={"model_path": path, "version": 1}, headers=AUTH, timeout=120)
    assert r.status_code == 200 and r.json()["version"] == 1, r.text
