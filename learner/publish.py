"""Weight publishing: how new weights and their version number reach the rollout workers.

The trainer only calls a ``WeightPublisher``; where the weights go is the
caller's choice. Locally that is the Ray object store (the Ray engineer's
publisher puts the state dict and announces the version); for inference
servers it is a checkpoint directory they reload. ``CheckpointPublisher`` is
the local, dependency-free implementation: one ``save_pretrained`` directory
per version, written to a temporary name and renamed, so a reader never sees
half a checkpoint, plus a ``LATEST`` file naming the newest version.

Versions only grow; a worker compares the version it holds with
``latest_version(root)`` between episodes.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Protocol, runtime_checkable

from transformers import PreTrainedTokenizerBase

from learner.errors import LearnerConfigError
from learner.model import PolicyModel

__all__ = ["CheckpointPublisher", "WeightPublisher", "latest_version", "version_dir"]

LATEST = "LATEST"


@runtime_checkable
class WeightPublisher(Protocol):
    """Make ``model``'s current weights available as ``version``; return where (a path, an object ref id)."""

    def __call__(self, model: PolicyModel, version: int) -> str: ...


def version_dir(root: str | os.PathLike[str], version: int) -> Path:
    return Path(root) / f"v{version:08d}"


def latest_version(root: str | os.PathLike[str]) -> tuple[int, Path] | None:
    """The newest published ``(version, directory)`` under ``root``, or ``None`` if nothing is published yet."""
    marker = Path(root) / LATEST
    if not marker.is_file():
        return None
    version = int(marker.read_text().strip())
    return version, version_dir(root, version)


class CheckpointPublisher:
    """Publish each version as ``root/vNNNNNNNN/`` (model, and the tokenizer if given); keep the newest ``keep``.

    >>> pub = CheckpointPublisher("runs/r1/weights", tokenizer=tok)   # doctest: +SKIP
    >>> trainer = Trainer(model, loss_cfg, cfg, publisher=pub)         # doctest: +SKIP
    """

    def __init__(
        self, root: str | os.PathLike[str], *, tokenizer: PreTrainedTokenizerBase | None = None, keep: int = 2
    ) -> None:
        if keep < 1:
            raise LearnerConfigError(f"CheckpointPublisher.keep: expected >= 1, got {keep}")
        self.root = Path(root)
        self.tokenizer = tokenizer
        self.keep = keep

    def __call__(self, model: PolicyModel, version: int) -> str:
        final = version_dir(self.root, version)
        tmp = final.with_name(final.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        model.save(tmp)
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(str(tmp))
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        marker_tmp = self.root / (LATEST + ".tmp")
        marker_tmp.write_text(f"{version}\n")
        marker_tmp.replace(self.root / LATEST)
        versions = sorted(p for p in self.root.glob("v" + "[0-9]" * 8) if p.is_dir())
        for old in versions[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return str(final)
