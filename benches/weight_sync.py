"""Weight sync per transport, seconds per version, against a disk reload in the same run.

    python -m benches.weight_sync                          # CPU: a 30M-parameter Qwen2 shape, fp32
    python -m benches.weight_sync --small                  # tiny shapes (the CI smoke test)
    python -m benches.weight_sync --cuda --json runs/bench_weight_sync.json   # Qwen2-0.5B shape, bf16, one GPU

On CPU every process (this one and the servers) runs one torch thread: on a
shared 2-core machine two OpenMP threads per process made a 72 MiB ``copy_``
30x slower. Every transport ends where a rollout engine ends: the new weights ``copy_``-ed
into a running engine's tensors, under the new version. Transports:

* ``in_process``: ``rollout.weight_transfer.load_in_process`` from the learner's
  model into an ``HFPolicy`` engine in this process (device to device on CUDA);
* ``ipc`` (``--cuda``): CUDA IPC to a colocated process on the same GPU: the
  learner packs its tensors into one buffer, whose handle the child opened once;
  per version the child copies out of it into its engine and acknowledges;
* ``gloo`` (CPU): ``learner.weight_transfer.BroadcastPublisher`` to 1 and 2
  ``agentenv serve`` processes (the group formed once, before timing);
* ``nccl`` (``--cuda``): the same to one server process on the same GPU (NCCL
  refuses two ranks on one device; the table says so when it does);
* ``disk``: ``learner.publish.ServerReloadPublisher`` (``save_pretrained``, fsync,
  ``POST /update_weights_from_disk``) to the same servers: the baseline every
  ratio is taken against (``disk / transport`` for the same number of servers).

After each transport's last version every receiver's weights are hashed
(``weights_sha256``) against the learner's. Servers are subprocesses of this
bench serving a model built from the same config (``--serve``, internal).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table
from transformers import AutoModelForCausalLM, PretrainedConfig, Qwen2Config

__all__ = ["bench_config", "run_bench"]

REPO = Path(__file__).resolve().parents[1]
console = Console(width=160)


def bench_config(kind: str, tok: Any) -> Qwen2Config:
    """``small``: the tiny test shape; ``cpu``: a 30M-parameter Qwen2 shape; ``cuda``: Qwen2-0.5B's shape."""
    from rollout.policy.models import tiny_config

    if kind == "small":
        return tiny_config(tok, hidden_size=64, num_layers=2)
    if kind == "cpu":
        return tiny_config(tok, hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=2)
    return Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                       num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768,
                       rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0}, tie_word_embeddings=True)


def _empty_model(config: PretrainedConfig, dtype: torch.dtype, device: str, fill: float) -> Any:
    """The model allocated on ``device`` and filled with a constant: a random init of 0.5B costs minutes on CPU."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.to_empty(device=device)
    model.tie_weights()
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(fill)
    return model.eval()


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


# ---------------------------------------------------------------- server and IPC child processes


def _serve(config_path: str, port: int, device: str, dtype: str) -> None:
    """``--serve``: one ``agentenv serve`` app over a model of ``config_path`` (filled, not initialised)."""
    import uvicorn

    from rollout.policy.hf import HFPolicy
    from rollout.serve import create_app
    from rollout.tokenizer import build_tokenizer

    config = Qwen2Config.from_json_file(config_path)
    model = _empty_model(config, getattr(torch, dtype), device, 0.0)
    policy = HFPolicy(model, build_tokenizer(), device=device, name="bench-server")
    uvicorn.run(create_app(policy, "bench"), host="127.0.0.1", port=port, log_level="warning")


def _ipc_child(conn: Any, config: PretrainedConfig, dtype: torch.dtype) -> None:
    """A colocated rollout process: opens the learner's buffer once, copies each version into its engine."""
    from rollout.policy.hf import HFPolicy
    from rollout.tokenizer import build_tokenizer
    from rollout.weight_transfer import load_in_process, open_ipc_handles, unpack, weights_sha256

    policy = HFPolicy(_empty_model(config, dtype, "cuda", 0.0), build_tokenizer(), device="cuda", name="bench-ipc")
    policy.engine  # the engine's tensors are the model's: the copy lands in them
    views: dict[str, torch.Tensor] = {}
    conn.send("ready")
    while True:
        msg = conn.recv()
        if msg[0] == "open":
            _, handle, metas = msg
            views = unpack(metas, open_ipc_handles(handle))
            conn.send("opened")
        elif msg[0] == "load":
            load_in_process(policy, views, msg[1])
            torch.cuda.synchronize()
            conn.send(("loaded", msg[1]))
        elif msg[0] == "hash":
            conn.send(weights_sha256(policy.model.state_dict()))
        else:
            policy.close()
            conn.send("bye")
            return


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Servers:
    """``n`` server subprocesses over the bench's config; their root URLs in ``urls``."""

    def __init__(self, n: int, config: PretrainedConfig, device: str, dtype: torch.dtype, tmp: Path) -> None:
        cfg = tmp / "config.json"
        config.to_json_file(str(cfg))
        self.procs: list[subprocess.Popen[bytes]] = []
        self.urls: list[str] = []
        self.logs: list[Path] = []
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
        if device == "cpu":
            env["OMP_NUM_THREADS"] = "1"
        for i in range(n):
            port = _free_port()
            log = tmp / f"server{i}.log"
            self.logs.append(log)
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "benches.weight_sync", "--serve", str(cfg), "--port", str(port),
                 "--device", device, "--dtype", str(dtype).removeprefix("torch.")],
                stdout=subprocess.DEVNULL, stderr=open(log, "w"), env=env, cwd=str(REPO)))  # noqa: SIM115
            self.urls.append(f"http://127.0.0.1:{port}")

    def wait(self, timeout_s: float = 300.0) -> None:
        import httpx

        deadline = time.monotonic() + timeout_s
        for proc, url, log in zip(self.procs, self.urls, self.logs):
            while True:
                try:
                    if httpx.get(f"{url}/v1/models", timeout=5).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"bench server {url} did not start: {log.read_text()[-2000:]}")
                time.sleep(0.2)

    def hashes(self, urls: list[str]) -> list[tuple[int, str]]:
        import httpx

        out = []
        for url in urls:
            body = httpx.get(f"{url}/weights_sha256", timeout=300).json()
            out.append((int(body["version"]), str(body["weights_sha256"])))
        return out

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


# ---------------------------------------------------------------- the bench


def _publish(pub: Callable[[Any, int], Any], learner: Any) -> Callable[[int], Any]:
    return lambda v: pub(learner, v)


def _verify(servers: _Servers, n: int, want: Callable[[int], list[tuple[int, str]]]) -> Callable[[], bool]:
    return lambda: servers.hashes(servers.urls[:n]) == want(n)


def run_bench(*, kind: str, repeats: int, fsync: bool = True,
              partial: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """The report; ``partial(report)`` is called after every transport (a run cut short keeps what it measured)."""
    from learner.model import PolicyModel
    from learner.publish import ServerReloadPublisher
    from learner.weight_transfer import BroadcastPublisher
    from rollout.policy.hf import HFPolicy
    from rollout.tokenizer import build_tokenizer
    from rollout.weight_transfer import ipc_handles, load_in_process, pack, plan, weights_sha256

    cuda = kind == "cuda"
    device = "cuda" if cuda else "cpu"
    if not cuda:  # 3 processes on a shared 2-core machine: 2 OpenMP threads each made a 72 MiB copy_ 30x slower
        torch.set_num_threads(1)
    dtype = torch.bfloat16 if cuda else torch.float32
    tok = build_tokenizer()
    config = bench_config(kind, tok)
    learner = PolicyModel(_empty_model(config, dtype, device, 0.01))
    emb: torch.Tensor = learner.lm.get_input_embeddings().weight  # type: ignore[assignment]
    with torch.no_grad():  # a learner state unlike any receiver's start, distinct per row
        emb.copy_(torch.randn(tuple(emb.shape), generator=torch.Generator().manual_seed(0)).to(emb))
    n_params = sum(p.numel() for p in learner.parameters())
    n_bytes = sum(t.numel() * t.element_size() for t in learner.lm.parameters())
    tmp = Path(tempfile.mkdtemp(prefix="bench_weight_sync_"))
    servers = _Servers(1 if cuda else 2, config, device, dtype, tmp)
    rows: dict[str, dict[str, Any]] = {}
    version = 0

    def bump() -> int:
        nonlocal version
        version += 1
        with torch.no_grad():
            emb[version % 97].add_(0.5)
        return version

    def timed(name: str, servers_n: int, once: Callable[[int], Any], verify: Callable[[], bool],
              note: str = "") -> None:
        secs: list[float] = []
        for _ in range(repeats):
            v = bump()
            _sync(device)
            start = time.monotonic()
            once(v)
            _sync(device)
            secs.append(time.monotonic() - start)
            console.log(f"{name}: version {v} in {secs[-1]:.4f}s")
        rows[name] = {"servers": servers_n, "seconds": [round(s, 5) for s in secs], "median_s": statistics.median(secs),
                      "verified": verify(), "note": note}
        if partial is not None:
            partial(report())

    def report() -> dict[str, Any]:
        for row in rows.values():
            base = rows.get(f"disk_{max(1, row['servers'])}")
            row["disk_over_this"] = (base["median_s"] / row["median_s"]) if base and row["median_s"] else None
        return {
            "model": {"small": "tiny (rollout.policy.models.tiny_config)", "cpu": "Qwen2 shape, hidden 512, 8 layers",
                      "cuda": "Qwen2-0.5B shape (Qwen2Config)"}[kind],
            "device": torch.cuda.get_device_name() if cuda else "cpu", "dtype": str(dtype).removeprefix("torch."),
            "params": n_params, "state_bytes": n_bytes, "repeats": repeats, "fsync": fsync,
            "torch": torch.__version__, "torch_threads": torch.get_num_threads(), "transports": rows,
        }

    try:
        servers.wait()  # before timing anything: a server starting up would take the CPU from the timed transports
        # in process: learner -> an engine in this process
        engine_policy = HFPolicy(_empty_model(config, dtype, device, 0.0), tok, device=device, name="bench-engine")
        engine_policy.engine  # noqa: B018 - started, as a worker's is
        load_in_process(engine_policy, learner.lm, 0)  # warm-up (allocator, first copy)
        timed("in_process", 0, lambda v: load_in_process(engine_policy, learner.lm, v),
              lambda: weights_sha256(engine_policy.model.state_dict()) == weights_sha256(learner.lm.state_dict()))
        engine_policy.close()
        del engine_policy

        if cuda:  # CUDA IPC to a colocated process
            ctx = mp.get_context("spawn")
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_ipc_child, args=(child, config, dtype), daemon=True)
            proc.start()
            try:
                assert parent.recv() == "ready"
                state = learner.lm.state_dict()
                metas, _ = plan(state)
                buf = pack(metas, state, device)
                start = time.monotonic()
                parent.send(("open", ipc_handles(buf), metas))
                assert parent.recv() == "opened"
                open_s = time.monotonic() - start

                def ipc_once(v: int) -> None:
                    pack(metas, learner.lm.state_dict(), device, out=buf)
                    torch.cuda.synchronize()
                    parent.send(("load", v))
                    assert parent.recv() == ("loaded", v)

                def ipc_verify() -> bool:
                    parent.send(("hash",))
                    return bool(parent.recv() == weights_sha256(learner.lm.state_dict()))

                timed("ipc", 1, ipc_once, ipc_verify, note=f"handle opened once: {open_s:.3f}s")
                parent.send(("stop",))
                parent.recv()
            finally:
                proc.join(30)

        def want(n: int) -> list[tuple[int, str]]:
            return [(version, weights_sha256(learner.lm.state_dict()))] * n

        if not cuda:  # gloo broadcast to 1 and 2 servers
            for n in (1, 2):
                pub = BroadcastPublisher(servers.urls[:n], "gloo", timeout_s=300)
                start = time.monotonic()
                pub(learner, bump())  # forms the group: not timed
                join_s = time.monotonic() - start
                timed(f"gloo_{n}", n, _publish(pub, learner), _verify(servers, n, want),
                      note=f"first publish (joins the group) {join_s:.3f}s")
                pub.close()

        ns = (1,) if cuda else (1, 2)
        for n in ns:
            root = tmp / f"disk{n}"
            disk = ServerReloadPublisher(root, servers.urls[:n], keep=1, timeout_s=600, fsync=fsync)
            timed(f"disk_{n}", n, _publish(disk, learner), _verify(servers, n, want),
                  note="save_pretrained + fsync + /update_weights_from_disk")
            shutil.rmtree(root, ignore_errors=True)

        if cuda:  # NCCL to a server process on the same GPU (last: a failure may leave that server unusable)
            pub = BroadcastPublisher(servers.urls[:1], "nccl", timeout_s=30)
            try:
                pub(learner, bump())
                timed("nccl_1", 1, lambda v: pub(learner, v), lambda: servers.hashes(servers.urls[:1]) == want(1))
            except Exception as exc:  # noqa: BLE001 - the bench reports why NCCL did not work here, and goes on
                rows["nccl_1"] = {"servers": 1, "seconds": [], "median_s": None, "verified": False,
                                  "note": f"failed: {str(exc)[:400]}"}
            finally:
                pub.close()
    finally:
        servers.close()
        shutil.rmtree(tmp, ignore_errors=True)

    return report()


def _table(report: dict[str, Any]) -> Table:
    t = Table(title=f"weight sync per version: {report['model']}, {report['params'] / 1e6:.1f}M params, "
                    f"{report['state_bytes'] / 2**20:.0f} MiB {report['dtype']} on {report['device']}, "
                    f"median of {report['repeats']}")
    for col in ("transport", "servers", "s / version", "all runs s", "disk reload / this", "verified", "note"):
        t.add_column(col)
    for name, row in report["transports"].items():
        med = row["median_s"]
        ratio = row["disk_over_this"]
        t.add_row(name, str(row["servers"] or "-"), f"{med:.4f}" if med is not None else "-",
                  " ".join(f"{s:.4f}" for s in row["seconds"]), f"{ratio:.1f}x" if ratio else "-",
                  str(row["verified"]), row["note"])
    return t


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benches.weight_sync", description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="tiny shapes (a smoke test)")
    parser.add_argument("--cuda", "--h200", dest="cuda", action="store_true",
                        help="Qwen2-0.5B shape, bf16, on one GPU: in-process, IPC, NCCL, disk")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-fsync", action="store_true")
    parser.add_argument("--json", type=Path, default=None, help="also write the report here")
    parser.add_argument("--serve", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cpu", help=argparse.SUPPRESS)
    parser.add_argument("--dtype", default="float32", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        _serve(args.serve, args.port, args.device, args.dtype)
        return
    if args.repeats < 1:
        parser.error(f"--repeats: expected >= 1, got {args.repeats}")
    if args.cuda and not torch.cuda.is_available():
        parser.error("--cuda: no CUDA device here")
    kind = "cuda" if args.cuda else ("small" if args.small else "cpu")
    def write(report: dict[str, Any]) -> None:
        if args.json is not None:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(report, indent=2) + "\n")

    report = run_bench(kind=kind, repeats=args.repeats, fsync=not args.no_fsync, partial=write)
    console.print(_table(report))
    write(report)
    if kind == "cuda":  # a failed NCCL attempt may leave a communicator thread waiting out its timeout: do not wait
        sys.stdout.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
