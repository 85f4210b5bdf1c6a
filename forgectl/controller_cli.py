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


def install(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the manifests instead of applying them (with -o yaml).")] = False,
    output: Annotated[str, typer.Option("--output", "-o", help="yaml: the manifests as one YAML stream.")] = "yaml",
    namespace: Annotated[str, typer.Option("--namespace", "-n", help="The controller's namespace.")] = "forge-system",
    image: Annotated[str, typer.Option("--image", help="The controller's image.")] = "forge-controller:0.1.0",
    replicas: Annotated[int, typer.Option("--replicas", min=1, help="Replicas (one leads each environment).")] = 2,
    manage: Annotated[list[str] | None, typer.Option("--manage", help="A namespace the controller applies to (repeat).")] = None,
) -> None:
    """The controller's manifests (Namespace, Sync CRD, ServiceAccount, RBAC, Deployment, Service,
    PodDisruptionBudget), as `deploy/` holds them rendered with the defaults (docs/controller.md)."""
    from reconciler.controller.install import InstallOptions, install_objects
    from reconciler.diagnostics import ForgeError
    from reconciler.present.manifests import to_yaml_stream

    if output != "yaml":
        raise ForgeError(f"--output {output!r}: only yaml is supported")
    if not dry_run:
        raise ForgeError("forgectl install applies nothing yet (the controller's image is not built): render the "
                         "manifests with --dry-run -o yaml and apply them with kubectl (docs/controller.md)")
    objects = install_objects(InstallOptions(namespace, image, replicas, tuple(manage or ())))
    print(to_yaml_stream(objects), end="")
