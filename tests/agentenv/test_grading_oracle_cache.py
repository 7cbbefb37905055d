"""The process-wide oracle cache: transient failures are retried, and tasks are told apart by content."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "verifiers"))
from verifier_fakes import make_variant  # noqa: E402

from agentenv.errors import OracleError  # noqa: E402
from agentenv.grading import BackendOracleReplay, OracleUnavailable, clear_oracle_cache, task_fingerprint  # noqa: E402
from sandboxes.errors import SandboxLost  # noqa: E402
from sandboxes.testing import FakeBackend, FakeSandbox  # noqa: E402
from sandboxes.types import SandboxSpec  # noqa: E402

pytestmark = pytest.mark.unit


class Task:
    """A task whose oracle fails as told (an exception per call, then succeeds)."""

    id = "t/fake"
    folder: Path | None = None

    def __init__(self, failures: list[BaseException] | None = None, answer: str = "42", folder: Path | None = None) -> None:
        self.failures = list(failures or [])
        self.answer = answer
        self.runs = 0
        if folder is not None:
            self.folder = folder

    builds: list[bool]

    def sandbox_spec(self, *, build: bool = True) -> SandboxSpec:
        self.__dict__.setdefault("builds", []).append(build)
        return SandboxSpec(image="fake")

    def setup(self, sandbox: FakeSandbox, variant: object) -> None:
        pass

    def oracle(self, sandbox: FakeSandbox, variant: object) -> str | None:
        self.runs += 1
        if self.failures:
            raise self.failures.pop(0)
        return self.answer


@pytest.fixture(autouse=True)
def _clean_cache():  # noqa: ANN202
    clear_oracle_cache()
    yield
    clear_oracle_cache()


def answer(task: Task) -> str:
    return BackendOracleReplay(FakeBackend(), task, make_variant()).compute("answer", lambda _sb, ans: ans)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "transient",
    [SandboxLost("container vanished"), TimeoutError("exec deadline"), ConnectionError("daemon reset"),
     OracleError("solve.sh: the oracle failed for seed 0: timed out")],
    ids=["lost", "timeout", "connection", "script-timed-out"],
)
def test_a_transient_replay_failure_is_not_cached(transient: BaseException) -> None:
    task = Task([transient])
    with pytest.raises(OracleUnavailable):
        answer(task)
    assert answer(task) == "42" and task.runs == 2  # retried, then cached
    assert answer(task) == "42" and task.runs == 2


def test_a_deterministic_oracle_failure_is_cached() -> None:
    task = Task([OracleError("solve.sh: exit code 1")])
    for _ in range(2):
        with pytest.raises(OracleError, match="exit code 1") as info:
            answer(task)
        assert not isinstance(info.value, OracleUnavailable)
    assert task.runs == 1


def test_a_broken_setup_is_a_cached_task_failure_and_a_lost_one_is_not() -> None:
    class BadSetup(Task):
        def __init__(self, exc: BaseException) -> None:
            super().__init__()
            self.exc = exc

        def setup(self, sandbox: FakeSandbox, variant: object) -> None:
            self.setups = getattr(self, "setups", 0) + 1
            raise self.exc

    broken = BadSetup(RuntimeError("setup.sh exit code 2"))
    for _ in range(2):
        with pytest.raises(OracleError, match="replay failed"):
            answer(broken)
    assert broken.setups == 1
    lost = BadSetup(SandboxLost("gone"))
    for _ in range(2):
        with pytest.raises(OracleUnavailable):
            answer(lost)
    assert lost.setups == 2


def test_two_folders_with_one_task_id_get_their_own_oracle_answers(tmp_path: Path) -> None:
    good, broken = tmp_path / "good", tmp_path / "broken"
    for folder, solve in ((good, "echo 42"), (broken, "exit 1")):
        (folder / "solution").mkdir(parents=True)
        (folder / "task.yaml").write_text("id: t/fake\n")
        (folder / "solution" / "solve.sh").write_text(solve)
    assert task_fingerprint(Task(folder=good)) != task_fingerprint(Task(folder=broken))
    assert answer(Task(folder=good)) == "42"
    failing = Task([OracleError("exit 1")], folder=broken)
    with pytest.raises(OracleError):
        answer(failing)  # not the good copy's cached answer
    assert failing.runs == 1


def test_editing_a_task_folder_changes_its_fingerprint(tmp_path: Path) -> None:
    (tmp_path / "task.yaml").write_text("id: t/fake\n")
    before = task_fingerprint(Task(folder=tmp_path))
    assert task_fingerprint(Task(folder=tmp_path)) == before  # stable while unchanged
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text("def test_x(): pass\n")
    assert task_fingerprint(Task(folder=tmp_path)) != before


def test_python_tasks_with_one_id_do_not_share_answers() -> None:
    first, second = Task(answer="1"), Task(answer="2")
    assert answer(first) == "1" and answer(second) == "2"
    assert answer(first) == "1" and first.runs == 1  # each object keeps its own cached answer


class LocalBackend(FakeBackend):
    name = "local"


def test_the_local_backend_builds_no_image_for_the_oracle_replay() -> None:
    """The local backend runs no image: grading there must not reach for Docker (found on a box without it)."""
    for backend, expected in ((FakeBackend(), True), (LocalBackend(), False)):
        task = Task()
        replay = BackendOracleReplay(backend, task, make_variant(seed=0))
        assert replay.compute("answer", lambda sb, answer: answer) == "42"
        assert task.builds and set(task.builds) == {expected}, (type(backend).__name__, task.builds)
