"""Adversarial agents against real pytest in Docker: planted conftest, fake PASSED, os._exit, hangs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agentenv.grading import grade_episode
from agentenv.task import FolderTask
from agentenv.types import Episode, UnitTestsVerifierSpec
from agentenv.verifiers import build_verifier

pytestmark = [pytest.mark.docker, pytest.mark.slow]

#: coding/fix_bug as graded in-process by hidden pytest tests (the built-in one now grades through ``calls``).
TASK = FolderTask.load(Path(__file__).parents[2] / "adversarial" / "tasks" / "fix_bug_pytest")

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


@pytest.mark.parametrize("in_place", [False, True], ids=["fork", "in_place"])
@pytest.mark.parametrize("cheat", sorted(CHEATS))
def test_cheats_earn_nothing(backend, agent, cheat: str, in_place: bool) -> None:  # noqa: ANN001
    sandbox, variant = agent
    for path, text in CHEATS[cheat].items():
        sandbox.write_file(path, text)
    sandbox.exec("echo 'test_clamp PASSED'; echo '== 4 passed =='")
    result = grade_episode(backend, sandbox, TASK, Episode(TASK.id, variant), in_place=in_place)
    assert result.reward == 0.0 and not result.passed, result
    assert result.extra["graded_in"] == ("place" if in_place else "fork")


def test_in_place_grading_kills_what_the_agent_left_running(backend, agent) -> None:  # noqa: ANN001
    # A background job that would swap the fixed file for the broken one while the tests run, and a
    # planted /tmp file: grading in place sees neither (as a fork would not).
    sandbox, variant = agent
    TASK.oracle(sandbox, variant)
    solved = sandbox.read_file("/workspace/mathutils.py")
    sandbox.exec("cp mathutils.py /tmp/.fixed; echo 'def clamp(*a): return 0' > /tmp/.broken; "
                 "nohup sh -c 'sleep 0.2; while true; do cp /tmp/.broken /workspace/mathutils.py; sleep 0.05; done' "
                 ">/dev/null 2>&1 &")
    result = grade_episode(backend, sandbox, TASK, Episode(TASK.id, variant), in_place=True)
    assert result.extra["graded_in"] == "place" and result.reward == 1.0, result
    left = sandbox.exec("ls -A /tmp").stdout.split()  # only grading's own staging dirs
    assert ".broken" not in left and all(n.startswith("agentenv-") for n in left), left
    assert sandbox.read_file("/workspace/mathutils.py") == solved
    procs = sandbox.exec("ps -u agent -o args=").stdout  # the agent and this ps only
    assert "sleep" not in procs and "while true" not in procs, procs


def test_planted_hidden_tests_are_cleared(backend, agent) -> None:  # noqa: ANN001
    sandbox, variant = agent
    planted = sandbox.exec("mkdir -p /tests && printf 'def test_ok():\\n    pass\\n' > /tests/test_mathutils.py")
    result = grade_episode(backend, sandbox, TASK, Episode(TASK.id, variant))
    assert result.reward == 0.0 and not result.invalid, (planted, result.reason)


def test_exiting_zero_from_the_code_under_test_is_invalid(backend, agent) -> None:  # noqa: ANN001
    sandbox, variant = agent
    sandbox.write_file("/workspace/mathutils.py", "import os\nprint('4 passed')\nos._exit(0)\n")
    result = grade_episode(backend, sandbox, TASK, Episode(TASK.id, variant))
    assert result.invalid and result.invalid_cause == "agent" and result.reward == 0.0
    assert "no session-finish line" in result.reason


def test_a_hang_is_a_timeout_and_invalid(agent) -> None:  # noqa: ANN001
    sandbox, variant = agent
    sandbox.write_file("/workspace/mathutils.py", "import time\ntime.sleep(600)\n")
    verifier = build_verifier(UnitTestsVerifierSpec(timeout_s=5), TASK.folder, variant)
    result = verifier.verify(sandbox, Episode(TASK.id, variant))
    assert result.invalid and "timed out" in result.reason
