"""Datasets: read a source, digest its canonical bytes, clean, label, split; read prepared splits.

The digest pins the *source* data (before cleaning), so a user can compute it once:

- ``file://`` and ``text://`` sources: sha256 of the file's bytes (``sha256sum`` gives the same).
- ``sklearn://NAME``: sha256 of a canonical encoding of the arrays scikit-learn ships
  (``forge-arrays/v1``, then for ``data`` and ``target``: name, dtype, shape, C-order little-endian
  bytes). ``python -m runtimes prepare --print-digest …`` prints it.

Prepared output (``PrepareConfig.output``): ``train.npz``, ``validation.npz``, ``test.npz`` (arrays
``x`` and ``y``; for text, ``tokens``) and ``meta.json`` (task, shapes, classes, feature transform).
"""

from __future__ import annotations

import hashlib
import importlib
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from runtimes._step import in_workspace, read_json, source_root
from runtimes.errors import StepFailed
from specs.dataset import Clip, DatasetSpec, Deduplicate, DropMissing, Filter, Standardize
from specs.safety import OutsideRoot, resolve_inside

LABEL = "__label__"
#: Largest source file read (docs/security.md); checked before reading.
MAX_SOURCE_BYTES = 16 * 1024**3


def canonical_array_digest(arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256(b"forge-arrays/v1\n")
    for name in sorted(arrays):
        arr = np.asarray(arrays[name])
        # Platform-independent: every float as little-endian float64, every integer as int64.
        if arr.dtype.kind == "f":
            arr = arr.astype("<f8")
        elif arr.dtype.kind in "iub":
            arr = arr.astype("<i8")
        arr = np.ascontiguousarray(arr)
        h.update(f"{name}|{arr.dtype.str}|{','.join(map(str, arr.shape))}\n".encode())
        h.update(arr.tobytes(order="C"))
    return "sha256:" + h.hexdigest()


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


@dataclass
class RawData:
    """A source as read: a table (features + label column) or a text, and its digest."""

    digest: str
    frame: Any = None  # pandas.DataFrame for tabular data
    text: bytes | None = None
    classes: list[str] = field(default_factory=list)
    image_shape: tuple[int, ...] | None = None


def read_parquet(path: Path) -> Any:
    """A Parquet file as a pandas frame, read by pyarrow from its path. Not ``pd.read_parquet``:
    that hands pyarrow an open Python file, after which pyarrow 26's thread pool can abort the
    interpreter at exit ("terminate called without an active exception", SIGABRT: 3 of 40 runs
    here; apache/arrow#34314, #50482) — a step that did its work would end 134 and be retried."""
    import pyarrow.parquet as pq

    return pq.read_table(str(path)).to_pandas()


def resolve_local(uri: str) -> Path:
    """The file a `file://`, `text://` or `pvc://` source names, which must stay inside its root (the
    source root, or the workspace's `pvc/` folder): `..`, absolute paths and symlinks leading out are
    refused, and so are FIFOs and devices."""
    scheme, _, rest = uri.partition("://")
    if scheme in ("file", "text", "pvc"):
        # pvc://claim/path: the workflow mounts claims under the workspace's `pvc/` folder.
        root = source_root() if scheme != "pvc" else in_workspace("pvc")
        try:
            return resolve_inside(root, rest, what=f"source {uri!r}")
        except OutsideRoot as exc:
            raise StepFailed(str(exc)) from None
    raise StepFailed(
        f"source {uri!r}: {scheme}:// is not read by this runtime (nothing is downloaded at run time); "
        "mount the data and use file:// or pvc://"
    )


def read_source(spec: DatasetSpec) -> RawData:
    import pandas as pd

    uri, fmt = spec.source.uri, spec.source.format
    if fmt == "sklearn":
        import sklearn.datasets as skd

        name = uri.removeprefix("sklearn://")
        bunch = getattr(skd, f"load_{name}")()
        x, y = np.asarray(bunch.data), np.asarray(bunch.target)
        digest = canonical_array_digest({"data": x, "target": y})
        columns = list(getattr(bunch, "feature_names", None) or [f"f{i}" for i in range(x.shape[1])])
        frame = pd.DataFrame(x, columns=[str(c) for c in columns])
        frame[LABEL] = y
        names = getattr(bunch, "target_names", None)
        classes = [str(c) for c in names] if names is not None and name != "diabetes" else []
        image_shape = (1, 8, 8) if name == "digits" else None
        return RawData(digest=digest, frame=frame, classes=classes, image_shape=image_shape)

    path = resolve_local(uri)
    if not path.is_file():
        raise StepFailed(f"source {uri!r}: no file at {path}")
    if path.stat().st_size > MAX_SOURCE_BYTES:
        raise StepFailed(f"source {uri!r}: {path.stat().st_size:,} bytes, more than the {MAX_SOURCE_BYTES:,} a "
                         "prepare step reads")
    digest = file_digest(path)
    if fmt == "text":
        return RawData(digest=digest, text=path.read_bytes())
    if fmt == "csv":
        frame = pd.read_csv(path)
    elif fmt == "parquet":
        frame = read_parquet(path)
    elif fmt == "npz":
        with np.load(path, allow_pickle=False) as npz:
            keys = {k.lower(): k for k in npz.files}
            if "x" not in keys or "y" not in keys:
                raise StepFailed(f"{path}: an NPZ data set needs arrays `x` and `y`, found {', '.join(npz.files)}")
            x, y = npz[keys["x"]], npz[keys["y"]]
        image_shape = tuple(x.shape[1:]) if x.ndim > 2 else None
        x2 = x.reshape(len(x), -1)
        frame = pd.DataFrame(x2, columns=[f"f{i}" for i in range(x2.shape[1])])
        frame[LABEL] = y
        return RawData(digest=digest, frame=frame, image_shape=image_shape)
    else:  # pragma: no cover - the spec's Literal stops this
        raise StepFailed(f"unknown format {fmt!r}")
    return RawData(digest=digest, frame=frame)


def _label(frame: Any, spec: DatasetSpec) -> Any:
    lab = spec.labeling
    if LABEL in frame.columns:
        return frame
    if lab.column:
        if lab.column not in frame.columns:
            raise StepFailed(f"label column {lab.column!r} not in the data (columns: {', '.join(map(str, frame.columns))})")
        frame = frame.rename(columns={lab.column: LABEL})
    elif lab.function:
        module, _, name = lab.function.partition(":")
        try:
            fn = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as exc:
            raise StepFailed(f"labeling function {lab.function}: {exc}") from None
        frame = frame.copy()
        frame[LABEL] = list(fn(frame))
    return frame


def _features(frame: Any, spec: DatasetSpec) -> list[str]:
    if spec.features:
        missing = [c for c in spec.features if c not in frame.columns]
        if missing:
            raise StepFailed(f"feature columns not in the data: {', '.join(missing)}")
        return list(spec.features)
    return [c for c in frame.columns if c != LABEL]


def prepare(spec: DatasetSpec, output: Path, verify_digest: bool = True) -> dict[str, Any]:
    """Read, check, clean, label and split; write the splits and ``meta.json``; return the meta."""
    raw = read_source(spec)
    if verify_digest and raw.digest != spec.digest:
        from runtimes.errors import DigestMismatch

        raise DigestMismatch(
            f"data digest {raw.digest} differs from the Dataset's {spec.digest}: the data changed "
            "(pin the new digest in the spec to retrain on it)"
        )
    output.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(spec.splits.seed)
    if raw.text is not None:
        return _prepare_text(spec, raw, output)

    frame, standardize, clips = _clean(_label(raw.frame, spec), spec)
    features = _features(frame, spec)
    x = frame[features].to_numpy(dtype=np.float32)
    task, y, classes = _targets(frame[LABEL], list(spec.labeling.classes) or list(raw.classes))
    if len(x) < 3:
        raise StepFailed(f"only {len(x)} rows left after cleaning")

    parts = _split(len(x), spec, rng)
    x, transform = _transform(x, parts["train"], features, clips, standardize)
    for name, idx in parts.items():
        _save_npz(output / f"{name}.npz", x=x[idx].astype(np.float32), y=y[idx])
    meta = {
        "task": task,
        "inputKind": "features",
        "numFeatures": int(x.shape[1]),
        "imageShape": list(raw.image_shape) if raw.image_shape else None,
        "classes": classes if task == "classification" else [],
        "numClasses": len(classes) if task == "classification" else 1,
        "features": [str(f) for f in features],
        "transform": transform,
        "digest": raw.digest,
        "rows": {k: int(len(v)) for k, v in parts.items()},
    }
    (output / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def _clean(frame: Any, spec: DatasetSpec) -> tuple[Any, bool, list[Clip]]:
    """The Dataset's cleaning steps, in order: (the cleaned frame, re-indexed; whether to
    standardize; the clips applied). Clipping and standardizing are also recorded in the meta's
    ``transform``, so that a server applies them to what it is sent; standardizing waits for the
    split, since its mean and spread are the training split's."""
    standardize = False
    clips: list[Clip] = []
    for step in spec.cleaning:
        if isinstance(step, DropMissing):
            frame = frame.dropna(subset=step.columns or None)
        elif isinstance(step, Deduplicate):
            frame = frame.drop_duplicates()
        elif isinstance(step, Clip):
            cols = step.columns or _features(frame, spec)
            frame = frame.copy()
            frame[cols] = frame[cols].clip(step.min, step.max)
            clips.append(step)
        elif isinstance(step, Filter):
            try:
                frame = frame.query(step.query)
            except Exception as exc:  # pandas raises many kinds here
                raise StepFailed(f"filter {step.query!r}: {exc}") from None
        elif isinstance(step, Standardize):
            standardize = True
    return frame.reset_index(drop=True), standardize, clips


def _targets(labels: Any, classes: list[str]) -> tuple[str, np.ndarray, list[str]]:
    """(task, targets, class names) from the label column: non-integral numbers without classes
    are a regression; integers (or integral floats) are class indices; anything else is a class
    name, looked up in ``classes`` (``labeling.classes``, else the source's, else sorted)."""
    if labels.dtype.kind == "f" and not classes and not np.allclose(labels, np.round(labels)):
        return "regression", labels.to_numpy(dtype=np.float32), classes
    if labels.dtype.kind in "iub" or (labels.dtype.kind == "f" and np.allclose(labels, np.round(labels))):
        y = labels.to_numpy().astype(np.int64)
        return "classification", y, classes or [str(c) for c in range(int(y.max()) + 1)]
    values = [str(v) for v in labels]
    classes = classes or sorted(set(values))
    index = {c: i for i, c in enumerate(classes)}
    unknown = sorted(set(values) - set(index))
    if unknown:
        raise StepFailed(f"labels not in labeling.classes: {', '.join(unknown[:5])}")
    return "classification", np.array([index[v] for v in values], dtype=np.int64), classes


def _split(rows: int, spec: DatasetSpec, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The rows of each split: one seeded permutation, cut at the spec's fractions."""
    order = rng.permutation(rows)
    n_train = max(1, int(round(rows * spec.splits.train)))
    n_val = int(round(rows * spec.splits.validation))
    return {
        "train": order[:n_train],
        "validation": order[n_train : n_train + n_val],
        "test": order[n_train + n_val :],
    }


def _transform(x: np.ndarray, train: np.ndarray, features: list[str], clips: list[Clip],
               standardize: bool) -> tuple[np.ndarray, dict[str, Any]]:
    """The features standardized with the training rows' mean and spread (when asked), and the
    meta's ``transform``: the clips and the standardization, as a server re-applies them."""
    transform: dict[str, Any] = {}
    if clips:
        transform["clip"] = [{"min": c.min, "max": c.max, "columns": [features.index(col) for col in c.columns] if c.columns else None} for c in clips]
    if standardize:
        xt = x[train]
        mean, std = xt.mean(axis=0), xt.std(axis=0)
        std[std == 0] = 1.0
        x = (x - mean) / std
        transform["standardize"] = {"mean": mean.tolist(), "std": std.tolist()}
    return x, transform


def _prepare_text(spec: DatasetSpec, raw: RawData, output: Path) -> dict[str, Any]:
    """Text is tokenised on the fly as bytes (vocabulary 256); splits are contiguous ranges."""
    text = raw.text or b""
    if any(isinstance(s, Deduplicate) for s in spec.cleaning):
        seen: set[bytes] = set()
        lines = []
        for line in text.splitlines(keepends=True):
            if line not in seen:
                seen.add(line)
                lines.append(line)
        text = b"".join(lines)
    tokens = np.frombuffer(text, dtype=np.uint8)
    n = len(tokens)
    n_train = int(n * spec.splits.train)
    n_val = int(n * spec.splits.validation)
    parts = {"train": tokens[:n_train], "validation": tokens[n_train : n_train + n_val], "test": tokens[n_train + n_val :]}
    for name, arr in parts.items():
        _save_npz(output / f"{name}.npz", tokens=arr)
    meta = {
        "task": "lm",
        "inputKind": "tokens",
        "vocabSize": 256,
        "classes": [],
        "numClasses": 256,
        "transform": {},
        "digest": raw.digest,
        "rows": {k: int(len(v)) for k, v in parts.items()},
    }
    (output / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def _save_npz(path: Path, **arrays: np.ndarray) -> None:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(buf.getvalue())
    tmp.replace(path)


@dataclass
class Prepared:
    """Prepared splits in memory; a sharded data set's stay in its files (``folder``), read by
    runtimes.learn.split_rows a bounded batch at a time."""

    meta: dict[str, Any]
    splits: dict[str, dict[str, np.ndarray]]
    folder: Path | None = None

    @property
    def sharded(self) -> bool:
        return "sharded" in self.meta

    def split(self, name: str) -> dict[str, np.ndarray]:
        if self.sharded:
            raise StepFailed(f"the {name} split of a sharded data set is streamed, never loaded whole "
                             "(runtimes.learn.split_rows)")
        return self.splits[name]


def is_sharded(folder: Path) -> bool:
    """Whether a prepared folder is a sharded data set's (its splits stay in the groups' files)."""
    return "sharded" in read_json(folder / "meta.json")


def load_prepared(folder: Path, names: tuple[str, ...] = ("train", "validation", "test")) -> Prepared:
    """The named splits in memory. A sharded data set's splits are not loaded: training streams
    its train split (runtimes.shard_stream.ShardStream) and every other step reads a split through
    runtimes.learn.split_rows, a bounded batch at a time."""
    meta = read_json(folder / "meta.json")
    splits: dict[str, dict[str, np.ndarray]] = {}
    if "sharded" in meta:
        return Prepared(meta=meta, splits={}, folder=folder)
    for name in names:
        path = folder / f"{name}.npz"
        if not path.exists():
            raise StepFailed(f"prepared split missing: {path} (did the prepare step run?)")
        with np.load(path, allow_pickle=False) as npz:
            splits[name] = {k: npz[k] for k in npz.files}
    return Prepared(meta=meta, splits=splits, folder=folder)
