"""`forgectl controller run`: the in-cluster controller (docs/controller.md) as one process."""

from __future__ import annotations

from typing import Annotated

import typer

from forgectl.options import ContextOpt, KubeconfigOpt
from forgectl.shell import err, out, safe

app = typer.Typer(help="The in-cluster controller: pull git, apply, walk every rollout.", no_args_is_help=True)


@app.command("run", short_help="Run until SIGTERM: pull each source's git, apply new revisions and walk the rollouts, as its Lease's holder.")
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
    config: Annotated[str | None, typer.Option("--config", help="The controller's configuration (a ControllerConfig file), "
                                                "checked and installed as ConfigMap forge-controller-config.")] = None,
    monitoring: Annotated[bool, typer.Option("--monitoring/--no-monitoring", help="The PodMonitor and PrometheusRule "
                                             "(the Prometheus Operator's CRDs needed).")] = True,
    memory_limit: Annotated[str, typer.Option("--memory-limit", help="The controller container's memory limit: a sync "
                                              "holds the environment's specs, render and live objects at once "
                                              "(about 310 MiB at 1,000 endpoints, 2.4 GiB at 10,000; docs/controller.md).")] = "1Gi",
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
) -> None:
    """Install the controller (Namespace, Sync CRD, ServiceAccount, RBAC, Deployment, Service,
    PodDisruptionBudget, PodMonitor, PrometheusRule), server-side applied; with --dry-run print the
    manifests, as `deploy/` holds them rendered with the defaults (docs/controller.md)."""
    from reconciler.controller.install import InstallOptions, install_objects, installed_secrets
    from reconciler.diagnostics import ForgeError
    from reconciler.present.manifests import to_yaml_stream

    if output != "yaml":
        raise ForgeError(f"--output {output!r}: only yaml is supported")
    secrets: tuple[str, ...] = ()
    text: str | None = None
    if config is not None:
        from pathlib import Path

        from reconciler.controller.config import load_config

        # a bad file: its file:line errors, nothing installed; its secretRefs: the Secrets the Role may get
        secrets = installed_secrets(load_config(config), config)
        text = Path(config).read_text()
    options = InstallOptions(namespace, image, replicas, tuple(manage or ()), monitoring, secrets, memory_limit)
    objects = install_objects(options, text)
    if dry_run:
        print(to_yaml_stream(objects), end="")
        return
    from reconciler.controller.installer import install_cluster

    applied = install_cluster(options, objects, kubeconfig, context, on_line=lambda line: err.print(line, markup=False))
    out.print(f"[bold green]Installed:[/bold green] {len(applied)} objects applied in namespace {safe(namespace)}"
              + ("" if config is not None else "; the Deployment waits for ConfigMap forge-controller-config "
                 "(--config FILE, docs/controller.md)"))


def uninstall(
    namespace: Annotated[str, typer.Option("--namespace", "-n", help="The controller's namespace.")] = "forge-system",
    manage: Annotated[list[str] | None, typer.Option("--manage", help="A namespace install bound the controller in "
                                                     "(those its Syncs name are found by themselves).")] = None,
    remove_workloads: Annotated[bool, typer.Option("--remove-workloads", help="Also delete what the controller applied: "
                                                   "every object Forge owns in the environments its Syncs name.")] = False,
    delete_namespace: Annotated[bool, typer.Option("--delete-namespace", help="Also delete the controller's namespace "
                                                   "and everything in it; refused while its Syncs say workloads live there.")] = False,
    auto_approve: Annotated[bool, typer.Option("--auto-approve", help="Uninstall without asking for confirmation.")] = False,
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
) -> None:
    """Remove the controller and its RBAC, CRD and configuration (like `flux uninstall`); the workloads it
    applied stay unless --remove-workloads."""
    import sys

    from reconciler.controller.install import InstallOptions
    from reconciler.controller.installer import uninstall_cluster
    from reconciler.diagnostics import ForgeError

    if not auto_approve:
        if not sys.stdin.isatty():
            raise ForgeError("refusing to uninstall without confirmation: stdin is not a terminal; pass --auto-approve")
        what = "the controller and every workload it applied" if remove_workloads else "the controller"
        if not typer.confirm(f"Remove {what} from namespace {namespace}?", default=False):
            err.print("Cancelled.")
            raise typer.Exit(1)
    done = uninstall_cluster(InstallOptions(namespace, manage=tuple(manage or ())), kubeconfig, context,
                             remove_workloads=remove_workloads, delete_namespace=delete_namespace,
                             on_line=lambda line: err.print(line, markup=False))
    for line in done.left:
        err.print(f"left {line}", markup=False)
    kept = "" if remove_workloads else "; the workloads it applied are kept (--remove-workloads deletes them)"
    out.print(f"[bold green]Uninstalled:[/bold green] {len(done.deleted)} objects deleted{kept}")
