"""``agentenv serve MODEL``: an OpenAI-compatible server for a local model (see ``rollout.serve``)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)


def serve(
    model: str = typer.Argument(..., help="A local checkpoint directory, or 'tiny' for a fresh seeded tiny model."),
    host: str = typer.Option("127.0.0.1", help="Interface to bind; keep loopback unless you mean to share it."),
    port: int = typer.Option(8000, help="TCP port."),
    device: str = typer.Option("cpu", help="torch device, e.g. cpu or cuda:0."),
    seed: int = typer.Option(0, help="Initialisation seed of the 'tiny' model."),
    served_name: str = typer.Option("", help="Model name clients must send (default: MODEL as given)."),
    max_tokens: int = typer.Option(256, help="Completion length when a chat request sets none."),
    policy_version: int = typer.Option(
        0, min=0, help="Version of the weights MODEL holds (reported on every response; updates must not go below it)."
    ),
    weights_root: str = typer.Option(
        "", help="POST /update_weights_from_disk loads only directories beneath this one (default: any)."
    ),
    api_key: str = typer.Option(
        "", envvar="AGENTENV_SERVE_API_KEY", help="Bearer token every route requires (401 otherwise); default: none."
    ),
    effort_budget: list[str] = typer.Option(
        [], "--effort-budget", help="LEVEL=TOKENS: a request's reasoning_effort LEVEL closes thinking after TOKENS (repeat)"
    ),
) -> None:
    """Serve MODEL at http://HOST:PORT/v1 (chat completions with tools, completions, logprobs, token ids).

    Weights are swapped under training with POST /update_weights_from_disk {"model_path": DIR, "version": N}
    (requests in flight finish on the old weights); GET /get_model_info reports the loaded version.
    """
    from rollout.serve import serve as run

    budgets: dict[str, int] = {}
    for item in effort_budget:
        level, _, tokens = item.partition("=")
        if not level or not tokens.isdigit() or int(tokens) < 1:
            raise typer.BadParameter(f"expected LEVEL=TOKENS with TOKENS >= 1, got {item!r}", param_hint="--effort-budget")
        budgets[level] = int(tokens)
    try:
        run(model, host, port, device=device, seed=seed, served_name=served_name or None, default_max_tokens=max_tokens,
            version=policy_version, effort_budgets=budgets or None, weights_root=weights_root or None,
            api_key=api_key or None)
    except FileNotFoundError as exc:
        raise typer.BadParameter(str(exc), param_hint="MODEL") from exc
