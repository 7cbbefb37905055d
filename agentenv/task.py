"""The two kinds of task: a folder with ``task.yaml`` (``FolderTask``) and plain Python (``PythonTask``).

Both implement the ``agentenv.types.Task`` hooks, so the env, the checker and
the rollout workers never ask which kind they hold.

A task folder::

    my_task/
      task.yaml          the spec (agentenv.types.TaskSpec)
      instruction.md     Jinja2 template of what the agent is asked
      workspace/         optional: copied into the sandbox's workdir before setup
      setup.sh           optional: templated script run in the sandbox before the agent starts
      solution/solve.sh  templated oracle script (what a perfect agent would do)
      tests/             hidden: copied into the grading sandbox only, with variant.json
      environment/       optional: a Dockerfile folder built on the base image

The oracle's final answer (for tasks with an ``answer`` verifier) is the last
non-empty line the solution prints on stdout. One rule, easy to follow from any
language: ``echo "$answer"`` last.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from pydantic import TypeAdapter

from agentenv.errors import OracleError, SetupError
from agentenv.spec import load_spec, setup_path
from agentenv.types import (
    AnswerVerifierSpec,
    Domain,
    EnvironmentSpec,
    Episode,
    Limits,
    ParamSpec,
    Task,
    TaskSpec,
    Variant,
    VerifierResult,
    VerifierSpec,
)
from agentenv.variants import context, make_variant, render
from sandboxes.types import ExecResult, Sandbox, SandboxSpec

#: Where grading copies the hidden tests (cleared first, so nothing the agent planted there survives).
#: Under /tmp because grading runs as the sandbox user, who may not create top-level folders.
HIDDEN_TESTS_DIR = "/tmp/agentenv-hidden"

_TAIL = 2000


def run_script(sandbox: Sandbox, script: str, *, timeout: float, env: Mapping[str, str] | None = None) -> ExecResult:
    """Run a bash script through stdin, so it never lies on disk where the agent could read it."""
    return sandbox.exec(["bash", "-s"], stdin=script.encode(), timeout=timeout, env=dict(env or {}))


def last_line(text: str) -> str | None:
    """The last non-empty line of ``text`` (the oracle's final-answer rule)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else None


def _describe(result: ExecResult) -> str:
    why = "timed out" if result.timed_out else f"exit code {result.exit_code}"
    out = (result.stdout + result.stderr)[-_TAIL:]
    return f"{why}\n{out}" if out else why


def _image_for(environment: EnvironmentSpec, folder: Path | None, name: str, build: bool) -> str:
    """The image a task runs in; building (cached by content hash) only when ``build``.

    With ``build=False`` nothing touches Docker: the local backend ignores the
    image, and a laptop without a daemon must still run tasks there.
    """
    from sandboxes import images

    if not build:
        return environment.image or images.LATEST
    import docker

    client = docker.from_env()
    if environment.image:
        from agentenv.tasks.images import ensure_named_image  # builds suite images (PostgreSQL) offline

        return ensure_named_image(client, environment.image)
    if environment.dockerfile and folder is not None:
        return images.build_dockerfile(client, folder / environment.dockerfile, name=name)
    return images.ensure_base_image(client)


def _sandbox_spec(environment: EnvironmentSpec, image: str, seed_env: Mapping[str, str] | None = None) -> SandboxSpec:
    return SandboxSpec(
        image=image,
        cpus=environment.cpus,
        memory_mb=environment.memory_mb,
        pids=environment.pids,
        network=environment.network,
        workdir=environment.workdir,
        env=dict(seed_env or {}),
    )


def grade_with(
    task: Task, verifiers: Sequence[VerifierSpec], sandbox: Sandbox, episode: Episode
) -> VerifierResult:
    """Run the declared verifiers through ``agentenv.verifiers`` (owned by the verifiers package)."""
    from agentenv.verifiers import run_verifiers  # lazy: verifiers may import task helpers

    return run_verifiers(task, list(verifiers), sandbox, episode)


class FolderTask(Task):
    """A task defined by a folder; see the module docstring for the layout.

    Usage::

        task = FolderTask.load("tasks/my_task")
        variant = task.variant(seed=3)
    """

    folder: Path

    def __init__(self, folder: Path | str, spec: TaskSpec | None = None) -> None:
        self.folder = Path(folder).resolve()
        self.spec = spec if spec is not None else load_spec(self.folder)
        self.id = self.spec.id
        self.domain = self.spec.domain
        self.limits = self.spec.limits
        self._image: str | None = None

    @classmethod
    def load(cls, folder: Path | str) -> FolderTask:
        return cls(folder)

    def __repr__(self) -> str:
        return f"FolderTask({self.id!r}, folder={str(self.folder)!r})"

    # ---------------------------------------------------------------- hooks

    def variant(self, seed: int) -> Variant:
        text = (self.folder / self.spec.instruction).read_text()
        return make_variant(self.id, seed, self.spec.params, text, where=str(self.folder / self.spec.instruction))

    def sandbox_spec(self, *, build: bool = True) -> SandboxSpec:
        if build and self._image is None:
            self._image = _image_for(self.spec.environment, self.folder, self.id.replace("/", "-"), build=True)
        image = self._image if build and self._image else _image_for(self.spec.environment, self.folder, self.id, False)
        return _sandbox_spec(self.spec.environment, image)

    def setup(self, sandbox: Sandbox, variant: Variant) -> None:
        """Copy ``workspace/`` into the workdir, then run the rendered setup script."""
        workdir = self.spec.environment.workdir
        files = self.folder / self.spec.workspace
        if files.is_dir():
            for path in sorted(p for p in files.rglob("*") if p.is_file()):
                rel = path.relative_to(files).as_posix()
                sandbox.write_file(f"{workdir}/{rel}", path.read_bytes(), mode=path.stat().st_mode & 0o777)
        script = self._setup_script()
        if script is None:
            return
        where = str(setup_path(self.folder, self.spec) or f"{self.folder / 'task.yaml'}: setup")
        rendered = render(script, context(variant.params, variant.seed), where=where)
        result = run_script(sandbox, rendered, timeout=self.limits.wall_time_s, env=self._script_env(variant))
        if not result.ok:
            raise SetupError(f"{where}: setup failed for seed {variant.seed}: {_describe(result)}")

    def oracle(self, sandbox: Sandbox, variant: Variant) -> str | None:
        where = str(self.folder / self.spec.solution)
        rendered = render((self.folder / self.spec.solution).read_text(), context(variant.params, variant.seed), where=where)
        result = run_script(sandbox, rendered, timeout=self.limits.wall_time_s, env=self._script_env(variant))
        if not result.ok:
            raise OracleError(f"{where}: the oracle failed for seed {variant.seed}: {_describe(result)}")
        if any(isinstance(v, AnswerVerifierSpec) for v in self.spec.verifiers):
            return last_line(result.stdout)
        return None

    def grade(self, sandbox: Sandbox, episode: Episode) -> VerifierResult:
        return grade_with(self, self.spec.verifiers, sandbox, episode)

    def oracle_script(self, variant: Variant) -> str | None:
        where = str(self.folder / self.spec.solution)
        return render((self.folder / self.spec.solution).read_text(), context(variant.params, variant.seed), where=where)

    def oracle_answers(self) -> bool:
        return any(isinstance(v, AnswerVerifierSpec) for v in self.spec.verifiers)

    @property
    def tags(self) -> Sequence[str]:
        return tuple(self.spec.tags)

    def hidden_paths(self) -> list[str]:
        return [HIDDEN_TESTS_DIR]

    def hidden_files(self, variant: Variant) -> dict[str, bytes]:
        return _under_hidden_dir(self.folder / self.spec.tests, variant)

    # ---------------------------------------------------------------- helpers

    def _setup_script(self) -> str | None:
        if not self.spec.setup:
            return None
        path = setup_path(self.folder, self.spec)
        return path.read_text() if path is not None else self.spec.setup

    def _script_env(self, variant: Variant) -> dict[str, str]:
        return {"AGENTENV_TASK_ID": self.id, "AGENTENV_SEED": str(variant.seed)}


def _under_hidden_dir(tests: Path | None, variant: Variant) -> dict[str, bytes]:
    """The hidden folder's files plus ``variant.json``, at their grading-sandbox paths."""
    from agentenv.verifiers.common import read_hidden

    return {f"{HIDDEN_TESTS_DIR}/{rel}": data for rel, data in read_hidden(tests, variant).items()}


_PARAMS = TypeAdapter(dict[str, ParamSpec])
_VERIFIERS = TypeAdapter(list[VerifierSpec])


class PythonTask(Task):
    """Base for tasks written in Python, typically ones that generate their data.

    Declare the spec as class attributes (validated like ``task.yaml``) and
    override ``setup`` (write the data into the sandbox) and ``oracle``; grading
    uses the declared verifiers, as for a folder task. Usage::

        class SumCsv(PythonTask):
            id = "general/sum_csv"
            domain = Domain.GENERAL
            params = {"rows": {"type": "int", "low": 3, "high": 9}}
            verifiers = [{"type": "answer", "expected": "{{ total }}", "mode": "numeric"}]
            instruction = "Add up the `value` column of data.csv and submit the sum."

            def setup(self, sandbox, variant): ...
            def oracle(self, sandbox, variant): ...
    """

    id: ClassVar[str]  # type: ignore[misc]
    domain: ClassVar[Domain]  # type: ignore[misc]
    instruction: ClassVar[str]
    limits: ClassVar[Limits] = Limits()  # type: ignore[misc]
    params: ClassVar[Mapping[str, Any]] = {}
    verifiers: ClassVar[Sequence[Any]] = ()
    environment: ClassVar[EnvironmentSpec] = EnvironmentSpec()
    description: ClassVar[str] = ""

    def __init__(self) -> None:
        where = type(self).__qualname__
        for attr in ("id", "domain", "instruction"):
            if not hasattr(self, attr):
                raise TypeError(f"{where}: PythonTask subclasses must set the class attribute {attr!r}")
        self.param_specs: dict[str, ParamSpec] = _PARAMS.validate_python(dict(self.params))
        self.verifier_specs: list[VerifierSpec] = _VERIFIERS.validate_python(list(self.verifiers))
        self._image: str | None = None

    def __repr__(self) -> str:
        return f"{type(self).__qualname__}({self.id!r})"

    def variant(self, seed: int) -> Variant:
        return make_variant(self.id, seed, self.param_specs, self.instruction, where=f"{type(self).__qualname__}.instruction")

    def sandbox_spec(self, *, build: bool = True) -> SandboxSpec:
        if build and self._image is None:
            self._image = _image_for(self.environment, None, self.id, build=True)
        return _sandbox_spec(self.environment, self._image if build and self._image else _image_for(self.environment, None, self.id, False))

    def setup(self, sandbox: Sandbox, variant: Variant) -> None:
        """Write the variant's data into the sandbox. The default writes nothing."""

    def grade(self, sandbox: Sandbox, episode: Episode) -> VerifierResult:
        return grade_with(self, self.verifier_specs, sandbox, episode)

    def oracle_answers(self) -> bool:
        return any(isinstance(v, AnswerVerifierSpec) for v in self.verifier_specs)

    def hidden_paths(self) -> list[str]:
        return [HIDDEN_TESTS_DIR]

    def hidden_files(self, variant: Variant) -> dict[str, bytes]:
        return _under_hidden_dir(None, variant)


__all__ = ["HIDDEN_TESTS_DIR", "FolderTask", "PythonTask", "last_line", "run_script"]
