"""`Dataset`: a pinned version of the data a Model trains on, with its cleaning and labeling."""

from __future__ import annotations

import fnmatch
from typing import Annotated, Literal

from pydantic import Field, model_validator

from specs.base import MAX_SEED, Digest, ImportRef, LaterFieldsModel, Name, SpecModel, check_relative_path
from specs.shards import root_digest

DataFormat = Literal["sklearn", "csv", "parquet", "npz", "text"]
SKLEARN_DATASETS = ("digits", "iris", "wine", "breast_cancer", "diabetes")
#: Limits (docs/security.md): cleaning steps, named columns/features, label classes.
MAX_CLEANING_STEPS = 64
MAX_COLUMNS = 10_000
MAX_CLASSES = 100_000
Column = Annotated[str, Field(min_length=1, max_length=256)]
#: Shards a sharded source may pin (docs/security.md): the list is part of the spec.
MAX_SHARDS = 100_000
GLOB_CHARS = "*?["


class ShardFile(SpecModel):
    """One pinned shard: its file name in the source's folder and its digest."""

    name: str = Field(min_length=1, max_length=255, pattern=r"^[^/\\{}$*?\[\]]+$",
                      description="File name in the folder the source's glob names (no `/`).")
    digest: Digest = Field(description="sha256 of the file's bytes (`sha256sum`).")


class Shards(SpecModel):
    """A sharded Parquet source: the shards pinned in order, prepared in groups by a fan-out of
    parallel steps, each group memoized by its own digest.

    Why the shards are listed here rather than found at run time: the plan is made from the specs
    alone (nothing in the data is listed or read), and it must say which groups a change re-prepares;
    the list is what makes the fan-out's width and each group's cache key known before anything
    runs. `runtimes.shards.file_digest` and `tree` compute the digests and the root
    (examples/sharded/make_shards.py prints the whole block)."""

    group_size: int = Field(ge=1, le=10_000, description="Consecutive shards prepared by one step of the fan-out.")
    parallelism: int = Field(default=4, ge=1, le=1024, description="Groups prepared at the same time.")
    credentials_secret: Name | None = Field(
        default=None, description="`s3://` only: the Kubernetes Secret holding `AWS_ACCESS_KEY_ID` and "
        "`AWS_SECRET_ACCESS_KEY` (the local target reads them from its own environment). Credentials never "
        "come from a spec.",
    )
    loader_workers: int = Field(
        default=0, ge=0, le=64, description="DataLoader worker processes streaming the training shards on each "
        "rank (0: read in the training process).",
    )
    files: list[ShardFile] = Field(min_length=1, max_length=MAX_SHARDS,
                                   description=f"The shards in order (at most {MAX_SHARDS:,}).")

    @model_validator(mode="after")
    def _unique(self) -> Shards:
        names = [f.name for f in self.files]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise ValueError(f"shard {dup!r} is listed twice")
        return self

    @property
    def digests(self) -> list[str]:
        return [f.digest for f in self.files]

    @property
    def groups(self) -> int:
        return -(-len(self.files) // self.group_size)


class Source(LaterFieldsModel):
    """Where the data comes from. Nothing is downloaded at run time."""

    uri: str = Field(
        max_length=1100,
        pattern=r"^(sklearn://[a-z_]+|file://.+|s3://.+|gs://.+|pvc://.+|text://.+)$",
        description="`sklearn://digits` (a data set scikit-learn ships), `file://path` (relative to "
        "the Environment's `root`, and inside it), `s3://…`, `gs://…`, `pvc://claim/path` or "
        "`text://path` (text to tokenise, relative to `root` like `file://`).",
        examples=["sklearn://digits", "file://data/reviews.parquet"],
    )
    format: DataFormat = Field(description="How the bytes are read.")
    shards: Shards | None = Field(
        default=None, description="A sharded Parquet source: `uri` names the shards with a glob "
        "(`file://data/events/*.parquet`, `pvc://claim/events/*.parquet`, `s3://bucket/events/*.parquet`).",
    )

    added_later = {"shards": None}

    @property
    def folder_and_glob(self) -> tuple[str, str]:
        """(the folder part of the URI without its scheme, the last segment), e.g. ("data/events", "*.parquet")."""
        rest = self.uri.partition("://")[2]
        folder, _, glob = rest.rpartition("/")
        return folder, glob

    @property
    def local_path(self) -> str | None:
        """The path of a `file://`, `text://` or `pvc://` source (relative to its root), else None."""
        scheme, _, rest = self.uri.partition("://")
        return rest if scheme in ("file", "text", "pvc") else None

    @model_validator(mode="after")
    def _contained(self) -> Source:
        if self.local_path is not None:
            check_relative_path(self.local_path, f"source path of {self.uri.partition('://')[0]}://")
        return self

    @model_validator(mode="after")
    def _sklearn_name(self) -> Source:
        if self.uri.startswith("sklearn://"):
            name = self.uri.removeprefix("sklearn://")
            if name not in SKLEARN_DATASETS:
                raise ValueError(
                    f"unknown scikit-learn data set {name!r}; expected one of {', '.join(SKLEARN_DATASETS)}"
                )
            if self.format != "sklearn":
                raise ValueError("a `sklearn://` source needs `format: sklearn`")
        return self

    @model_validator(mode="after")
    def _sharded(self) -> Source:
        scheme = self.uri.partition("://")[0]
        folder, glob = self.folder_and_glob
        has_glob = any(c in self.uri for c in GLOB_CHARS)
        if self.shards is None:
            if has_glob:
                raise ValueError("a glob in `uri` needs `shards` (the pinned shard list)")
            return self
        if scheme not in ("file", "pvc", "s3"):
            raise ValueError(f"`shards` needs a `file://`, `pvc://` or `s3://` source, not {scheme}://")
        if self.format != "parquet":
            raise ValueError("`shards` needs `format: parquet`")
        if not folder or not any(c in glob for c in GLOB_CHARS) or any(c in folder for c in GLOB_CHARS):
            raise ValueError("with `shards`, `uri` names the shards with a glob in its last segment only, "
                             "e.g. `file://data/events/*.parquet`")
        if scheme == "s3" and self.shards.credentials_secret is None:
            raise ValueError("an `s3://` source needs `shards.credentialsSecret`: the Secret holding "
                             "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (credentials never come from a spec)")
        if scheme != "s3" and self.shards.credentials_secret is not None:
            raise ValueError("`shards.credentialsSecret` is for an `s3://` source only")
        unmatched = [f.name for f in self.shards.files if not fnmatch.fnmatchcase(f.name, glob)]
        if unmatched:
            raise ValueError(f"shard {unmatched[0]!r} does not match the glob {glob!r} of `uri`")
        return self


class Splits(SpecModel):
    """Fractions of the rows used for training, validation and the held-out test."""

    train: float = Field(default=0.8, gt=0, lt=1, description="Fraction used for training.")
    validation: float = Field(default=0.1, ge=0, lt=1, description="Fraction used for early stopping/HPO.")
    test: float = Field(default=0.1, gt=0, lt=1, description="Held-out fraction for offline evaluation.")
    seed: int = Field(default=0, ge=0, le=MAX_SEED, description="Seed of the shuffle before splitting.")

    @model_validator(mode="after")
    def _sum_to_one(self) -> Splits:
        total = self.train + self.validation + self.test
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"train + validation + test must be 1.0, got {total:g}")
        return self


class DropMissing(SpecModel):
    """Drop rows with a missing value in any (or the given) column."""

    op: Literal["dropMissing"] = Field(description="Step type.")
    columns: list[Column] = Field(default_factory=list, max_length=MAX_COLUMNS, description="Columns to check; empty means all.")


class Deduplicate(SpecModel):
    """Drop exact duplicate rows."""

    op: Literal["deduplicate"] = Field(description="Step type.")


class Clip(SpecModel):
    """Clip feature values into a range."""

    op: Literal["clip"] = Field(description="Step type.")
    min: float = Field(description="Lower bound.")
    max: float = Field(description="Upper bound.")
    columns: list[Column] = Field(
        default_factory=list, max_length=MAX_COLUMNS, description="Columns to clip; empty means all features."
    )

    @model_validator(mode="after")
    def _ordered(self) -> Clip:
        if self.max < self.min:
            raise ValueError(f"max ({self.max:g}) is below min ({self.min:g})")
        return self


class Standardize(SpecModel):
    """Scale features to zero mean and unit variance, fitted on the training split only."""

    op: Literal["standardize"] = Field(description="Step type.")


class Filter(SpecModel):
    """Keep rows for which a pandas query expression is true."""

    op: Literal["filter"] = Field(description="Step type.")
    query: str = Field(min_length=1, max_length=4096, description="A pandas `DataFrame.query` expression.")


CleaningStep = Annotated[
    DropMissing | Deduplicate | Clip | Standardize | Filter, Field(discriminator="op")
]


class AutoLabel(LaterFieldsModel):
    """Pre-label unlabelled rows with a registered model (`python -m runtimes autolabel`): rows whose
    top class reaches `confidence` get it as their label; the others go to a review file with the
    model's top-k classes. Accepted reviews are merged into the source (`python -m runtimes
    merge-labels`, or `forgectl labels merge`, which rewrites the `digest`): the plan then shows
    which models retrain. Rendered, it is the Workflow's `autolabel` step
    (renderers/workflow.py, `autolabel_steps`)."""

    model_ref: Name = Field(description="The registered Model whose `base` variant pre-labels.")
    confidence: float = Field(gt=0, le=1, description="Top-class probability at or above which a row is labelled without review.")
    top_k: int = Field(default=3, ge=1, le=20, description="Classes (with probabilities) shown per row in the review file.")
    unlabelled: str = Field(
        max_length=1024, pattern=r"^(file|pvc)://[^{}$]+$",
        description="`file://` (or `pvc://`) CSV/Parquet of rows to label: the source's feature columns, "
        "plus optionally `heldBackColumn`.",
    )
    held_back_column: Column | None = Field(
        default=None, description="A column of true labels held back from labelling, only to measure the agreement.",
    )
    review_format: Literal["csv", "parquet"] = Field(default="csv", description="Format of the review file.")
    min_agreement: float | None = Field(
        default=None, ge=0, le=1,
        description="Fail the `autolabel` step when the auto-labels agree with the held-back labels less "
        "than this (a fraction; needs `heldBackColumn`). None: recorded, not gated.",
    )

    added_later = {"min_agreement": None}

    @model_validator(mode="after")
    def _contained(self) -> AutoLabel:
        check_relative_path(self.unlabelled.partition("://")[2], "labeling.auto.unlabelled")
        if self.min_agreement is not None and not self.held_back_column:
            raise ValueError("`minAgreement` needs `heldBackColumn` (the held-back labels it is measured against)")
        return self


class Labeling(LaterFieldsModel):
    """Where labels come from: a column, or a function that labels each row."""

    column: Column | None = Field(default=None, description="Column that holds the label (CSV/Parquet).")
    function: ImportRef | None = Field(
        default=None, description="A `module:function` called with a DataFrame, returning labels."
    )
    classes: list[Annotated[str, Field(max_length=256)]] = Field(
        default_factory=list, max_length=MAX_CLASSES,
        description=f"Class names in label order, used by reports and serving (at most {MAX_CLASSES:,}).",
    )
    auto: AutoLabel | None = Field(default=None, description="Auto-labeling with a registered model; none: off.")

    added_later = {"auto": None}

    @model_validator(mode="after")
    def _one_source(self) -> Labeling:
        if self.column and self.function:
            raise ValueError("give `column` or `function`, not both")
        return self


class DatasetSpec(SpecModel):
    """A versioned data set. The content digest pins it: when it moves, models retrain."""

    source: Source = Field(description="Where the data comes from.")
    version: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,62}$", description="Human version label, e.g. `2024-06-01` or `v3`."
    )
    digest: Digest = Field(
        description="sha256 of the data's canonical bytes. The prepare step checks it and fails on a "
        "mismatch; a change of digest is what tells the plan to retrain."
    )
    splits: Splits = Field(default_factory=Splits, description="Train/validation/test split.")
    cleaning: list[CleaningStep] = Field(
        default_factory=list, max_length=MAX_CLEANING_STEPS,
        description=f"Cleaning steps, run in order (at most {MAX_CLEANING_STEPS}).",
    )
    labeling: Labeling = Field(default_factory=Labeling, description="Where labels come from.")
    features: list[Column] = Field(
        default_factory=list, max_length=MAX_COLUMNS,
        description="Feature columns (CSV/Parquet); empty means every non-label column.",
    )

    @model_validator(mode="after")
    def _tabular_label(self) -> DatasetSpec:
        if self.source.format in ("csv", "parquet") and not (self.labeling.column or self.labeling.function):
            raise ValueError("a CSV or Parquet data set needs `labeling.column` or `labeling.function`")
        return self

    @model_validator(mode="after")
    def _sharded(self) -> DatasetSpec:
        shards = self.source.shards
        if shards is None:
            return self
        if not self.labeling.column:
            raise ValueError("a sharded data set needs `labeling.column` (each batch is labelled as it streams)")
        other = sorted({s.op for s in self.cleaning if not isinstance(s, Clip)})
        if other:
            raise ValueError(f"a sharded data set streams its rows and applies `clip` only; not {', '.join(other)}")
        root = root_digest(shards.digests, shards.group_size)
        if self.digest != root:
            raise ValueError(f"`digest` must be the root of the pinned shards' tree, {root} "
                             "(runtimes.shards.tree of the listed digests)")
        return self
