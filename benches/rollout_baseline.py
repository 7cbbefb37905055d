"""The benchmark's baseline: the oracle over the built-in suite, one episode at a time, plain ``docker`` SDK.

``agentenv rollout bench`` (``benches.rollout``) runs it first, then our rollout on the same episodes.

What a careful script without this project would do for each episode::

    containers.run(image)                      # same limits: no network, cpus, memory, pids, init
    put_archive(workspace) + exec_run(setup)   # the variant's setup, every episode
    exec_run(oracle script)                    # the agent's work (the scripted policy's shell call)
    put_archive(hidden tests)                  # only now, as grading does
    exec_run(verifier command)                 # pytest / exit-code script / db dump / file reads
    container.remove(force=True)

It counts two tool calls per episode (the oracle's shell call and the submit),
as the scripted oracle policy makes through a harness with a submit tool.

Where it is *lighter* than our runner, on purpose (so the ratio is not
flattered): no harness rendering or parsing, no snapshot of the final state and
no separate grading container, no oracle replay for the verifiers that compare
with the oracle (``files`` with ``match_oracle``, ``db_state``'s state hash: the
baseline only checks that the files exist and that the database dump and its
row assertions pass), no trajectory store. ``ok`` counts episodes whose checks
all passed.

Usage::

    result = run_baseline(suite_task_ids(), episodes_per_task=2)
    print(result.episodes_per_s, result.tool_calls_per_s)
"""

from __future__ import annotations

import io
import json
import shlex
import tarfile
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker

from agentenv.spec import setup_path
from agentenv.task import HIDDEN_TESTS_DIR, FolderTask, last_line
from agentenv.types import (
    AnswerVerifierSpec,
    DbStateVerifierSpec,
    ExitCodeVerifierSpec,
    FilesVerifierSpec,
    UnitTestsVerifierSpec,
    Variant,
)
from agentenv.variants import context, render
from rollout.errors import UnsupportedTask

USER, UID = "agent", 1000  # the sandbox user every project image has (sandboxes.images)
TOOL_CALLS_PER_EPISODE = 2
DB_DIR = "/tmp/agentenv-baseline-db"


@dataclass(frozen=True)
class BaselineResult:
    """Throughput of the sequential loop, and where its time went (seconds, summed over episodes)."""

    episodes: int
    ok: int
    wall_s: float
    tool_calls: int
    split: Mapping[str, float] = field(default_factory=dict)  # start, setup, oracle, grade, remove
    failures: Sequence[str] = ()

    @property
    def episodes_per_s(self) -> float:
        return self.episodes / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def tool_calls_per_s(self) -> float:
        return self.tool_calls / self.wall_s if self.wall_s > 0 else 0.0


def suite_task_ids() -> list[str]:
    """Every built-in folder task, sorted (the benchmark's suite)."""
    import agentenv.tasks.builtin as builtin

    root = Path(next(iter(builtin.__path__)))
    return sorted(FolderTask.load(p.parent).id for p in root.rglob("task.yaml"))


def run_baseline(
    task_ids: Sequence[str], *, episodes_per_task: int = 1, seed: int = 0, client: docker.DockerClient | None = None
) -> BaselineResult:
    """Run ``episodes_per_task`` oracle episodes of each task (variant ``seed``), one after another."""
    from agentenv.registry import get_task

    client = client or docker.from_env(timeout=120)
    tasks = []
    for task_id in task_ids:
        task = get_task(task_id)
        if not isinstance(task, FolderTask):
            raise UnsupportedTask(
                f"task_ids: the baseline runs folder tasks only, expected a FolderTask, "
                f"got {task_id!r} as {type(task).__name__}"
            )
        tasks.append((task, task.sandbox_spec().image))  # build images before the clock starts
    split = dict.fromkeys(("start", "setup", "oracle", "grade", "remove"), 0.0)
    ok, episodes, failures = 0, 0, []
    started = time.monotonic()
    for task, image in tasks:
        variant = task.variant(seed)
        for _ in range(episodes_per_task):
            problem = _episode(client, task, image, variant, split)
            episodes += 1
            ok += problem is None
            if problem is not None:
                failures.append(f"{task.id}: {problem}")
    wall = time.monotonic() - started
    return BaselineResult(episodes, ok, wall, episodes * TOOL_CALLS_PER_EPISODE, split, tuple(failures))


# ---------------------------------------------------------------- one episode


def _episode(client: docker.DockerClient, task: FolderTask, image: str, variant: Variant, split: dict[str, float]) -> str | None:
    """One episode; returns why its checks failed, or None."""
    env = task.spec.environment
    t0 = time.monotonic()
    container = client.containers.run(
        image, ["sleep", "infinity"], detach=True, init=True, network_mode="none", working_dir=env.workdir,
        mem_limit=f"{env.memory_mb}m", nano_cpus=int(env.cpus * 1e9), pids_limit=env.pids,
        cap_drop=["ALL"], security_opt=["no-new-privileges"],
        labels={"agentenv.baseline": "1"},
    )
    t1 = time.monotonic()
    split["start"] += t1 - t0
    try:
        problem = _setup(container, task, variant)
        t2 = time.monotonic()
        split["setup"] += t2 - t1
        if problem is not None:
            return problem
        code, out = _run(container, task.oracle_script(variant) or "", env.workdir)
        answer = last_line(out.decode(errors="replace")) if task.oracle_answers() else None
        t3 = time.monotonic()
        split["oracle"] += t3 - t2
        if code != 0:
            return f"oracle exit {code}: {out[-300:]!r}"
        problem = _grade(container, task, variant, answer)
        split["grade"] += time.monotonic() - t3
        return problem
    finally:
        t4 = time.monotonic()
        container.remove(force=True)
        split["remove"] += time.monotonic() - t4


def _run(container: Any, script: str, workdir: str, env: Mapping[str, str] | None = None) -> tuple[int, bytes]:
    result = container.exec_run(["bash", "-c", script], user=USER, workdir=workdir, environment=dict(env or {}))
    return int(result.exit_code), bytes(result.output or b"")


def _put(container: Any, files: Mapping[str, bytes], mode: int = 0o644) -> None:
    """Absolute path -> bytes, owned by the sandbox user (parents too)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        dirs = sorted({str(parent) for p in files for parent in Path(p).parents if str(parent) not in ("/", "/tmp")})
        for d in dirs:
            info = tarfile.TarInfo(d.lstrip("/"))
            info.type, info.mode, info.uid, info.gid = tarfile.DIRTYPE, 0o755, UID, UID
            tar.addfile(info)
        for path, data in files.items():
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode, info.uid, info.gid = len(data), mode, UID, UID
            tar.addfile(info, io.BytesIO(data))
    container.put_archive("/", buf.getvalue())


def _setup(container: Any, task: FolderTask, variant: Variant) -> str | None:
    workdir = task.spec.environment.workdir
    files = task.folder / task.spec.workspace
    if files.is_dir():
        _put(container, {f"{workdir}/{p.relative_to(files).as_posix()}": p.read_bytes() for p in files.rglob("*") if p.is_file()})
    if not task.spec.setup:
        return None
    path = setup_path(task.folder, task.spec)
    script = render(path.read_text() if path else task.spec.setup, context(variant.params, variant.seed), where=f"{task.id} setup")
    code, out = _run(container, script, workdir)
    return None if code == 0 else f"setup exit {code}: {out[-300:]!r}"


def _grade(container: Any, task: FolderTask, variant: Variant, answer: str | None) -> str | None:
    """Copy the hidden files in, then run each verifier's command; the first failure, or None."""
    _put(container, task.hidden_files(variant))
    workdir = task.spec.environment.workdir
    ctx = {**context(variant.params, variant.seed), "oracle_answer": answer or ""}
    for spec in task.spec.verifiers:
        if isinstance(spec, UnitTestsVerifierSpec):
            ini = f"{HIDDEN_TESTS_DIR}/pytest.ini"
            _put(container, {ini: f"[pytest]\npythonpath = {workdir}\naddopts =\n".encode()})
            command = spec.command or f"python3 -I -m pytest -c {ini} --rootdir={HIDDEN_TESTS_DIR} -p no:cacheprovider -q {HIDDEN_TESTS_DIR}"
            code, out = _run(container, command, workdir, {"AGENTENV_TESTS_DIR": HIDDEN_TESTS_DIR, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
        elif isinstance(spec, ExitCodeVerifierSpec):
            code, out = _run(container, render(spec.command, ctx, where=f"{task.id} exit_code"), workdir, {"AGENTENV_TESTS_DIR": HIDDEN_TESTS_DIR})
            code = 0 if code == spec.expect else 1
        elif isinstance(spec, AnswerVerifierSpec):
            expected = render(spec.expected, ctx, where=f"{task.id} answer")
            code, out = _run(container, f"cat {shlex.quote(spec.file)}", workdir) if spec.file else (0, (answer or "").encode())
            got = (answer if answer is not None else out.decode(errors="replace")).strip()
            code = 0 if code == 0 and _same_answer(got, expected, spec) else 1
        elif isinstance(spec, FilesVerifierSpec):
            paths = " ".join(shlex.quote(c.path) for c in spec.checks if c.exists)
            code, out = _run(container, f"cat -- {paths} >/dev/null", workdir)
        elif isinstance(spec, DbStateVerifierSpec):
            code, out = _db_state(container, spec, ctx, workdir, task.id)
        else:  # pragma: no cover - a new verifier kind: say so rather than pass
            return f"baseline cannot run verifier {type(spec).__name__}"
        if code != 0:
            return f"{spec.type} check failed: {out[-300:]!r}"
    return None


def _same_answer(got: str, expected: str, spec: AnswerVerifierSpec) -> bool:
    if spec.mode == "numeric":
        try:
            return abs(float(got) - float(expected)) <= spec.tolerance
        except ValueError:
            return False
    if spec.mode == "normalized":
        return " ".join(got.lower().split()) == " ".join(expected.lower().split())
    return got == expected


def _db_state(container: Any, spec: DbStateVerifierSpec, ctx: Mapping[str, Any], workdir: str, task_id: str) -> tuple[int, bytes]:
    """The database dumped inside the sandbox (as the verifier does for servers), assertions checked."""
    from agentenv.verifiers import db_canon

    if spec.prepare:
        code, out = _run(container, spec.prepare, workdir)
        if code != 0:
            return code, out
    queries = [render(a.query, ctx, where=f"{task_id} db_state") for a in spec.assertions]
    if spec.url.startswith("sqlite:///"):  # as the verifier does: copy the file out, dump it here
        out = b""
        with tempfile.TemporaryDirectory() as tmp:
            local = Path(tmp) / "db.sqlite"
            stream, _ = container.get_archive(spec.url[len("sqlite:///") :])
            with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
                member = tar.next()
                data = tar.extractfile(member) if member is not None else None
                local.write_bytes(data.read() if data is not None else b"")
            dump = db_canon.dump(f"sqlite:///{local}", spec.tables, queries)
    else:
        request = json.dumps({"url": spec.url, "tables": spec.tables, "queries": queries}).encode()
        _put(container, {f"{DB_DIR}/db_canon.py": Path(db_canon.__file__).read_bytes(), f"{DB_DIR}/request.json": request})
        code, out = _run(container, f"python3 -I {DB_DIR}/db_canon.py {DB_DIR}/request.json", workdir)
        if code != 0:
            return code, out
        dump = json.loads(out.decode().strip().splitlines()[-1])
    for assertion, got in zip(spec.assertions, dump.get("queries", [])):
        rows = got.get("rows")
        if assertion.expect is not None and rows != assertion.expect:
            return 1, f"{assertion.query}: {rows} != {assertion.expect}".encode()
        if assertion.expect_count is not None and (rows is None or len(rows) != assertion.expect_count):
            return 1, f"{assertion.query}: {rows}".encode()
    return 0, out


__all__ = ["BaselineResult", "run_baseline", "suite_task_ids"]
