"""Weight-publish latency to 4 workers: the Ray object store against a checkpoint reload, in one run.

    python -m benches.publish --json runs/bench_publish.json      # Qwen2-0.5B shapes, bf16
    python -m benches.publish --small                             # tiny shapes, a CI smoke test

The model is a ``transformers`` ``Qwen2Config`` with Qwen2-0.5B's shapes
(24 layers, hidden 896, MLP 4864, 14 heads / 2 KV heads, vocabulary 151,936,
tied embeddings; 494M parameters), random-initialised in bf16 (1 GB; nothing is
downloaded). Each of ``--workers`` Ray actors holds its own ``HFPolicy`` over
its own copy of the model and serves it with ``agentenv serve``'s app, so both
sides end where the engine's workers end: the policy swapped to the new
version. One publish is, timed on the driver from its first step until every
worker holds the new weights:

* **object store**: one ``ray.put(to_shareable(state))`` per version, then every
  worker ``ray.get``s it (numpy arrays: mapped, not copied) and calls
  ``HFPolicy.load_state_dict``;
* **checkpoint reload**: ``ServerReloadPublisher``: ``save_pretrained`` once
  (written under a temporary name, fsynced, renamed), then every worker's server
  gets ``POST /update_weights_from_disk`` and loads it (memory-mapped, checked
  strictly).

The two alternate within each repetition (the order flips every time), the
median of ``--repeats`` is reported with their ratio, and after the last
repetition every worker's weights are hashed against the learner's. Ray runs
with ``num_cpus=2`` and is stopped at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import ray
import torch
from rich.console import Console
from rich.table import Table
from transformers import AutoModelForCausalLM, PretrainedConfig, Qwen2Config

from learner.model import PolicyModel
from learner.publish import ServerReloadPublisher, from_shareable, to_shareable

__all__ = ["qwen2_05b_config", "run_bench"]


def qwen2_05b_config(vocab_size: int = 151936) -> Qwen2Config:
    """Qwen2-0.5B's shapes (from its published config), built locally."""
    return Qwen2Config(
        vocab_size=vocab_size, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        rms_norm_eps=1e-6, tie_word_embeddings=True, hidden_act="silu",
    )


def _digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


@ray.remote
class _Worker:
    """A rollout worker's side: its own model in an ``HFPolicy``, served by ``agentenv serve``'s app."""

    def __init__(self, config: PretrainedConfig, seed: int) -> None:  # noqa: D107
        from rollout.policy.hf import HFPolicy
        from rollout.serve import create_app, serve_in_thread
        from rollout.tokenizer import build_tokenizer

        # Allocated, not initialised (random init of 0.5B parameters per worker costs minutes on 2 cores and
        # is overwritten by the first publish); the learner's weights are random-initialised.
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        model.to_empty(device="cpu")
        model.tie_weights()
        with torch.no_grad():
            model.get_input_embeddings().weight.fill_(float(seed))  # differs from every published version
        self.policy = HFPolicy(model, build_tokenizer(), name=f"bench-worker-{seed}")
        self._serving = serve_in_thread(create_app(self.policy, "bench"))
        self.url = self._serving.__enter__()

    def base_url(self) -> str:
        return self.url

    def load_from_store(self, boxed: list[Any], version: int) -> float:
        start = time.monotonic()
        shared = ray.get(boxed[0])
        self.policy.load_state_dict(from_shareable(shared), version)
        del shared
        return time.monotonic() - start

    def state(self) -> tuple[int, str]:
        return self.policy.version, _digest(self.policy.model)

    def close(self) -> None:
        self._serving.__exit__(None, None, None)


def _bump(model: PolicyModel, version: int) -> None:
    """A new version differs from the last (one row of the embedding), so a stale worker cannot pass the check."""
    with torch.no_grad():
        weight = model.lm.get_input_embeddings().weight
        assert isinstance(weight, torch.Tensor)
        weight[version % 7].add_(0.5)


def run_bench(*, small: bool, workers: int, repeats: int, fsync: bool = True, console: Console | None = None) -> dict[str, Any]:
    from rollout.policy.models import tiny_config
    from rollout.tokenizer import build_tokenizer

    tok = build_tokenizer()
    config: PretrainedConfig = tiny_config(tok) if small else qwen2_05b_config()
    learner = PolicyModel.from_config(config, seed=0, dtype=torch.bfloat16)
    n_params = sum(p.numel() for p in learner.parameters())
    n_bytes = sum(a.nbytes for a in to_shareable(learner.lm.state_dict())["arrays"].values())
    root = Path(tempfile.mkdtemp(prefix="bench_publish_"))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=True,
             object_store_memory=max(256 << 20, 3 * n_bytes))
    seconds: dict[str, list[float]] = {"object_store": [], "checkpoint_reload": []}
    parts: dict[str, list[float]] = {"put_s": [], "write_s": [], "worker_store_s": [], "worker_reload_s": []}
    try:
        actors = [_Worker.options(num_cpus=2 / workers).remote(config, seed) for seed in range(1, workers + 1)]  # type: ignore[attr-defined]
        urls = ray.get([a.base_url.remote() for a in actors])
        pub = ServerReloadPublisher(root, urls, tokenizer=None, keep=1, timeout_s=600, fsync=fsync)
        version = 0

        def object_store() -> None:
            start = time.monotonic()
            ref = ray.put(to_shareable(learner.lm.state_dict()))
            parts["put_s"].append(time.monotonic() - start)
            took = ray.get([a.load_from_store.remote([ref], version) for a in actors])
            seconds["object_store"].append(time.monotonic() - start)
            parts["worker_store_s"].append(max(took))
            del ref

        def checkpoint_reload() -> None:
            start = time.monotonic()
            pub(learner, version)
            total = time.monotonic() - start
            reload_s = max(float(r["request_s"]) for r in pub.last_reloads.values())
            seconds["checkpoint_reload"].append(total)
            parts["write_s"].append(total - reload_s)
            parts["worker_reload_s"].append(reload_s)

        verified: dict[str, bool] = {}
        for rep in range(repeats):
            order = (object_store, checkpoint_reload) if rep % 2 == 0 else (checkpoint_reload, object_store)
            for method in order:
                version += 1
                _bump(learner, version)
                method()
                if console is not None:
                    console.log(f"repetition {rep + 1}/{repeats}: {method.__name__} "
                                f"{seconds[method.__name__][-1]:.3f}s (version {version})")
                if rep == repeats - 1:
                    want = (version, _digest(learner.lm))
                    verified[method.__name__] = all(s == want for s in ray.get([a.state.remote() for a in actors]))
        ray.get([a.close.remote() for a in actors])
    finally:
        ray.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    methods: dict[str, dict[str, Any]] = {
        name: {"seconds": [round(s, 4) for s in secs], "median_s": statistics.median(secs), "verified": verified[name]}
        for name, secs in seconds.items()
    }
    return {
        "model": "tiny (rollout.policy.models.tiny_config)" if small else "Qwen2-0.5B shapes (Qwen2Config, random init)",
        "params": n_params, "state_bytes": n_bytes, "dtype": "bfloat16", "workers": workers, "repeats": repeats,
        "fsync": fsync, "ray_num_cpus": 2, "methods": methods,
        "parts_median_s": {k: statistics.median(v) for k, v in parts.items()},
        "ratio_checkpoint_over_object_store": methods["checkpoint_reload"]["median_s"] / methods["object_store"]["median_s"],
        # each repetition's two publishes ran back to back: their ratio is the least noisy figure
        "ratio_per_repetition_median": statistics.median(
            c / o for c, o in zip(seconds["checkpoint_reload"], seconds["object_store"])),
    }


def _table(report: dict[str, Any]) -> Table:
    parts = report["parts_median_s"]
    t = Table(title=f"publish to {report['workers']} workers: {report['model']}, {report['params'] / 1e6:.1f}M params, "
                    f"{report['state_bytes'] / 2**20:.1f} MiB {report['dtype']}, median of {report['repeats']}")
    for col in ("method", "median s", "all runs s", "of which", "weights verified"):
        t.add_column(col)
    os_row, ck_row = report["methods"]["object_store"], report["methods"]["checkpoint_reload"]
    t.add_row("object_store (baseline)", f"{os_row['median_s']:.3f}", " ".join(f"{s:.3f}" for s in os_row["seconds"]),
              f"put {parts['put_s']:.3f} + slowest worker get+load {parts['worker_store_s']:.3f}", str(os_row["verified"]))
    t.add_row("checkpoint_reload", f"{ck_row['median_s']:.3f}", " ".join(f"{s:.3f}" for s in ck_row["seconds"]),
              f"write {parts['write_s']:.3f} + slowest server reload {parts['worker_reload_s']:.3f}", str(ck_row["verified"]))
    t.add_row("ratio checkpoint / object_store", f"{report['ratio_checkpoint_over_object_store']:.2f}x",
              f"per repetition: median {report['ratio_per_repetition_median']:.2f}x", "", "")
    return t


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benches.publish", description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="tiny shapes (a smoke test), not Qwen2-0.5B's")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=None, help="repetitions per method (default: 5, --small: 3)")
    parser.add_argument("--no-fsync", action="store_true", help="skip fsync before the checkpoint's renames")
    parser.add_argument("--json", type=Path, default=None, help="also write the report here")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error(f"--workers: expected >= 1, got {args.workers}")
    repeats = args.repeats if args.repeats is not None else (3 if args.small else 5)
    if repeats < 1:
        parser.error(f"--repeats: expected >= 1, got {repeats}")
    console = Console(width=160)
    report = run_bench(small=args.small, workers=args.workers, repeats=repeats, fsync=not args.no_fsync, console=console)
    console.print(_table(report))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
