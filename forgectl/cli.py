"""`forgectl`: validate, render, plan and apply Forge specs.

Each command is a thin shell over the library: load → render → diff → plan → apply. User errors
(:class:`ForgeError`) print one clear message and exit 1, never a traceback.
"""

from __future__ import annotations

import json
import sys
import time
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from reconciler.diagnostics import ForgeError, SpecError, render_diagnostics
from reconciler.loader import load
from renderers.errors import RenderError

app = typer.Typer(
    name="forgectl",
    help="GitOps for the model lifecycle: validate, render, plan and apply Forge specs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err = Console(stderr=True, highlight=False, soft_wrap=True)
out = Console(highlight=False, soft_wrap=True)

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "schema"


class DiagnosticsOutput(str, Enum):
    text = "text"
    json = "json"
    github = "github"


PathsArg = Annotated[Optional[list[str]], typer.Argument(help="Spec files or folders (default: current folder).")]
RevOpt = Annotated[Optional[str], typer.Option("--rev", help="Read the specs at this git revision instead of the working tree.")]


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
    from specs.schemagen import dumps, schemas

    generated = {name: dumps(s) for name, s in schemas().items()}
    if check:
        stale = [n for n, text in generated.items() if not (directory / n).is_file() or (directory / n).read_text() != text]
        extra = sorted(p.name for p in directory.glob("*.schema.json") if p.name not in generated)
        if stale or extra:
            for name in stale:
                err.print(f"stale: {directory / name}")
            for name in extra:
                err.print(f"not generated from specs/: {directory / name}")
            err.print("run `forgectl schema --write` and commit the result")
            raise typer.Exit(1)
        out.print(f"[green]✓[/green] {len(generated)} schema files up to date")
        return
    if write:
        directory.mkdir(parents=True, exist_ok=True)
        for name, text in generated.items():
            (directory / name).write_text(text)
        out.print(f"wrote {len(generated)} schema files to {directory}")
        return
    sys.stdout.write(generated["forge.schema.json"])


EnvOpt = Annotated[Optional[str], typer.Option("--env", "-e", help="Environment to use (default: the one marked default, else `local`).")]


def _load_for(paths: list[str] | None, rev: str | None, env_name: str | None):  # type: ignore[no-untyped-def]
    """Load specs (raising on any problem) and pick the environment."""
    from reconciler.loader import load_or_raise
    from specs import Environment

    result = load_or_raise(paths or ["."], rev)
    env = result.specs.environment(env_name)
    if env is None:
        names = ", ".join(e.name for e in result.specs.of(Environment)) or "none defined"
        wanted = f"environment {env_name!r}" if env_name else "a default environment"
        raise ForgeError(f"no {wanted} in the specs (environments: {names}); pass --env NAME")
    return result, env


@app.command()
def render(
    paths: PathsArg = None,
    rev: RevOpt = None,
    env: EnvOpt = None,
    out_dir: Annotated[Optional[Path], typer.Option("-o", "--out", help="Write one file per object into this folder.")] = None,
) -> None:
    """Render the specs into Kubernetes manifests (YAML on stdout, or one file per object)."""
    from reconciler.manifests import file_name, to_yaml, to_yaml_stream
    from reconciler.sources import revision_of
    from renderers import RenderContext
    from renderers import render as render_specs

    result, environment = _load_for(paths, rev, env)
    rendered = render_specs(result.specs, RenderContext(environment, revision_of(paths or ["."], rev)))
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


KubeconfigOpt = Annotated[Optional[str], typer.Option("--kubeconfig", help="Kubeconfig file (default $KUBECONFIG, then ~/.kube/config).")]
ContextOpt = Annotated[Optional[str], typer.Option("--context", help="Kubeconfig context (default: the current one).")]
NamespaceOpt = Annotated[Optional[str], typer.Option("--namespace", "-n", help="Namespace (default: the environment's).")]


def _print_plan(plan_json: dict, output: PlanOutput, *, verbose: bool = False) -> None:
    from reconciler import views

    if output is PlanOutput.json:
        print(json.dumps(plan_json, indent=2, sort_keys=False))
    elif output is PlanOutput.markdown:
        print(views.markdown(plan_json))
    else:
        out.print(views.text(plan_json, verbose=verbose))


def _open(env_spec, kubeconfig, context, namespace, progress=None):  # type: ignore[no-untyped-def]
    from reconciler.session import TargetOptions, namespace_of, open_target

    options = TargetOptions(kubeconfig, context, namespace, progress)
    return open_target(env_spec, options), namespace_of(env_spec, options)


@app.command()
def plan(
    paths: PathsArg = None,
    rev: RevOpt = None,
    env: EnvOpt = None,
    base: Annotated[Optional[str], typer.Option("--base", help="Pull-request mode: compare the specs at this git revision…")] = None,
    head: Annotated[Optional[str], typer.Option("--head", help="…with this revision (default: the working tree).")] = None,
    save: Annotated[Optional[Path], typer.Option("-out", "--out", help="Save the plan as JSON, to apply exactly it later.")] = None,
    output: Annotated[PlanOutput, typer.Option("--output", "-o", help="text, json or markdown.")] = PlanOutput.text,
    detailed_exitcode: Annotated[bool, typer.Option("--detailed-exitcode", help="Exit 0 with no changes, 2 with changes, 1 on error.")] = False,
    fail_on_risk: Annotated[Optional[list[str]], typer.Option("--fail-on-risk", metavar="FLAG[,FLAG]", help="Exit 3 when one of these risk flags is raised (`all` for any); see docs/plan-json.md.")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Also list unchanged objects.")] = False,
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Show what applying the specs would change, and why: blockers and risk flags first, the GPU
    arithmetic and cost, then the changes. Exit 1 when the target cannot run it, 3 on a risk flag
    named by --fail-on-risk, 2 on changes with --detailed-exitcode, else 0."""
    from reconciler.review import EXIT_ERROR, EXIT_RISK, exit_code, parse_fail_on, reviewed_live_plan
    from reconciler.sources import revision_of

    fail_on = parse_fail_on(fail_on_risk)
    if base is not None:
        plan_json = _pull_request_plan(paths, base, head, env, kubeconfig, context, namespace)
    else:
        result, environment = _load_for(paths, rev, env)
        target, ns = _open(environment, kubeconfig, context, namespace)
        the_plan = reviewed_live_plan(result, environment, target, ns, revision_of(paths or ["."], rev), rev=rev,
                                      start=(paths or ["."])[0])
        plan_json = the_plan.to_json()
        if environment.spec.target == "kubernetes":
            plan_json["notes"] = [*plan_json.get("notes", []), *_prerequisite_notes(result.specs, environment, target)]
        if save is not None:
            save.write_text(json.dumps(plan_json, indent=2) + "\n")
    _print_plan(plan_json, output, verbose=verbose)
    if save is not None and output is PlanOutput.text:
        err.print(f"saved the plan to {save}; apply exactly it with `forgectl apply {save}`")
    code = exit_code(plan_json, detailed=detailed_exitcode, fail_on=fail_on)
    if code == EXIT_ERROR:
        err.print(f"[red]error:[/red] the target cannot run this plan ({len(plan_json['blockers'])} blocker(s), listed with it)")
    elif code == EXIT_RISK:
        raised = sorted({r["flag"] for r in plan_json["risks"] if r["flag"] in fail_on})
        err.print(f"[yellow]risk:[/yellow] {_safe(', '.join(raised))} raised (--fail-on-risk)")
    raise typer.Exit(code)


def _prerequisite_notes(specs, environment, target) -> list[str]:  # type: ignore[no-untyped-def]
    """Notes naming what the cluster lacks for the rendered objects (checked read-only)."""
    from reconciler.prerequisites import check_environment, missing_notes

    return missing_notes(check_environment(specs, environment, target))


def _pull_request_plan(paths, base, head, env_name, kubeconfig, context, namespace) -> dict:  # type: ignore[no-untyped-def]
    """The manifest-level diff between two revisions (no cluster needed), reviewed against the base
    (spec changes, risk flags, cost, blockers), plus the live plan when the environment's cluster
    answers."""
    from reconciler.errors import TargetError
    from reconciler.review import live_risks, registry_records, reviewed_git_plan
    from reconciler.session import make_plan
    from reconciler.sources import revision_of
    from specs import Environment

    old, old_env = _load_for(paths, base, env_name)
    new, new_env = _load_for(paths, head, env_name)
    the_plan = reviewed_git_plan(old, old_env, new, new_env, base=base, head=head,
                                 revision=revision_of(paths or ["."], head), start=(paths or ["."])[0])
    plan_json = the_plan.to_json()
    plan_json["base"] = base
    plan_json["head"] = head or "working tree"
    if isinstance(new_env, Environment) and new_env.spec.target == "kubernetes":
        # Pull-request mode is inert: the cluster is reached only with the runner's credential
        # (never a kubeconfig a spec names or one inside the checkout), at the coordinates the
        # *base* revision's Environment gives (reviewed already), and with read verbs only.
        from reconciler.session import TargetOptions, namespace_of, open_target
        from reconciler.sources import project_root

        reviewed = old.specs.get(Environment, new_env.name)
        if reviewed is None or reviewed.spec.kubernetes is None:
            plan_json["notes"].append(f"no live diff: environment `{new_env.name}` is not a cluster environment at "
                                      f"{base}; a pull request cannot choose where its plan reads from")
            return plan_json
        if reviewed.spec.kubernetes != new_env.spec.kubernetes:
            plan_json["notes"].append(f"environment `{new_env.name}` changes its cluster settings; the live diff "
                                      f"uses those at {base}")
        k8s = reviewed.spec.kubernetes
        options = TargetOptions(kubeconfig, context or k8s.context, namespace or k8s.namespace,
                                untrusted_root=project_root(Path((paths or ["."])[0])))
        try:
            target = open_target(reviewed, options)
            live_plan, _ = make_plan(new.specs, new_env, target, namespace_of(reviewed, options), None, dry_run=False)
            plan_json["live"] = live_plan.to_json()
            known = {(r["flag"], r["message"]) for r in plan_json["risks"]}
            plan_json["risks"] += [r.to_json() for r in live_risks(live_plan, new, old, registry_records(live_plan, target))
                                   if (r.flag, r.message) not in known]
            plan_json["notes"].append(f"live: {live_plan.counts()} against the cluster (read-only: not settled by "
                                      "server-side dry runs)")
        except (TargetError, ForgeError) as exc:
            plan_json["notes"].append(f"no live diff: {str(exc).splitlines()[0]}")
    else:
        plan_json["notes"].append("no live diff: the environment's target is not a cluster")
    return plan_json


@app.command()
def diff(
    paths: PathsArg = None,
    env: EnvOpt = None,
    output: Annotated[PlanOutput, typer.Option("--output", "-o", help="text, json or markdown.")] = PlanOutput.text,
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Show drift: live objects that differ from what the specs render (exit 2 when any)."""
    from reconciler.session import make_plan

    result, environment = _load_for(paths, None, env)
    target, ns = _open(environment, kubeconfig, context, namespace)
    the_plan, _ = make_plan(result.specs, environment, target, ns, None)
    _print_plan(the_plan.to_json(), output)
    raise typer.Exit(2 if the_plan.has_changes else 0)


@app.command()
def apply(
    paths: PathsArg = None,
    rev: RevOpt = None,
    env: EnvOpt = None,
    auto_approve: Annotated[bool, typer.Option("--auto-approve", help="Apply without asking for confirmation.")] = False,
    output: Annotated[PlanOutput, typer.Option("--output", "-o", help="text or json.")] = PlanOutput.text,
    specs_dir: Annotated[Optional[list[str]], typer.Option("--specs", help="With a saved plan: where the specs (for the environment's settings) are; default the current folder.")] = None,
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Apply the specs (or a saved plan file): show the plan, confirm, then make it so."""
    from reconciler.apply import apply_plan
    from reconciler.plan import Plan
    from reconciler.review import reviewed_live_plan
    from reconciler.session import ensure_fresh
    from reconciler.sources import revision_of

    saved = None
    if paths and len(paths) == 1 and paths[0].endswith(".json") and Path(paths[0]).is_file():
        try:
            saved = Plan.from_json(json.loads(Path(paths[0]).read_text()))
        except (ValueError, KeyError) as exc:
            raise ForgeError(f"{paths[0]}: not a saved Forge plan ({exc})") from exc
        # The plan holds the objects; the specs are read only for the environment's settings.
        result, environment = _load_for(specs_dir or ["."], None, env or saved.environment)
    else:
        result, environment = _load_for(paths, rev, env)
    from contextlib import nullcontext

    from forgectl.progress import StepProgress

    bars = StepProgress(err) if output is PlanOutput.text and environment.spec.target == "local" else None
    target, ns = _open(environment, kubeconfig, context, namespace, bars)
    started = time.monotonic()
    with target.lock():
        if saved is not None:
            ensure_fresh(saved, target)
            the_plan = saved
        else:
            the_plan = reviewed_live_plan(result, environment, target, ns, revision_of(paths or ["."], rev), rev=rev,
                                          start=(paths or ["."])[0])
        plan_json = the_plan.to_json()
        if environment.spec.target == "kubernetes":
            plan_json["notes"] = [*plan_json.get("notes", []), *_prerequisite_notes(result.specs, environment, target)]
        if output is PlanOutput.text:
            _print_plan(plan_json, output)
        if the_plan.blockers:
            raise ForgeError(f"the target cannot run this plan: {the_plan.blockers[0].message}"
                             + (f" (and {len(the_plan.blockers) - 1} more)" if len(the_plan.blockers) > 1 else ""))
        if not the_plan.has_changes:
            if output is PlanOutput.json:
                print(json.dumps({"plan": plan_json, "changeset": None}, indent=2))
            raise typer.Exit(0)
        if not auto_approve:
            if not sys.stdin.isatty():
                raise ForgeError("refusing to apply without confirmation: stdin is not a terminal; pass --auto-approve")
            if not typer.confirm("Apply these changes?", default=False):
                err.print("Apply cancelled.")
                raise typer.Exit(1)
        from reconciler.errors import ApplyFailed

        try:
            with bars if bars is not None else nullcontext():
                changeset = apply_plan(the_plan, target)
        except ApplyFailed as exc:
            if output is PlanOutput.json:
                print(json.dumps({"plan": plan_json, "changeset": exc.changeset.to_json(), "error": str(exc)}, indent=2))
            raise
    if output is PlanOutput.json:
        print(json.dumps({"plan": plan_json, "changeset": changeset.to_json()}, indent=2))
    else:
        s = changeset.to_json()["summary"]
        elapsed = time.monotonic() - started
        out.print(f"[bold green]Apply complete:[/bold green] {s['created']} created, {s['configured']} configured, "
                  f"{s['deleted']} deleted, {s['unchanged']} unchanged ({elapsed:.0f} s).")


rollout_app = typer.Typer(help="Inspect and steer rollouts: status, promote, abort, retry.", no_args_is_help=True)
app.add_typer(rollout_app, name="rollout")

from forgectl.models_cli import app as models_app  # noqa: E402 - the registry, lineage, leaderboard

app.add_typer(models_app, name="models")

from forgectl.experiment_cli import app as experiment_app  # noqa: E402 - A/B experiments

app.add_typer(experiment_app, name="experiment")


def _controller(paths, env, kubeconfig, context, namespace):  # type: ignore[no-untyped-def]
    """Specs, environment, the rollout backend and controller of an environment."""
    from reconciler.prometheus import Prometheus
    from reconciler.rollout import Controller
    from reconciler.sources import revision_of

    result, environment = _load_for(paths, None, env)
    target, ns = _open(environment, kubeconfig, context, namespace)
    backend = target.rollout_backend(result.specs, environment, revision_of(paths or ["."], None))
    url = environment.spec.prometheus.url or target.prometheus_url()
    from specs import duration_seconds

    prometheus = Prometheus(url, timeout=duration_seconds(environment.spec.prometheus.timeout)) if url else None
    controller = Controller(backend, prometheus, ns, on_rollback=_writeback_hook(result, environment, backend, paths))
    return result, environment, backend, controller


def _writeback_hook(result, environment, backend, paths):  # type: ignore[no-untyped-def]
    """After a rollback, commit the model spec of the stable version to a branch, when the policy asks."""
    from reconciler.writeback import write_back

    def hook(endpoint, state) -> str:  # type: ignore[no-untyped-def]
        policy = result.specs.policy_of(endpoint, environment)
        if policy is None or not policy.spec.git_writeback.enabled:
            return ""
        model = result.specs.model_of(endpoint)
        revision = backend.stable_revision(model.name, state.stable)
        if not revision:
            return f"write-back skipped: the revision of stable version {state.stable} is unknown"
        origin = result.origins[("Model", model.name)]
        branch = policy.spec.git_writeback.branch_for(endpoint.name)
        try:
            sha = write_back(Path(origin.file).parent, [origin.file], revision, branch,
                             f"Revert model {model.name} to {state.stable}: canary {state.canary} rolled back\n\n{state.reason}")
        except Exception as exc:  # git failures must not stop the rollback itself
            return f"write-back failed: {exc}"
        return f"committed {sha[:12]} on branch {branch}"

    return hook


def _endpoints(result, environment, only=None):  # type: ignore[no-untyped-def]
    from renderers.versions import model_version
    from specs import Endpoint

    for endpoint in result.specs.of(Endpoint):
        if only and endpoint.name != only:
            continue
        model = result.specs.model_of(endpoint)
        yield endpoint, model.name, model_version(result.specs, model, environment), result.specs.policy_of(endpoint, environment)


@app.command()
def reconcile(
    paths: PathsArg = None,
    env: EnvOpt = None,
    watch: Annotated[bool, typer.Option("--watch", help="Keep reconciling every --interval until interrupted.")] = False,
    interval: Annotated[float, typer.Option("--interval", help="Seconds between passes with --watch.")] = 1.0,
    passes: Annotated[int, typer.Option("--passes", help="With --watch, stop after this many passes (0: never).")] = 0,
    until_settled: Annotated[bool, typer.Option("--until-settled", help="With --watch, stop once no rollout is in progress.")] = False,
    timeout: Annotated[float, typer.Option("--timeout", help="With --watch, give up after this many seconds (0: never).")] = 0.0,
    output: Annotated[PlanOutput, typer.Option("--output", "-o", help="text or json.")] = PlanOutput.text,
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Run the rollout controller: one pass over every endpoint, or continuously with --watch."""

    result, environment, backend, controller = _controller(paths, env, kubeconfig, context, namespace)
    from reconciler.experiment import FINAL as EXPERIMENT_FINAL
    from reconciler.experiment import ExperimentController
    from reconciler.rollout import FINAL, Phase

    experiments = ExperimentController(backend, controller.prometheus, controller.namespace)

    count = 0
    last: dict[str, str] = {}
    began = time.monotonic()
    while True:
        backend.refresh()
        states = {}
        for endpoint, model, version, policy in _endpoints(result, environment):
            if endpoint.spec.experiment is not None:  # the experiment controller decides what it serves
                xs = experiments.reconcile(endpoint, version)
                if xs is not None:
                    states[endpoint.name] = backend.load_state(endpoint.name)
                    line = f"{endpoint.name}: experiment {xs.phase} — {xs.reason}"
                    if output is PlanOutput.text and last.get(endpoint.name) != line:
                        out.print(line, markup=False)
                        last[endpoint.name] = line
                continue
            state = controller.reconcile(endpoint, version, model, policy)
            if state is not None:
                states[endpoint.name] = state
                line = f"{endpoint.name}: {state.phase.value} step {state.step + 1} canary {state.weight} % — {state.reason}"
                if output is PlanOutput.text and last.get(endpoint.name) != line:
                    out.print(line, markup=False)
                    last[endpoint.name] = line
        if output is PlanOutput.json:
            print(json.dumps({k: v.to_json() for k, v in states.items()}))
        count += 1
        settled = all((st.phase in FINAL or st.phase is Phase.IDLE)
                      and (not st.experiment or st.experiment.get("phase") in EXPERIMENT_FINAL) for st in states.values())
        if not watch or (passes and count >= passes) or (until_settled and settled):
            failed = [n for n, st in states.items() if st.phase in (Phase.ROLLED_BACK, Phase.ABORTED)]
            raise typer.Exit(3 if until_settled and failed else 0)
        if timeout and time.monotonic() - began > timeout:
            raise ForgeError(f"rollouts still in progress after {timeout:.0f} s: "
                             + ", ".join(f"{n} {st.phase.value}" for n, st in states.items()))
        time.sleep(interval)


def _one(paths, env, kubeconfig, context, namespace, endpoint_name):  # type: ignore[no-untyped-def]
    result, environment, backend, controller = _controller(paths, env, kubeconfig, context, namespace)
    backend.refresh()
    found = list(_endpoints(result, environment, endpoint_name))
    if not found:
        raise ForgeError(f"no Endpoint {endpoint_name!r} in the specs")
    state = backend.load_state(endpoint_name)
    return controller, backend, found[0], state


EndpointArg = Annotated[str, typer.Argument(help="Endpoint name.")]
SpecsOpt = Annotated[Optional[list[str]], typer.Option("--specs", help="Spec files or folders (default: current folder).")]


@rollout_app.command("status")
def rollout_status(
    endpoint: EndpointArg,
    specs_paths: SpecsOpt = None,
    env: EnvOpt = None,
    output: Annotated[PlanOutput, typer.Option("--output", "-o", help="text or json.")] = PlanOutput.text,
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Step, weights, last analysis values and the reason for the last transition."""
    _, backend, (ep, model, version, policy), state = _one(specs_paths, env, kubeconfig, context, namespace, endpoint)
    serving = backend.serving(endpoint)
    data = {"endpoint": endpoint, "model": model, "desiredVersion": version,
            "serving": None if serving is None else {"stable": serving.stable, "canary": serving.canary,
                                                     "weights": {"stable": 100 - serving.canary_weight, "canary": serving.canary_weight}},
            "rollout": state.to_json() if state else None}
    shadow_stats = getattr(backend, "shadow_stats", None)  # the local router's mirror (docs/experiments.md)
    data["shadow"] = shadow_stats(endpoint) if shadow_stats is not None and ep.spec.shadow is not None else None
    if output is PlanOutput.json:
        print(json.dumps(data, indent=2))
        return
    from forgectl.experiment_cli import experiment_lines
    from reconciler import views

    out.print(views.rollout_text(data))
    for line in experiment_lines(data):
        out.print(line, markup=False)


def _steer(endpoint: str, specs_paths, env, kubeconfig, context, namespace, promote: bool) -> None:  # type: ignore[no-untyped-def]
    controller, backend, (ep, *_), state = _one(specs_paths, env, kubeconfig, context, namespace, endpoint)
    if state is None or state.canary is None or state.phase.value in ("Promoted", "RolledBack", "Aborted", "Idle"):
        raise ForgeError(f"endpoint {endpoint!r} has no rollout in progress")
    state = controller.promote(ep, state, "promoted by hand") if promote else controller.abort(ep, state)
    backend.save_state(endpoint, state)
    out.print(state.reason, markup=False)


@rollout_app.command("promote")
def rollout_promote(endpoint: EndpointArg, specs_paths: SpecsOpt = None, env: EnvOpt = None,
                    kubeconfig: KubeconfigOpt = None, context: ContextOpt = None, namespace: NamespaceOpt = None) -> None:
    """Promote the canary now (skipping the remaining steps)."""
    _steer(endpoint, specs_paths, env, kubeconfig, context, namespace, promote=True)


@rollout_app.command("abort")
def rollout_abort(endpoint: EndpointArg, specs_paths: SpecsOpt = None, env: EnvOpt = None,
                  kubeconfig: KubeconfigOpt = None, context: ContextOpt = None, namespace: NamespaceOpt = None) -> None:
    """Roll back now: all traffic to stable, canary removed."""
    _steer(endpoint, specs_paths, env, kubeconfig, context, namespace, promote=False)


@rollout_app.command("retry")
def rollout_retry(endpoint: EndpointArg, specs_paths: SpecsOpt = None, env: EnvOpt = None,
                  kubeconfig: KubeconfigOpt = None, context: ContextOpt = None, namespace: NamespaceOpt = None) -> None:
    """Start a rolled-back or aborted rollout again."""
    controller, backend, (ep, *_), state = _one(specs_paths, env, kubeconfig, context, namespace, endpoint)
    if state is None or state.phase.value not in ("RolledBack", "Aborted"):
        raise ForgeError(f"endpoint {endpoint!r} has no rolled-back or aborted rollout to retry")
    state = controller.retry(state)
    backend.save_state(endpoint, state)
    out.print(f"{endpoint}: retrying {state.canary}; run `forgectl reconcile` (or --watch) to proceed", markup=False)


@app.command()
def doctor(
    paths: PathsArg = None,
    env: EnvOpt = None,
    output: Annotated[PlanOutput, typer.Option("--output", "-o", help="text or json.")] = PlanOutput.text,
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Check that the cluster provides what the rendered objects need (CRDs, PriorityClasses,
    StorageClass, GPU resources); exit 1 when something is missing."""
    from reconciler.prerequisites import check_environment

    result, environment = _load_for(paths, None, env)
    if environment.spec.target != "kubernetes":
        raise ForgeError(f"environment {environment.name!r} runs on the local target: there is no cluster to check "
                         "(`forgectl doctor --env <a kubernetes environment>`)")
    target, _ = _open(environment, kubeconfig, context, namespace)
    findings = check_environment(result.specs, environment, target)
    if output is PlanOutput.json:
        print(json.dumps({"environment": environment.name, "findings": [f.to_json() for f in findings]}, indent=2))
    else:
        from rich.table import Table

        table = Table(title=f"cluster prerequisites of environment {environment.name}", title_justify="left")
        for column in ("", "kind", "name", "detail"):
            table.add_column(column, overflow="fold")
        marks = {"ok": "[green]✓[/green]", "missing": "[red]✗[/red]", "unknown": "[yellow]?[/yellow]", "manual": "[dim]·[/dim]"}
        for f in findings:
            table.add_row(marks[f.status], f.requirement.kind, _safe(f.requirement.name), _safe(f"{f.detail} — {f.requirement.why}"))
        out.print(table)
    raise typer.Exit(1 if any(f.status == "missing" for f in findings) else 0)


@app.command()
def status(
    paths: PathsArg = None,
    env: EnvOpt = None,
    output: Annotated[PlanOutput, typer.Option("--output", "-o", help="text or json.")] = PlanOutput.text,
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Workflows and their steps, model versions and metrics, endpoints, traffic and rollouts."""
    from reconciler.status import collect, render_text

    result, environment = _load_for(paths, None, env)
    target, ns = _open(environment, kubeconfig, context, namespace)
    data = collect(result.specs, environment, target)
    if output is PlanOutput.json:
        print(json.dumps(data, indent=2, default=str))
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
    result, environment = _load_for(paths, None, env)
    target, _ = _open(environment, None, None, None)
    if environment.spec.target != "local":
        raise ForgeError("in a cluster, use `kubectl logs` (or `argo logs`) for steps and servers")
    from reconciler.status import log_files

    files = log_files(target, name)
    if not files:
        raise ForgeError(f"no logs for {name!r} (try a step name such as `train`, a workflow name, or an endpoint)")
    for path in files:
        lines = path.read_text(errors="replace").splitlines()
        out.print(f"[bold]==> {path}[/bold]")
        print("\n".join(lines[-tail:] if tail else lines))


@app.command()
def down(paths: PathsArg = None, env: EnvOpt = None) -> None:
    """Stop everything Forge started for a local environment (servers, router, Prometheus, steps)."""
    result, environment = _load_for(paths, None, env)
    if environment.spec.target != "local":
        raise ForgeError("`down` is for the local target; in a cluster, remove the specs and `forgectl apply`")
    target, _ = _open(environment, None, None, None)
    with target.lock():
        stopped = target.down()
    out.print(f"stopped {len(stopped)} process(es)" + "".join(f"\n  {s}" for s in stopped))


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

    result, environment = _load_for(paths, None, env)
    if environment.spec.target != "local":
        raise ForgeError("`load` drives a local endpoint; in a cluster, use your own load tool against the Seldon service")
    spec = result.specs.get(Endpoint, endpoint)
    if spec is None:
        raise ForgeError(f"no Endpoint {endpoint!r} in the specs")
    target, _ = _open(environment, None, None, None)
    url = target.serving.endpoint_url(endpoint)
    if not url:
        raise ForgeError(f"endpoint {endpoint!r} is not being served; run `forgectl apply` first")
    import signal
    import threading

    stop = threading.Event()  # Ctrl-C / SIGTERM end the run cleanly: in-flight requests complete
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stats = generate(url, result.specs.model_of(spec).name, rate=rate, seconds=seconds, concurrency=concurrency, stop=stop)
    if output is PlanOutput.json:
        print(json.dumps(stats, indent=2))
    else:
        out.print(stats)


def _safe(text: str) -> str:
    """A message for the terminal: each line's control characters shown as escapes, rich markup
    escaped (messages quote user input: file names, revisions, values)."""
    from rich.markup import escape

    from reconciler.diagnostics import log_safe

    return "\n".join(escape(log_safe(line)) for line in text.split("\n"))


def main() -> None:
    """Console-script entry point: run the app, turning user errors into one message and exit 1.
    Anything else is a bug: one line and exit 1 as well (`FORGE_DEBUG=1` shows the traceback)."""
    import os

    try:
        app()
    except SpecError as exc:
        print(render_diagnostics(exc.diagnostics, "text"), file=sys.stderr)
        err.print(f"[red]error:[/red] {_safe(str(exc))}")
        sys.exit(exc.exit_code)
    except ForgeError as exc:
        err.print(f"[red]error:[/red] {_safe(str(exc))}")
        sys.exit(exc.exit_code)
    except RenderError as exc:  # specs valid one by one that make no working objects
        err.print(f"[red]error:[/red] {_safe(str(exc))}")
        sys.exit(1)
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:  # noqa: BLE001 - never a traceback on user input
        if os.environ.get("FORGE_DEBUG"):
            raise
        err.print(f"[red]error:[/red] internal error ({type(exc).__name__}): {_safe(str(exc).splitlines()[0] if str(exc) else '')}"
                  " — please report it; FORGE_DEBUG=1 shows the traceback")
        sys.exit(1)
