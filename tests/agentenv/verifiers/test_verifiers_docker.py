"""Adversarial agents against real pytest in Docker: planted conftest, fake PASSED, os._exit, hangs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import agentenv.tasks.builtin as builtin_pkg
from agentenv.grading import grade_episode
from agentenv.task import FolderTask
from agentenv.types import Episode, UnitTestsVerifierSpec
from agentenv.verifiers import build_verifier

pytestmark = [pytest.mark.docker, pytest.mark.slow]

TASK = FolderTask.load(Path(builtin_pkg.__path__[0]) / "coding" / "fix_bug")

CHEATS = {
    "conftest_forces_pass": {
        "/workspace/conftest.py": "import pytest\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
        "    out = yield\n    out.get_result().outcome = 'passed'\n",
        "/workspace/pytest.ini": "[pytest]\naddopts = -p conftest\n",
        "/workspace/sitecustomize.py": "print('test_clamp PASSED')\n",
    },
    "prints_passed_and_plants_reports": {
        "/workspace/report.xml": '<testsuites><testsuite tests="1" failures="0" errors="0"><testcase name="test_clamp"/></testsuite></testsuites>',
        "/tmp/report.xml": '<testsuites><testsuite tests="1" failures="0" errors="0"><testcase name="test_clamp"/></testsuite></testsuites>',
    },
}


@pytest.fixture(scope="module")
def backend(docker_client, base_image) -> Iterator[object]:  # noqa: ANN001
    from sandboxes.docker_backend import DockerBackend

    backend = DockerBackend(docker_client)
    yield backend
    backend.close()


@pytest.fixture()
def agent(backend):  # noqa: ANN001, ANN201
    variant = TASK.variant(0)
    sandbox = backend.create(TASK.sandbox_spec())
    TASK.setup(sandbox, variant)
    yield sandbox, variant
    sandbox.close()


@pytest.mark.parametrize("cheat", sorted(CHEATS))
def test_cheats_earn_nothing(backend, agent, cheat: str) -> None:  # noqa: ANN001
    sandbox, variant = agent
    for path, text in CHEATS[cheat].items():
        sandbox.write_file(path, text)
    sandbox.exec("echo 'test_clamp PASSED'; echo '== 4 passed =='")
    result = grade_episode(backend, sandbox, TASK, Episode(TASK.id, variant))
    assert result.reward == 0.0 and not result.passed, result


def test_planted_hidden_tests_are_cleared(backend, agent) -> None:  # noqa: ANN001
    sandbox, variant = agent
    planted = sandbox.exec("mkdir -p /tests && printf 'def test_ok():\\n    pass\\n' > /tests/test_mathutils.py")
    result = grade_episode(backend, sandbox, TASK, Episode(TASK.id, variant))
    assert result.reward == 0.0 and not result.invalid, (planted, result.reason)


def test_exiting_zero_from_the_code_under_test_is_invalid(backend, agent) -> None:  # noqa: ANN001
    sandbox, variant = agent
    sandbox.write_file("/workspace/mathutils.py", "import os\nprint('4 passed')\nos._exit(0)\n")
    result = grade_episode(backend, sandbox, TASK, Episode(TASK.id, variant))
    assert result.invalid and result.reward == 0.0 and "no JUnit report" in result.reason


def test_a_hang_is_a_timeout_and_invalid(agent) -> None:  # noqa: ANN001
    sandbox, variant = agent
    sandbox.write_file("/workspace/mathutils.py", "import time\ntime.sleep(600)\n")
    verifier = build_verifier(UnitTestsVerifierSpec(timeout_s=5), TASK.folder, variant)
    result = verifier.verify(sandbox, Episode(TASK.id, variant))
    assert result.invalid and "timed out" in result.reason
