"""Planning a sweep into cells, and the resume lock that keeps its results honest.

``plan_cells`` expands the axes into one ``CellRequest`` per cell key, in an
order that interleaves policies (so a policy bounded by its endpoint never
holds every worker slot while others wait) and groups a variant's cells (one
variant set up once per worker, restored from its snapshot for the rest).

The lock is the sweep's row in the trajectory store (``runs.config``): the
locked fields and every policy's identity, written at the first run. A
``--resume`` compares against it field by field and refuses a change by name;
policies it has not seen are added to it. Cells are keyed by content, so a
resume runs exactly the cells whose ids are not stored yet.

The lock also holds every task's content and image (``task_locks``): a hash of
the task folder's files (paths and bytes; a Python task: its class's source
file) and the id of the image its sandboxes run. A resume after a task was
edited, or its image rebuilt, is refused with the task and the image named:
the stored cells were graded against the old ones. An image not built yet when
the lock is written is recorded once it is (``record_images``, after each run).
"""

from __future__ import annotations

import hashlib
import inspect
import os
from collections.abc import Iterable, Mapping
from typing import Any

from rollout.episode import EpisodeRequest
from rollout.eval.config import SweepConfig, identity_id
from rollout.eval.types import CellKey, ResumeRefused

__all__ = ["CellRequest", "check_lock", "plan_cells", "record_images", "stored_ids", "task_content_hash", "task_locks"]


#: A cell's request: an ``EpisodeRequest`` whose ``policy`` names the sweep policy and whose
#: ``sampling`` is that policy's own (so the request says everything that decides its result).
CellRequest = EpisodeRequest


def plan_cells(cfg: SweepConfig, task_ids: list[str], identities: Mapping[str, dict[str, Any]]) -> list[tuple[CellKey, CellRequest]]:
    """Every cell of the sweep: tasks x seeds x harnesses x efforts x samples x policies."""
    from rollout.policy.types import SamplingParams

    sampling = {
        p.name: SamplingParams(temperature=p.sampling.temperature, top_p=p.sampling.top_p,
                               max_new_tokens=p.sampling.max_new_tokens) if p.samples_model else None
        for p in cfg.policies
    }
    out: list[tuple[CellKey, CellRequest]] = []
    for task_id in task_ids:
        for seed in cfg.seeds:
            group = f"{cfg.sweep_id}/{task_id}/{seed}"
            for harness in cfg.harnesses:
                for effort in cfg.efforts:
                    for k in range(cfg.samples):
                        for p in cfg.policies:
                            key = CellKey(p.name, identity_id(identities[p.name]), task_id, seed, harness, effort, k)
                            req = CellRequest(
                                episode_id=key.episode_id(cfg.sweep_id), run_id=cfg.sweep_id, task_id=task_id,
                                seed=seed, harness=harness, effort=effort, group_id=group, policy=p.name,
                                sampling=sampling[p.name],
                            )
                            out.append((key, req))
    return out


def stored_ids(store: Any, sweep_id: str) -> set[str]:
    from sqlalchemy import select

    from rollout.store import EpisodeRow

    with store.engine.connect() as conn:
        return {str(r[0]) for r in conn.execute(select(EpisodeRow.episode_id).where(EpisodeRow.run_id == sweep_id))}


def task_content_hash(task: Any) -> str:
    """What a task's results depend on besides its variant: its folder's files (paths and bytes), else its class's source."""
    digest = hashlib.sha256(str(task.id).encode())
    folder = getattr(task, "folder", None)
    if folder is not None and os.path.isdir(folder):
        for top, dirs, names in os.walk(folder):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(names):
                path = os.path.join(top, name)
                digest.update(b"\0" + os.path.relpath(path, folder).encode() + b"\0")
                with open(path, "rb") as handle:
                    digest.update(hashlib.sha256(handle.read()).digest())
        return "folder:" + digest.hexdigest()[:32]
    source = inspect.getsourcefile(type(task))
    if source is not None and os.path.isfile(source):
        with open(source, "rb") as handle:
            digest.update(handle.read())
    return "class:" + digest.hexdigest()[:32]


def _image_id(ref: str, backend: str) -> str | None:
    """The local image id of ``ref`` (None where the backend runs no images, or it is not built yet)."""
    if backend != "docker" or not ref:
        return None
    import docker

    try:
        client = docker.from_env()
        try:
            return str(client.images.get(ref).id)
        finally:
            client.close()
    except docker.errors.ImageNotFound:
        return None


def task_locks(task_ids: Iterable[str], backend: str) -> dict[str, dict[str, Any]]:
    """Per task: its content hash, its image reference and that image's id (None until built)."""
    from agentenv.registry import get_task

    out: dict[str, dict[str, Any]] = {}
    for task_id in sorted(task_ids):
        task = get_task(task_id)
        image = task.sandbox_spec(build=False).image if backend == "docker" else ""
        out[task_id] = {"content": task_content_hash(task), "image": image, "image_id": _image_id(image, backend)}
    return out


def _task_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    changes: list[str] = []
    for task_id in sorted(set(old) & set(new)):
        was, now = old[task_id], new[task_id]
        if was.get("content") != now.get("content"):
            changes.append(f"tasks[{task_id}]: the task was edited (content {was.get('content')} -> {now.get('content')})")
        if was.get("image") != now.get("image"):
            changes.append(f"tasks[{task_id}]: its image changed ({was.get('image')!r} -> {now.get('image')!r})")
        elif was.get("image_id") and now.get("image_id") and was["image_id"] != now["image_id"]:
            changes.append(f"tasks[{task_id}]: image {now.get('image')!r} was rebuilt (id {was['image_id']} -> {now['image_id']})")
    return changes


def _merge_tasks(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """``old`` with new tasks added and image ids it lacked filled in (the lock never forgets what it saw)."""
    merged = {k: dict(v) for k, v in old.items()}
    for task_id, now in new.items():
        if task_id not in merged:
            merged[task_id] = dict(now)
        elif not merged[task_id].get("image_id"):
            merged[task_id]["image_id"] = now.get("image_id")
    return merged


def record_images(store: Any, cfg: SweepConfig, tasks: Mapping[str, Any]) -> None:
    """Fill in the lock's image ids that were not built when it was written (call after a run)."""
    from sqlalchemy import select, update

    from rollout.store import RunRow

    with store.engine.begin() as conn:
        row = conn.execute(select(RunRow.config).where(RunRow.run_id == cfg.sweep_id)).first()
        if row is None or not row[0]:
            return
        lock = dict(row[0])
        lock["tasks"] = _merge_tasks(lock.get("tasks", {}), tasks)
        conn.execute(update(RunRow).where(RunRow.run_id == cfg.sweep_id).values(config=lock))


def _diff(path: str, old: Any, new: Any) -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for k in sorted(set(old) | set(new)):
            out += _diff(f"{path}.{k}", old.get(k), new.get(k))
        return out
    return [] if old == new else [f"{path}: was {old!r}, now {new!r}"]


def check_lock(
    store: Any, cfg: SweepConfig, identities: Mapping[str, dict[str, Any]], *, resume: bool,
    tasks: Mapping[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Write the sweep's lock, or check ``cfg`` against it. Returns the lock now in force.

    Without ``resume`` a sweep that already has stored episodes is refused (pass
    ``--resume`` or a new ``sweep_id``), so two different configs never share one.
    ``tasks`` (``task_locks``) locks each task's content and image id too.
    """
    from sqlalchemy import select, update

    from rollout.store import RunRow

    new: dict[str, Any] = {"eval_sweep": 1, "locked": cfg.locked(), "policies": {k: dict(v) for k, v in identities.items()},
                           "tasks": {k: dict(v) for k, v in (tasks or {}).items()}}
    with store.engine.connect() as conn:
        row = conn.execute(select(RunRow.config).where(RunRow.run_id == cfg.sweep_id)).first()
    old: dict[str, Any] | None = dict(row[0]) if row is not None and row[0] else None
    if old is not None and not resume and stored_ids(store, cfg.sweep_id):
        raise ResumeRefused(
            f"sweep_id: {cfg.sweep_id!r} already has stored episodes in {cfg.store}; "
            "pass --resume to continue it, or choose a new sweep_id"
        )
    if old is not None and old.get("eval_sweep") == 1:
        changes = _diff("", old.get("locked", {}), new["locked"])
        for name, ident in identities.items():
            if name in old.get("policies", {}):
                changes += _diff(f"policies[{name}]", old["policies"][name], dict(ident))
        changes += _task_changes(old.get("tasks", {}), new["tasks"])
        if changes:
            raise ResumeRefused(
                f"sweep {cfg.sweep_id!r}: the config changed in fields that change stored results "
                f"(add a policy under a new name, or use a new sweep_id):\n  " + "\n  ".join(c.lstrip(".") for c in changes)
            )
        merged = {**old, "policies": {**old.get("policies", {}), **new["policies"]},
                  "tasks": _merge_tasks(old.get("tasks", {}), new["tasks"])}
    elif old is not None and old:
        raise ResumeRefused(f"sweep_id: {cfg.sweep_id!r} is a run of another kind in {cfg.store}, not an eval sweep")
    else:
        merged = new
    store.ensure_run(cfg.sweep_id, merged)
    with store.engine.begin() as conn:
        conn.execute(update(RunRow).where(RunRow.run_id == cfg.sweep_id).values(config=merged))
    return merged
