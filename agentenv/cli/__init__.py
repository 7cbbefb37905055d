"""The ``agentenv`` command line. Every command group imports its backend lazily,
so ``agentenv --help`` stays fast and a missing optional part fails only the
command that needs it."""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="agentenv",
    help="AgentENV: sandboxes, verifier environments, rollouts and training.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)

# (module, attribute) pairs: a sub-app to mount, or a register(app) function.
_GROUPS = {
    "sandbox": ("agentenv.cli.sandbox", "app"),
    "image": ("agentenv.cli.image", "app"),
}
_REGISTERS = ["agentenv.cli.tasks", "agentenv.cli.demo", "agentenv.cli.rollout", "agentenv.cli.serve", "agentenv.cli.train", "agentenv.cli.eval",
               "agentenv.cli.distill", "agentenv.cli.teachers"]

for _name, (_module, _attr) in _GROUPS.items():
    app.add_typer(getattr(importlib.import_module(_module), _attr), name=_name)
for _module in _REGISTERS:
    try:
        _mod = importlib.import_module(_module)
    except ModuleNotFoundError as _exc:
        if _exc.name != _module:  # the module exists but something it imports is missing
            raise
        continue
    _mod.register(app)


def main() -> None:
    app()


__all__ = ["app", "main"]
