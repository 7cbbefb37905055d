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
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rollout.episode import EpisodeRequest
from rollout.eval.config import SweepConfig, identity_id
from rollout.eval.types import CellKey, ResumeRefused

__all__ = ["CellRequest", "check_lock", "plan_cells", "stored_ids"]


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


def _diff(path: str, old: Any, new: Any) -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for k in sorted(set(old) | set(new)):
            out += _diff(f"{path}.{k}", old.get(k), new.get(k))
        return out
    return [] if old == new else [f"{path}: was {old!r}, now {new!r}"]


def check_lock(store: Any, cfg: SweepConfig, identities: Mapping[str, dict[str, Any]], *, resume: bool) -> dict[str, Any]:
    """Write the sweep's lock, or check ``cfg`` against it. Returns the lock now in force.

    Without ``resume`` a sweep that already has stored episodes is refused (pass
    ``--resume`` or a new ``sweep_id``), so two different configs never share one.
    """
    from sqlalchemy import select, update

    from rollout.store import RunRow

    new: dict[str, Any] = {"eval_sweep": 1, "locked": cfg.locked(), "policies": {k: dict(v) for k, v in identities.items()}}
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
        if changes:
            raise ResumeRefused(
                f"sweep {cfg.sweep_id!r}: the config changed in fields that change stored results "
                f"(add a policy under a new name, or use a new sweep_id):\n  " + "\n  ".join(c.lstrip(".") for c in changes)
            )
        merged = {**old, "policies": {**old.get("policies", {}), **new["policies"]}}
    elif old is not None and old:
        raise ResumeRefused(f"sweep_id: {cfg.sweep_id!r} is a run of another kind in {cfg.store}, not an eval sweep")
    else:
        merged = new
    store.ensure_run(cfg.sweep_id, merged)
    with store.engine.begin() as conn:
        conn.execute(update(RunRow).where(RunRow.run_id == cfg.sweep_id).values(config=merged))
    return merged
