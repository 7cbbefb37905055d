"""Resume points of a training run: written atomically, loaded strictly, in Hugging Face format.

Layout under ``out_dir/run_id/checkpoints/``::

    run.json                 the store's run id of this run (written once, at the start)
    warm-start/              the model right after the warm start (the KL reference), HF format
    iter-000003/
        trainer/model/       save_pretrained + tokenizer: ``from_pretrained`` loads it as is
        trainer/trainer_state.pt, trainer/configs.json   optimizer, scheduler, step, RNG (Trainer.save)
        engine.json          iteration, version, episode index, the draw RNG, pending groups,
                             trained episode ids, history (EngineState)
    LATEST                   the name of the newest complete iter-* directory

Order of a write: the new directory under a ``.tmp`` name, renamed into place,
then ``LATEST`` replaced (``os.replace``), and only then the oldest removed; a
kill at any point leaves the previous checkpoint readable, and a half-written
``.tmp`` is never taken for one. Loading is strict: ``EngineState`` forbids
unknown fields, the trainer refuses missing or extra tensors, and a checkpoint
of another config (the config's hash) or another run id is refused by name.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from agentenv.configs import validation_problems
from learner.errors import CheckpointMismatch, CheckpointNotFound
from rollout.config import PolicyConfig

__all__ = ["EngineState", "RunCheckpoints", "config_hash"]

LATEST = "LATEST"
RUN_FILE = "run.json"
ENGINE_FILE = "engine.json"
WARM_START = "warm-start"


class EngineState(BaseModel):
    """What the engine needs besides the trainer's own state to continue exactly where it stopped."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str
    config_hash: str
    iteration: int  # RL iterations completed
    version: int  # weights version published last
    episode_index: int  # harness / effort draws consumed
    planned_batches: int  # RL batches of groups planned so far
    rng: list[Any]  # random.Random.getstate() of the variant-seed draws, as JSON
    pending: list[list[dict[str, Any]]]  # groups planned and submitted but not trained yet (EpisodeRequest fields)
    trained: list[str]  # every episode id trained on so far, in order
    history: dict[str, Any]
    evals_done: int


def config_hash(config: dict[str, Any]) -> str:
    """The hash of what decides the run's result (paths, ids and budgets of the resume itself left out)."""
    keep = {k: v for k, v in config.items() if k not in {"store", "out_dir", "checkpoint", "run_id"}}
    rollout = dict(keep.get("rollout") or {})
    for k in ("store", "run_id", "ray", "workers", "concurrency", "pool_size", "warm"):
        rollout.pop(k, None)  # where and how wide it runs, not what it learns
    if rollout.get("branching", {}).get("kind", "off") == "off":
        rollout.pop("branching", None)  # off: a run that never branched keeps the hash it had before branching existed
    if not rollout.get("resume_from_snapshots", False):
        rollout.pop("resume_from_snapshots", None)
    if "seeds" not in rollout and "policy" not in rollout:
        # A training run's rollout: section has no seeds or policy; before it was a whole rollout job's config, where
        # training left both at their defaults. They stay in the hash so a run checkpointed then still resumes.
        rollout.update(seeds=[0], policy=PolicyConfig().model_dump(mode="json"))
    keep["rollout"] = rollout
    trainer = dict(keep.get("trainer") or {})
    for k in ("world_size", "devices_per_node", "distributed_timeout_s", "activation_checkpointing"):
        trainer.pop(k, None)  # how many ranks train, not what they learn (a checkpoint loads at any world size)
    if "trainer" in keep:
        keep["trainer"] = trainer
    return hashlib.sha256(json.dumps(keep, sort_keys=True, default=str).encode()).hexdigest()[:16]


class RunCheckpoints:
    """The checkpoint directory of one run (see the module docstring)."""

    def __init__(self, root: str | os.PathLike[str], *, keep: int = 2) -> None:
        self.root = Path(root)
        self.keep = keep

    # ------------------------------------------------------------ run identity

    def write_run(self, run_id: str, config_hash: str) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / (RUN_FILE + ".tmp")
        tmp.write_text(json.dumps({"run_id": run_id, "config_hash": config_hash}))
        tmp.replace(self.root / RUN_FILE)

    def read_run(self, config_hash: str) -> str:
        """The run id to resume; refuses a run written by a different config."""
        path = self.root / RUN_FILE
        if not path.is_file():
            raise CheckpointNotFound(f"--resume: {str(path)!r} does not exist: this config has no run to resume")
        data = json.loads(path.read_text())
        if data.get("config_hash") != config_hash:
            raise CheckpointMismatch(
                f"--resume: {str(path)!r} was written by a different config (hash {data.get('config_hash')} != "
                f"{config_hash}): resuming would mix two runs; use a new run_id or the original config"
            )
        return str(data["run_id"])

    # ------------------------------------------------------------ iterations

    def latest(self) -> Path | None:
        marker = self.root / LATEST
        if not marker.is_file():
            return None
        path = self.root / marker.read_text().strip()
        if not (path / ENGINE_FILE).is_file():
            raise CheckpointNotFound(f"{str(marker)!r} names {path.name!r}, which has no {ENGINE_FILE}")
        return path

    def write(self, iteration: int, state: EngineState, save_trainer: Any, tokenizer: Any = None) -> Path:
        """``save_trainer(dir)`` writes the trainer part (``Trainer.save``); the rest is written here."""
        final = self.root / f"iter-{iteration:06d}"
        tmp = self.root / (final.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        save_trainer(tmp / "trainer")
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp / "trainer" / "model"))
        (tmp / ENGINE_FILE).write_text(state.model_dump_json())
        if final.exists():  # a resumed run redoing an iteration whose LATEST was never written
            shutil.rmtree(final)
        tmp.rename(final)
        marker = self.root / (LATEST + ".tmp")
        marker.write_text(final.name + "\n")
        marker.replace(self.root / LATEST)
        done = sorted(p for p in self.root.glob("iter-[0-9]*") if p.is_dir() and not p.name.endswith(".tmp"))
        for old in done[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    @staticmethod
    def read_state(path: Path) -> EngineState:
        try:
            return EngineState.model_validate_json((path / ENGINE_FILE).read_text())
        except ValidationError as exc:
            raise CheckpointMismatch("\n  ".join(validation_problems(exc, source=repr(str(path / ENGINE_FILE))))) from None

    # ------------------------------------------------------------ the warm-started model

    def warm_start_dir(self) -> Path:
        return self.root / WARM_START

    def write_warm_start(self, save_model: Any) -> Path:
        final = self.warm_start_dir()
        tmp = self.root / (WARM_START + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        save_model(tmp)
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        return final
