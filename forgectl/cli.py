"""`forgectl`: validate, render, plan and apply Forge specs.

Each command parses its arguments, calls the library and prints: load → render → diff → plan →
apply (`reconciler.plan.live`), the pull-request plan (`reconciler.plan.pullrequest`), the rollout
controllers' watch loop (`reconciler.controller.watch`) and steering (`reconciler.rollout.steering`). The target
flags are one option group (`forgectl.options`). User errors (:class:`ForgeError`) print one
clear message and exit 1, never a traceback.
"""

from __future__ import annotations

import json
import sys
import time
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from forgectl.controller_cli import app as controller_app
from forgectl.controller_cli import install as controller_install
from forgectl.controller_cli import uninstall as controller_uninstall
from forgectl.experiment_cli import app as experiment_app
from forgectl.experiment_cli import experiment_lines
from forgectl.labels_cli import app as labels_app
from forgectl.models_cli import app as models_app
from forgectl.options import NO_OVERRIDES, EndpointArg, EnvOpt, PathsArg, RevOpt, SpecsOpt, TargetFlags, with_target_flags
from forgectl.shell import (
    controllers_of,
    endpoint_in,
    err,
    json_bytes,
    load_for,
    one_endpoint,
    one_line_summaries,
    open_environment,
    out,
    print_json,
    safe,
    target_options,
)
from reconciler.diagnostics import ForgeError, SpecError, render_diagnostics
from reconciler.load.loader import load
from renderers.errors import RenderError

if TYPE_CHECKING:
    from reconciler.plan.plan import Plan
    from reconciler.targets.base import Target

app = typer.Typer(
    name="forgectl",
    help="GitOps for the model lifecycle: validate, render, plan and apply Forge specs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
SCHEMA_DIR = Path(__file__).resolve().parent.parent / "schema"


class DiagnosticsOutput(str, Enum):
    text = "text"
    json = "json"
    github = "github"


@app.command()
def validate(
    paths: PathsArg = None,
    rev: RevOpt = None,
    output: Annotated[DiagnosticsOutput, typer.Option("--output", "-o", help="text, json or github (workflow annotations).")] = DiagnosticsOutput.text,
) -> None:
    """Check specs: YAML, schema, cross-field rules and references. Exit 0 when valid, 1 otherwise."""
    result = load(paths or ["."], rev)
    rendered = render_diagnostics(result.diagnostics, output.value)
    if output is DiagnosticsOutput.text:
        if rendered:
            print(rendered, file=sys.stderr)
        docs = len(result.specs.documents)
        if result.ok:
            out.print(f"[green]✓[/green] {docs} spec{'s' if docs != 1 else ''} in {result.files} file{'s' if result.files != 1 else ''} valid")
        else:
            errors = len(result.diagnostics)
            err.print(f"[red]✗[/red] {errors} problem{'s' if errors != 1 else ''} in {result.files} file{'s' if result.files != 1 else ''}")
    elif rendered:
        print(rendered)
    raise typer.Exit(0 if result.ok else 1)


@app.command()
def schema(
    check: Annotated[bool, typer.Option("--check", help="Fail when the committed schema/ files are stale.")] = False,
    write: Annotated[bool, typer.Option("--write", help="Regenerate schema/ from specs/.")] = False,
    directory: Annotated[Path, typer.Option("--dir", help="Folder of the schema files.")] = SCHEMA_DIR,
) -> None:
    """Print, write or check the JSON Schema generated from the spec models."""
    from reconciler.load import schema as schema_files

    if check:
        found = schema_files.check(directory)
        if not found.current:
            for path in found.stale:
                err.print(f"stale: {path}")
            for path in found.extra:
                err.print(f"not generated from specs/: {path}")
            err.print("run `forgectl schema --write` and commit the result")
            raise typer.Exit(1)
        out.print(f"[green]✓[/green] {found.generated} schema files up to date")
        return
    if write:
        out.print(f"wrote {schema_files.write(directory)} schema files to {directory}")
        return
    sys.stdout.write(schema_files.generated()[schema_files.ANY_DOCUMENT])


@app.command()
def render(
    paths: PathsArg = None,
    rev: RevOpt = None,
    env: EnvOpt = None,
    out_dir: Annotated[Path | None, typer.Option("-o", "--out", help="Write one file per object into this folder.")] = None,
) -> None:
    """Render the specs into Kubernetes manifests (YAML on stdout, or one file per object)."""
    from reconciler.budgets import check_rendered_bytes
    from reconciler.load.sources import revision_of
    from reconciler.present.manifests import file_name, to_yaml, to_yaml_stream
    from renderers import RenderContext
    from renderers import render as render_specs

    result, environment = load_for(paths, rev, env)
    rendered = render_specs(result.specs, RenderContext(environment, revision_of(paths or ["."], rev)))
    check_rendered_bytes(rendered.manifests, result.origins)  # before a byte of YAML is written
    if out_dir is None:
        sys.stdout.write(to_yaml_stream(rendered.manifests))
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    for obj in rendered.manifests:
        (out_dir / file_name(obj)).write_text(to_yaml(obj))
    err.print(f"wrote {len(rendered.manifests)} manifests to {out_dir}")


class PlanOutput(str, Enum):
    text = "text"
    json = "json"
    markdown = "markdown"


def _print_plan(plan_json: dict[str, Any], output: PlanOutput, *, verbose: bool = False) -> None:
    from reconciler.present import views
    if output is PlanOutput.json:
        print_json(plan_json)
    elif output is PlanOutput.markdown:
        print(views.markdown(plan_json))
    else:
        out.print(views.text(plan_json, verbose=verbose))


@app.command()
@with_target_flags
def plan(
    paths: PathsArg = None,
    rev: RevOpt = None,
    env: EnvOpt = None,
    base: Annotated[str | None, typer.Option("--base", help="Pull-request mode: compare the specs at this git revision…")] = None,
    head: Annotated[str | None, typer.Option("--head", help="…with this revision (default: the working tree).")] = None,
    save: Annotated[Path | None, typer.Option("-out", "--out", help="Save the plan as JSON, to apply exactly it later.")] = None,
    output: Annotated[PlanOutput, typer.Option("--output", "-o", help="text, json or markdown.")] = PlanOutput.text,
    detailed_exitcode: Annotated[bool, typer.Option("--detailed-exitcode", help="Exit 0 with no changes, 2 with changes, 1 on error.")] = False,
    fail_on_risk: Annotated[list[str] | None, typer.Option("--fail-on-risk", metavar="FLAG[,FLAG]", help="Exit 3 when one of these risk flags is raised (`all` for any); see docs/plan-json.md.")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Also list unchanged objects.")] = False,
    refresh: Annotated[bool, typer.Option("--refresh", help="Read every live object whole and compare it (drift made outside Forge too), not only those whose recorded digest differs.")] = False,
    flags: TargetFlags = NO_OVERRIDES,
) -> None:
    """Show what applying the specs would change, and why: blockers and risk flags first, the GPU
    arithmetic and cost, then the changes. Exit 1 when the target cannot run it, 3 on a risk flag
    named by --fail-on-risk, 2 on changes with --detailed-exitcode, else 0."""
    from reconciler.plan.live import live_plan, plan_json
    from reconciler.plan.pullrequest import pull_request_plan
    from reconciler.plan.review import EXIT_ERROR, EXIT_RISK, exit_code, parse_fail_on

    fail_on = parse_fail_on(fail_on_risk)
    if base is not None:
        shown = pull_request_plan(paths, base, head, env, target_options(flags))
    else:
        ctx = open_environment(paths, rev, env, flags)
        shown = plan_json(live_plan(ctx.result, ctx.environment, ctx.target, ctx.namespace, paths, rev, refresh=refresh),
                          ctx.environment, ctx.target)
        if save is not None:
            save.write_bytes(json_bytes(shown) + b"\n")
    _print_plan(shown, output, verbose=verbose)
    if save is not None and output is PlanOutput.text:
        err.print(f"saved the plan to {save}; apply exactly it with `forgectl apply {save}`")
    code = exit_code(shown, detailed=detailed_exitcode, fail_on=fail_on)
    if code == EXIT_ERROR:
        err.print(f"[red]error:[/red] the target cannot run this plan ({len(shown['blockers'])} blocker(s), listed with it)")
    elif code == EXIT_RISK:
        raised = sorted({r["flag"] for r in shown["risks"] if r["flag"] in fail_on})
        err.print(f"[yellow]risk:[/yellow] {safe(', '.join(raised))} raised (--fail-on-risk)")
    raise typer.Exit(code)


@app.command()
@with_target_flags
def diff(
    paths: PathsArg = None,
    env: EnvOpt = None,
    output: Annotated[PlanOutput, typer.Option("--output", "-o", help="text, json or markdown.")] = PlanOutput.text,
    flags: TargetFlags = NO_OVERRIDES,
) -> None:
    """Show drift: live objects that differ from what the specs render (exit 2 when any). Always the
    full compare: every live object read whole, edits made outside Forge included."""
    from reconciler.plan.session import make_plan

    ctx = open_environment(paths, None, env, flags)
    the_plan, _ = make_plan(ctx.result.specs, ctx.environment, ctx.target, ctx.namespace, None, refresh=True)
    _print_plan(the_plan.to_json(), output)
    raise typer.Exit(2 if the_plan.has_changes else 0)


@app.command()
@with_target_flags
def apply(
    paths: PathsArg = None,
    rev: RevOpt = None,
    env: EnvOpt = None,
    auto_approve: Annotated[bool, typer.Option("--auto-approve", help="Apply without asking for confirmation.")] = False,
    output: Annotated[PlanOutput, typer.Option("--output", "-o", help="text or json.")] = PlanOutput.text,
    specs_dir: Annotated[list[str] | None, typer.Option("--specs", help="With a saved plan: where the specs (for the environment's settings) are; default the current folder.")] = None,
    refresh: Annotated[bool, typer.Option("--refresh", help="Plan with the full compare (every live object read whole): also restores edits made outside Forge.")] = False,
    flags: TargetFlags = NO_OVERRIDES,
) -> None:
    """Apply the specs (or a saved plan file): show the plan, confirm, then make it so."""
    from reconciler.plan.live import ensure_runnable, live_plan, plan_json, saved_plan
    from reconciler.plan.session import ensure_fresh

    saved = saved_plan(paths)
    # With a saved plan, the plan holds the objects; the specs are read only for the environment's settings.
    ctx = (open_environment(specs_dir or ["."], None, env or saved.environment, flags) if saved is not None
           else open_environment(paths, rev, env, flags))
    target = ctx.target
    from forgectl.progress import StepProgress

    bars = StepProgress(err) if output is PlanOutput.text else None
    if bars is not None and not target.follow_steps(bars):
        bars = None  # the steps run elsewhere (a cluster's Argo): nothing to draw
    started = time.monotonic()
    with target.lock():
        if saved is not None:
            ensure_fresh(saved, target)
            the_plan = saved
        else:
            the_plan = live_plan(ctx.result, ctx.environment, target, ctx.namespace, paths, rev, refresh=refresh)
        shown = plan_json(the_plan, ctx.environment, target)
        if output is PlanOutput.text:
            _print_plan(shown, output)
        ensure_runnable(the_plan)
        _confirm_and_apply(the_plan, shown, target, output, auto_approve, started, "Apply these changes?", bars)


def _confirm_and_apply(the_plan: Plan, shown: dict[str, Any], target: Target, output: PlanOutput, auto_approve: bool,
                       started: float, question: str, bars: Any = None) -> None:
    """Apply a shown plan once confirmed (or ``--auto-approve``): nothing to do exits 0; the
    change set is printed as JSON or summed up in a line."""
    from contextlib import nullcontext

    from reconciler.errors import ApplyFailed
    from reconciler.plan.apply import apply_plan

    if not the_plan.has_changes:
        if output is PlanOutput.json:
            print_json({"plan": shown, "changeset": None})
        raise typer.Exit(0)
    if not auto_approve:
        if not sys.stdin.isatty():
            raise ForgeError("refusing to apply without confirmation: stdin is not a terminal; pass --auto-approve")
        if not typer.confirm(question, default=False):
            err.print("Cancelled.")  # nothing was changed
            raise typer.Exit(1)
    try:
        with bars if bars is not None else nullcontext():
            changeset = apply_plan(the_plan, target)
    except ApplyFailed as exc:
        if output is PlanOutput.json:
            print_json({"plan": shown, "changeset": exc.changeset.to_json(), "error": str(exc)})
        raise
    if output is PlanOutput.json:
        print_json({"plan": shown, "changeset": changeset.to_json()})
    else:
        s = changeset.to_json()["summary"]
        elapsed = time.monotonic() - started
        out.print(f"[bold green]Apply complete:[/bold green] {s['created']} created, {s['configured']} configured, "
                  f"{s['deleted']} deleted, {s['unchanged']} unchanged ({elapsed:.0f} s).")


rollout_app = typer.Typer(help="Inspect and steer rollouts: status, promote, abort, retry.", no_args_is_help=True)
app.add_typer(rollout_app, name="rollout")
app.add_typer(models_app, name="models")  # the registry, lineage, leaderboard
app.add_typer(labels_app, name="labels")  # auto-labeling's reviewed labels (labeling.auto)
app.add_typer(experiment_app, name="experiment")  # A/B experiments
app.add_typer(controller_app, name="controller")  # the in-cluster controller (docs/controller.md)
app.command("install", short_help="Install the in-cluster controller, server-side applied (--dry-run: print it).")(controller_install)  # the controller's manifests (docs/controller.md)
app.command("uninstall", short_help="Remove the controller; the workloads it applied stay unless --remove-workloads.")(controller_uninstall)


@app.command()
@with_target_flags
def reconcile(
    paths: PathsArg = None,
    env: EnvOpt = None,
    watch: Annotated[bool, typer.Option("--watch", help="Keep reconciling every --interval until interrupted.")] = False,
    interval: Annotated[float, typer.Option("--interval", help="Seconds between passes with --watch.")] = 1.0,
    passes: Annotated[int, typer.Option("--passes", help="With --watch, stop after this many passes (0: never).")] = 0,
    until_settled: Annotated[bool, typer.Option("--until-settled", help="With --watch, stop once no rollout is in progress.")] = False,
    timeout: Annotated[float, typer.Option("--timeout", help="With --watch, give up after this many seconds (0: never).")] = 0.0,
    lease_duration: Annotated[float, typer.Option("--lease-duration", min=3.0, help=(
        "Seconds the environment's Lease lasts while this reconcile holds it (kubernetes target): another "
        "watch takes over this long after the holder stops renewing it."))] = 15.0,
    output: Annotated[PlanOutput, typer.Option("--output", "-o", help="text or json.")] = PlanOutput.text,
    flags: TargetFlags = NO_OVERRIDES,
) -> None:
    """Run the rollout controller: one pass over every endpoint, or continuously with --watch.
    Only the holder of the environment's lock (the one an apply takes) acts: a second watch waits
    and takes over when the first is gone."""
    from reconciler.controller.leadership import Leadership, default_holder, watch_lease
    from reconciler.controller.watch import WatchOptions, run
    from reconciler.load.endpoints import desired_endpoints
    from reconciler.rollout.controller import RolloutState

    ctx = open_environment(paths, None, env, flags, lease=watch_lease(lease_duration))
    controllers = controllers_of(ctx, paths, flags)

    def print_line(line: str) -> None:
        out.print(line, markup=False)

    def print_pass(states: dict[str, RolloutState]) -> None:
        print(json.dumps({k: v.to_json() for k, v in states.items()}))

    code = run(controllers, desired_endpoints(ctx.result.specs, ctx.environment),
               WatchOptions(watch, interval, passes, until_settled, timeout),
               leadership=Leadership(ctx.target.lock, default_holder()),
               on_line=print_line if output is PlanOutput.text else None,
               on_pass=print_pass if output is PlanOutput.json else None)
    raise typer.Exit(code)


@rollout_app.command("status")
@with_target_flags
def rollout_status(
    endpoint: EndpointArg,
    specs_paths: SpecsOpt = None,
    env: EnvOpt = None,
    output: Annotated[PlanOutput, typer.Option("--output", "-o", help="text or json.")] = PlanOutput.text,
    flags: TargetFlags = NO_OVERRIDES,
) -> None:
    """Step, weights, last analysis values and the reason for the last transition."""
    from reconciler.observe.syncs import read_syncs, sync_lines
    from reconciler.rollout.steering import status_data

    ctx = open_environment(specs_paths, None, env, flags)
    controllers, desired = endpoint_in(ctx, specs_paths, flags, endpoint)
    backend = controllers.backend
    # the shadow's figures: the local router's mirror, or the live servers' copies in Prometheus (docs/experiments.md)
    data = status_data(desired, backend.serving(endpoint), backend.load_state(endpoint), controllers.shadow_stats)
    api = ctx.target.cluster_api()
    if api is not None:  # a cluster: what its controller says of the endpoint (docs/controller.md)
        data["controller"] = read_syncs(api, ctx.environment.name, ctx.namespace).to_json()
    if output is PlanOutput.json:
        print_json(data)
        return
    from reconciler.present import views
    out.print(views.rollout_text(data))
    if "controller" in data:
        out.print("[bold]Controller[/bold]")
        out.print("\n".join(sync_lines(data["controller"], endpoint)))
    for line in experiment_lines(data):
        out.print(line, markup=False)


def _steer(endpoint: str, specs_paths: list[str] | None, env: str | None, flags: TargetFlags, *, promote: bool) -> None:
    from reconciler.rollout.steering import steer

    controllers, desired = one_endpoint(specs_paths, env, flags, endpoint)
    state = steer(controllers.rollouts, controllers.backend, desired, controllers.backend.load_state(endpoint), promote=promote)
    out.print(state.reason, markup=False)


@rollout_app.command("promote")
@with_target_flags
def rollout_promote(endpoint: EndpointArg, specs_paths: SpecsOpt = None, env: EnvOpt = None,
                    flags: TargetFlags = NO_OVERRIDES) -> None:
    """Promote the canary now (skipping the remaining steps)."""
    _steer(endpoint, specs_paths, env, flags, promote=True)


@rollout_app.command("abort")
@with_target_flags
def rollout_abort(endpoint: EndpointArg, specs_paths: SpecsOpt = None, env: EnvOpt = None,
                  flags: TargetFlags = NO_OVERRIDES) -> None:
    """Roll back now: all traffic to stable, canary removed."""
    _steer(endpoint, specs_paths, env, flags, promote=False)


@rollout_app.command("retry")
@with_target_flags
def rollout_retry(endpoint: EndpointArg, specs_paths: SpecsOpt = None, env: EnvOpt = None,
                  flags: TargetFlags = NO_OVERRIDES) -> None:
    """Start a rolled-back or aborted rollout again."""
    from reconciler.rollout.steering import retry

    controllers, desired = one_endpoint(specs_paths, env, flags, endpoint)
    state = retry(controllers.rollouts, controllers.backend, desired, controllers.backend.load_state(endpoint))
    out.print(f"{endpoint}: retrying {state.canary}; run `forgectl reconcile` (or --watch) to proceed", markup=False)


@app.command()
@with_target_flags
def doctor(
    paths: PathsArg = None,
    env: EnvOpt = None,
    output: Annotated[PlanOutput, typer.Option("--output", "-o", help="text or json.")] = PlanOutput.text,
    flags: TargetFlags = NO_OVERRIDES,
) -> None:
    """Check that the cluster provides what the rendered objects need (CRDs, PriorityClasses,
    StorageClass, GPU resources); exit 1 when something is missing."""
    from reconciler.plan.prerequisites import check_environment

    ctx = open_environment(paths, None, env, flags)
    environment = ctx.environment
    findings = check_environment(ctx.result.specs, environment, ctx.target)  # a target without a cluster refuses
    if output is PlanOutput.json:
        print_json({"environment": environment.name, "findings": [f.to_json() for f in findings]})
    else:
        from rich.table import Table

        table = Table(title=f"cluster prerequisites of environment {environment.name}", title_justify="left")
        for column in ("", "kind", "name", "detail"):
            table.add_column(column, overflow="fold")
        marks = {"ok": "[green]✓[/green]", "missing": "[red]✗[/red]", "unknown": "[yellow]?[/yellow]", "manual": "[dim]·[/dim]"}
        for f in findings:
            table.add_row(marks[f.status], f.requirement.kind, safe(f.requirement.name), safe(f"{f.detail} — {f.requirement.why}"))
        out.print(table)
    raise typer.Exit(1 if any(f.status == "missing" for f in findings) else 0)


@app.command()
@with_target_flags
def status(
    paths: PathsArg = None,
    env: EnvOpt = None,
    output: Annotated[PlanOutput, typer.Option("--output", "-o", help="text or json.")] = PlanOutput.text,
    flags: TargetFlags = NO_OVERRIDES,
) -> None:
    """Workflows and their steps, model versions and metrics, endpoints, traffic and rollouts."""
    from reconciler.observe.status import collect, render_text

    ctx = open_environment(paths, None, env, flags)
    data = collect(ctx.result.specs, ctx.environment, ctx.target)
    if output is PlanOutput.json:
        print_json(data, default=str)
    else:
        out.print(render_text(data))


@app.command()
def logs(
    name: Annotated[str, typer.Argument(help="A workflow step (`WORKFLOW/STEP` or `STEP`), a workflow, or an endpoint.")],
    paths: PathsArg = None,
    env: EnvOpt = None,
    tail: Annotated[int, typer.Option("--tail", help="Lines from the end (0: all).")] = 50,
) -> None:
    """Logs of a local workflow step or model server."""
    files = open_environment(paths, None, env).target.log_files(name)  # a cluster target says where its logs are instead
    if not files:
        raise ForgeError(f"no logs for {name!r} (try a step name such as `train`, a workflow name, or an endpoint)")
    for path in files:
        lines = path.read_text(errors="replace").splitlines()
        out.print(f"[bold]==> {path}[/bold]")
        print("\n".join(lines[-tail:] if tail else lines))


@app.command(short_help="Stop everything Forge started here, or delete what it owns in a cluster (shown first, then confirmed).")
@with_target_flags
def down(
    paths: PathsArg = None,
    env: EnvOpt = None,
    auto_approve: Annotated[bool, typer.Option("--auto-approve", help="In a cluster: delete without asking for confirmation.")] = False,
    output: Annotated[PlanOutput, typer.Option("--output", "-o", help="text or json.")] = PlanOutput.text,
    flags: TargetFlags = NO_OVERRIDES,
) -> None:
    """Stop everything Forge started: a local environment's servers, router, Prometheus and steps;
    in a cluster, delete every object Forge owns there (shown first, then confirmed)."""
    from reconciler.plan.live import teardown_plan

    ctx = open_environment(paths, None, env, flags)
    target = ctx.target
    started = time.monotonic()
    with target.lock():
        stopped = target.down()  # what ran on this machine; None where nothing does (a cluster)
        if stopped is not None:
            out.print(f"stopped {len(stopped)} process(es)" + "".join(f"\n  {s}" for s in stopped))
            return
        the_plan = teardown_plan(ctx.environment, target)
        shown = the_plan.to_json()
        if output is PlanOutput.text:
            _print_plan(shown, output)
        _confirm_and_apply(the_plan, shown, target, output, auto_approve, started, "Delete these objects?")


@app.command("load")
def load_traffic(
    endpoint: EndpointArg,
    paths: PathsArg = None,
    env: EnvOpt = None,
    rate: Annotated[float, typer.Option("--rate", help="Requests per second.")] = 20.0,
    seconds: Annotated[float, typer.Option("--seconds", help="How long to send (bounded).")] = 30.0,
    concurrency: Annotated[int, typer.Option("--concurrency", help="Requests in flight at most.")] = 4,
    output: Annotated[PlanOutput, typer.Option("--output", "-o", help="text or json.")] = PlanOutput.text,
) -> None:
    """Send bounded traffic to a local endpoint, so the rollout gates have data in a demo."""
    from reconciler.targets.local.load import generate
    from specs import Endpoint

    ctx = open_environment(paths, None, env)
    result = ctx.result
    spec = result.specs.get(Endpoint, endpoint)
    if spec is None:
        raise ForgeError(f"no Endpoint {endpoint!r} in the specs")
    url = ctx.target.endpoint_url(endpoint)  # a cluster's endpoints are not on this machine: it says so
    if not url:
        raise ForgeError(f"endpoint {endpoint!r} is not being served; run `forgectl apply` first")
    import signal
    import threading

    stop = threading.Event()  # Ctrl-C / SIGTERM end the run cleanly: in-flight requests complete
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stats = generate(url, result.specs.model_of(spec).name, rate=rate, seconds=seconds, concurrency=concurrency, stop=stop)
    if output is PlanOutput.json:
        print_json(stats)
    else:
        out.print(stats)


one_line_summaries(app)


def main() -> None:
    """Console-script entry point: run the app, turning user errors into one message and exit 1.
    Anything else is a bug: one line and exit 1 as well (`FORGE_DEBUG=1` shows the traceback)."""
    import os

    try:
        app()
    except SpecError as exc:
        print(render_diagnostics(exc.diagnostics, "text"), file=sys.stderr)
        err.print(f"[red]error:[/red] {safe(str(exc))}")
        sys.exit(exc.exit_code)
    except ForgeError as exc:
        err.print(f"[red]error:[/red] {safe(str(exc))}")
        sys.exit(exc.exit_code)
    except RenderError as exc:  # specs valid one by one that make no working objects
        err.print(f"[red]error:[/red] {safe(str(exc))}")
        sys.exit(1)
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:  # noqa: BLE001 - never a traceback on user input
        if os.environ.get("FORGE_DEBUG"):
            raise
        err.print(f"[red]error:[/red] internal error ({type(exc).__name__}): {safe(str(exc).splitlines()[0] if str(exc) else '')}"
                  " — please report it; FORGE_DEBUG=1 shows the traceback")
        sys.exit(1)
