"""`forgectl labels merge`: reviewed labels of a Dataset's auto-labeling into its source, the
digest re-pinned in the spec (and committed with `--commit`), so `forgectl plan` shows the Models
that retrain. The logic is reconciler/labels/merge.py; this parses and prints."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from forgectl.options import EnvOpt, SpecsOpt

app = typer.Typer(help="Labels of a Dataset's auto-labeling (`labeling.auto`): merge the reviewed ones.",
                  no_args_is_help=True)


@app.command("merge")
def merge(
    dataset: Annotated[str, typer.Argument(help="Dataset name.")],
    reviewed: Annotated[Path, typer.Option("--reviewed", help="The review file with the accepted rows' labels filled in "
                                           "(the `autolabel` step's `review.csv`, edited).")],
    auto_labels: Annotated[Path | None, typer.Option("--auto-labels", help="The `autolabel` step's `auto-labels.csv` "
                                                     "(default: beside the reviewed file).")] = None,
    specs_paths: SpecsOpt = None,
    env: EnvOpt = None,
    commit: Annotated[bool, typer.Option("--commit", help="Commit the source (or the new shard) and the spec, only those "
                                         "(an `s3://` shard is in the bucket: the spec alone).")] = False,
    output: Annotated[str, typer.Option("--output", "-o", help="text or json.")] = "text",
) -> None:
    """Append the auto-labels and the accepted reviewed rows to the Dataset's `file://` CSV or
    Parquet source (a sharded `file://` or `s3://` source: write them as a new Parquet shard in its
    folder or bucket prefix, with the shell's AWS_* credentials, and append it to
    `source.shards.files`) and pin its new digest in the spec's `digest:` line."""
    from reconciler.labels.merge import merge_reviewed

    done = merge_reviewed(specs_paths or ["."], dataset, reviewed, auto_labels, env=env, commit=commit)
    if output == "json":
        print(json.dumps(done.to_json(), indent=2))
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
