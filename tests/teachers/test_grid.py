"""The grid config: every error names the file and the field; a 9-cell grid of tiny checkpoints builds one router."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from transformers import PreTrainedTokenizerBase

from rollout.policy.hf import HFPolicy
from rollout.policy.models import load_checkpoint, save_checkpoint, tiny_model
from rollout.serve import create_app, serve_in_thread
from teachers.grid import EndpointRef, HFRef, LoRARef, TeacherGridConfig, build_scorer
from teachers.scoring import EndpointScorer, HFScorer, LoRAScorer
from teachers.types import DOMAINS, EFFORTS, ScoreRequest, TeacherConfigError, cell_key

pytestmark = pytest.mark.unit

CELLS = [cell_key(d, e) for d in DOMAINS for e in EFFORTS]


def _write(tmp_path: Path, data: Any, name: str = "grid.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def _all_hf() -> dict[str, Any]:
    return {"cells": {c: {"kind": "hf", "path": f"ckpt/{c.replace('/', '-')}"} for c in CELLS}}


def test_defaults_and_relative_paths(tmp_path: Path) -> None:
    cfg = TeacherGridConfig.load(_write(tmp_path, _all_hf()))
    assert cfg.domains == DOMAINS and list(cfg.efforts) == list(EFFORTS) and cfg.cell_keys == CELLS
    assert cfg.tau("low") < cfg.tau("high") < cfg.tau("max")
    ref = cfg.cells["coding/max"]
    assert isinstance(ref, HFRef) and ref.path == str(tmp_path / "ckpt" / "coding-max")


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda d: d["cells"].pop("agent/high"), r"cells: every domain x effort needs exactly one teacher; missing: agent/high"),
        (lambda d: d["cells"].update({"math/low": {"kind": "hf", "path": "x"}}), r"cells: unknown cell 'math/low'"),
        (lambda d: d.update(domians=["general"]), r"domians: Extra inputs are not permitted"),
        (lambda d: d["cells"]["coding/low"].update(kind="gguf"), r"cells\.coding/low: .*'gguf'.*'hf', 'lora', 'endpoint'"),
        (lambda d: d["cells"]["coding/low"].update(paht="x"), r"cells\.coding/low\.hf\.paht: Extra inputs are not permitted"),
        (lambda d: d.update(efforts={"low": {"tau": 0}, "high": {"tau": 1}, "max": {"tau": 2}}),
         r"efforts\.low\.tau: Input should be greater than 0"),
        (lambda d: d.update(efforts={"low": {"tau": 1}, "extreme": {"tau": 9}}), r"efforts: effort level 'extreme' unknown"),
        (lambda d: d["cells"].update({"coding/low": {"kind": "lora", "base": "b"}}), r"cells\.coding/low\.lora\.adapter: Field required"),
    ],
)
def test_each_error_names_the_file_and_the_field(tmp_path: Path, edit: Any, expected: str) -> None:
    data = _all_hf()
    edit(data)
    path = _write(tmp_path, data, "bad-grid.yaml")
    with pytest.raises(TeacherConfigError, match=rf"{tmp_path}/bad-grid\.yaml: {expected}"):
        TeacherGridConfig.load(path)


def test_a_smaller_grid_needs_only_its_cells(tmp_path: Path) -> None:
    data = {"domains": ["coding"], "efforts": {"low": {"tau": 0.5}, "max": {"tau": 3, "max_thinking_tokens": 64}},
            "cells": {"coding/low": {"kind": "hf", "path": "a"}, "coding/max": {"kind": "endpoint", "base_url": "http://x/v1", "model": "m"}}}
    cfg = TeacherGridConfig.load(_write(tmp_path, data))
    assert cfg.cell_keys == ["coding/low", "coding/max"] and cfg.efforts["max"].max_thinking_tokens == 64
    assert isinstance(cfg.cells["coding/max"], EndpointRef)
    with pytest.raises(TeacherConfigError, match=r"no such file|cannot read"):
        TeacherGridConfig.load(tmp_path / "missing.yaml")


def test_a_nine_cell_grid_of_tiny_checkpoints_builds_each_backend_once(tok: PreTrainedTokenizerBase, tmp_path: Path) -> None:
    from peft import LoraConfig, get_peft_model

    save_checkpoint(tiny_model(seed=1, tokenizer=tok)[0], tok, tmp_path / "general")
    save_checkpoint(tiny_model(seed=2, tokenizer=tok)[0], tok, tmp_path / "base")
    for k, effort in enumerate(EFFORTS):
        torch.manual_seed(k)
        cfg = LoraConfig(r=2, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
        get_peft_model(tiny_model(seed=2, tokenizer=tok)[0], cfg).save_pretrained(str(tmp_path / f"coding-{effort}"))
    served = tiny_model(seed=3, tokenizer=tok)[0]
    with serve_in_thread(create_app(HFPolicy(served, tok), "agent-teacher")) as url:
        cells: dict[str, Any] = {}
        for e in EFFORTS:
            cells[f"general/{e}"] = {"kind": "hf", "path": "general"}
            cells[f"coding/{e}"] = {"kind": "lora", "base": "base", "adapter": f"coding-{e}"}
            cells[f"agent/{e}"] = {"kind": "endpoint", "base_url": url, "model": "agent-teacher", "timeout_s": 30}
        grid = TeacherGridConfig.load(_write(tmp_path, {"cells": cells, "batch_tokens": 256}))
        assert isinstance(grid.cells["coding/low"], LoRARef)
        router = build_scorer(grid)
        try:
            backends = {c: router.scorers[c] for c in CELLS}
            assert len({id(b) for b in backends.values()}) == 3
            assert isinstance(backends["general/low"], HFScorer) and isinstance(backends["coding/max"], LoRAScorer)
            assert isinstance(backends["agent/high"], EndpointScorer)
            ids = tuple(range(5, 25))
            reqs = [ScoreRequest(c, ids, (1, 7, 19), c) for c in reversed(CELLS)]
            got = {r.sample_id: res.logprobs for r, res in zip(reqs, router.score(reqs))}
        finally:
            router.close()
    same = HFScorer(load_checkpoint(tmp_path / "general")[0]).score([ScoreRequest("x", ids, (1, 7, 19))])[0].logprobs
    assert all(got[f"general/{e}"] == pytest.approx(same, abs=1e-6) for e in EFFORTS)
    agent = HFScorer(served).score([ScoreRequest("x", ids, (1, 7, 19))])[0].logprobs
    assert all(got[f"agent/{e}"] == pytest.approx(agent, abs=1e-4) for e in EFFORTS)
    coding = [got[f"coding/{e}"] for e in EFFORTS]
    assert coding[0] != pytest.approx(coding[1], abs=1e-3) and coding[1] != pytest.approx(coding[2], abs=1e-3)
