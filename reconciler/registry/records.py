"""The model registry: every registered version with its variants, measurements and lineage.

A record is built from two things the pipeline already leaves behind:

- the **Workflow** that produced the version (its manifest is the lineage): the model and version
  labels, the spec digest and git revision annotations, the dataset and its pinned digest (the
  prepare step's config), the Model spec as trained (the train step's config), the compression
  variants, the distillation teachers with their versions (the compress steps' `teachers`);
- the **registration** the `register` step wrote (`registry/<model>/<version>/registry.json`):
  per variant the weights' size and sha256, parameters, the compress/export reports and the
  `benchmark` step's accuracy, latency per batch size, throughput and memory; plus the evaluation.

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
from collections.abc import Iterable, Mapping
from typing import Any

from reconciler.diagnostics import ForgeError
from reconciler.specdiff import spec_changes
from renderers.labels import ENDPOINT, GIT_REVISION, MODEL_VERSION, NAME, ROLE, SPEC_DIGEST, VARIANT
from renderers.workflow import workflow_steps

#: Figures of a variant the leaderboard and `models show` use (from `variant_figures`).
FIGURES = ("accuracy", "sizeBytes", "parameters", "p50Ms", "p99Ms", "throughput", "memoryBytes")


def lineage(workflow: Mapping[str, Any]) -> dict[str, Any]:
    """Where a version came from, read from the Workflow that produced it (pure)."""
    meta = workflow.get("metadata", {})
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    steps = workflow_steps(workflow)
    prepare = steps.get("prepare-data", {}).get("config", {})
    train: dict[str, Any] = next((s["config"] for s in steps.values() if s["config"].get("step") == "train"), {})
    revision = annotations.get(GIT_REVISION)
    parents: list[dict[str, Any]] = []
    compression: dict[str, Any] = {}
    exports: dict[str, Any] = {}
    for name, step in steps.items():
        config = step["config"]
        if config.get("step") == "compress":
            variant = config.get("variant") or {}
            compression[variant.get("name", name)] = {"stages": variant.get("stages", []), "hardwareTarget": config.get("hardwareTarget"),
                                                      "maxAccuracyDrop": config.get("maxAccuracyDrop")}
            for teacher, folder in sorted((config.get("teachers") or {}).items()):
                parts = str(folder).split("/")
                version = parts[2] if len(parts) >= 3 and parts[0] == "registry" else None
                entry = {"model": teacher, "version": version, "relation": "distillation teacher", "variant": variant.get("name")}
                if version and not any(p["model"] == teacher and p["version"] == version for p in parents):
                    parents.append(entry)
        elif config.get("step") in ("export", "build-engine"):
            exports[name] = {k: config.get(k) for k in ("source", "hardwareTarget", "opset", "maxAbsDiff", "int8", "tensorrt", "required")
                             if config.get(k) is not None}
    return {
        "workflow": meta.get("name"),
        "model": labels.get(NAME),
        "version": labels.get(MODEL_VERSION),
        "specDigest": annotations.get(SPEC_DIGEST),
        "gitRevision": revision,
        "gitCommit": revision.removesuffix("-dirty") if revision else None,
        "uncommitted": bool(revision and revision.endswith("-dirty")),
        "dataset": prepare.get("dataset"),
        "datasetDigest": (prepare.get("spec") or {}).get("digest"),
        "datasetVersion": (prepare.get("spec") or {}).get("version"),
        "parents": parents,
        "spec": train.get("spec") or {},
        "compression": compression,
        "exports": exports,
        "steps": list(steps),
    }


def variant_figures(name: str, entry: Mapping[str, Any], evaluation: Mapping[str, Any] | None = None,
                    batch: int = 1) -> dict[str, Any]:
    """One variant's figures: accuracy (the benchmark's, else its report's), size, parameters and
    the benchmark's latency/throughput at ``batch`` rows and memory."""
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
    return {
        "variant": name, "kind": entry.get("kind"), "runtime": bench.get("runtime") or ("onnxruntime" if str(entry.get("kind", "")).startswith("onnx") else "pytorch"),
        "source": entry.get("source"), "accuracy": accuracy, "accuracyFrom": where if accuracy is not None else None,
        "sizeBytes": entry.get("sizeBytes"), "parameters": entry.get("parameters"),
        "p50Ms": point.get("p50Ms"), "p99Ms": point.get("p99Ms"), "throughput": point.get("throughput"),
        "memoryBytes": bench.get("memoryBytes"), "batches": bench.get("batches") or {},
    }


def build_record(workflow: Mapping[str, Any], registry: Mapping[str, Any], evaluation: Mapping[str, Any] | None,
                 registered: float, environment: str, explanations: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The registry record of one version (pure). `privacy`, `robustness` (from the evaluate
    step's metrics) and `explanations` (the explain step's summary) only when the version has them."""
    line = lineage(workflow)
    trust = {k: (evaluation or {}).get(k) for k in ("privacy", "robustness") if isinstance((evaluation or {}).get(k), dict)}
    if isinstance(explanations, Mapping) and explanations:
        trust["explanations"] = dict(explanations)
    evaluation = {k: v for k, v in (evaluation or {}).items()
                  if (isinstance(v, (int, float)) and not isinstance(v, bool)) or k == "passed"}
    variants = {name: {**entry, "figures": variant_figures(name, entry, evaluation)}
                for name, entry in sorted((registry.get("variants") or {}).items())}
    return {
        "model": registry.get("model") or line["model"],
        "version": registry.get("version") or line["version"],
        "environment": environment,
        "registeredAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(registered)),
        "lineage": line,
        "evaluation": evaluation,
        "hardware": registry.get("hardware"),
        "variants": variants,
        "artifacts": registry.get("artifacts") or {},
        **trust,
    }


def serving(live: Iterable[Mapping[str, Any]], rollouts: Mapping[str, Any] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Version → the endpoints serving it now (live SeldonDeployments: role, variant, traffic),
    then what the rollout states remember (after `forgectl down`, only those). Versions are
    content digests, so the version alone names a model's version."""
    out: dict[str, list[dict[str, Any]]] = {}
    for obj in live:
        if obj.get("kind") != "SeldonDeployment":
            continue
        labels = obj.get("metadata", {}).get("labels") or {}
        endpoint = labels.get(ENDPOINT) or obj.get("metadata", {}).get("name")
        for predictor in obj.get("spec", {}).get("predictors", []):
            plabels = predictor.get("labels") or {}
            out.setdefault(plabels.get(MODEL_VERSION, ""), []).append(
                {"endpoint": endpoint, "role": plabels.get(ROLE, predictor.get("name")), "variant": plabels.get(VARIANT),
                 "traffic": int(predictor.get("traffic", 0)), "live": True})
    for endpoint, state in sorted((rollouts or {}).items()):
        data = state.to_json() if hasattr(state, "to_json") else dict(state)
        for role in ("stable", "canary"):
            version = data.get(role)
            if role == "canary" and version == data.get("stable"):
                continue  # a promoted canary is the stable version now
            if version and not any(e["endpoint"] == endpoint and e["live"] for e in out.get(version, [])):
                out.setdefault(version, []).append({"endpoint": endpoint, "role": role, "live": False,
                                                    "rollout": str(data.get("phase", ""))})
    return out


def attach_serving(records: list[dict[str, Any]], served: Mapping[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each record with `servedBy`."""
    for record in records:
        record["servedBy"] = list(served.get(record["version"], []))
    return records


def find(records: list[dict[str, Any]], ref: str) -> dict[str, Any]:
    """The record `MODEL@VERSION` names (a unique version prefix is enough; `MODEL@latest` and
    `MODEL` alone mean the newest)."""
    model, _, version = ref.partition("@")
    mine = [r for r in records if r["model"] == model]
    if not mine:
        known = ", ".join(sorted({r["model"] for r in records})) or "none registered"
        raise ForgeError(f"no registered model {model!r} (models: {known})")
    if not version or version == "latest":
        return mine[-1]
    hits = [r for r in mine if r["version"].startswith(version)]
    if len(hits) != 1:
        versions = ", ".join(r["version"] for r in mine)
        raise ForgeError(f"{'no' if not hits else 'more than one'} version of {model!r} matches {version!r} (versions: {versions})")
    return hits[0]


def pair(records: list[dict[str, Any]], a: str, b: str | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The two records `forgectl models diff A [B]` compares: ``a`` and ``b`` as :func:`find` reads
    them (``b`` may be a bare version of ``a``'s model); a bare model ``a`` alone: its last two
    versions. :class:`ForgeError` when they do not name two."""
    model = a.partition("@")[0]
    if b is None and "@" not in a:
        mine = [r for r in records if r["model"] == model]
        if len(mine) < 2:
            raise ForgeError(f"model {model!r} has {len(mine)} registered version(s); `models diff` needs two")
        return mine[-2], mine[-1]
    if b is None:
        raise ForgeError("`models diff A B`: name two versions (MODEL@VERSION), or one model for its last two")
    return find(records, a), find(records, b if "@" in b else f"{model}@{b}")


def _change(a: Any, b: Any, relative: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"from": a, "to": b}
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        out["delta"] = b - a
        if relative and a:
            out["ratio"] = b / a
    return out


def diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """What changed from version `a` to version `b`: the specs (model, dataset, compression,
    exports) and the metrics of every variant both have (pure)."""
    la, lb = a["lineage"], b["lineage"]
    specs = [f"model spec: {line}" for line in spec_changes(la.get("spec") or {}, lb.get("spec") or {})]
    if la.get("datasetDigest") != lb.get("datasetDigest"):
        specs.append(f"dataset `{lb.get('dataset')}` digest {la.get('datasetDigest')} → {lb.get('datasetDigest')}")
    for line in spec_changes(la.get("compression") or {}, lb.get("compression") or {}):
        specs.append(f"compression: {line}")
    for line in spec_changes(la.get("exports") or {}, lb.get("exports") or {}):
        specs.append(f"export: {line}")
    if la.get("gitRevision") != lb.get("gitRevision"):
        specs.append(f"git revision {la.get('gitRevision')} → {lb.get('gitRevision')}")
    evaluation = {k: _change(a.get("evaluation", {}).get(k), b.get("evaluation", {}).get(k))
                  for k in sorted(set(a.get("evaluation") or {}) | set(b.get("evaluation") or {}))
                  if isinstance((a.get("evaluation") or {}).get(k), (int, float)) or isinstance((b.get("evaluation") or {}).get(k), (int, float))}
    variants: dict[str, Any] = {}
    for name in sorted(set(a["variants"]) | set(b["variants"])):
        fa = (a["variants"].get(name) or {}).get("figures")
        fb = (b["variants"].get(name) or {}).get("figures")
        if fa is None or fb is None:
            variants[name] = {"only": "a" if fb is None else "b"}
            continue
        variants[name] = {k: _change(fa.get(k), fb.get(k), relative=k != "accuracy") for k in FIGURES
                          if fa.get(k) is not None or fb.get(k) is not None}
    return {"a": {"model": a["model"], "version": a["version"]}, "b": {"model": b["model"], "version": b["version"]},
            "specChanges": specs, "evaluation": evaluation, "variants": variants}
