"""Offline images: mirror discovery and recipe hashing (unit); Dockerfile builds cached by hash (docker)."""

from __future__ import annotations

from pathlib import Path

import docker
import pytest

from sandboxes.images import (
    ImageBuildError,
    RootfsRecipe,
    build_dockerfile,
    context_hash,
    host_apt_mirror,
)


@pytest.mark.unit
def test_recipe_hash_is_stable_and_tracks_content() -> None:
    a, b = RootfsRecipe(), RootfsRecipe()
    assert a.tag() == b.tag()
    assert RootfsRecipe(packages=(*a.packages, "jq")).tag() != a.tag()
    assert a.tag().startswith("agentenv-base:")


@pytest.mark.unit
def test_mirror_override_and_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTENV_APT_MIRROR", "http://mirror.example/debian")
    assert host_apt_mirror() == "http://mirror.example/debian"
    monkeypatch.delenv("AGENTENV_APT_MIRROR")
    assert host_apt_mirror().startswith("http")


@pytest.mark.unit
def test_context_hash_changes_with_files_and_base(tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text("FROM agentenv-base:latest\n")
    h1 = context_hash(tmp_path, "sha256:aaa")
    assert context_hash(tmp_path, "sha256:aaa") == h1
    assert context_hash(tmp_path, "sha256:bbb") != h1
    (tmp_path / "extra.txt").write_text("x")
    assert context_hash(tmp_path, "sha256:aaa") != h1


@pytest.mark.docker
def test_dockerfile_builds_on_base_and_is_cached(docker_client: docker.DockerClient, base_image: str, tmp_path: Path) -> None:
    env = tmp_path / "mytask" / "environment"
    env.mkdir(parents=True)
    (env / "Dockerfile").write_text(f"FROM agentenv-base:latest\nRUN echo built-{tmp_path.name} > /etc/marker\n")
    logs: list[str] = []
    tag = build_dockerfile(docker_client, env, log=logs.append)
    try:
        assert tag.startswith("agentenv-env-mytask:")
        out = docker_client.containers.run(tag, ["cat", "/etc/marker"], remove=True)
        assert out.decode().strip() == f"built-{tmp_path.name}"
        logs.clear()
        assert build_dockerfile(docker_client, env, log=logs.append) == tag
        assert any("present" in line for line in logs), "an unchanged context is not rebuilt"
    finally:
        docker_client.images.remove(tag, force=True)


@pytest.mark.docker
def test_broken_dockerfile_names_the_file(docker_client: docker.DockerClient, base_image: str, tmp_path: Path) -> None:
    env = tmp_path / "broken"
    env.mkdir()
    (env / "Dockerfile").write_text("FROM agentenv-base:latest\nRUN exit 3\n")
    with pytest.raises(ImageBuildError, match=str(env / "Dockerfile")):
        build_dockerfile(docker_client, env)
