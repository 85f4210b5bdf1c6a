"""`forgectl labels pull` and `forgectl labels merge`: the `autolabel` step's review file brought
to the reviewer (from a cluster's workspace claim by a one-off pod), and the reviewed labels merged
into the Dataset's source with the digest re-pinned in the spec (and committed with `--commit`), so
`forgectl plan` shows the Models that retrain. The logic is reconciler/labels/; this parses and
prints."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from forgectl.options import NO_OVERRIDES, EnvOpt, SpecsOpt, TargetFlags, with_target_flags
from forgectl.shell import err, print_json, safe, target_options

app = typer.Typer(help="Labels of a Dataset's auto-labeling (`labeling.auto`): pull the review file, merge the "
                  "reviewed labels.", no_args_is_help=True)


def _progress(message: str) -> None:
    err.print(f"[dim]{safe(message)}[/dim]")


@app.command("pull", short_help="Copy a version's review file out of the workspace, to fill in and merge.")
@with_target_flags
def pull(
    model: Annotated[str, typer.Argument(help="The Model whose Workflow ran the `autolabel` step.")],
    version: Annotated[str | None, typer.Option("--version", help="Its version (default: the one its spec renders "
                                                "to now).")] = None,
    to: Annotated[Path | None, typer.Option("--to", help="Folder to write the files into (default: "
                                            "labels-<model>-<version's first 12>).")] = None,
    specs_paths: SpecsOpt = None,
    env: EnvOpt = None,
    output: Annotated[str, typer.Option("--output", "-o", help="text or json.")] = "text",
    flags: TargetFlags = NO_OVERRIDES,
) -> None:
    """Copy the `autolabel` step's `review.csv`, `auto-labels.csv` and `report.json` of a Model's
    version out of the Environment's workspace (on a cluster, its claim, read by a one-off pod):
    fill the review file's label column, then `forgectl labels merge --reviewed` it."""
    from forgectl.shell import open_environment
    from reconciler.labels.cluster import current_version, pull_labels

    opened = open_environment(specs_paths, None, env, flags)
    chosen = version or current_version(opened.result, opened.environment, model)
    folder = to if to is not None else Path(f"labels-{model}-{chosen[:12]}")
    done = pull_labels(opened.target, opened.environment, model, chosen, folder, progress=_progress)
    if output == "json":
        print_json(done.to_json())
        return
    report = done.report or {}
    print(f"{model} {chosen}: {', '.join(done.files)} → {done.folder}")
    if report:
        gate = report.get("gate") or {}
        print(f"  {report.get('autoLabelled')} row(s) labelled at confidence ≥ {report.get('confidence')}, "
              f"{report.get('toReview')} to review" + (f"; agreement {gate['agreement']:.3f} (gate {gate.get('minAgreement')})"
                                                        if isinstance(gate.get("agreement"), float) else ""))
    review = done.folder / str(report.get("reviewFile") or "review.csv")
    print(f"  next: fill the `{report.get('labelColumn') or 'label'}` column of {review}, then `forgectl labels merge "
          f"{report.get('dataset') or '<dataset>'} --reviewed {review}`")


@app.command("merge", short_help="Add the reviewed labels to the Dataset's source and pin its new digest.")
@with_target_flags
def merge(
    dataset: Annotated[str, typer.Argument(help="Dataset name.")],
    reviewed: Annotated[Path, typer.Option("--reviewed", help="The review file with the accepted rows' labels filled in "
                                           "(the `autolabel` step's `review.csv`, edited).")],
    auto_labels: Annotated[Path | None, typer.Option("--auto-labels", help="The `autolabel` step's `auto-labels.csv` "
                                                     "(default: beside the reviewed file).")] = None,
    specs_paths: SpecsOpt = None,
    env: EnvOpt = None,
    commit: Annotated[bool, typer.Option("--commit", help="Commit the source (or the new shard) and the spec, only those "
                                         "(an `s3://` shard is in the bucket, a `pvc://` source on its claim: the spec alone).")] = False,
    output: Annotated[str, typer.Option("--output", "-o", help="text or json.")] = "text",
    flags: TargetFlags = NO_OVERRIDES,
) -> None:
    """Append the auto-labels and the accepted reviewed rows to the Dataset's `file://` CSV or
    Parquet source (a sharded `file://` or `s3://` source: write them as a new Parquet shard in its
    folder or bucket prefix, with the shell's AWS_* credentials, and append it to
    `source.shards.files`; a `pvc://` one: through a one-off pod of the Environment's cluster, the
    shard written into the claim) and pin its new digest in the spec's `digest:` line."""
    from reconciler.labels.merge import merge_reviewed

    done = merge_reviewed(specs_paths or ["."], dataset, reviewed, auto_labels, env=env, commit=commit,
                          options=target_options(flags), progress=_progress)
    if output == "json":
        print_json(done.to_json())
        return
    if done.shard:
        print(f"{done.dataset}: merged {done.auto_labelled} auto-labelled and {done.accepted} reviewed row(s) "
              f"({done.rejected} left out) as the new shard {done.source} ({done.shard_digest}; shard "
              f"{done.shards} of {done.shards})")
    else:
        print(f"{done.dataset}: merged {done.auto_labelled} auto-labelled and {done.accepted} reviewed row(s) "
              f"({done.rejected} left out) into {done.source} ({done.rows} rows)")
    print(f"  digest {done.old_digest} → {done.new_digest} ({done.spec_file}:{done.spec_line})")
    print(f"  committed {done.commit[:12]}" if done.commit else "  not committed: `forgectl plan` shows the Models that retrain")
