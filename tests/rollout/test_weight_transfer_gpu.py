"""Weight transfer on an accelerator (marker ``gpu``; never in CI): CUDA IPC into a colocated process's engine,
and an NCCL broadcast into ``agentenv serve`` on a second GPU. Runs with ``--noconftest``."""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from rollout.policy.models import tiny_model
from rollout.weight_transfer import ipc_handles, pack, plan, weights_sha256

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
ROOT = Path(__file__).resolve().parents[2]


def _child(conn: Any) -> None:
    from rollout.policy.hf import HFPolicy
    from rollout.weight_transfer import load_in_process, open_ipc_handles, unpack

    model, tok = tiny_model(seed=0)
    policy = HFPolicy(model, tok, device="cuda")
    before = {n: p.data_ptr() for n, p in policy.model.named_parameters()}
    policy.engine  # noqa: B018 - started: graphs captured over these tensors must stay valid
    handle, metas = conn.recv()
    load_in_process(policy, unpack(metas, open_ipc_handles(handle)), 3)
    torch.cuda.synchronize()
    same = {n: p.data_ptr() for n, p in policy.model.named_parameters()} == before
    conn.send((policy.version, weights_sha256(policy.model.state_dict()), same))
    conn.recv()
    policy.close()


def test_cuda_ipc_into_a_colocated_engine() -> None:
    learner: Any = tiny_model(seed=7)[0]
    state = learner.to("cuda").state_dict()
    metas, _ = plan(state)
    buf = pack(metas, state, "cuda")
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_child, args=(child,), daemon=True)
    proc.start()
    try:
        parent.send((ipc_handles(buf), metas))
        assert parent.poll(120), "the colocated process did not answer"
        version, digest, in_place = parent.recv()
        assert (version, digest, in_place) == (3, weights_sha256(state), True)
        parent.send("done")
    finally:
        proc.join(60)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL refuses two ranks on one GPU: needs 2 GPUs")
def test_nccl_broadcast_into_a_server_on_another_gpu(tmp_path: Path) -> None:
    from learner.model import PolicyModel
    from learner.weight_transfer import BroadcastPublisher

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "agentenv.cli", "serve", "tiny", "--port", str(port), "--device",
                             "cuda:1"], stdout=subprocess.DEVNULL, stderr=open(tmp_path / "s.log", "w"),  # noqa: SIM115
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=str(ROOT))
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if httpx.get(f"{url}/v1/models", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "s.log").read_text()[-2000:]
            time.sleep(0.3)
        lm: Any = tiny_model(seed=7)[0]
        learner = PolicyModel(lm.to("cuda:0"))
        pub = BroadcastPublisher([url], "nccl", timeout_s=60)
        pub(learner, 1)
        body = httpx.get(f"{url}/weights_sha256", timeout=60).json()
        assert body == {"weights_sha256": weights_sha256(learner.lm.state_dict()), "version": 1}
        pub.close()
    finally:
        proc.terminate()
        proc.wait(30)
