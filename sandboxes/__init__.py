"""Sandboxes: the ``Sandbox`` contract (``sandboxes.types``), the Docker and local backends, warm pools,
snapshots, images, and an in-memory fake for unit tests (``sandboxes.testing``).

    from sandboxes import DockerBackend, SandboxPool, SandboxSpec, ensure_base_image
"""

from sandboxes.exports import lazy_exports

_EXPORTS = {
    **dict.fromkeys(
        ["ExecResult", "FileEntry", "Sandbox", "SandboxBackend", "SandboxSpec", "SnapshotKind", "SnapshotRef"],
        "sandboxes.types",
    ),
    **dict.fromkeys(
        ["SandboxError", "SandboxLost", "SandboxTimeout", "SnapshotError", "SpecError", "UnknownBackend"],
        "sandboxes.errors",
    ),
    "DockerBackend": "sandboxes.docker_backend",
    "LocalBackend": "sandboxes.local_backend",
    "SandboxPool": "sandboxes.pool",
    "make_backend": "sandboxes.backends",
    "ensure_base_image": "sandboxes.images",
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS)
