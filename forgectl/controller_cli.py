"""`forgectl controller run`: the in-cluster controller (docs/controller.md) as one process."""

from __future__ import annotations

from typing import Annotated

import typer

from forgectl.shell import err

app = typer.Typer(help="The in-cluster controller: pull git, apply, walk every rollout.", no_args_is_help=True)


@app.command("run")
def run(
    config: Annotated[str, typer.Option("--config", help="The controller's configuration (a ControllerConfig YAML file).")],
) -> None:
    """Run until SIGTERM: for each configured source, hold its environment's Lease as a leader,
    pull git on an interval or a push webhook, apply new revisions and walk the rollouts."""
    from reconciler.controller.process import run_controller

    def listening(address: str) -> None:
        err.print(f"forge-controller: serving at {address}", markup=False)

    raise typer.Exit(run_controller(config, on_listening=listening))
