"""Training through inference servers: the train config's ``serving:`` section, its publisher and its runner.

With ``serving:`` a training (or ``agentenv distill``) run samples every ``train`` turn on the servers named
there (``agentenv serve`` processes, or any server speaking vLLM's token-in/token-out route) instead of a
copy of the model in this process, and after each learner step publishes the new version to every server::

    learner step -> ServerPublisher(model, version)       weights to every live server, each told to load them
                 -> ServedPolicy.set_version(version)      what the policy reports between turns
    episode turn -> ServedPolicy.generate(...)            POST /inference/v1/generate on the least-loaded server;
                                                          each token comes back with its logprob and version

Episodes still run here (``InProcessRunner``: sandboxes, harness, grading, the turn gate for partial rollouts),
so the staleness bound K and ``rl.partial_rollouts`` behave as with the in-process policy: K = 0 publishes
between iterations with nothing in flight; K >= 1 publishes while episodes run, and each server finishes the
requests it holds on the old weights before it swaps (``/update_weights_from_disk``'s drain), so a turn is
sampled by one version and reports it. The oracle policies of the warm start stay in process.

**A server killed mid-run** (our choice, tested in ``tests/learner/test_train_served.py``): the turns it held
raise ``ServerLost``; those episodes are rerun from the start on the other servers (an attempt that is lost is
never stored, so nothing is stored or trained twice), the dead server gets no more turns and the publisher
leaves it out, and the run finishes on the servers left. It fails only when none is left (``PublishError`` or
the episodes' ``policy_error``, naming every URL and why) or when a live server answers a weight update with an
error (``PublishError`` naming it): a server on other weights than the rest must never sample.

Transports (``serving.transport``): ``disk`` writes each version as a ``save_pretrained`` directory under
``serving.weights_dir`` (default ``RUN_DIR/served_weights``; one folder per run id) and posts
``/update_weights_from_disk`` (SGLang's route) to each server: the servers must see that directory at the
same path. ``gloo`` / ``nccl`` broadcast each version to every server through a process group
(``learner.weight_transfer.BroadcastPublisher``; ``make_server_publisher`` is the one place a transport plugs in).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from transformers import PreTrainedTokenizerBase

from learner.errors import LearnerConfigError
from learner.model import PolicyModel
from learner.publish import CheckpointPublisher, PublishError, reload_from_disk
from learner.types import ServingConfig
from rollout.policy.served import ServedPolicy, ServerFleet
from rollout.runner import InProcessRunner
from rollout.store import TrajectoryStore

if TYPE_CHECKING:
    from learner.train_config import TrainConfig

__all__ = [
    "DiskServerPublisher", "ServedRunner", "ServerPublisher", "ServingConfig", "initial_checkpoint", "make_served_runner",
    "make_server_publisher",
]

class ServerPublisher(Protocol):
    """Publishes ``model`` as ``version`` to the servers; returns where the weights went (a path, a group name)."""

    def __call__(self, model: PolicyModel, version: int) -> str: ...

    def close(self) -> None:
        """Release what the publisher holds (a process group, HTTP clients); called once, when the run ends."""


class DiskServerPublisher:
    """``transport: disk``: one checkpoint directory per version, then ``/update_weights_from_disk`` on every live server.

    A server that cannot be reached (refused, reset) is marked dead in ``fleet`` and left out, as the policy
    does for a turn; with none left, or when a server answers with an error, ``PublishError`` names them.
    """

    def __init__(
        self, root: str | os.PathLike[str], fleet: ServerFleet, *, tokenizer: PreTrainedTokenizerBase | None = None,
        keep: int = 2, timeout_s: float = 300.0, api_key: str | None = None,
    ) -> None:
        self.checkpoint = CheckpointPublisher(root, tokenizer=tokenizer, keep=keep)
        self.fleet = fleet
        self.timeout_s = float(timeout_s)
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.last_reloads: dict[str, dict[str, Any]] = {}

    def __call__(self, model: PolicyModel, version: int) -> str:
        path = self.checkpoint(model, version)
        model_path = str(Path(path).resolve())
        live = self.fleet.live()
        if live:
            with concurrent.futures.ThreadPoolExecutor(max_workers=min(16, len(live))) as pool:
                outcomes = list(pool.map(lambda u: self._reload(u, model_path, version), live))
        else:
            outcomes = []
        self.last_reloads = {u: body for u, (body, _) in zip(live, outcomes) if body is not None}
        failed = {u: why for u, (_, why) in zip(live, outcomes) if why is not None}
        if failed:
            causes = "; ".join(f"{u}: {why}" for u, why in failed.items())
            raise PublishError(f"serving: version {version} is written to {path}, but {len(failed)} live server(s) did "
                               f"not load it: {causes}", path, failed)
        if not self.fleet.live():
            dead = self.fleet.describe()["dead_servers"]
            causes = "; ".join(f"{u}: {why}" for u, why in dead.items())
            raise PublishError(f"serving: version {version} is written to {path}, but no server is left to load it: "
                               f"{causes}", path, dead)
        return path

    def close(self) -> None:
        pass  # one HTTP request per reload: nothing held between versions

    def _reload(self, url: str, model_path: str, version: int) -> tuple[dict[str, Any] | None, str | None]:
        answer, why, unreachable = reload_from_disk(url, model_path, version, self.timeout_s, self.headers)
        if unreachable:  # gone: dropped from the fleet, as a turn on it would be
            self.fleet.mark_dead(url, f"{why} while loading version {version}")
            return None, None
        return answer, why


def make_server_publisher(
    serving: ServingConfig, root: str | os.PathLike[str], *, tokenizer: PreTrainedTokenizerBase | None = None,
    keep: int = 2, fleet: ServerFleet | None = None,
) -> ServerPublisher:
    """The publisher for ``serving.transport``: after each learner version, the weights reach every live server
    of ``fleet`` (default: all of ``serving.urls``) and each is told to load them; a failure raises naming the URL.

    ``root``: where ``disk`` writes its versions (under ``serving.weights_dir`` instead when set: ``WEIGHTS_DIR/NAME``,
    ``NAME`` being ``root``'s last part, the run id for a training run).
    """
    fleet = fleet if fleet is not None else ServerFleet(serving.urls)
    if serving.transport == "disk":
        where = Path(serving.weights_dir) / Path(root).name if serving.weights_dir else root
        return DiskServerPublisher(where, fleet, tokenizer=tokenizer, keep=keep, timeout_s=serving.publish_timeout_s,
                                   api_key=serving.api_key())
    if serving.transport in ("gloo", "nccl"):
        from learner.weight_transfer import BroadcastPublisher  # lazily: it loads torch.distributed

        # A process group cannot drop a member mid-run: a server killed mid-run fails the next publish, naming it.
        return BroadcastPublisher(fleet.live(), serving.transport, timeout_s=serving.publish_timeout_s,
                                  api_key=serving.api_key())
    raise LearnerConfigError(f"serving.transport: expected disk, gloo or nccl, got {serving.transport!r}")


class ServedRunner(InProcessRunner):
    """Episodes here, ``train`` turns on the servers; ``publish`` sends the learner's model through ``publisher``.

    ``model`` is the learner's ``PolicyModel``: ``TrainLoop`` publishes its state (the ``weights`` it passes are
    that model's), so the publisher writes the model itself, in its own ``save_pretrained`` layout.
    """

    name = "served"

    def __init__(self, policy: ServedPolicy, publisher: ServerPublisher, model: PolicyModel, *, transport: str = "disk",
                 **runner: Any) -> None:
        super().__init__(policy, **runner)
        self.served = policy
        self.publisher = publisher
        self.model = model
        self.transport = transport
        self.versions_published = 0
        self.publish_s = 0.0

    async def start(self, task_ids: Sequence[str]) -> None:
        await super().start(task_ids)
        await asyncio.to_thread(_check_servers, self.served)

    async def publish(self, version: int, weights: Mapping[str, Any]) -> None:
        t0 = time.monotonic()
        await asyncio.to_thread(self.publisher, self.model, version)
        self.served.set_version(version)
        self.versions_published += 1
        self.publish_s += time.monotonic() - t0

    async def close(self) -> None:
        try:
            await super().close()
        finally:
            try:
                await asyncio.to_thread(self.publisher.close)
            finally:
                await self.served.aclose()

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), **self.served.fleet.describe(), "transport": self.transport,
                "versions_published": self.versions_published, "publish_s": round(self.publish_s, 3)}


def _check_servers(policy: ServedPolicy) -> None:
    """Every server answers ``/get_model_info`` (and serves ``policy.model`` when named) before any episode runs."""
    import httpx

    bad = {}
    for url in policy.fleet.urls:
        try:
            resp = httpx.get(f"{url}/get_model_info", timeout=min(policy.timeout_s, 30.0), headers=policy.headers)
        except httpx.HTTPError as exc:
            bad[url] = f"connection failed ({type(exc).__name__}: {exc})"
            continue
        if resp.status_code != 200:
            bad[url] = f"HTTP {resp.status_code} on /get_model_info: {resp.text[:200]}"
            continue
        served = resp.json().get("served_model_name")
        if policy.model is not None and served not in (None, policy.model):
            bad[url] = f"serves {served!r}, not serving.model {policy.model!r}"
    if bad:
        causes = "; ".join(f"{u}: {why}" for u, why in bad.items())
        raise LearnerConfigError(f"serving.urls: {len(bad)} of {len(policy.fleet.urls)} server(s) not usable: {causes}")


def make_served_runner(cfg: TrainConfig, model: PolicyModel, tokenizer: PreTrainedTokenizerBase, store: TrajectoryStore,
                       run_id: str) -> ServedRunner:
    """The runner of a run with ``serving:``: a ``ServedPolicy`` over its URLs, published to by its transport."""
    serving = cfg.serving
    if serving is None:
        raise LearnerConfigError("serving: make_served_runner needs a config with a serving: section")
    rollout = cfg.rollout_job(run_id)
    fleet = ServerFleet(serving.urls)
    policy = ServedPolicy(fleet, model=serving.model, tokenizer=tokenizer, api_key=serving.api_key(),
                          timeout_s=serving.timeout_s, name="train-policy")
    # one folder per run (the run id holds its start time): a later run of the config starts again from version 0
    publisher = make_server_publisher(serving, cfg.run_dir() / "served_weights" / run_id, tokenizer=tokenizer, fleet=fleet)
    return ServedRunner(
        policy, publisher, model, transport=serving.transport, tokenizer=tokenizer, backend=rollout.backend,
        run_id=run_id, store=store, concurrency=rollout.concurrency, pool_size=max(rollout.pool_size, 1),
        grade_in_place=rollout.grading == "in_place", sandbox_retries=rollout.retries.sandbox_acquire,
    )


def initial_checkpoint(cfg: TrainConfig, out: str | os.PathLike[str]) -> Path:
    """Write the config's model as the learner builds it (seeded, or ``model.checkpoint``) with its tokenizer:
    what each server starts from (``agentenv serve OUT``), so the learner's versions load into it.

    ``python -m learner.serving CONFIG OUT`` does the same from a shell.
    """
    from rollout.policy.models import load_checkpoint, save_checkpoint, tiny_config
    from rollout.tokenizer import build_tokenizer

    m = cfg.model
    if m.checkpoint:
        lm, tok = load_checkpoint(m.checkpoint)
        return save_checkpoint(lm, tok, out)
    tok = build_tokenizer()
    config = tiny_config(tok, hidden_size=m.hidden_size, num_layers=m.num_layers, num_heads=m.num_heads,
                         num_kv_heads=m.num_kv_heads, init_std=m.init_std, sliding_window=m.sliding_window,
                         full_attention_layers=m.full_attention_layers)
    model = PolicyModel.from_config(config, seed=m.seed)
    return save_checkpoint(model.lm, tok, out)


if __name__ == "__main__":
    import sys

    from learner.train_config import load_train_config

    if len(sys.argv) != 3:
        raise SystemExit("usage: python -m learner.serving CONFIG OUT_DIR")
    print(initial_checkpoint(load_train_config(sys.argv[1]), sys.argv[2]))
