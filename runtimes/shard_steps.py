"""``python -m runtimes prepare-group`` and ``python -m runtimes join-shards``: a sharded Dataset's
preparation, one group per step of the rendered fan-out, then the join.

prepare-group ``--group ID`` (the fan-out's item, a group identity: specs.stepconfig.shard_group_ids)
streams the group's shards (runtimes/shards.py: each shard's digest checked, clipped, split) into
``<output>/<ID>/{train,validation,test}/<shard>.parquet`` and writes ``<output>/<ID>/group.json``
last. It writes into a temporary folder renamed into place at the end, so a killed attempt leaves
nothing a join would accept, and a group another version already prepared is left as it is.

join-shards checks that the source holds exactly the pinned shards, that every group was prepared
from the pinned digests, and that the root of the tree is the spec's ``digest``; then it writes
``manifest.json`` (shards, groups, root, rows), ``meta.json`` (what train and evaluate read; its
``sharded`` entry points them to the manifest) and ``metrics.json``.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
from typing import Any

from runtimes._step import in_workspace, parse_config, read_json, run_step, write_json
from runtimes.errors import DigestMismatch, StepFailed
from specs.dataset import Clip, DatasetSpec
from specs.shards import combine, group_digests
from specs.stepconfig import JoinShardsConfig, PrepareGroupConfig, shard_group_ids

log = logging.getLogger("forge.shards")
GROUP_FILE = "group.json"
MANIFEST = "manifest.json"


def _group_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--group", required=True, help="the group's identity (the fan-out's item)")


def prepare_group_main(argv: list[str] | None = None) -> int:
    from runtimes import shards
    from runtimes.shard_source import open_source

    config, args = parse_config(PrepareGroupConfig, argv, "python -m runtimes prepare-group", _group_flag)
    spec = config.spec
    pinned = spec.source.shards
    if pinned is None:
        raise StepFailed(f"dataset {config.dataset} has no `source.shards`")
    ids = shard_group_ids(spec)
    if args.group not in ids:
        raise StepFailed(f"group {args.group!r} is not one of the {len(ids)} groups of dataset {config.dataset}")
    index = ids.index(args.group)
    first = index * pinned.group_size
    files = pinned.files[first : first + pinned.group_size]
    final = in_workspace(config.output) / args.group
    if (final / GROUP_FILE).is_file():
        log.info("group %d (%s) is already prepared", index, args.group)
        return 0
    location = open_source(spec.source)
    tmp = final.parent / f".{args.group}.{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    log.info("group %d/%d of %s: %d shard(s) from %s", index + 1, len(ids), config.dataset, len(files), spec.source.uri)
    result = shards.prepare_group(
        [location.path(f.name) for f in files], [f.digest for f in files], tmp, label=str(spec.labeling.column),
        splits=(spec.splits.train, spec.splits.validation, spec.splits.test), seed=spec.splits.seed, first_index=first,
        clips=[(c.min, c.max, list(c.columns) or None) for c in spec.cleaning if isinstance(c, Clip)],
        batch_rows=config.batch_rows, filesystem=location.filesystem)
    write_json(tmp / GROUP_FILE, {"group": args.group, "index": index, "digest": result["groupDigest"],
                                  "shards": [{"name": f.name, "digest": f.digest} for f in files],
                                  **{k: result[k] for k in ("rows", "label", "columns", "bytes", "seconds")}})
    try:
        tmp.rename(final)
    except OSError:  # prepared meanwhile by another run (the same identity: the same content)
        shutil.rmtree(tmp, ignore_errors=True)
        if not (final / GROUP_FILE).is_file():
            raise
    log.info("group %d: %s rows (train/validation/test), %.1f MB/s", index,
             "/".join(str(v) for v in result["rows"].values()), result["mbPerSecond"] or 0.0)
    return 0


def _task(spec: DatasetSpec, label: dict[str, Any]) -> tuple[str, list[str]]:
    """(task, class names) from the labels' range over every group."""
    classes = list(spec.labeling.classes)
    if label["min"] is None:
        raise StepFailed("the data set has no rows")
    if not label["integral"]:
        if classes:
            raise StepFailed("labeling.classes is set but the label column holds non-integral numbers")
        return "regression", []
    if label["min"] < 0:
        raise StepFailed(f"class labels must be indices from 0; found {label['min']}")
    top = int(label["max"])
    if classes and top >= len(classes):
        raise StepFailed(f"label {top} has no name in labeling.classes ({len(classes)} classes)")
    return "classification", classes or [str(c) for c in range(top + 1)]


def join_main(argv: list[str] | None = None) -> int:
    from runtimes.shard_source import check_listing, open_source

    config, _ = parse_config(JoinShardsConfig, argv, "python -m runtimes join-shards")
    spec = config.spec
    pinned = spec.source.shards
    if pinned is None:
        raise StepFailed(f"dataset {config.dataset} has no `source.shards`")
    check_listing(open_source(spec.source), [f.name for f in pinned.files])
    expected = group_digests(pinned.digests, pinned.group_size)
    groups = []
    for index, (ident, digest) in enumerate(zip(shard_group_ids(spec), expected)):
        folder = f"{config.groups}/{ident}"
        path = in_workspace(folder) / GROUP_FILE
        if not path.is_file():
            raise StepFailed(f"group {index} ({ident}) was not prepared: no {path}")
        group = read_json(path)
        if group["digest"] != digest:
            raise DigestMismatch(f"group {index}: prepared from {group['digest']}, the spec pins {digest}")
        groups.append({**group, "folder": folder})
    root = combine([g["digest"] for g in groups])
    if root != spec.digest:
        raise DigestMismatch(f"root digest {root} differs from the Dataset's {spec.digest}")
    label_column = str(spec.labeling.column)
    columns = groups[0]["columns"]
    features = list(spec.features) or [c for c in columns if c != label_column]
    for g in groups:
        missing = [c for c in [*features, label_column] if c not in g["columns"]]
        if missing:
            raise StepFailed(f"group {g['index']}: columns not in the data: {', '.join(missing)}")
    label = {"min": min(g["label"]["min"] for g in groups if g["label"]["min"] is not None),
             "max": max(g["label"]["max"] for g in groups if g["label"]["max"] is not None),
             "integral": all(g["label"]["integral"] for g in groups)} if any(g["label"]["min"] is not None for g in groups) \
        else {"min": None, "max": None, "integral": True}
    task, classes = _task(spec, label)
    rows = {s: sum(g["rows"][s] for g in groups) for s in ("train", "validation", "test")}
    out = in_workspace(config.output)
    manifest = {"dataset": config.dataset, "digest": root, "groupSize": pinned.group_size, "label": label_column,
                "features": features, "rows": rows,
                "groups": [{k: g[k] for k in ("index", "group", "digest", "folder", "rows", "shards")} for g in groups]}
    write_json(out / MANIFEST, manifest)
    clips = [c for c in spec.cleaning if isinstance(c, Clip)]
    transform: dict[str, Any] = {}
    if clips:
        transform["clip"] = [{"min": c.min, "max": c.max,
                              "columns": [features.index(col) for col in c.columns if col in features] if c.columns else None}
                             for c in clips]
    meta = {"task": task, "inputKind": "features", "numFeatures": len(features), "imageShape": None,
            "classes": classes if task == "classification" else [], "numClasses": len(classes) if task == "classification" else 1,
            "features": features, "transform": transform, "digest": root, "rows": rows, "sharded": {"manifest": MANIFEST, "loaderWorkers": pinned.loader_workers}}
    write_json(out / "meta.json", meta)
    write_json(out / "metrics.json", {"dataset": config.dataset, "digest": root, "rows": rows, "task": task,
                                      "shards": len(pinned.files), "groups": len(groups)})
    log.info("joined %s: %d shards in %d groups, %s rows (train/validation/test), root %s", config.dataset,
             len(pinned.files), len(groups), "/".join(str(v) for v in rows.values()), root[:19])
    return 0


def run_prepare_group(argv: list[str] | None = None) -> int:
    return run_step(prepare_group_main, argv)


def run_join(argv: list[str] | None = None) -> int:
    return run_step(join_main, argv)
