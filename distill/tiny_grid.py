"""``python -m distill.tiny_grid OUT [--from CHECKPOINT] [--per domain|cell|one]``: a teacher grid of local checkpoints.

No weights are fetched at run time, so the CPU example and the tests need
teachers they can make: either fresh tiny Qwen2-shaped models built from a
config with the project tokenizer (one seed per checkpoint from 1000 on, so the
teachers differ from each other and from a seed-0 student), or copies of one trained checkpoint (``--from``, e.g. a model
``agentenv train`` produced). ``--per`` says how many checkpoints: one per
domain (three, each serving its domain's three efforts: the default), one per
cell (nine) or one for the whole grid. It writes ``OUT/grid.yaml`` (a
``teachers.grid`` file with relative paths) and the checkpoints beside it.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Literal

import yaml

from teachers.types import DOMAINS, EFFORTS, cell_key

__all__ = ["write_tiny_grid"]


def write_tiny_grid(
    out: str | Path, *, per: Literal["domain", "cell", "one"] = "domain", source: str | Path | None = None,
    hidden_size: int = 32, num_layers: int = 1, num_heads: int = 2, num_kv_heads: int = 1, init_std: float = 0.1,
    seed: int = 1000,
) -> Path:
    """Checkpoints and ``grid.yaml`` under ``out`` (see the module docstring); returns the grid file's path."""
    from rollout.policy.models import save_checkpoint, tiny_config
    from rollout.tokenizer import build_tokenizer
    from transformers import AutoModelForCausalLM
    import torch

    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    names = {
        "one": {cell_key(d, e): "teacher" for d in DOMAINS for e in EFFORTS},
        "domain": {cell_key(d, e): d for d in DOMAINS for e in EFFORTS},
        "cell": {cell_key(d, e): f"{d}-{e}" for d in DOMAINS for e in EFFORTS},
    }[per]
    tokenizer = build_tokenizer()
    config = tiny_config(tokenizer, hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
                         num_kv_heads=num_kv_heads, init_std=init_std)
    for i, name in enumerate(dict.fromkeys(names.values())):
        where = root / name
        if source is not None:
            shutil.rmtree(where, ignore_errors=True)
            shutil.copytree(source, where)
            continue
        torch.manual_seed(seed + i)
        model = AutoModelForCausalLM.from_config(config)
        save_checkpoint(model, tokenizer, where)
    grid = {"cells": {cell: {"kind": "hf", "path": name} for cell, name in names.items()}}
    path = root / "grid.yaml"
    path.write_text(yaml.safe_dump(grid, sort_keys=False))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m distill.tiny_grid", description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--per", choices=("domain", "cell", "one"), default="domain")
    parser.add_argument("--from", dest="source", default=None, help="copy this checkpoint instead of fresh tiny models")
    parser.add_argument("--hidden-size", type=int, default=32)
    parser.add_argument("--num-layers", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1000, help="first init seed (a student is usually seed 0)")
    args = parser.parse_args(argv)
    path = write_tiny_grid(args.out, per=args.per, source=args.source, hidden_size=args.hidden_size,
                           num_layers=args.num_layers, seed=args.seed)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
