"""Weight transfer for real: two ``agentenv serve`` subprocesses receive a gloo broadcast from the learner
(``learner.weight_transfer.BroadcastPublisher``) over vLLM's weight-transfer routes, and report its hash."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from ray_heads import free_port
from serve_procs import start_serve, stop, wait_up

from learner.model import PolicyModel
from learner.publish import PublishError
from learner.weight_transfer import BroadcastPublisher
from rollout.policy.hf import HFPolicy
from rollout.policy.models import tiny_model
from rollout.tokenizer import build_tokenizer
from rollout.weight_transfer import (
    TransferRequestError,
    check_metadata,
    load_in_process,
    pack,
    plan,
    unpack,
    weights_sha256,
)



@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    tmp = tmp_path_factory.mktemp("weight_transfer")
    started = [start_serve("tiny", tmp / f"s{i}.log") for i in range(2)]
    try:
        for server in started:
            wait_up(server)
        yield [server.url for server in started]
    finally:
        for server in started:
            stop(server)


@pytest.fixture(scope="module")
def learner() -> PolicyModel:
    model, _ = tiny_model(seed=7, tokenizer=build_tokenizer())
    return PolicyModel(model)


def _bump(learner: PolicyModel, version: int) -> None:
    with torch.no_grad():
        weight = learner.lm.get_input_embeddings().weight
        assert isinstance(weight, torch.Tensor)
        weight[version % 11].add_(0.25)


def _hash(url: str) -> dict[str, Any]:
    r = httpx.get(f"{url}/weights_sha256", timeout=30)
    assert r.status_code == 200, r.text
    return dict(r.json())


# ---------------------------------------------------------------- unit: no processes


@pytest.mark.unit
def test_pack_unpack_roundtrip_mixed_dtypes_and_alignment() -> None:
    state = {"a": torch.arange(3, dtype=torch.bfloat16), "b": torch.randn(5, 3), "c": torch.arange(7, dtype=torch.int64)}
    metas, aliases = plan(state)
    assert aliases == {}
    back = unpack(metas, pack(metas, state, "cpu"))
    for name, t in state.items():
        assert back[name].dtype == t.dtype and torch.equal(back[name], t)


@pytest.mark.unit
def test_in_process_copy_keeps_the_engine_tensors_and_checks_names(learner: PolicyModel) -> None:
    tok = build_tokenizer()
    policy = HFPolicy(tiny_model(seed=0, tokenizer=tok)[0], tok)
    before = {n: p.data_ptr() for n, p in policy.model.named_parameters()}
    policy.engine  # started: its cache and slots point at the model's tensors
    load_in_process(policy, learner.lm, version=4)
    assert policy.version == 4 and policy.engine.version == 4
    assert weights_sha256(policy.model.state_dict()) == weights_sha256(learner.lm.state_dict())
    assert {n: p.data_ptr() for n, p in policy.model.named_parameters()} == before  # copied in place
    bad = dict(learner.lm.state_dict())
    bad["model.norm.weight"] = torch.ones(3)
    with pytest.raises(TransferRequestError, match=r"model\.norm\.weight.*\[64\].*\[3\]"):
        load_in_process(policy, bad, version=5)
    assert policy.version == 4
    policy.close()


@pytest.mark.unit
def test_metadata_errors_name_the_tensor(learner: PolicyModel) -> None:
    metas, _ = plan(learner.lm.state_dict())
    names, dtypes, shapes = [m.name for m in metas], [m.dtype for m in metas], [list(m.shape) for m in metas]
    with pytest.raises(TransferRequestError, match="model.layers.0.mlp.nope") as e:
        check_metadata(learner.lm, ["model.layers.0.mlp.nope", *names[1:]], dtypes, shapes)
    assert e.value.field == "update_info.names"
    with pytest.raises(TransferRequestError, match="int64") as e:
        check_metadata(learner.lm, names, ["int64", *dtypes[1:]], shapes)
    assert e.value.field == "update_info.dtype_names"
    with pytest.raises(TransferRequestError, match="not sent") as e:
        check_metadata(learner.lm, names[:-1], dtypes[:-1], shapes[:-1])
    check_metadata(learner.lm, names, ["bfloat16"] * len(names), shapes)  # floating -> floating: cast on copy


# ---------------------------------------------------------------- two real servers


@pytest.mark.slow
def test_broadcast_to_two_servers_gives_them_the_learners_weights(servers: list[str], learner: PolicyModel) -> None:
    want = weights_sha256(learner.lm.state_dict())
    assert all(_hash(u)["weights_sha256"] != want for u in servers)
    pub = BroadcastPublisher([f"{u}/v1" for u in servers], "gloo", timeout_s=30)
    try:
        assert pub(learner, 1) == "broadcast:v1"
        assert [_hash(u) for u in servers] == [{"weights_sha256": want, "version": 1}] * 2
        _bump(learner, 2)  # the same group carries the next version
        pub(learner, 2)
        want = weights_sha256(learner.lm.state_dict())
        assert [_hash(u) for u in servers] == [{"weights_sha256": want, "version": 2}] * 2
        info = httpx.get(f"{servers[0]}/get_model_info", timeout=30).json()
        assert info["weights_sha256"] == want and info["version"] == 2 and info["model_path"] == "weight_transfer:v2"
    finally:
        pub.close()


@pytest.mark.slow
def test_keep_paused_generation_resumes_on_the_new_weights(servers: list[str], learner: PolicyModel) -> None:
    url = servers[0]
    old = int(httpx.get(f"{url}/get_model_info", timeout=30).json()["version"])
    result: dict[str, Any] = {}
    body = {"token_ids": [5, 6, 7], "sampling_params": {"max_tokens": 3000, "seed": 1, "ignore_eos": True}}
    t = threading.Thread(target=lambda: result.update(r=httpx.post(f"{url}/inference/v1/generate", json=body, timeout=120)))
    t.start()
    time.sleep(1.0)
    assert httpx.post(f"{url}/pause", params={"mode": "keep"}, timeout=30).status_code == 200
    pub = BroadcastPublisher([url], "gloo", timeout_s=30)
    try:
        _bump(learner, old + 1)
        pub(learner, old + 1)
    finally:
        pub.close()
    assert httpx.post(f"{url}/resume", timeout=30).status_code == 200
    t.join(120)
    r = result["r"]
    assert r.status_code == 200, r.text
    versions = r.json()["agentenv"]["token_versions"]
    assert len(versions) == 3000
    split = versions.index(old + 1)
    assert 0 < split and versions == [old] * split + [old + 1] * (3000 - split)
    assert _hash(url) == {"weights_sha256": weights_sha256(learner.lm.state_dict()), "version": old + 1}


@pytest.mark.slow
@pytest.mark.parametrize(("route", "body", "param"), [
    ("init_weight_transfer_engine", {"init_info": {"master_address": "127.0.0.1", "rank_offset": 1, "world_size": 2}},
     "init_info.master_port"),
    ("init_weight_transfer_engine", {"init_info": {"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 2,
                                                   "world_size": 2}}, "init_info.rank_offset"),
    ("init_weight_transfer_engine", {"init_info": {"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 1,
                                                   "world_size": 2, "backend": "nccl"}}, "init_info.backend"),
    ("update_weights", {"update_info": {"names": ["lm_head.nope"], "dtype_names": ["float32"], "shapes": [[1]]}},
     "update_info.names"),
    ("update_weights", {"update_info": {"names": ["model.norm.weight"], "dtype_names": ["float32"]}},
     "update_info.shapes"),
    ("update_weights", {"update_info": {"names": ["model.norm.weight"], "dtype_names": ["float32"], "shapes": [[3]]}},
     "update_info.shapes"),
    ("finish_weight_update", {"version": -1}, "version"),
])
def test_malformed_transfer_request_is_a_400_naming_the_field(servers: list[str], route: str, body: dict[str, Any],
                                                              param: str) -> None:
    r = httpx.post(f"{servers[1]}/{route}", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


@pytest.mark.slow
def test_a_server_that_never_joins_fails_the_publish_within_the_timeout(servers: list[str], learner: PolicyModel) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    pub = BroadcastPublisher([servers[1], dead], "gloo", timeout_s=5)
    start = time.monotonic()
    with pytest.raises(PublishError) as e:
        pub(learner, 50)
    assert time.monotonic() - start < 15
    assert dead in str(e.value) and dead in e.value.failed
    pub.close()


@pytest.mark.slow
def test_a_server_killed_between_versions_fails_the_next_publish_naming_it(
    tmp_path: Path, learner: PolicyModel
) -> None:
    victim = start_serve("tiny", tmp_path / "victim.log")
    proc, url = victim.proc, victim.url
    try:
        wait_up(victim)
        pub = BroadcastPublisher([url], "gloo", timeout_s=5)
        pub(learner, 1)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        start = time.monotonic()
        with pytest.raises(PublishError) as e:
            pub(learner, 2)
        assert time.monotonic() - start < 15
        assert url in e.value.failed
        pub.close()
    finally:
        stop(victim)


@pytest.mark.unit
def test_a_rank_that_never_joins_or_never_sends_is_a_timeout_not_a_hang() -> None:
    from rollout.weight_transfer import TransferGroup, TransferTimeout

    start = time.monotonic()
    with pytest.raises(TransferTimeout, match="within 2.0s"):
        TransferGroup("gloo", "127.0.0.1", free_port(), rank=0, world_size=2, timeout_s=2)
    assert time.monotonic() - start < 15
    port = free_port()
    made: dict[str, TransferGroup] = {}
    joiner = threading.Thread(target=lambda: made.update(
        r0=TransferGroup("gloo", "127.0.0.1", port, rank=0, world_size=2, timeout_s=2)))
    joiner.start()
    receiver = TransferGroup("gloo", "127.0.0.1", port, rank=1, world_size=2, timeout_s=2)
    joiner.join(15)
    start = time.monotonic()
    with pytest.raises(TransferTimeout):
        receiver.broadcast(torch.empty(4))  # rank 0 never sends
    assert time.monotonic() - start < 15
    made["r0"].close()
    receiver.close()


@pytest.mark.unit
def test_publisher_sends_the_servers_api_key(learner: PolicyModel) -> None:
    from rollout.serve import create_app, serve_in_thread

    tok = build_tokenizer()
    policy = HFPolicy(tiny_model(seed=0, tokenizer=tok)[0], tok)
    with serve_in_thread(create_app(policy, "tiny", api_key="sekrit")) as base:
        refused = BroadcastPublisher([base], "gloo", timeout_s=5)
        with pytest.raises(PublishError, match="401"):
            refused(learner, 1)
        pub = BroadcastPublisher([base], "gloo", timeout_s=30, api_key="sekrit")
        assert pub(learner, 1) == "broadcast:v1"
        assert policy.version == 1
        assert weights_sha256(policy.model.state_dict()) == weights_sha256(learner.lm.state_dict())
        pub.close()
    policy.close()
