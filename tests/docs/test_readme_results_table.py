"""The README's results table (and docs/training.md's seed table) are renderings of docs/results.json: one source
for every headline number."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def _script():  # noqa: ANN202 - a module
    spec = importlib.util.spec_from_file_location("results_table", ROOT / "scripts" / "results_table.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_table_is_the_rendering_of_results_json() -> None:
    rt = _script()
    results = json.loads((ROOT / "docs" / "results.json").read_text())
    paths = [path for path, _ in rt.targets(results)]
    assert paths == [ROOT / "README.md", ROOT / "docs" / "training.md"]
    for path, table in rt.targets(results):
        text = path.read_text()
        assert rt.splice(text, table) == text, f"{path.name}: its results table differs from docs/results.json: run python scripts/results_table.py"
    assert rt.main(["--check"]) == 0


def test_a_changed_number_is_caught() -> None:
    rt = _script()
    results = json.loads((ROOT / "docs" / "results.json").read_text())
    readme = (ROOT / "README.md").read_text()
    results["rollout_bench"]["ratios"][0] = 1.23
    results["main_job"]["seeds"]["0"]["wall_s"] = 1
    assert rt.splice(readme, rt.render(results)) != readme
    training = (ROOT / "docs" / "training.md").read_text()
    assert rt.splice(training, rt.render_seeds(results)) != training


def test_the_readme_names_nothing_outside_the_repository() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "shared folder" not in readme and "ARCHITECTURE.md" not in readme
    for link in re.findall(r"\]\(([^)#]+)\)", readme):  # every relative link resolves in a clone
        assert (ROOT / link).exists(), link


def test_every_ray_job_submit_command_in_the_docs_authenticates() -> None:
    """Ray >= 2.59: a head with a token refuses a plain `ray job submit` (docs/rollout.md)."""
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(), re.S):
            for line in block.splitlines():
                if line.strip().startswith("ray job submit"):
                    pytest.fail(f"{page.name}: `{line.strip()}` needs RAY_AUTH_MODE=token in front")
