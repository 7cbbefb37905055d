"""Small sweep files for the sweep tests (imported by the test modules of this folder)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import yaml


def sweep_data(tmp_path: Path, **changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "sweep_id": f"t-{uuid.uuid4().hex[:8]}",
        "store": f"sqlite:///{tmp_path / 'store.db'}",
        "out": str(tmp_path / "out"),
        "policies": [{"name": "oracle", "kind": "oracle"}, {"name": "nothing", "kind": "do_nothing"}],
        "tasks": {"ids": ["general/answer_number", "general/count_lines"]},
        "harnesses": ["claude_code", "codex"],
        "efforts": ["low", "high"],
        "seeds": 1,
        "workers": 2,
        "concurrency": 2,
        "retries": {"backoff_s": 0.1},
        "ray": {"num_cpus": 2},
    }
    data.update(changes)
    return data


def write_sweep(tmp_path: Path, data: dict[str, Any], name: str = "sweep.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path
