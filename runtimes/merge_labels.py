"""``python -m runtimes merge-labels``: merge auto-labels and accepted reviews into the source.

Reads the Dataset's source (CSV/Parquet, its digest checked first), the autolabel step's
``auto-labels.csv`` and the reviewed file (rows whose label column is filled are accepted; the
others are left out; which rows merge and which are refused is specs/labels.py, shared with
`forgectl labels merge`), appends them to the source's rows — a CSV source's own lines kept
byte for byte — and writes the merged table under ``output`` with the source's file name, plus
``merge.json``: counts, the old and the new digest (sha256 of the merged file, what `sha256sum`
prints). Copy the file over the source and pin the new digest in the Dataset (what `forgectl
labels merge` does in the repository for a CSV source): the plan then shows the models that retrain.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

from runtimes._step import in_workspace, parse_config, run_step, write_json
from runtimes.autolabel import read_table, write_table
from runtimes.errors import DigestMismatch, StepFailed
from specs.labels import LabelsError, Table, append_csv, csv_table, merge_rows
from specs.stepconfig import MergeLabelsConfig

log = logging.getLogger("forge.merge-labels")


def table(path: Path) -> Table:
    """A CSV file as its text's rows (specs.labels, as `forgectl labels merge` reads it); a Parquet
    file's rows numbered as if it had a header line."""
    if path.suffix != ".parquet":
        return csv_table(path.name, path.read_text(encoding="utf-8"))
    frame = read_table(path)
    return Table(path.name, tuple(str(c) for c in frame.columns),
                 [(i + 2, row) for i, row in enumerate(frame.to_dict("records"))])


def merged_frame(source: Any, rows: list[list[object]], label: str) -> Any:
    """A Parquet source with the merged rows appended (the label keeps the source's integer type)."""
    import pandas as pd

    added = pd.DataFrame(rows, columns=list(source.columns)).astype(source.dtypes.to_dict(), errors="ignore")
    merged = pd.concat([source, added], ignore_index=True)
    if source[label].dtype.kind in "iu":
        merged[label] = merged[label].astype(source[label].dtype)
    return merged


def _cell(value: object, kind: Any, label: bool, classes: list[str]) -> object:
    """A merged cell as the shard column's type wants it (a label given as a class name becomes its
    index when the label column holds integers)."""
    import pyarrow as pa

    if label and pa.types.is_integer(kind):
        text = str(value).strip()
        return classes.index(text) if text in classes else int(float(text))
    if pa.types.is_integer(kind):
        return int(float(str(value)))
    if pa.types.is_floating(kind):
        return float(str(value))
    if pa.types.is_boolean(kind):
        return str(value).strip().lower() in ("1", "true", "yes")
    return str(value)


def merge_shard(config: MergeLabelsConfig, label: str) -> int:
    """A sharded source: the merged rows as one new Parquet shard with the pinned shards' schema
    (columns, order and types of the first one), named after its digest (specs.shards
    `labels_shard_name`), under ``output``; ``merge.json`` gives the file, its digest, the shard
    list with it appended and the new root. The folder must hold exactly the pinned shards (the
    join step's check); their bytes are not read again here (the join step checks each)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from runtimes.data import file_digest
    from runtimes.shard_source import check_listing, open_source
    from specs.shards import labels_shard_name, root_digest

    spec = config.spec
    shards = spec.source.shards
    assert shards is not None
    location = open_source(spec.source)
    check_listing(location, [f.name for f in shards.files])
    first = shards.files[0].name
    try:
        with location.filesystem.open_input_file(location.path(first)) as fh:
            schema = pq.read_schema(fh).remove_metadata()
    except (OSError, ValueError) as exc:
        raise StepFailed(f"source {spec.source.uri}: cannot read the schema of the shard {first}: {exc}") from None
    columns = [n for n in schema.names if not n.startswith("__index_level_")]
    try:
        auto, reviewed = table(in_workspace(config.labels) / "auto-labels.csv"), table(in_workspace(config.review))
        merged = merge_rows(columns, label, auto, reviewed, spec.labeling.classes)
    except LabelsError as exc:
        raise StepFailed(str(exc)) from None
    if not merged.rows:
        raise StepFailed(f"{Path(config.review).name}: nothing to merge (no auto-labels, and no reviewed row has its "
                         f"`{label}` filled)")
    fields = [schema.field(n) for n in columns]
    arrays = []
    for i, f in enumerate(fields):
        try:
            arrays.append(pa.array([_cell(row[i], f.type, f.name == label, spec.labeling.classes) for row in merged.rows],
                                   type=f.type))
        except (ValueError, TypeError, pa.ArrowException) as exc:
            raise StepFailed(f"column {f.name!r}: a merged value does not fit the shards' type {f.type}: {exc}") from None
    out = in_workspace(config.output)
    out.mkdir(parents=True, exist_ok=True)
    staged = out / ".labels.parquet"
    pq.write_table(pa.Table.from_arrays(arrays, schema=pa.schema(fields)), staged, compression="zstd")
    digest = file_digest(staged)
    name = labels_shard_name(location.glob, digest)
    if name is None:
        staged.unlink()
        raise StepFailed(f"the source's glob {location.glob!r} matches no name of the form labels-<digest>.parquet; "
                         "write and pin the shard by hand")
    if name in {f.name for f in shards.files}:
        staged.unlink()
        raise StepFailed(f"a shard named {name} is pinned already: these labels were merged before")
    staged.rename(out / name)
    files = [{"name": f.name, "digest": f.digest} for f in shards.files] + [{"name": name, "digest": digest}]
    new_root = root_digest([f["digest"] for f in files], shards.group_size)
    report = {"dataset": config.dataset, "source": spec.source.uri, "sharded": True, "autoLabelled": merged.auto_labelled,
              "accepted": merged.accepted, "rejected": merged.rejected, "rows": len(merged.rows),
              "oldDigest": spec.digest, "newDigest": new_root, "file": name, "fileDigest": digest, "files": files}
    write_json(out / "merge.json", report)
    log.info("merged %d auto-labelled and %d accepted rows into the new shard %s (%s): digest %s → %s",
             merged.auto_labelled, merged.accepted, out / name, digest, spec.digest, new_root)
    print(new_root)
    return 0


def main(argv: list[str] | None = None) -> int:
    config, _ = parse_config(MergeLabelsConfig, argv, "python -m runtimes merge-labels")
    from runtimes.data import _resolve_local, file_digest

    spec = config.spec
    label = spec.labeling.column
    if spec.labeling.auto is None or not label or spec.source.format not in ("csv", "parquet"):
        raise StepFailed("merge-labels needs a CSV/Parquet Dataset with `labeling.column` and `labeling.auto`")
    if spec.source.shards is not None:
        return merge_shard(config, label)
    source_path = _resolve_local(spec.source.uri)
    old = file_digest(source_path)
    if old != spec.digest:
        raise DigestMismatch(f"source {spec.source.uri}: digest {old} differs from the Dataset's {spec.digest}")
    out = in_workspace(config.output) / source_path.name
    try:
        auto, reviewed = table(in_workspace(config.labels) / "auto-labels.csv"), table(in_workspace(config.review))
        if spec.source.format == "csv":
            text = source_path.read_text(encoding="utf-8")
            source_rows = csv_table(source_path.name, text)
            merged = merge_rows(source_rows.columns, label, auto, reviewed, spec.labeling.classes)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(append_csv(text, merged.rows), encoding="utf-8", newline="")
            total = len(source_rows.rows) + len(merged.rows)
            source_count = len(source_rows.rows)
        else:
            source = read_table(source_path)
            merged = merge_rows([str(c) for c in source.columns], label, auto, reviewed, spec.labeling.classes)
            write_table(merged_frame(source, merged.rows, label), out)
            total, source_count = len(source) + len(merged.rows), len(source)
    except LabelsError as exc:
        raise StepFailed(str(exc)) from None
    new = file_digest(out)
    report = {"dataset": config.dataset, "source": spec.source.uri, "sourceRows": source_count,
              "autoLabelled": merged.auto_labelled, "accepted": merged.accepted, "rejected": merged.rejected,
              "rows": total, "oldDigest": old, "newDigest": new, "file": out.name}
    write_json(in_workspace(config.output) / "merge.json", report)
    log.info("merged %d auto-labelled and %d accepted rows into %s (%d rows): digest %s → %s",
             merged.auto_labelled, merged.accepted, out, total, old, new)
    print(new)
    return 0


def run(argv: list[str] | None = None) -> int:
    return run_step(main, argv)


if __name__ == "__main__":
    sys.exit(run())
