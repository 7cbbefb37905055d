"""Weight publishing: atomic checkpoints (a crash mid-write never becomes LATEST), reloads into real
``agentenv serve`` servers (and the error that names a server that is down) and object-store packing.
The publish-latency bench's ``--small`` mode is tested in ``tests/benches/test_publish_bench.py``."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from transformers import PreTrainedTokenizerBase

from learner.errors import LearnerConfigError
from learner.model import PolicyModel
from learner.publish import (
    CheckpointPublisher,
    PublishError,
    ServerReloadPublisher,
    from_shareable,
    latest_version,
    to_shareable,
)
from rollout.policy.hf import HFPolicy
from rollout.policy.models import tiny_model
from rollout.policy.types import Prompt, SamplingParams
from rollout.serve import create_app, serve_in_thread

PROMPT = [5, 6, 7, 8]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tok() -> PreTrainedTokenizerBase:
    return tiny_model(seed=0)[1]


def _policy_model(tok: PreTrainedTokenizerBase, seed: int) -> PolicyModel:
    return PolicyModel(tiny_model(seed=seed, tokenizer=tok)[0])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _logprobs(base: str) -> list[float]:
    r = httpx.post(f"{base}/completions", timeout=30,
                   json={"model": "tiny", "prompt": PROMPT, "max_tokens": 4, "seed": 1, "logprobs": 1})
    assert r.status_code == 200, r.text
    return list(r.json()["choices"][0]["logprobs"]["token_logprobs"])


def _reference(tok: PreTrainedTokenizerBase, seed: int) -> list[float]:
    policy = HFPolicy(tiny_model(seed=seed, tokenizer=tok)[0], tok)
    return list(policy.generate_sync(Prompt(token_ids=PROMPT), SamplingParams(max_new_tokens=4, seed=1)).logprobs)


@pytest.fixture()
def servers(tok: PreTrainedTokenizerBase) -> Iterator[list[str]]:
    with serve_in_thread(create_app(HFPolicy(tiny_model(seed=0, tokenizer=tok)[0], tok), "tiny")) as a, \
            serve_in_thread(create_app(HFPolicy(tiny_model(seed=0, tokenizer=tok)[0], tok), "tiny")) as b:
        yield [a, b]


# ---------------------------------------------------------------- ServerReloadPublisher, real servers


@pytest.mark.unit
def test_server_reload_publisher_loads_every_server(servers: list[str], tok: PreTrainedTokenizerBase, tmp_path: Path) -> None:
    pub = ServerReloadPublisher(tmp_path / "w", servers, tokenizer=tok, timeout_s=30)
    path = pub(_policy_model(tok, 1), 1)
    assert path == str(tmp_path / "w" / "v00000001") and latest_version(tmp_path / "w") == (1, Path(path))
    for base in servers:
        assert httpx.get(base.removesuffix("/v1") + "/get_model_info").json()["version"] == 1
        assert _logprobs(base) == _reference(tok, 1)
    assert sorted(pub.last_reloads) == sorted(s.removesuffix("/v1") for s in servers)
    assert all(r["version"] == 1 and r["load_s"] >= 0 for r in pub.last_reloads.values())
    pub(_policy_model(tok, 2), 2)
    assert all(_logprobs(base) == _reference(tok, 2) for base in servers)


@pytest.mark.unit
def test_a_server_that_is_down_or_refuses_is_named(servers: list[str], tok: PreTrainedTokenizerBase, tmp_path: Path) -> None:
    down = f"http://127.0.0.1:{_free_port()}/v1"
    pub = ServerReloadPublisher(tmp_path / "w", [servers[0], down], tokenizer=tok, timeout_s=10)
    with pytest.raises(PublishError) as info:
        pub(_policy_model(tok, 1), 3)
    err = info.value
    assert down.removesuffix("/v1") in str(err) and "connection failed" in str(err) and "1 of 2" in str(err)
    assert list(err.failed) == [down.removesuffix("/v1")] and err.path.endswith("v00000003")
    assert _logprobs(servers[0]) == _reference(tok, 1)  # the live one is on the new version
    # a server already ahead refuses an older version: its HTTP answer is in the error
    httpx.post(servers[1].removesuffix("/v1") + "/update_weights_from_disk",
               json={"model_path": err.path, "version": 9}, timeout=30).raise_for_status()
    behind = ServerReloadPublisher(tmp_path / "w2", [servers[1]], tokenizer=tok, timeout_s=10)
    with pytest.raises(PublishError, match=r"HTTP 409: version: 4 is older than the loaded version 9"):
        behind(_policy_model(tok, 1), 4)


@pytest.mark.unit
def test_server_reload_publisher_rejects_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(LearnerConfigError, match="servers: expected a non-empty list"):
        ServerReloadPublisher(tmp_path, [])
    with pytest.raises(LearnerConfigError, match=r"servers\[1\]: expected an http\(s\):// URL, got 'localhost:8000'"):
        ServerReloadPublisher(tmp_path, ["http://a:1", "localhost:8000"])
    with pytest.raises(LearnerConfigError, match="timeout_s: expected > 0"):
        ServerReloadPublisher(tmp_path, ["http://a:1"], timeout_s=0)


# ---------------------------------------------------------------- CheckpointPublisher is atomic


class _CrashingModel(PolicyModel):
    """Writes part of a checkpoint, then fails (as a full disk or a kill mid-write would)."""

    def save(self, path: str | os.PathLike[str]) -> Path:
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text("{}")
        (out / "model.safetensors").write_bytes(b"\0" * 100)
        raise OSError("No space left on device")


@pytest.mark.unit
def test_a_half_written_checkpoint_never_becomes_latest(tok: PreTrainedTokenizerBase, tmp_path: Path) -> None:
    root = tmp_path / "w"
    pub = CheckpointPublisher(root, keep=2)
    good = _policy_model(tok, 1)
    pub(good, 1)
    with pytest.raises(OSError, match="No space"):
        pub(_CrashingModel(tiny_model(seed=2, tokenizer=tok)[0]), 2)
    assert latest_version(root) == (1, root / "v00000001") and (root / "v00000002.tmp").is_dir()
    assert not (root / "v00000002").exists()
    loaded = PolicyModel.from_pretrained(root / "v00000001")
    assert all(torch.equal(p, q) for p, q in zip(good.parameters(), loaded.parameters()))
    # the same version again replaces it whole; the next publish sweeps the leftover
    pub(_policy_model(tok, 3), 1)
    pub(_policy_model(tok, 4), 2)
    assert sorted(p.name for p in root.iterdir()) == ["LATEST", "v00000001", "v00000002"]
    with pytest.raises(LearnerConfigError, match="version 1 is older than LATEST 2"):
        pub(good, 1)
    (root / "LATEST").write_text("garbage")
    with pytest.raises(OSError, match="expected a version number"):
        latest_version(root)


@pytest.mark.unit
@pytest.mark.slow
def test_killed_mid_publish_latest_is_always_a_whole_checkpoint(tmp_path: Path) -> None:
    """A real SIGKILL at several points of a publishing loop: LATEST always names a loadable checkpoint."""
    root = tmp_path / "w"
    script = textwrap.dedent(f"""
        import sys
        from learner.model import PolicyModel
        from learner.publish import CheckpointPublisher, latest_version
        from rollout.policy.models import tiny_model
        model, tok = tiny_model(seed=0, hidden_size=128, num_layers=4)
        pub = CheckpointPublisher({str(root)!r}, tokenizer=tok, keep=2)
        v = (latest_version({str(root)!r}) or (0,))[0]  # a restarted run continues from LATEST
        while True:
            v += 1
            pub(PolicyModel(model), v)
            print(v, flush=True)
    """)
    for delay in (0.03, 0.3):
        proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            first = proc.stdout.readline()  # one version is published: the loop is running
            assert first.strip().isdigit(), first
            time.sleep(delay)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
        version, where = latest_version(root)  # type: ignore[misc]
        assert version >= 1 and where.is_dir()
        PolicyModel.from_pretrained(where)  # whole: config and weights, loaded strictly below


# ---------------------------------------------------------------- object-store packing


@pytest.mark.unit
def test_shareable_state_round_trips_bf16_and_tied_weights(tok: PreTrainedTokenizerBase) -> None:
    model = tiny_model(seed=0, tokenizer=tok, dtype=torch.bfloat16)[0]
    state = model.state_dict()
    shared = to_shareable(state)
    assert "lm_head.weight" in shared["aliases"] and shared["dtypes"]["model.embed_tokens.weight"] == "bfloat16"
    back = from_shareable(shared)
    assert set(back) == set(state) and all(torch.equal(back[k], state[k]) and back[k].dtype == state[k].dtype for k in state)
    other = tiny_model(seed=5, tokenizer=tok, dtype=torch.bfloat16)[0]
    other.load_state_dict(back, strict=True)
    assert torch.equal(other.lm_head.weight, state["model.embed_tokens.weight"])

