"""The configs that rendered workflow steps and model servers hand to the runtimes.

This is the seam between `renderers/` (which build these values, purely) and `runtimes/` (which
read them): both import only `specs`. A step receives its config as JSON (`--config FILE` or
`--config-json TEXT`). Every path in a config is relative to the workspace root — the
`FORGE_WORKSPACE` environment variable (`/forge/workspace` in the runtime images, where the
workflow's shared volume is mounted; `.forge/workspace` for the local target) — so the same
rendered manifest runs in a cluster and on one machine.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field

from specs.base import LaterFieldsModel, Name, SpecModel
from specs.compression import Benchmark, HardwareTarget, OnnxInt8, TensorRT, Variant
from specs.dataset import DatasetSpec
from specs.endpoint import Batching, FaultInjection, ServingBackend
from specs.environment import StudyDatabase
from specs.model import Explanations, ModelSpec, ModelThreshold, Robustness, Search
from specs.shards import group_digests, group_identity

WORKSPACE_ENV = "FORGE_WORKSPACE"
DEFAULT_WORKSPACE = "/forge/workspace"

#: Exit codes of a step that retrying cannot fix (the runtimes raise them, the renderer's
#: `retryStrategy.expression` and therefore Argo and the local executor leave them alone).
EXIT_DIGEST_MISMATCH = 2
EXIT_THRESHOLDS_FAILED = 3
EXIT_UPSTREAM_FAILED = 5  # 4 was a rejected variant's: a verdict now, not a failure (runtimes.verdicts)
PERMANENT_EXIT_CODES = (EXIT_DIGEST_MISMATCH, EXIT_THRESHOLDS_FAILED, EXIT_UPSTREAM_FAILED)


class StepConfig(SpecModel):
    """Fields common to every step config."""

    step: str = Field(description="The step's kind.")
    cache_key: str = Field(default="", description="Content-addressed key of this step (sha256 hex).")


class PrepareConfig(StepConfig):
    """Read, check (digest), clean, label and split a Dataset into `output/{train,validation,test}.npz`."""

    step: Literal["prepare"] = "prepare"
    dataset: Name = Field(description="Dataset name.")
    spec: DatasetSpec = Field(description="The Dataset spec.")
    output: str = Field(description="Folder to write the splits and `meta.json` into.")
    verify_digest: bool = Field(default=True, description="Fail when the data's digest differs from the spec.")


def shard_settings(spec: DatasetSpec) -> dict[str, Any]:
    """What a prepared group depends on besides its shards: label, features, clips, splits."""
    return {"label": spec.labeling.column, "features": list(spec.features),
            "clip": [c.model_dump(mode="json", by_alias=True) for c in spec.cleaning],
            "splits": spec.splits.model_dump(mode="json", by_alias=True)}


def shard_group_ids(spec: DatasetSpec) -> list[str]:
    """Each group's identity (its folder name under the groups folder, and its fan-out item), in order."""
    shards = spec.source.shards
    assert shards is not None
    settings = shard_settings(spec)
    return [group_identity(d, i * shards.group_size, settings)
            for i, d in enumerate(group_digests(shards.digests, shards.group_size))]


class PrepareGroupConfig(StepConfig):
    """Stream one group of a sharded Dataset's shards (`--group ID`, the fan-out item) into
    `groups/<ID>/{train,validation,test}/<shard>.parquet` and `groups/<ID>/group.json`."""

    step: Literal["prepare-group"] = "prepare-group"
    dataset: Name = Field(description="Dataset name.")
    spec: DatasetSpec = Field(description="The Dataset spec (with `source.shards`).")
    output: str = Field(description="Folder of the prepared groups, one sub-folder per group identity.")
    batch_rows: int = Field(default=16_384, ge=1, le=1 << 24, description="Rows read at a time (bounds the memory).")


class JoinShardsConfig(StepConfig):
    """Join a sharded Dataset's prepared groups: check every group and the root digest, check that
    the source holds exactly the pinned shards, write `manifest.json` and `meta.json`."""

    step: Literal["join-shards"] = "join-shards"
    dataset: Name = Field(description="Dataset name.")
    spec: DatasetSpec = Field(description="The Dataset spec (with `source.shards`).")
    groups: str = Field(description="Folder of the prepared groups (the fan-out's `output`).")
    output: str = Field(description="Folder for `manifest.json`, `meta.json` and `metrics.json`.")


class AutoLabelConfig(StepConfig):
    """Pre-label a Dataset's unlabelled rows with a registered model (`labeling.auto`)."""

    step: Literal["autolabel"] = "autolabel"
    dataset: Name = Field(description="Dataset name.")
    spec: DatasetSpec = Field(description="The Dataset spec (with `labeling.auto`).")
    model_dir: str = Field(description="Folder of the labelling model's bundle (its registered `base`).")
    output: str = Field(description="Folder for `auto-labels.csv`, the review file and `report.json`.")


class MergeLabelsConfig(StepConfig):
    """Merge auto-labels and accepted reviews into a copy of the Dataset's source, with its new digest."""

    step: Literal["merge-labels"] = "merge-labels"
    dataset: Name = Field(description="Dataset name.")
    spec: DatasetSpec = Field(description="The Dataset spec (with `labeling.auto`).")
    labels: str = Field(description="The autolabel step's output folder.")
    review: str = Field(description="The reviewed file (CSV/Parquet): rows whose `label` is filled are accepted.")
    output: str = Field(description="Folder for the merged source file and `merge.json` (with its digest).")


#: What starts the one line a one-off pod's step prints for forgectl to read from the pod's log
#: (`labels-export`, `merge-labels --then-publish`): the log holds the step's stderr as well.
RESULT_PREFIX = "forge-result: "


class LabelsExportConfig(StepConfig):
    """Print an `autolabel` step's output folder (its review file, auto-labels and report) as one
    JSON line, for `forgectl labels pull` to read from the pod's log on a cluster."""

    step: Literal["labels-export"] = "labels-export"
    labels: str = Field(description="The autolabel step's output folder (workspace-relative).")


#: The variable a study's steps read a `studyDatabase` URL from (the Secret's key, rendered as env).
STUDY_URL_ENV = "FORGE_STUDY_URL"
#: The variable naming the run a study in a database belongs to (the Workflow's uid): a database
#: outlives the workspace, so a version trained again starts a study of its own.
STUDY_RUN_ENV = "FORGE_STUDY_RUN"


class SearchStudy(LaterFieldsModel):
    """The Optuna study of a search whose trials learn (`tpe`) or stop early (`asha`, `median`): an
    RDB storage every trial reaches — a SQLite file on the workspace volume, or the cluster's
    PostgreSQL database (the Environment's `kubernetes.studyDatabase`)."""

    storage: str = Field(description="The study's SQLite file (workspace-relative); ignored with `database`.")
    name: str = Field(description="The study's name (the model and its version).")
    search: Search = Field(description="The Model's search: algorithm, early stopping, metric, goal, space.")
    seed: int = Field(ge=0, description="Seed of the sampler (from the spec's digest).")
    database: StudyDatabase | None = Field(
        default=None, description="The PostgreSQL database holding the study instead (its URL from a Secret, "
        f"as `{STUDY_URL_ENV}`; the run's id as `{STUDY_RUN_ENV}`).",
    )

    added_later = {"database": None}

    @property
    def where(self) -> str:
        """Where the study is kept, as a person reads it."""
        if self.database is not None:
            return f"the PostgreSQL database of Secret {self.database.secret}"
        return self.storage


class StudyTrial(SpecModel):
    """One trial task of a search that runs against its study."""

    study: SearchStudy = Field(description="The study.")
    index: int = Field(ge=0, description="The trial task's index in the fan-out (a retried task replaces its own trial).")


class TrainConfig(StepConfig, LaterFieldsModel):
    """Train one Model (or one hyperparameter-search trial) on prepared data."""

    step: Literal["train"] = "train"
    model: Name = Field(description="Model name.")
    version: str = Field(description="Model version being trained (content-addressed).")
    spec: ModelSpec = Field(description="The Model spec.")
    overrides: dict[str, float | int | str] = Field(
        default_factory=dict, description="Hyperparameters (camelCase) replacing the spec's, for a search trial."
    )
    data: str = Field(description="Folder of the prepared splits.")
    output: str = Field(description="Folder for `model.pt`, `model.json`, `metrics.json` and checkpoints.")
    deepspeed: dict[str, Any] | None = Field(default=None, description="DeepSpeed config JSON (strategy deepspeed).")
    checkpoint_every: int = Field(default=50, ge=1, description="Optimizer steps between checkpoints.")
    trial: StudyTrial | None = Field(
        default=None, description="A search trial run against its study: the hyperparameters asked of it "
        "(after `overrides`), the validation metric reported each epoch, stopped when pruned.",
    )

    added_later = {"trial": None}


class PickBestConfig(StepConfig, LaterFieldsModel):
    """Choose the best trial of a hyperparameter search and copy it to `output`."""

    step: Literal["pick-best"] = "pick-best"
    model: Name = Field(description="Model name.")
    trials: list[str] = Field(min_length=1, description="Output folders of the trials.")
    metric: str = Field(description="Validation metric to compare.")
    goal: Literal["maximize", "minimize"] = Field(description="Whether higher is better.")
    output: str = Field(description="Folder receiving the best trial's model.")
    study: SearchStudy | None = Field(
        default=None, description="The search's study: the best of its completed trials is picked (pruned ones "
        "never are), and `trials.json` records every trial's state.",
    )

    added_later = {"study": None}


class EvaluateConfig(StepConfig, LaterFieldsModel):
    """Measure a trained model on the held-out split and check the offline thresholds."""

    step: Literal["evaluate"] = "evaluate"
    model: Name = Field(description="Model name.")
    model_dir: str = Field(description="Folder of the trained model.")
    data: str = Field(description="Folder of the prepared splits.")
    thresholds: list[ModelThreshold] = Field(default_factory=list, description="Offline gates.")
    output: str = Field(description="Folder for `metrics.json`.")
    robustness: Robustness | None = Field(default=None, description="Adversarial accuracy to measure (FGSM/PGD).")

    added_later = {"robustness": None}


class ExplainConfig(StepConfig):
    """Attributions of an evaluated model (Captum) on a sample of the held-out split."""

    step: Literal["explain"] = "explain"
    model: Name = Field(description="Model name.")
    model_dir: str = Field(description="Folder of the trained model.")
    data: str = Field(description="Folder of the prepared splits.")
    settings: Explanations = Field(default_factory=Explanations, description="Methods, sample, maps.")
    output: str = Field(description="Folder for `explanations.json`, `metrics.json` and `maps/*.png`.")


class CompressConfig(StepConfig):
    """Build one compressed variant of an evaluated model."""

    step: Literal["compress"] = "compress"
    model: Name = Field(description="Model name.")
    variant: Variant = Field(description="The variant and its stages.")
    model_dir: str = Field(description="Folder of the evaluated base model.")
    data: str = Field(description="Folder of the prepared splits.")
    teachers: dict[str, str] = Field(default_factory=dict, description="Teacher Model name → its model folder.")
    hardware_target: HardwareTarget = Field(description="Hardware the variant is built for.")
    max_accuracy_drop: float = Field(description="Most accuracy (points) the variant may lose.")
    output: str = Field(description="Folder for the variant's model and `report.json`.")


class ExportConfig(StepConfig):
    """Export one float variant to ONNX, verify it against PyTorch on the held-out split, and (CPU
    and ARM targets) quantize it to static INT8 with ONNX Runtime, calibrated on training rows."""

    step: Literal["export"] = "export"
    model: Name = Field(description="Model name.")
    source: Name = Field(description="The variant exported (`base` or a float compression variant).")
    model_dir: str = Field(description="Folder of the source variant's bundle.")
    data: str = Field(description="Folder of the prepared splits.")
    hardware_target: HardwareTarget = Field(description="Hardware the export is built for.")
    opset: int = Field(default=18, description="ONNX opset.")
    max_abs_diff: float = Field(description="Largest class-probability difference PyTorch vs ONNX Runtime allowed.")
    int8: OnnxInt8 | None = Field(default=None, description="ONNX Runtime static INT8 (None: not for this target).")
    max_accuracy_drop: float = Field(description="Most accuracy (points) the INT8 export may lose against its source.")
    output: str = Field(description="Folder receiving `onnx/`, `onnx-int8/` and `report.json`.")


class EngineConfig(StepConfig):
    """Build a TensorRT engine from a verified ONNX export (`trtexec`), on the target device."""

    step: Literal["build-engine"] = "build-engine"
    model: Name = Field(description="Model name.")
    source: Name = Field(description="The variant whose ONNX export is built.")
    onnx_dir: str = Field(description="Folder of the verified ONNX bundle.")
    hardware_target: HardwareTarget = Field(description="The device the engine is for.")
    tensorrt: TensorRT = Field(description="Engine settings.")
    required: bool = Field(description="Fail when TensorRT is missing (a cluster's GPU node); otherwise record "
                                       "the engine as not built (a machine without TensorRT).")
    output: str = Field(description="Folder receiving `model.engine` and `report.json`.")


class BenchmarkConfig(StepConfig):
    """Measure every variant of a version on this node: accuracy on the held-out split, latency
    (p50/p99) and throughput per batch size, peak memory."""

    step: Literal["benchmark"] = "benchmark"
    model: Name = Field(description="Model name.")
    version: str = Field(description="Model version.")
    variants: dict[str, str] = Field(description="Variant name → bundle folder (PyTorch or ONNX).")
    data: str = Field(description="Folder of the prepared splits.")
    hardware_target: HardwareTarget = Field(description="Hardware the variants were built for (recorded).")
    settings: Benchmark = Field(default_factory=Benchmark, description="Batch sizes, time and threads.")
    output: str = Field(description="Folder for `benchmark.json`.")


class RegisterConfig(StepConfig, LaterFieldsModel):
    """Record a model version and its variants in the registry."""

    step: Literal["register"] = "register"
    model: Name = Field(description="Model name.")
    version: str = Field(description="Model version.")
    variants: dict[str, str] = Field(description="Variant name (`base` included) → model folder.")
    output: str = Field(description="Registry folder of this version.")
    benchmark: str | None = Field(default=None, description="Folder of the version's `benchmark.json`, recorded per variant.")
    artifacts: dict[str, str] = Field(
        default_factory=dict, description="Name → folder of a built artifact that is not a servable bundle (a "
                                          "TensorRT engine): its `report.json` is recorded, built or not.")

    added_later = {"benchmark": None, "artifacts": {}}


class AwaitConfig(StepConfig, LaterFieldsModel):
    """Wait until files another run writes exist: a teacher's registration before distillation, a
    model version's registration before its server starts. Fails at once when a run it waits for
    recorded a failed outcome, and after `timeoutSeconds`."""

    step: Literal["await"] = "await"
    paths: list[str] = Field(min_length=1, description="Files that must all exist (workspace-relative).")
    outcomes: list[str] = Field(default_factory=list,
                                description="`outcome.json` files of the awaited runs: one whose status is not "
                                            "`Succeeded` fails the wait.")
    what: str = Field(description="What is awaited, for the log.")
    timeout_seconds: int = Field(default=86_400, ge=0, le=30 * 86_400, description="Give up after this long.")
    poll_seconds: float = Field(default=10.0, gt=0, le=3600, description="Time between two looks.")
    variant: Name | None = Field(default=None,
                                 description="The variant the waiter serves: once a `registry.json` among `paths` "
                                             "exists, a registration whose step rejected this variant fails the wait "
                                             "at once, with the step's reason.")

    added_later = {"variant": None}

    def registrations(self) -> list[str]:
        """The awaited paths that are registrations (``registry.json``, which name rejected variants)."""
        return [p for p in self.paths if p.rsplit("/", 1)[-1] == "registry.json"]

    def rejected(self, registration: Mapping[str, Any]) -> str | None:
        """Why ``registration`` (a ``registry.json``, parsed) has nothing to serve as :attr:`variant`:
        its step rejected it (None: it has one, or no variant is awaited). The local target asks it
        of the files as the init container does (runtimes.await_files)."""
        if self.variant is None:
            return None
        reason = rejection_reasons(registration).get(self.variant)
        return rejected_line(self.variant, str(registration.get("version")), reason) if reason is not None else None


def rejection_reasons(registration: Mapping[str, Any]) -> dict[str, str]:
    """The variants a registration lists as rejected, with their step's reasons: ``registry.json``
    keeps each as ``{reason, report}``, the cluster's `metrics` summary as its reason alone."""
    return {name: str(why.get("reason") if isinstance(why, Mapping) else why)
            for name, why in sorted((registration.get("rejected") or {}).items())}


def rejected_line(variant: str, version: str, reason: str) -> str:
    """How a rejected variant is named wherever it stops something (a server's wait, an offline gate)."""
    return f"variant {variant} of version {version} was rejected: {reason}"


class MirrorConfig(SpecModel):
    """Where a live model server sends copies of the requests it answered, and compares the
    answers (runtimes/serving/mirror.py): the shadow predictor of an Endpoint whose router
    mirrors nothing itself (`gatewayAPI`)."""

    url: str = Field(max_length=512, pattern=r"^http://[A-Za-z0-9.\-]+(:[0-9]{1,5})?$",
                     description="Base URL of the shadow's server (`http://host:port`); the request's own path is kept.")
    percent: int = Field(default=100, ge=1, le=100, description="Percent of the answered requests copied.")
    max_in_flight: int = Field(default=16, ge=1, le=1024,
                               description="Copies outstanding at once; one more is dropped (and counted), never queued.")
    timeout_ms: int = Field(default=2000, ge=10, le=60_000, description="A copy unanswered this long counts as failed.")


class ServeConfig(LaterFieldsModel):
    """One model server of an Endpoint's predictor."""

    endpoint: Name = Field(description="Endpoint name (a metrics label).")
    namespace: str = Field(default="default", description="Namespace (a metrics label).")
    model: Name = Field(description="Model name.")
    version: str = Field(description="Model version served (a metrics label).")
    variant: Name = Field(default="base", description="Compression variant served.")
    role: Name = Field(default="stable", description="Predictor role (a metrics label): `stable`, `canary`, `shadow` or an experiment arm's name.")
    model_dir: str = Field(description="Folder of the served model.")
    batching: Batching = Field(default_factory=Batching, description="Dynamic batching.")
    fault_injection: FaultInjection | None = Field(default=None, description="Injected faults for drills.")
    host: str = Field(default="0.0.0.0", description="Listen address.")
    port: int = Field(default=8080, ge=0, le=65535, description="HTTP port (0 picks a free one).")
    backend: ServingBackend | None = Field(default=None, description="Variant selection and threads (the Endpoint's `backend`).")
    mirror: MirrorConfig | None = Field(default=None, description="Copies of the answered requests to the shadow, compared.")

    added_later = {"backend": None, "mirror": None}


AnyStepConfig = (PrepareConfig | PrepareGroupConfig | JoinShardsConfig | TrainConfig | PickBestConfig | EvaluateConfig | ExplainConfig | CompressConfig
                 | ExportConfig | EngineConfig | BenchmarkConfig | RegisterConfig)
