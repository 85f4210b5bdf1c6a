"""The model registry: every registered version with its variants, measurements and lineage.

A record is built from two things the pipeline already leaves behind:

- the **Workflow** that produced the version (its manifest is the lineage): the model and version
  labels, the spec digest and git revision annotations, the dataset and its pinned digest (the
  prepare step's config), the Model spec as trained (the train step's config), the compression
  variants, the distillation teachers with their versions (the compress steps' `teachers`);
- the **registration** the `register` step wrote (`registry/<model>/<version>/registry.json`):
  per variant the weights' size and sha256, parameters, the compress/export reports and the
  `benchmark` step's accuracy, latency per batch size, throughput and memory; plus the evaluation.

A record is a typed value, :class:`Record` — its :class:`Lineage` (with the :class:`Parent`
versions), the evaluation, each :class:`Variant` with its :class:`Figures`, and who serves it
(:class:`Served`) — built here by :func:`build_record` and read by attribute everywhere else;
:meth:`Record.to_json` is what `forgectl models -o json` prints and the local target stores. What
a runtime wrote and Forge only passes on (a variant's registration entry, the hardware, the trust
reports, the step settings in the lineage) stays the JSON it was (:data:`JSONObject`).

Where it is kept is the target's business: the local target stores each record in its SQLite
state DB (:mod:`reconciler.targets.local.records`: written when a workflow succeeds, backfilled
from live Workflows otherwise); on a cluster the records are read from the Workflows themselves
(:mod:`reconciler.targets.kubernetes.records`: the register step's `metrics` output parameter
carries the per-variant summary). Which endpoints serve a version is never stored: it is read from
the live SeldonDeployments (and the rollout states) when asked (:mod:`reconciler.observe.models`).

Everything here is pure: the targets build their records with it, so it imports no target (nor
anything above them) — a value module below the targets, as the rooms' rules say
(docs/architecture.md).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from reconciler.diagnostics import ForgeError
from reconciler.specdiff import spec_changes
from renderers.labels import ENDPOINT, GIT_REVISION, MODEL_VERSION, NAME, ROLE, SPEC_DIGEST, VARIANT
from renderers.workflow import workflow_steps
from specs.stepconfig import rejected_line, rejection_reasons

#: A JSON object another program wrote — a step's config as rendered, a runtime's report — kept as
#: it is. `Any` is what `json.loads` gives (the values are whatever the writer put there); Forge
#: reads such an object only where it names a key, and passes the rest through to `-o json`.
JSONObject = Mapping[str, Any]

#: Figures of a variant the leaderboard and `models show` use, by their JSON names.
FIGURES = ("accuracy", "sizeBytes", "parameters", "p50Ms", "p99Ms", "throughput", "memoryBytes")


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# -- the record and its parts ---------------------------------------------------------------------

@dataclass(frozen=True)
class Parent:
    """A version this one was made from: a distillation teacher of the student ``variant``, or the
    model that pre-labelled its data set (`labeling.auto`; relation ``labelling model``)."""

    model: str
    version: str | None
    relation: str
    variant: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "version": self.version, "relation": self.relation, "variant": self.variant}

    @classmethod
    def from_json(cls, data: JSONObject) -> Parent:
        return cls(data["model"], data.get("version"), data.get("relation", ""), data.get("variant"))


@dataclass(frozen=True)
class Lineage:
    """Where a version came from, as the Workflow that produced it says."""

    workflow: str | None = None
    model: str | None = None
    version: str | None = None
    spec_digest: str | None = None
    #: The specs' git revision (`-dirty` when the working tree had changes).
    git_revision: str | None = None
    dataset: str | None = None
    dataset_digest: str | None = None
    dataset_version: str | None = None
    parents: tuple[Parent, ...] = ()
    #: The Model spec as trained (the train step's config).
    spec: JSONObject = field(default_factory=dict)
    #: Variant → its compress step's settings (`stages`, `hardwareTarget`, `maxAccuracyDrop`), as rendered.
    compression: Mapping[str, JSONObject] = field(default_factory=dict)
    #: Export and engine-build step → the settings it was rendered with.
    exports: Mapping[str, JSONObject] = field(default_factory=dict)
    steps: tuple[str, ...] = ()

    @property
    def git_commit(self) -> str | None:
        """The commit the specs came from (the revision without `-dirty`)."""
        return self.git_revision.removesuffix("-dirty") if self.git_revision else None

    @property
    def uncommitted(self) -> bool:
        """Whether the working tree had changes the commit does not hold."""
        return bool(self.git_revision and self.git_revision.endswith("-dirty"))

    def to_json(self) -> dict[str, Any]:
        return {
            "workflow": self.workflow,
            "model": self.model,
            "version": self.version,
            "specDigest": self.spec_digest,
            "gitRevision": self.git_revision,
            "gitCommit": self.git_commit,
            "uncommitted": self.uncommitted,
            "dataset": self.dataset,
            "datasetDigest": self.dataset_digest,
            "datasetVersion": self.dataset_version,
            "parents": [p.to_json() for p in self.parents],
            "spec": self.spec,
            "compression": self.compression,
            "exports": self.exports,
            "steps": list(self.steps),
        }

    @classmethod
    def from_json(cls, data: JSONObject) -> Lineage:
        return cls(data.get("workflow"), data.get("model"), data.get("version"), data.get("specDigest"),
                   data.get("gitRevision"), data.get("dataset"), data.get("datasetDigest"), data.get("datasetVersion"),
                   tuple(Parent.from_json(p) for p in data.get("parents") or []), data.get("spec") or {},
                   data.get("compression") or {}, data.get("exports") or {}, tuple(data.get("steps") or []))


@dataclass(frozen=True)
class Point:
    """Latency and throughput at one batch size, as the benchmark step measured them."""

    p50_ms: float | None = None
    p99_ms: float | None = None
    throughput: float | None = None

    @classmethod
    def from_json(cls, data: JSONObject) -> Point:
        return cls(data.get("p50Ms"), data.get("p99Ms"), data.get("throughput"))


@dataclass(frozen=True)
class Figures:
    """One variant's figures: accuracy (and which step measured it), size, parameters, and the
    benchmark's latency and throughput at one batch size and memory (see :func:`variant_figures`)."""

    variant: str
    kind: str | None
    runtime: str
    source: str | None
    accuracy: float | None
    #: `benchmark`, `report` (the compress/export report) or `evaluate`; None without an accuracy.
    accuracy_from: str | None
    size_bytes: int | None
    parameters: int | None
    p50_ms: float | None
    p99_ms: float | None
    throughput: float | None
    memory_bytes: int | None
    #: Batch size → the benchmark's figures at it, as the step wrote them.
    batches: Mapping[str, JSONObject] = field(default_factory=dict)

    def at(self, batch: str) -> Point | None:
        """The latency and throughput at ``batch`` rows, when the benchmark measured that size."""
        found = self.batches.get(batch)
        return Point.from_json(found) if found else None

    def named(self) -> dict[str, float | None]:
        """The :data:`FIGURES` by their JSON names."""
        return {"accuracy": self.accuracy, "sizeBytes": self.size_bytes, "parameters": self.parameters, "p50Ms": self.p50_ms,
                "p99Ms": self.p99_ms, "throughput": self.throughput, "memoryBytes": self.memory_bytes}

    def to_json(self) -> dict[str, Any]:
        return {
            "variant": self.variant, "kind": self.kind, "runtime": self.runtime, "source": self.source,
            "accuracy": self.accuracy, "accuracyFrom": self.accuracy_from, "sizeBytes": self.size_bytes,
            "parameters": self.parameters, "p50Ms": self.p50_ms, "p99Ms": self.p99_ms, "throughput": self.throughput,
            "memoryBytes": self.memory_bytes, "batches": self.batches,
        }

    @classmethod
    def from_json(cls, data: JSONObject) -> Figures:
        return cls(data["variant"], data.get("kind"), data.get("runtime") or "pytorch", data.get("source"),
                   data.get("accuracy"), data.get("accuracyFrom"), data.get("sizeBytes"), data.get("parameters"),
                   data.get("p50Ms"), data.get("p99Ms"), data.get("throughput"), data.get("memoryBytes"),
                   data.get("batches") or {})


@dataclass(frozen=True)
class Variant:
    """One registered variant: its entry in the registration, as the register step wrote it (path,
    sha256, sizeBytes, kind, parameters, the compress/export `report` and `metrics`, the
    `benchmark` step's figures), and the figures Forge reads from it."""

    registration: JSONObject
    figures: Figures

    def measured(self, metric: str) -> float | None:
        """``metric`` as the benchmark step, the variant's own step (`metrics`) or its report
        (`report.after`) measured it, the first that has it."""
        reg = self.registration
        for source in (reg.get("benchmark") or {}, reg.get("metrics") or {}, (reg.get("report") or {}).get("after") or {}):
            if isinstance(source.get(metric), (int, float)):
                return float(source[metric])
        return None

    def to_json(self) -> dict[str, Any]:
        return {**self.registration, "figures": self.figures.to_json()}

    @classmethod
    def from_json(cls, name: str, data: JSONObject) -> Variant:
        registration = {k: v for k, v in data.items() if k != "figures"}
        figures = data.get("figures")
        return cls(registration, Figures.from_json({"variant": name, **figures}) if isinstance(figures, Mapping)
                   else variant_figures(name, registration))


@dataclass(frozen=True)
class Served:
    """An endpoint that serves a version: live (a predictor of its SeldonDeployment, with its
    traffic), or remembered by its last rollout (``rollout``: that rollout's phase)."""

    endpoint: str
    role: str
    live: bool
    variant: str | None = None
    traffic: int = 0
    rollout: str = ""

    def to_json(self) -> dict[str, Any]:
        if self.live:
            return {"endpoint": self.endpoint, "role": self.role, "variant": self.variant, "traffic": self.traffic, "live": True}
        return {"endpoint": self.endpoint, "role": self.role, "live": False, "rollout": self.rollout}

    @classmethod
    def from_json(cls, data: JSONObject) -> Served:
        return cls(data["endpoint"], data["role"], bool(data.get("live")), data.get("variant"), int(data.get("traffic") or 0),
                   data.get("rollout") or "")


@dataclass(frozen=True)
class Record:
    """One registered version: its lineage, evaluation, variants with their figures, what it was
    measured on, and — when asked (:func:`attach_serving`) — the endpoints serving it.

    :meth:`to_json` is what `forgectl models -o json` prints and what the local target stores."""

    model: str
    version: str
    environment: str
    #: When it was registered, `YYYY-MM-DDTHH:MM:SSZ` (UTC).
    registered_at: str
    lineage: Lineage
    #: The evaluate step's numeric metrics, and whether its thresholds `passed`.
    evaluation: Mapping[str, float | bool]
    #: What the benchmark step measured on (cpu, machine, cores, threads, hardwareTarget, versions, note).
    hardware: JSONObject | None
    #: Variant name → variant, by name.
    variants: Mapping[str, Variant]
    #: Built artifacts that are not servable bundles (TensorRT engines): name → the build's report.
    artifacts: JSONObject
    #: The evaluate step's DP-SGD privacy budget, when the Model trains with one.
    privacy: JSONObject | None = None
    #: The evaluate step's adversarial robustness figures, when the Model asks for them.
    robustness: JSONObject | None = None
    #: The explain step's summary, when the Model has one.
    explanations: JSONObject | None = None
    #: The hyperparameter search that trained it, when the Model has one: the pick-best step's
    #: `trials.json` as the register step recorded it (metric, goal, best; with a study, its
    #: algorithm, trials, states and the epochs pruning saved).
    search: JSONObject | None = None
    #: The `autolabel` step's report, when the Model's data set is auto-labelled (`labeling.auto`):
    #: the labelling model, the counts, the agreement with the held-back labels and the gate.
    labeling: JSONObject | None = None
    #: Who serves this version; None when not asked (a target's records carry none).
    served_by: tuple[Served, ...] | None = None
    #: Variants a step rejected (beyond their accuracy bound, an export that computes something
    #: else): name → the step's reason. Not registered, so never served.
    rejected: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "model": self.model,
            "version": self.version,
            "environment": self.environment,
            "registeredAt": self.registered_at,
            "lineage": self.lineage.to_json(),
            "evaluation": dict(self.evaluation),
            "hardware": self.hardware,
            "variants": {name: v.to_json() for name, v in self.variants.items()},
            "artifacts": self.artifacts,
        }
        for key, value in (("privacy", self.privacy), ("robustness", self.robustness), ("explanations", self.explanations),
                           ("search", self.search), ("labeling", self.labeling)):
            if value is not None:
                out[key] = value
        if self.rejected:
            out["rejected"] = dict(self.rejected)
        if self.served_by is not None:
            out["servedBy"] = [s.to_json() for s in self.served_by]
        return out

    @classmethod
    def from_json(cls, data: JSONObject) -> Record:
        """Inverse of :meth:`to_json` (a record the local target stored)."""
        served = data.get("servedBy")
        return cls(data["model"], data["version"], data.get("environment", ""), data.get("registeredAt", ""),
                   Lineage.from_json(data.get("lineage") or {}), dict(data.get("evaluation") or {}), data.get("hardware"),
                   {name: Variant.from_json(name, v) for name, v in (data.get("variants") or {}).items()},
                   data.get("artifacts") or {}, data.get("privacy"), data.get("robustness"), data.get("explanations"),
                   data.get("search"), data.get("labeling"),
                   None if served is None else tuple(Served.from_json(s) for s in served),
                   dict(data.get("rejected") or {}))


# -- building a record ----------------------------------------------------------------------------

def lineage(workflow: Mapping[str, Any]) -> Lineage:
    """Where a version came from, read from the Workflow that produced it (pure)."""
    meta = workflow.get("metadata", {})
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    steps = workflow_steps(workflow)
    prepare = steps.get("prepare-data", {}).get("config", {})
    train: dict[str, Any] = next((s["config"] for s in steps.values() if s["config"].get("step") == "train"), {})
    parents: list[Parent] = []
    compression: dict[str, JSONObject] = {}
    exports: dict[str, JSONObject] = {}
    for name, step in steps.items():
        config = step["config"]
        if config.get("step") == "compress":
            variant = config.get("variant") or {}
            compression[variant.get("name", name)] = {"stages": variant.get("stages", []), "hardwareTarget": config.get("hardwareTarget"),
                                                      "maxAccuracyDrop": config.get("maxAccuracyDrop")}
            for teacher, folder in sorted((config.get("teachers") or {}).items()):
                parts = str(folder).split("/")
                version = parts[2] if len(parts) >= 3 and parts[0] == "registry" else None
                if version and not any(p.model == teacher and p.version == version for p in parents):
                    parents.append(Parent(teacher, version, "distillation teacher", variant.get("name")))
        elif config.get("step") == "autolabel":
            # The labelling model's registered `base` (`registry/<model>/<version>/base`); a model
            # labelling its own data set labels with this very version: no parent.
            parts = str(config.get("modelDir") or "").split("/")
            auto = ((config.get("spec") or {}).get("labeling") or {}).get("auto") or {}
            if len(parts) >= 3 and parts[0] == "registry" and parts[1] == auto.get("modelRef"):
                if not any(p.model == parts[1] and p.version == parts[2] for p in parents):
                    parents.append(Parent(parts[1], parts[2], "labelling model"))
        elif config.get("step") in ("export", "build-engine"):
            exports[name] = {k: config.get(k) for k in ("source", "hardwareTarget", "opset", "maxAbsDiff", "int8", "tensorrt", "required")
                             if config.get(k) is not None}
    return Lineage(
        workflow=meta.get("name"),
        model=labels.get(NAME),
        version=labels.get(MODEL_VERSION),
        spec_digest=annotations.get(SPEC_DIGEST),
        git_revision=annotations.get(GIT_REVISION),
        dataset=prepare.get("dataset"),
        dataset_digest=(prepare.get("spec") or {}).get("digest"),
        dataset_version=(prepare.get("spec") or {}).get("version"),
        parents=tuple(parents),
        spec=train.get("spec") or {},
        compression=compression,
        exports=exports,
        steps=tuple(steps),
    )


def variant_figures(name: str, entry: JSONObject, evaluation: Mapping[str, Any] | None = None,
                    batch: int = 1) -> Figures:
    """One variant's figures from its registration entry: accuracy (the benchmark's, else its
    report's, else — for `base` — the evaluation's), size, parameters and the benchmark's
    latency/throughput at ``batch`` rows (its smallest batch when it did not measure that one) and memory."""
    bench = entry.get("benchmark") or {}
    metrics = entry.get("metrics") or {}
    report = entry.get("report") or {}
    accuracy = bench.get("accuracy")
    where = "benchmark"
    if accuracy is None:
        accuracy = metrics.get("accuracy", (report.get("after") or {}).get("accuracy"))
        where = "report"
    if accuracy is None and name == "base" and evaluation:
        accuracy, where = evaluation.get("accuracy"), "evaluate"
    point = ((bench.get("batches") or {}).get(str(batch)) or {}) if bench else {}
    if not point and bench.get("batches"):
        point = bench["batches"][sorted(bench["batches"], key=int)[0]]
    return Figures(
        variant=name, kind=entry.get("kind"),
        runtime=bench.get("runtime") or ("onnxruntime" if str(entry.get("kind", "")).startswith("onnx") else "pytorch"),
        source=entry.get("source"), accuracy=accuracy, accuracy_from=where if accuracy is not None else None,
        size_bytes=entry.get("sizeBytes"), parameters=entry.get("parameters"),
        p50_ms=point.get("p50Ms"), p99_ms=point.get("p99Ms"), throughput=point.get("throughput"),
        memory_bytes=bench.get("memoryBytes"), batches=bench.get("batches") or {},
    )


def build_record(workflow: Mapping[str, Any], registry: JSONObject, evaluation: JSONObject | None,
                 registered: float, environment: str, explanations: JSONObject | None = None,
                 labeling: JSONObject | None = None) -> Record:
    """The registry record of one version (pure): ``registry`` is the registration the register
    step wrote, ``evaluation`` the evaluate step's metrics. `privacy`, `robustness` (from the
    evaluate step's metrics) and `explanations` (the explain step's summary) only when the version
    has them; `labeling` (the autolabel step's report) only with `labeling.auto`."""
    line = lineage(workflow)
    privacy, robustness = ((evaluation or {}).get(k) for k in ("privacy", "robustness"))
    numbers = {k: v for k, v in (evaluation or {}).items() if _number(v) or k == "passed"}
    variants = {name: Variant(entry, variant_figures(name, entry, numbers))
                for name, entry in sorted((registry.get("variants") or {}).items())}
    return Record(
        model=registry.get("model") or line.model or "",
        version=registry.get("version") or line.version or "",
        environment=environment,
        registered_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(registered)),
        lineage=line,
        evaluation=numbers,
        hardware=registry.get("hardware"),
        variants=variants,
        artifacts=registry.get("artifacts") or {},
        privacy=privacy if isinstance(privacy, dict) else None,
        robustness=robustness if isinstance(robustness, dict) else None,
        explanations=dict(explanations) if isinstance(explanations, Mapping) and explanations else None,
        search=registry["search"] if isinstance(registry.get("search"), Mapping) else None,
        labeling=dict(labeling) if isinstance(labeling, Mapping) and labeling else None,
        rejected=rejection_reasons(registry),
    )


def rejected_variant(record: Record | None, variant: str | None) -> str | None:
    """Why an offline gate that the version's Workflow passed still fails for ``variant``: a step
    rejected that variant, so the version has nothing of that name to serve (None: it has)."""
    if record is None or variant is None or variant not in record.rejected:
        return None
    return (f"{rejected_line(variant, record.version, record.rejected[variant])} "
            f"(registered: {', '.join(sorted(record.variants)) or 'none'})")


def succeeded_gate(workflow: str, record: Record | None, variant: str | None) -> tuple[bool, bool, str]:
    """The offline gate (finished, passed, detail) of a version whose Workflow ``workflow``
    succeeded: passed, unless a step rejected ``variant`` (both targets' ``model_gate``)."""
    rejected = rejected_variant(record, variant)
    if rejected is not None:
        return True, False, f"Workflow {workflow} succeeded, but {rejected}"
    return True, True, f"Workflow {workflow} succeeded: evaluation thresholds met, version registered"


# -- who serves a version -------------------------------------------------------------------------

class RolloutMemory(Protocol):
    """What a rollout state remembers (:class:`reconciler.rollout.machine.RolloutState` is one):
    its JSON, with the `stable` and `canary` versions and the `phase`."""

    def to_json(self) -> Mapping[str, Any]: ...


def serving(live: Iterable[Mapping[str, Any]], rollouts: Mapping[str, RolloutMemory] | None = None) -> dict[str, list[Served]]:
    """Version → the endpoints serving it now (live SeldonDeployments: role, variant, traffic),
    then what the rollout states remember (after `forgectl down`, only those). Versions are
    content digests, so the version alone names a model's version."""
    out: dict[str, list[Served]] = {}
    for obj in live:
        if obj.get("kind") != "SeldonDeployment":
            continue
        labels = obj.get("metadata", {}).get("labels") or {}
        endpoint = labels.get(ENDPOINT) or obj.get("metadata", {}).get("name")
        for predictor in obj.get("spec", {}).get("predictors", []):
            plabels = predictor.get("labels") or {}
            out.setdefault(plabels.get(MODEL_VERSION, ""), []).append(
                Served(endpoint, plabels.get(ROLE, predictor.get("name")), True, plabels.get(VARIANT), int(predictor.get("traffic", 0))))
    for endpoint, state in sorted((rollouts or {}).items()):
        data = state.to_json()
        for role in ("stable", "canary"):
            version = data.get(role)
            if role == "canary" and version == data.get("stable"):
                continue  # a promoted canary is the stable version now
            if version and not any(e.endpoint == endpoint and e.live for e in out.get(version, [])):
                out.setdefault(version, []).append(Served(endpoint, role, False, rollout=str(data.get("phase", ""))))
    return out


def attach_serving(records: Iterable[Record], served: Mapping[str, list[Served]]) -> list[Record]:
    """Each record with who serves it (`servedBy`)."""
    return [replace(record, served_by=tuple(served.get(record.version, []))) for record in records]


# -- finding and comparing ------------------------------------------------------------------------

def find(records: Sequence[Record], ref: str) -> Record:
    """The record `MODEL@VERSION` names (a unique version prefix is enough; `MODEL@latest` and
    `MODEL` alone mean the newest)."""
    model, _, version = ref.partition("@")
    mine = [r for r in records if r.model == model]
    if not mine:
        known = ", ".join(sorted({r.model for r in records})) or "none registered"
        raise ForgeError(f"no registered model {model!r} (models: {known})")
    if not version or version == "latest":
        return mine[-1]
    hits = [r for r in mine if r.version.startswith(version)]
    if len(hits) != 1:
        versions = ", ".join(r.version for r in mine)
        raise ForgeError(f"{'no' if not hits else 'more than one'} version of {model!r} matches {version!r} (versions: {versions})")
    return hits[0]


def pair(records: Sequence[Record], a: str, b: str | None = None) -> tuple[Record, Record]:
    """The two records `forgectl models diff A [B]` compares: ``a`` and ``b`` as :func:`find` reads
    them (``b`` may be a bare version of ``a``'s model); a bare model ``a`` alone: its last two
    versions. :class:`ForgeError` when they do not name two."""
    model = a.partition("@")[0]
    if b is None and "@" not in a:
        mine = [r for r in records if r.model == model]
        if len(mine) < 2:
            raise ForgeError(f"model {model!r} has {len(mine)} registered version(s); `models diff` needs two")
        return mine[-2], mine[-1]
    if b is None:
        raise ForgeError("`models diff A B`: name two versions (MODEL@VERSION), or one model for its last two")
    return find(records, a), find(records, b if "@" in b else f"{model}@{b}")


@dataclass(frozen=True)
class Delta:
    """A figure from version A to version B, with `delta` (and `ratio`, for a ``relative``
    figure: sizes, latencies) when both are numbers."""

    a: float | None
    b: float | None
    relative: bool = False

    @property
    def delta(self) -> float | None:
        return self.b - self.a if isinstance(self.a, (int, float)) and isinstance(self.b, (int, float)) else None

    @property
    def ratio(self) -> float | None:
        if self.relative and self.delta is not None and self.a:
            assert self.b is not None
            return self.b / self.a
        return None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"from": self.a, "to": self.b}
        if self.delta is not None:
            out["delta"] = self.delta
        if self.ratio is not None:
            out["ratio"] = self.ratio
        return out


@dataclass(frozen=True)
class VariantDiff:
    """A variant's figures from A to B, or (``only``: `a` or `b`) the one version that has it."""

    figures: Mapping[str, Delta] = field(default_factory=dict)
    only: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"only": self.only} if self.only else {k: d.to_json() for k, d in self.figures.items()}


@dataclass(frozen=True)
class RecordDiff:
    """What changed from version `a` to version `b` (`forgectl models diff`)."""

    a: Record
    b: Record
    #: The spec-level changes, as lines: model spec, dataset digest, compression, exports, git revision.
    spec_changes: tuple[str, ...]
    evaluation: Mapping[str, Delta]
    variants: Mapping[str, VariantDiff]

    def to_json(self) -> dict[str, Any]:
        return {"a": {"model": self.a.model, "version": self.a.version}, "b": {"model": self.b.model, "version": self.b.version},
                "specChanges": list(self.spec_changes), "evaluation": {k: d.to_json() for k, d in self.evaluation.items()},
                "variants": {k: v.to_json() for k, v in self.variants.items()}}


def diff(a: Record, b: Record) -> RecordDiff:
    """What changed from version `a` to version `b`: the specs (model, dataset, compression,
    exports) and the metrics of every variant both have (pure)."""
    la, lb = a.lineage, b.lineage
    specs = [f"model spec: {line}" for line in spec_changes(la.spec, lb.spec)]
    if la.dataset_digest != lb.dataset_digest:
        specs.append(f"dataset `{lb.dataset}` digest {la.dataset_digest} → {lb.dataset_digest}")
    for line in spec_changes(la.compression, lb.compression):
        specs.append(f"compression: {line}")
    for line in spec_changes(la.exports, lb.exports):
        specs.append(f"export: {line}")
    if la.git_revision != lb.git_revision:
        specs.append(f"git revision {la.git_revision} → {lb.git_revision}")
    evaluation = {k: Delta(a.evaluation.get(k), b.evaluation.get(k)) for k in sorted(set(a.evaluation) | set(b.evaluation))
                  if isinstance(a.evaluation.get(k), (int, float)) or isinstance(b.evaluation.get(k), (int, float))}
    variants: dict[str, VariantDiff] = {}
    for name in sorted(set(a.variants) | set(b.variants)):
        va, vb = a.variants.get(name), b.variants.get(name)
        if va is None or vb is None:
            variants[name] = VariantDiff(only="a" if vb is None else "b")
            continue
        fa, fb = va.figures.named(), vb.figures.named()
        variants[name] = VariantDiff({k: Delta(fa[k], fb[k], relative=k != "accuracy") for k in FIGURES
                                      if fa[k] is not None or fb[k] is not None})
    return RecordDiff(a, b, tuple(specs), evaluation, variants)
