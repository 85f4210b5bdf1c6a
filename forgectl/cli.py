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
