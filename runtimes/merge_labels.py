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


def main(argv: list[str] | None = None) -> int:
    config, _ = parse_config(MergeLabelsConfig, argv, "python -m runtimes merge-labels")
    from runtimes.data import _resolve_local, file_digest

    spec = config.spec
    label = spec.labeling.column
    if spec.labeling.auto is None or not label or spec.source.format not in ("csv", "parquet"):
        raise StepFailed("merge-labels needs a CSV/Parquet Dataset with `labeling.column` and `labeling.auto`")
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
