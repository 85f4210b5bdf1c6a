"""``python -m runtimes merge-labels``: merge auto-labels and accepted reviews into the source.

Reads the Dataset's source (CSV/Parquet, its digest checked first), the autolabel step's
``auto-labels.csv`` and the reviewed file (rows whose label column is filled are accepted; the
others are left out), appends them to the source's rows and writes the merged table under
``output`` with the source's file name, plus ``merge.json``: counts, the old and the new digest
(sha256 of the merged file, what `sha256sum` prints). Copy the file over the source and pin the
new digest in the Dataset: the plan then shows the models that retrain.
"""

from __future__ import annotations

import logging
import sys

from runtimes._step import in_workspace, parse_config, run_step, write_json
from runtimes.autolabel import read_table, write_table
from runtimes.errors import DigestMismatch, StepFailed
from specs.stepconfig import MergeLabelsConfig

log = logging.getLogger("forge.merge-labels")


def main(argv: list[str] | None = None) -> int:
    config, _ = parse_config(MergeLabelsConfig, argv, "python -m runtimes merge-labels")
    import pandas as pd

    from runtimes.data import _resolve_local, file_digest

    spec = config.spec
    label = spec.labeling.column
    if spec.labeling.auto is None or not label or spec.source.format not in ("csv", "parquet"):
        raise StepFailed("merge-labels needs a CSV/Parquet Dataset with `labeling.column` and `labeling.auto`")
    source_path = _resolve_local(spec.source.uri)
    old = file_digest(source_path)
    if old != spec.digest:
        raise DigestMismatch(f"source {spec.source.uri}: digest {old} differs from the Dataset's {spec.digest}")
    source = read_table(source_path)
    auto = read_table(in_workspace(config.labels) / "auto-labels.csv")
    reviewed = read_table(in_workspace(config.review))
    if label not in reviewed.columns:
        raise StepFailed(f"{config.review}: no label column {label!r}")
    filled = reviewed[label].notna() & (reviewed[label].astype(str).str.strip() != "")
    accepted = reviewed.loc[filled, [c for c in source.columns if c in reviewed.columns]]
    columns = list(source.columns)
    parts = [source, auto.reindex(columns=columns), accepted.reindex(columns=columns)]
    merged = pd.concat(parts, ignore_index=True)
    merged[label] = merged[label].astype(source[label].dtype) if source[label].dtype.kind in "iu" else merged[label]
    out = in_workspace(config.output) / source_path.name
    write_table(merged, out)
    new = file_digest(out)
    report = {"dataset": config.dataset, "source": spec.source.uri, "sourceRows": int(len(source)),
              "autoLabelled": int(len(auto)), "accepted": int(len(accepted)), "rejected": int((~filled).sum()),
              "rows": int(len(merged)), "oldDigest": old, "newDigest": new, "file": out.name}
    write_json(in_workspace(config.output) / "merge.json", report)
    log.info("merged %d auto-labelled and %d accepted rows into %s (%d rows): digest %s → %s",
             len(auto), len(accepted), out, len(merged), old, new)
    print(new)
    return 0


def run(argv: list[str] | None = None) -> int:
    return run_step(main, argv)


if __name__ == "__main__":
    sys.exit(run())
