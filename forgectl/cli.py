"""`forgectl`: validate, render, plan and apply Forge specs.

Each command is a thin shell over the library: load → render → diff → plan → apply. User errors
(:class:`ForgeError`) print one clear message and exit 1, never a traceback.
"""

from __future__ import annotations

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
