"""``agentenv image``: build the offline base image and environment images."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

app = typer.Typer(help="Build images offline (no registry needed).", no_args_is_help=True)
console = Console()


@app.command("build-base")
def build_base(force: bool = typer.Option(False, help="rebuild even if the recipe hash is present")) -> None:
    """Bootstrap a minimal Debian (python3, pytest, sqlite3, git) and import it, tagged by recipe hash."""
    import docker

    from sandboxes.images import RootfsRecipe, build_rootfs_image, host_apt_mirror

    recipe = RootfsRecipe()
    console.print(f"recipe hash [bold]{recipe.content_hash()}[/] (mirror {host_apt_mirror(recipe.suite)})")
    with console.status("building base image"):
        tag = build_rootfs_image(docker.from_env(timeout=600), recipe, force=force, log=console.log)
    console.print(f"[green]ready[/] {tag}")


@app.command("build")
def build(
    path: Path = typer.Argument(..., help="folder with a Dockerfile (FROM agentenv-base:latest)"),
    name: str = typer.Option(None, help="image name suffix; default: the folder's parent name"),
    force: bool = typer.Option(False, help="rebuild even if the content hash is present"),
) -> None:
    """Build an environment's Dockerfile on the base image, cached by content hash."""
    import docker

    from sandboxes.images import build_dockerfile

    if not path.exists():
        raise typer.BadParameter(f"{path} does not exist", param_hint="PATH")
    folder = path if path.is_dir() else path.parent
    with console.status(f"building {folder}"):
        tag = build_dockerfile(docker.from_env(timeout=600), folder, name=name, force=force, log=console.log)
    console.print(f"[green]ready[/] {tag}")


@app.command("build-native")
def build_native(
    program: str = typer.Argument(..., help="claude | codex | kimi"),
    base: str = typer.Option(None, help="image to put the program on; default: the suite base image"),
    force: bool = typer.Option(False, help="rebuild even if the content hash is present"),
) -> None:
    """Put a pinned native agent program (a real harness CLI, from PyPI) on an image, cached by content hash.

    claude and codex are binaries from their wheels; kimi is kimi-cli in its own Python 3.13 from
    Debian trixie (built once into a runtime image by debootstrap, pip and patchelf; needs root).
    """
    import docker

    from sandboxes.images import ensure_base_image
    from sandboxes.native_images import RECIPES, ensure_native_image

    if program not in RECIPES:
        raise typer.BadParameter(f"expected one of {', '.join(sorted(RECIPES))}, got {program!r}", param_hint="PROGRAM")
    client = docker.from_env(timeout=600)
    with console.status(f"building the {program} image"):
        tag = ensure_native_image(client, program, base or ensure_base_image(client, log=console.log), force=force, log=console.log)
    console.print(f"[green]ready[/] {tag}")


# The command's name before "cli" (the third-party programs) became "native": kept working, not listed.
app.command("build-cli", hidden=True)(build_native)
