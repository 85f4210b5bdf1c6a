"""``python -m runtimes merge-labels``: merge auto-labels and accepted reviews into the source.

Reads the Dataset's source (CSV/Parquet, its digest checked first), the autolabel step's
``auto-labels.csv`` and the reviewed file (rows whose label column is filled are accepted; the
others are left out; which rows merge and which are refused is specs/labels.py, shared with
`forgectl labels merge`), appends them to the source's rows — a CSV source's own lines kept
byte for byte — and writes the merged table under ``output`` with the source's file name, plus
``merge.json``: counts, the old and the new digest (sha256 of the merged file, what `sha256sum`
prints). A Parquet source is rewritten with the same columns, types and compression. Copy the file
over the source and pin the new digest in the Dataset (what `forgectl labels merge` does in the
repository for a `file://` source): the plan then shows the models that retrain.

A sharded source keeps its shards: the merged rows become one new shard (:func:`merge_shard`),
staged under ``output``; ``--publish NAME`` then writes it into the source's folder (a local
folder, or S3 through the same client the data steps read shards with), which `forgectl labels
merge` runs once it has checked the spec's rewrite, so a shard is never left unpinned by a spec
it could not write (``--withdraw NAME`` removes it again if that write fails).

On a cluster (a `pvc://` source, whose claim only a pod can write) one pod runs
``--then-publish``: the merge, then the shard written into the claim — or a single file replaced
in place, its bytes kept under ``output`` — and merge.json printed as one line of its log for
`forgectl labels merge`; ``--withdraw NAME`` undoes either (the file put back by digest).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from runtimes._step import in_workspace, parse_config, run_step, write_json
from runtimes.autolabel import read_table
from runtimes.errors import DigestMismatch, StepFailed
from specs.labels import LabelsError, Merged, Table, append_csv, csv_table, merge_rows
from specs.stepconfig import RESULT_PREFIX, MergeLabelsConfig

log = logging.getLogger("forge.merge-labels")


def table(path: Path) -> Table:
    """A CSV file as its text's rows (specs.labels, as `forgectl labels merge` reads it); a Parquet
    file's rows numbered as if it had a header line."""
    if path.suffix != ".parquet":
        return csv_table(path.name, path.read_text(encoding="utf-8"))
    frame = read_table(path)
    return Table(path.name, tuple(str(c) for c in frame.columns),
                 [(i + 2, row) for i, row in enumerate(frame.to_dict("records"))])


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


def rows_table(rows: list[list[object]], schema: Any, columns: list[str], label: str, classes: list[str]) -> Any:
    """The merged rows (values in ``columns`` order) as an Arrow table of those columns with
    ``schema``'s types, so they append to the source's data without a type changing; a value that
    does not fit its column's type is refused, naming the column."""
    import pyarrow as pa

    fields = [schema.field(n) for n in columns]
    arrays = []
    for i, f in enumerate(fields):
        try:
            arrays.append(pa.array([_cell(row[i], f.type, f.name == label, classes) for row in rows], type=f.type))
        except (ValueError, TypeError, pa.ArrowException) as exc:
            raise StepFailed(f"column {f.name!r}: a merged value does not fit the source's type {f.type}: {exc}") from None
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def merge_shard(config: MergeLabelsConfig, label: str) -> int:
    """A sharded source: the merged rows as one new Parquet shard with the pinned shards' schema
    (columns, order and types of the first one), named after its digest (specs.shards
    `labels_shard_name`), under ``output``; ``merge.json`` gives the file, its digest, the shard
    list with it appended and the new root. The folder must hold exactly the pinned shards (the
    join step's check); their bytes are not read again here (the join step checks each)."""
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
    added = rows_table(merged.rows, schema, columns, label, spec.labeling.classes)
    out = in_workspace(config.output)
    out.mkdir(parents=True, exist_ok=True)
    staged = out / ".labels.parquet"
    pq.write_table(added, staged, compression="zstd")
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


def merge_parquet(source_path: Path, out: Path, label: str, auto: Table, reviewed: Table,
                  classes: list[str]) -> tuple[int, int, Merged]:
    """A single Parquet source rewritten to ``out`` with the merged rows appended: the same columns,
    order and types (the rows cast as a new shard's are), its compression and its metadata (a
    pandas RangeIndex's length moved to the new row count). A source that stores a pandas index as
    a column is refused: a merged row has no value for it. The rows after the merge, the source's,
    and what merged."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(source_path)
        source = parquet.read()
    except (OSError, pa.ArrowException) as exc:
        raise StepFailed(f"{source_path.name}: cannot read the Parquet source: {exc}") from None
    index = [n for n in source.schema.names if n.startswith("__index_level_")]
    if index:
        raise StepFailed(f"{source_path.name}: the Parquet source stores a pandas index as the column(s) "
                         f"{', '.join(index)}, which a merged row has no value for; write it without the index "
                         "(`to_parquet(..., index=False)`), pin its digest, then merge")
    columns = list(source.schema.names)
    merged = merge_rows(columns, label, auto, reviewed, classes)
    if not merged.rows:
        return len(source), len(source), merged
    added = rows_table(merged.rows, source.schema, columns, label, classes)
    table = pa.concat_tables([source.replace_schema_metadata(None), added.replace_schema_metadata(None)])
    table = table.replace_schema_metadata(_pandas_range(source.schema.metadata, table.num_rows))
    meta = parquet.metadata
    codec = meta.row_group(0).column(0).compression if meta.num_row_groups and meta.num_columns else "SNAPPY"
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, out, compression="none" if codec == "UNCOMPRESSED" else codec.lower())
    return table.num_rows, len(source), merged


def _pandas_range(metadata: dict[bytes, bytes] | None, rows: int) -> dict[bytes, bytes] | None:
    """``metadata`` with a pandas RangeIndex of 0…n-1 stretched to ``rows`` (pandas would otherwise
    find its length wrong and quietly fall back to a default index)."""
    import json

    if not metadata or b"pandas" not in metadata:
        return metadata
    try:
        pandas = json.loads(metadata[b"pandas"])
        for index in pandas.get("index_columns", []):
            if isinstance(index, dict) and index.get("kind") == "range" and index.get("start") == 0 and index.get("step") == 1:
                index["stop"] = rows
    except (ValueError, AttributeError):
        return metadata
    return {**metadata, b"pandas": json.dumps(pandas).encode()}


def publish(config: MergeLabelsConfig, name: str, withdraw: bool) -> int:
    """``--publish NAME``: write the shard a previous run staged under ``output`` into the source's
    folder (through the filesystem the steps read it with: S3 with the environment's credentials,
    or the local folder), its digest checked against that run's ``merge.json`` first.
    ``--withdraw NAME``: remove it again (`forgectl labels merge`, when the spec that would pin it
    could not be written). A single file's source has no shard to publish (``--then-publish``
    replaces it in the merge's own run); ``--withdraw`` puts its original back (`restore_source`)."""
    from runtimes._step import read_json
    from runtimes.data import file_digest
    from runtimes.shard_source import delete_shard, open_source, put_shard

    shards = config.spec.source.shards
    if shards is None:
        if withdraw:
            return restore_source(config, name)
        raise StepFailed("--publish writes a shard of a sharded source (`source.shards`); a single file is replaced "
                         "by --then-publish")
    staged = in_workspace(config.output) / name
    done = read_json(in_workspace(config.output) / "merge.json") if (staged.parent / "merge.json").is_file() else {}
    # Only the shard this merge staged, never one the spec pins: --withdraw deletes from the source.
    if not staged.is_file() or done.get("file") != name or name in {f.name for f in shards.files}:
        raise StepFailed(f"{staged}: not the new shard the merge in {config.output} staged (run merge-labels first)")
    location = open_source(config.spec.source)
    if withdraw:
        delete_shard(location, name)
        return 0
    if file_digest(staged) != done.get("fileDigest"):
        raise StepFailed(f"{staged}: its digest is not the {done.get('fileDigest')} its merge.json gives")
    target = put_shard(location, name, staged)
    log.info("wrote the shard %s (%s)", target, done["fileDigest"])
    print(target)
    return 0


def _copy_over(data: Path, target: Path) -> None:
    """Replace ``target`` with the bytes of ``data``: written beside it under a temporary name and
    renamed over it, so no reader sees half a file."""
    import shutil

    partial = target.parent / f".{target.name}.partial"
    try:
        shutil.copyfile(data, partial)
        partial.replace(target)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise StepFailed(f"cannot replace {target}: {exc}") from None


def replace_source(config: MergeLabelsConfig, source_path: Path, done: dict[str, Any]) -> None:
    """``--then-publish`` for a single-file source (a claim's file, in a pod on a cluster): the
    merged file replaces the source; the source's bytes are kept under ``output`` first
    (``<name>.before``), which ``--withdraw NAME`` puts back."""
    import shutil

    out = in_workspace(config.output)
    try:
        shutil.copyfile(source_path, out / f"{source_path.name}.before")
    except OSError as exc:
        raise StepFailed(f"cannot keep a copy of {source_path}: {exc}") from None
    _copy_over(out / str(done["file"]), source_path)
    log.info("replaced %s (%s → %s)", source_path, done["oldDigest"], done["newDigest"])


def restore_source(config: MergeLabelsConfig, name: str) -> int:
    """``--withdraw NAME`` for a single-file source: the bytes ``--then-publish`` replaced go back,
    only while the source is still the merged file and the kept copy is the original (by digest)."""
    from runtimes._step import read_json
    from runtimes.data import file_digest, resolve_local

    out = in_workspace(config.output)
    before = out / f"{name}.before"
    done = read_json(out / "merge.json") if (out / "merge.json").is_file() else {}
    source_path = resolve_local(config.spec.source.uri)
    if done.get("file") != name or source_path.name != name or not before.is_file():
        raise StepFailed(f"{before}: not the copy a --then-publish in {config.output} kept (nothing to withdraw)")
    if file_digest(before) != done.get("oldDigest") or file_digest(source_path) != done.get("newDigest"):
        raise StepFailed(f"{source_path}: not the file the merge in {config.output} wrote (changed since): not restored")
    _copy_over(before, source_path)
    log.info("restored %s (%s)", source_path, done["oldDigest"])
    return 0


def _options(parser: argparse.ArgumentParser) -> None:
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--publish", metavar="NAME", help="write the staged shard NAME into the sharded source's folder")
    what.add_argument("--withdraw", metavar="NAME", help="remove the shard NAME from the sharded source's folder (a "
                                                        "single file: put back what --then-publish replaced)")
    what.add_argument("--then-publish", action="store_true",
                      help="merge, then write the new shard into the source's folder (a single file: replace it, "
                           "its bytes kept under the output), and print merge.json as one line (a pod on a "
                           "cluster, whose log forgectl reads)")


def main(argv: list[str] | None = None) -> int:
    config, args = parse_config(MergeLabelsConfig, argv, "python -m runtimes merge-labels", _options)
    from runtimes.data import file_digest, resolve_local

    spec = config.spec
    label = spec.labeling.column
    if spec.labeling.auto is None or not label or spec.source.format not in ("csv", "parquet"):
        raise StepFailed("merge-labels needs a CSV/Parquet Dataset with `labeling.column` and `labeling.auto`")
    if args.publish or args.withdraw:
        return publish(config, args.publish or args.withdraw, withdraw=bool(args.withdraw))
    if spec.source.shards is not None:
        merge_shard(config, label)
        if args.then_publish:
            # One pod on a cluster does both (`forgectl labels merge` has checked its rewrite of the
            # spec first, and withdraws the shard with --withdraw if writing it fails after all).
            from runtimes._step import read_json

            done = read_json(in_workspace(config.output) / "merge.json")
            publish(config, str(done["file"]), withdraw=False)
            print(RESULT_PREFIX + json.dumps(done, separators=(",", ":")), flush=True)
        return 0
    source_path = resolve_local(spec.source.uri)
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
            if merged.rows:
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(append_csv(text, merged.rows), encoding="utf-8", newline="")
            total = len(source_rows.rows) + len(merged.rows)
            source_count = len(source_rows.rows)
        else:
            total, source_count, merged = merge_parquet(source_path, out, label, auto, reviewed, spec.labeling.classes)
    except LabelsError as exc:
        raise StepFailed(str(exc)) from None
    if not merged.rows:
        raise StepFailed(f"{Path(config.review).name}: nothing to merge (no auto-labels, and no reviewed row has its "
                         f"`{label}` filled): the digest stays {old}")
    new = file_digest(out)
    report = {"dataset": config.dataset, "source": spec.source.uri, "sourceRows": source_count,
              "autoLabelled": merged.auto_labelled, "accepted": merged.accepted, "rejected": merged.rejected,
              "rows": total, "oldDigest": old, "newDigest": new, "file": out.name}
    write_json(in_workspace(config.output) / "merge.json", report)
    log.info("merged %d auto-labelled and %d accepted rows into %s (%d rows): digest %s → %s",
             merged.auto_labelled, merged.accepted, out, total, old, new)
    print(new)
    if args.then_publish:
        replace_source(config, source_path, report)
        print(RESULT_PREFIX + json.dumps(report, separators=(",", ":")), flush=True)
    return 0


def run(argv: list[str] | None = None) -> int:
    return run_step(main, argv)


if __name__ == "__main__":
    sys.exit(run())
