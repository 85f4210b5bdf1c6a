"""`forgectl`: validate, render, plan and apply Forge specs.

Each command is a thin shell over the library: load → render → diff → plan → apply. User errors
(:class:`ForgeError`) print one clear message and exit 1, never a traceback.
"""

from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from reconciler.diagnostics import ForgeError, SpecError, render_diagnostics
from reconciler.loader import load

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
    from renderers import RenderContext, SchedulingError
    from renderers import render as render_specs

    result, environment = _load_for(paths, rev, env)
    try:
        rendered = render_specs(result.specs, RenderContext(environment, revision_of(paths or ["."], rev)))
    except SchedulingError as exc:
        raise ForgeError(str(exc)) from exc
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


def _open(env_spec, kubeconfig, context, namespace):  # type: ignore[no-untyped-def]
    from reconciler.session import TargetOptions, namespace_of, open_target

    options = TargetOptions(kubeconfig, context, namespace)
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
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Also list unchanged objects.")] = False,
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Show what applying the specs would change, and why."""
    from reconciler.session import make_plan
    from reconciler.sources import revision_of

    if base is not None:
        plan_json = _pull_request_plan(paths, base, head, env, kubeconfig, context, namespace)
    else:
        result, environment = _load_for(paths, rev, env)
        target, ns = _open(environment, kubeconfig, context, namespace)
        the_plan, _ = make_plan(result.specs, environment, target, ns, revision_of(paths or ["."], rev))
        plan_json = the_plan.to_json()
        if save is not None:
            save.write_text(json.dumps(plan_json, indent=2) + "\n")
    _print_plan(plan_json, output, verbose=verbose)
    if save is not None and output is PlanOutput.text:
        err.print(f"saved the plan to {save}; apply exactly it with `forgectl apply {save}`")
    changed = any(plan_json["summary"][a] for a in ("create", "update", "delete"))
    raise typer.Exit(2 if detailed_exitcode and changed else 0)


def _pull_request_plan(paths, base, head, env_name, kubeconfig, context, namespace) -> dict:  # type: ignore[no-untyped-def]
    """The manifest-level diff between two revisions (no cluster needed), plus the spec-level
    changes as notes, plus the live plan when the environment's cluster answers."""
    from reconciler.errors import TargetError
    from reconciler.plan import build_plan
    from reconciler.reasons import spec_changes
    from reconciler.session import make_plan
    from reconciler.sources import revision_of
    from renderers import RenderContext
    from renderers import render as render_specs
    from specs import Environment

    old, old_env = _load_for(paths, base, env_name)
    new, new_env = _load_for(paths, head, env_name)
    old_rendered = render_specs(old.specs, RenderContext(old_env))
    new_rendered = render_specs(new.specs, RenderContext(new_env))
    the_plan = build_plan(new_rendered.manifests, old_rendered.manifests, environment=new_env.name,
                          target="git", revision=revision_of(paths or ["."], head), exact=True)
    notes = []
    old_docs = {(d.kind, d.name): d for d in old.specs}  # type: ignore[attr-defined]
    new_docs = {(d.kind, d.name): d for d in new.specs}  # type: ignore[attr-defined]
    for key in sorted(set(old_docs) | set(new_docs)):
        a, b = old_docs.get(key), new_docs.get(key)
        if a is None:
            notes.append(f"spec {key[0]} `{key[1]}` added")
        elif b is None:
            notes.append(f"spec {key[0]} `{key[1]}` removed")
        else:
            for line in spec_changes(a.model_dump(mode="json", by_alias=True)["spec"], b.model_dump(mode="json", by_alias=True)["spec"]):
                notes.append(f"spec {key[0]} `{key[1]}`: {line}")
    from dataclasses import replace

    plan_json = replace(the_plan, notes=tuple(notes)).to_json()
    plan_json["base"] = base
    plan_json["head"] = head or "working tree"
    if isinstance(new_env, Environment) and new_env.spec.target == "kubernetes":
        try:
            target, ns = _open(new_env, kubeconfig, context, namespace)
            live_plan, _ = make_plan(new.specs, new_env, target, ns, None)
            plan_json["live"] = live_plan.to_json()
            plan_json["notes"].append(f"live: {live_plan.counts()} against the cluster")
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
    from reconciler.session import ensure_fresh, make_plan
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
    target, ns = _open(environment, kubeconfig, context, namespace)
    with target.lock():
        if saved is not None:
            ensure_fresh(saved, target)
            the_plan = saved
        else:
            the_plan, _ = make_plan(result.specs, environment, target, ns, revision_of(paths or ["."], rev))
        plan_json = the_plan.to_json()
        if output is PlanOutput.text:
            _print_plan(plan_json, output)
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
            changeset = apply_plan(the_plan, target)
        except ApplyFailed as exc:
            if output is PlanOutput.json:
                print(json.dumps({"plan": plan_json, "changeset": exc.changeset.to_json(), "error": str(exc)}, indent=2))
            raise
    if output is PlanOutput.json:
        print(json.dumps({"plan": plan_json, "changeset": changeset.to_json()}, indent=2))
    else:
        s = changeset.to_json()["summary"]
        out.print(f"[bold green]Apply complete:[/bold green] {s['created']} created, {s['configured']} configured, "
                  f"{s['deleted']} deleted, {s['unchanged']} unchanged.")


def main() -> None:
    """Console-script entry point: run the app, turning user errors into one message and exit 1."""
    try:
        app()
    except SpecError as exc:
        print(render_diagnostics(exc.diagnostics, "text"), file=sys.stderr)
        err.print(f"[red]error:[/red] {exc}")
        sys.exit(exc.exit_code)
    except ForgeError as exc:
        err.print(f"[red]error:[/red] {exc}", markup=True)
        sys.exit(exc.exit_code)
