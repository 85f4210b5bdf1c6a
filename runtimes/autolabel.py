"""``python -m runtimes autolabel``: pre-label a Dataset's unlabelled rows with a registered model.

Reads ``labeling.auto.unlabelled`` (CSV/Parquet with the source's feature columns; a
``heldBackColumn`` of true labels, if named, is never shown to the model and only measures the
agreement) and runs the model's bundle on it through the serving core (the same clip/standardise
transform as in training and serving). Writes under ``output``:

- ``auto-labels.csv``: the rows whose top-class probability reaches ``confidence``, with the
  label column filled in (the class name), ready to merge;
- ``review.csv`` (or ``.parquet``): the other rows with the model's ``topK`` classes and
  probabilities (``top1``, ``p1``, …; ``_top1``, ``_p1``, … when a feature has such a name) and
  an empty label column for a reviewer: a filled label accepts the row, an empty one leaves it out;
- ``report.json`` (and ``metrics.json``, the step's output parameter): counts, the confidence,
  and with held-back labels the agreement of the auto-labels (and of the top-1 over every row,
  and the top-k hit rate of the review rows); with ``minAgreement``, the gate — below it the step
  fails (exit 3, not retried) after writing every file.

Rows whose feature values the Dataset's source holds already are skipped (``alreadyInDataset`` in
the report): after `forgectl labels merge`, the next version's step does not offer the merged rows
again. The source is streamed once for it (a sharded one shard by shard); a row's key is its
features as the model sees them (float32), so a merged row matches whatever type its column has.

In a Workflow this is the `autolabel` step (renderers/autolabel.py), which reads the labelling
model from the registry.

``python -m runtimes merge-labels`` (runtimes/merge_labels.py) merges them into the source.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from typing import Any

from runtimes._step import in_workspace, parse_config, run_step, write_json
from runtimes.errors import StepFailed, ThresholdsFailed
from specs.stepconfig import AutoLabelConfig

log = logging.getLogger("forge.autolabel")

ROW = "row"


def read_table(path: Any) -> Any:
    """A CSV or Parquet file (by its suffix) as a pandas frame."""
    import pandas as pd

    from runtimes.data import read_parquet

    if path.suffix == ".parquet":
        return read_parquet(path)
    return pd.read_csv(path)


def write_table(frame: Any, path: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        frame.to_parquet(path, index=False)
    else:
        frame.to_csv(path, index=False)


def source_columns(spec: Any) -> list[str]:
    """The source's columns: a sharded data set's from its first pinned shard's Parquet footer (the
    shards are never read whole here), any other's from the source read as the prepare step reads it."""
    from runtimes.data import read_source

    shards = spec.source.shards
    if shards is None:
        return [str(c) for c in read_source(spec).frame.columns]
    import pyarrow.parquet as pq

    from runtimes.shard_source import open_source

    location = open_source(spec.source)
    first = shards.files[0].name
    try:
        with location.filesystem.open_input_file(location.path(first)) as fh:
            return [str(n) for n in pq.read_schema(fh).names if not str(n).startswith("__index_level_")]
    except (OSError, ValueError) as exc:
        raise StepFailed(f"source {spec.source.uri}: cannot read the columns of the shard {first}: {exc}") from None


def row_keys(values: Any) -> list[bytes]:
    """A key per row of a 2-D array of feature values: the row as the model sees it (float32), so a
    row merged into the data set (cast to its columns' types, or written back as CSV text) has the
    key it had in the `unlabelled` file. -0.0 counts as 0.0."""
    import numpy as np

    rows = np.ascontiguousarray(np.asarray(values, dtype=np.float32) + np.float32(0.0))
    return [row.tobytes() for row in rows]


def source_batches(spec: Any, features: list[str], batch_rows: int = 65536) -> Iterator[Any]:
    """The Dataset's source, ``features`` only, as float32 arrays of at most ``batch_rows`` rows:
    read batch by batch (a sharded source shard by shard, through the filesystem the data steps
    use), so a large data set is never held whole."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    def arrays(parquet: Any, where: str) -> Iterator[Any]:
        missing = [c for c in features if c not in parquet.schema_arrow.names]
        if missing:
            raise StepFailed(f"{where}: no feature column(s) {', '.join(missing[:5])}")
        for batch in parquet.iter_batches(batch_size=batch_rows, columns=features):
            yield np.column_stack([batch.column(i).to_numpy(zero_copy_only=False).astype(np.float32)
                                   for i in range(batch.num_columns)])

    shards = spec.source.shards
    try:
        if shards is not None:
            from runtimes.shard_source import open_source

            location = open_source(spec.source)
            for shard in shards.files:
                with location.filesystem.open_input_file(location.path(shard.name)) as fh:
                    yield from arrays(pq.ParquetFile(fh), f"{spec.source.uri} shard {shard.name}")
            return
        import pandas as pd

        from runtimes.data import resolve_local

        path = resolve_local(spec.source.uri)
        if spec.source.format == "parquet":
            yield from arrays(pq.ParquetFile(path), spec.source.uri)
            return
        for chunk in pd.read_csv(path, usecols=features, chunksize=batch_rows):
            yield chunk[features].to_numpy(dtype=np.float32)
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise StepFailed(f"source {spec.source.uri}: cannot read its rows to skip those already labelled: {exc}") from None


def in_dataset(spec: Any, features: list[str], values: Any) -> Any:
    """Which rows of ``values`` (the `unlabelled` rows' features) the Dataset's source holds already
    — rows `forgectl labels merge` merged, or labelled some other way — as a boolean array: those
    are not offered again. The source is streamed once; only the unlabelled rows' keys are held."""
    import numpy as np

    keys: dict[bytes, list[int]] = {}
    for i, key in enumerate(row_keys(values)):
        keys.setdefault(key, []).append(i)
    found = np.zeros(len(values), dtype=bool)
    if not keys:
        return found
    for batch in source_batches(spec, features):
        for key in row_keys(batch):
            for i in keys.get(key, ()):
                found[i] = True
    return found


def review_columns(features: list[str], label: str, top_k: int) -> tuple[str, list[str], list[str]]:
    """The review file's own columns: ``row``, ``top1``…, ``p1``…, each set prefixed with as many
    ``_`` as it takes to name no feature nor the label. Features named ``p0``, ``p1``, … (the
    Parquet examples' pixels) would otherwise be overwritten by the probabilities, and a reviewed
    row would merge them as its feature values."""
    def free(names: list[str], taken: set[str]) -> list[str]:
        prefix = ""
        while any(prefix + n in taken for n in names):
            prefix += "_"
        return [prefix + n for n in names]

    taken = {*features, label}
    [row] = free([ROW], taken)
    suggested = free([f"{c}{k + 1}" for c in ("top", "p") for k in range(top_k)], taken | {row})
    return row, suggested[:top_k], suggested[top_k:]


def gate(report: dict[str, Any], min_agreement: float | None) -> str:
    """Record the `minAgreement` gate in ``report`` (``gate``: threshold, measured, passed); the
    failure's message when the auto-labels agree with the held-back labels less than it, else ""."""
    if min_agreement is None:
        return ""
    if report["rows"] == 0:  # every row is in the data set already: no label to trust or distrust
        report["gate"] = {"minAgreement": min_agreement, "agreement": None, "passed": True}
        return ""
    measured = (report.get("agreement") or {}).get("autoLabels")
    passed = measured is not None and measured >= min_agreement
    report["gate"] = {"minAgreement": min_agreement, "agreement": measured, "passed": passed}
    if passed:
        return ""
    if measured is None:
        return (f"no row reached confidence {report['confidence']}: the agreement with the held-back labels cannot "
                f"be measured, and `labeling.auto.minAgreement` is {min_agreement}")
    return (f"the {report['autoLabelled']} auto-labels agree with the held-back labels "
            f"({report['agreement']['column']}) on {measured:.4f} < `labeling.auto.minAgreement` {min_agreement}: "
            f"the labelling model {report['model']} is not trusted to label this data (raise `confidence` or "
            "retrain it); the review file is written")


def main(argv: list[str] | None = None) -> int:
    config, _ = parse_config(AutoLabelConfig, argv, "python -m runtimes autolabel")
    import numpy as np

    from runtimes.data import resolve_local
    from runtimes.serving.core import ServingCore

    spec = config.spec
    auto = spec.labeling.auto
    if auto is None:
        raise StepFailed(f"dataset {config.dataset} has no `labeling.auto`")
    label = spec.labeling.column
    if not label:
        raise StepFailed("auto-labeling needs `labeling.column` (the column the labels go into)")
    features = list(spec.features) or [c for c in source_columns(spec) if c not in (label, "__label__")]
    unlabelled = read_table(resolve_local(auto.unlabelled))
    missing = [c for c in features if c not in unlabelled.columns]
    if missing:
        raise StepFailed(f"{auto.unlabelled}: missing feature column(s) {', '.join(missing[:5])}")
    # Rows the data set holds already (merged by `forgectl labels merge` after an earlier version
    # labelled them) are not offered again: `positions` are the offered rows' places in the file.
    in_source = in_dataset(spec, features, unlabelled[features].to_numpy(dtype=np.float32))
    positions = np.flatnonzero(~in_source)
    file_rows = len(unlabelled)
    unlabelled = unlabelled.iloc[positions]
    core = ServingCore(in_workspace(config.model_dir))
    if core.task != "classification":
        raise StepFailed(f"the labelling model {auto.model_ref} is not a classifier (task {core.task})")
    classes = core.classes or [str(i) for i in range(int(core.info.get("numClasses") or 0))]
    x = unlabelled[features].to_numpy(dtype=np.float32)
    probs = core.predict(x)["probabilities"] if len(x) else np.zeros((0, len(classes)), dtype=np.float32)
    order = np.argsort(-probs, axis=1)[:, : auto.top_k]
    top = probs[np.arange(len(probs)), order[:, 0]]
    confident = top >= auto.confidence
    names = np.asarray(classes, dtype=object)
    out = in_workspace(config.output)

    labelled = unlabelled.loc[confident, features].copy()
    labelled[label] = names[order[confident, 0]]
    write_table(labelled, out / "auto-labels.csv")
    review = unlabelled.loc[~confident, features].copy()
    row_column, tops, ps = review_columns(features, label, order.shape[1])
    review.insert(0, row_column, positions[~confident])  # the row's place in the `unlabelled` file
    for k in range(order.shape[1]):
        review[tops[k]] = names[order[~confident, k]]
        review[ps[k]] = np.round(probs[np.flatnonzero(~confident), order[~confident, k]], 4)
    review[label] = ""
    review_path = out / f"review.{auto.review_format}"
    write_table(review, review_path)

    report: dict[str, Any] = {"dataset": config.dataset, "datasetDigest": spec.digest, "model": auto.model_ref,
                              "modelDir": config.model_dir, "confidence": auto.confidence,
                              "rows": int(len(unlabelled)), "unlabelledRows": file_rows,
                              "alreadyInDataset": int(in_source.sum()), "autoLabelled": int(confident.sum()),
                              "toReview": int((~confident).sum()), "topK": auto.top_k,
                              "reviewFile": review_path.name, "labelColumn": label}
    if auto.held_back_column:
        if auto.held_back_column not in unlabelled.columns:
            raise StepFailed(f"{auto.unlabelled}: no held-back column {auto.held_back_column!r}")
        truth = unlabelled[auto.held_back_column].astype(str).to_numpy()
        predicted = names[order[:, 0]].astype(str)
        in_top_k = np.array([truth[i] in set(names[order[i]].astype(str)) for i in range(len(truth))])
        report["agreement"] = {
            "autoLabels": float((predicted[confident] == truth[confident]).mean()) if confident.any() else None,
            "allRowsTop1": float((predicted == truth).mean()) if len(truth) else None,
            "reviewRowsTopK": float(in_top_k[~confident].mean()) if (~confident).any() else None,
            "column": auto.held_back_column,
        }
    failed = gate(report, auto.min_agreement)
    write_json(out / "report.json", report)
    write_json(out / "metrics.json", report)
    if failed:
        raise ThresholdsFailed(failed)
    log.info("auto-labelled %d of %d rows at confidence ≥ %g (%d in the data set already); %d to review in %s%s",
             report["autoLabelled"], report["rows"], auto.confidence, report["alreadyInDataset"], report["toReview"],
             review_path,
             f"; agreement with held-back labels {report['agreement']['autoLabels']}" if "agreement" in report else "")
    return 0


def run(argv: list[str] | None = None) -> int:
    return run_step(main, argv)


if __name__ == "__main__":
    sys.exit(run())
