"""``python -m runtimes autolabel``: pre-label a Dataset's unlabelled rows with a registered model.

Reads ``labeling.auto.unlabelled`` (CSV/Parquet with the source's feature columns; a
``heldBackColumn`` of true labels, if named, is never shown to the model and only measures the
agreement) and runs the model's bundle on it through the serving core (the same clip/standardise
transform as in training and serving). Writes under ``output``:

- ``auto-labels.csv``: the rows whose top-class probability reaches ``confidence``, with the
  label column filled in (the class name), ready to merge;
- ``review.csv`` (or ``.parquet``): the other rows with the model's ``topK`` classes and
  probabilities (``top1``, ``p1``, …) and an empty label column for a reviewer: a filled label
  accepts the row, an empty one leaves it out;
- ``report.json`` (and ``metrics.json``, the step's output parameter): counts, the confidence,
  and with held-back labels the agreement of the auto-labels (and of the top-1 over every row,
  and the top-k hit rate of the review rows); with ``minAgreement``, the gate — below it the step
  fails (exit 3, not retried) after writing every file.

In a Workflow this is the `autolabel` step (renderers/autolabel.py), which reads the labelling
model from the registry.

``python -m runtimes merge-labels`` (runtimes/merge_labels.py) merges them into the source.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from runtimes._step import in_workspace, parse_config, run_step, write_json
from runtimes.errors import StepFailed, ThresholdsFailed
from specs.stepconfig import AutoLabelConfig

log = logging.getLogger("forge.autolabel")

ROW = "row"


def read_table(path: Any) -> Any:
    import pandas as pd

    if path.suffix == ".parquet":
        return pd.read_parquet(path)
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


def gate(report: dict[str, Any], min_agreement: float | None) -> str:
    """Record the `minAgreement` gate in ``report`` (``gate``: threshold, measured, passed); the
    failure's message when the auto-labels agree with the held-back labels less than it, else ""."""
    if min_agreement is None:
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

    from runtimes.data import _resolve_local
    from runtimes.serving.core import ServingCore

    spec = config.spec
    auto = spec.labeling.auto
    if auto is None:
        raise StepFailed(f"dataset {config.dataset} has no `labeling.auto`")
    label = spec.labeling.column
    if not label:
        raise StepFailed("auto-labeling needs `labeling.column` (the column the labels go into)")
    features = list(spec.features) or [c for c in source_columns(spec) if c not in (label, "__label__")]
    unlabelled = read_table(_resolve_local(auto.unlabelled))
    missing = [c for c in features if c not in unlabelled.columns]
    if missing:
        raise StepFailed(f"{auto.unlabelled}: missing feature column(s) {', '.join(missing[:5])}")
    core = ServingCore(in_workspace(config.model_dir))
    if core.task != "classification":
        raise StepFailed(f"the labelling model {auto.model_ref} is not a classifier (task {core.task})")
    classes = core.classes or [str(i) for i in range(int(core.info.get("numClasses") or 0))]
    probs = core.predict(unlabelled[features].to_numpy(dtype=np.float32))["probabilities"]
    order = np.argsort(-probs, axis=1)[:, : auto.top_k]
    top = probs[np.arange(len(probs)), order[:, 0]]
    confident = top >= auto.confidence
    names = np.asarray(classes, dtype=object)
    out = in_workspace(config.output)

    labelled = unlabelled.loc[confident, features].copy()
    labelled[label] = names[order[confident, 0]]
    write_table(labelled, out / "auto-labels.csv")
    review = unlabelled.loc[~confident, features].copy()
    review.insert(0, ROW, np.flatnonzero(~confident))
    for k in range(order.shape[1]):
        review[f"top{k + 1}"] = names[order[~confident, k]]
        review[f"p{k + 1}"] = np.round(probs[np.flatnonzero(~confident), order[~confident, k]], 4)
    review[label] = ""
    review_path = out / f"review.{auto.review_format}"
    write_table(review, review_path)

    report: dict[str, Any] = {"dataset": config.dataset, "datasetDigest": spec.digest, "model": auto.model_ref,
                              "modelDir": config.model_dir, "confidence": auto.confidence,
                              "rows": int(len(unlabelled)), "autoLabelled": int(confident.sum()),
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
    log.info("auto-labelled %d of %d rows at confidence ≥ %g; %d to review in %s%s", report["autoLabelled"],
             report["rows"], auto.confidence, report["toReview"], review_path,
             f"; agreement with held-back labels {report['agreement']['autoLabels']}" if "agreement" in report else "")
    return 0


def run(argv: list[str] | None = None) -> int:
    return run_step(main, argv)


if __name__ == "__main__":
    sys.exit(run())
