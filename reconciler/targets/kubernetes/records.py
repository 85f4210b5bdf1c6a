"""The cluster's model registry: a record per finished Workflow, read from its status — the register
node's `metrics` output parameter (the per-variant summary), and the evaluate, explain and
autolabel nodes' `metrics` outputs — and built by :func:`reconciler.registry.records.build_record`. Argo keeps
them with the Workflow, so there is nothing to store or backfill (pure)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from typing import Any

from reconciler.registry.records import Record, build_record


def _from_workflow_status(workflow: Mapping[str, Any], environment: str) -> Record | None:
    """A record from a cluster Workflow: the register node's `metrics` output parameter."""
    nodes = (workflow.get("status") or {}).get("nodes") or {}
    outputs: dict[str, Any] = {}  # the evaluate, explain and autolabel steps' `metrics` output parameters
    for node in nodes.values():
        if node.get("templateName") in ("evaluate", "explain", "autolabel") and node.get("phase") == "Succeeded":
            for param in (node.get("outputs") or {}).get("parameters") or []:
                if param.get("name") == "metrics":
                    try:
                        outputs[node["templateName"]] = json.loads(param.get("value") or "{}")
                    except ValueError:
                        pass
    for node in nodes.values():
        if node.get("templateName") != "register" or node.get("phase") != "Succeeded":
            continue
        for param in (node.get("outputs") or {}).get("parameters") or []:
            if param.get("name") != "metrics":
                continue
            try:
                summary = json.loads(param.get("value") or "{}")
            except ValueError:
                return None
            variants = {}
            for name, figures in (summary.get("registry") or {}).items():
                batches = {b: f for b, f in (figures.get("latency") or {}).items()}
                bench = {"accuracy": figures.get("accuracy"), "batches": batches} if batches or figures.get("accuracy") is not None else {}
                variants[name] = {"kind": figures.get("kind"), "sizeBytes": figures.get("sizeBytes"),
                                  "parameters": figures.get("parameters"), "benchmark": bench}
            finished = node.get("finishedAt") or ""
            try:
                when = time.mktime(time.strptime(finished, "%Y-%m-%dT%H:%M:%SZ"))
            except ValueError:
                when = 0.0
            registry = {"model": summary.get("model"), "version": summary.get("version"), "variants": variants,
                        "hardware": summary.get("hardware"), "artifacts": summary.get("artifacts"),
                        "search": summary.get("search"), "rejected": summary.get("rejected")}
            evaluation = outputs.get("evaluate")
            explanations, labeling = outputs.get("explain"), outputs.get("autolabel")
            return build_record(workflow, registry, evaluation if isinstance(evaluation, dict) else None, when, environment,
                                explanations if isinstance(explanations, dict) else None,
                                labeling if isinstance(labeling, dict) else None)
    return None


def records_from_workflows(workflows: Iterable[Mapping[str, Any]], environment: str, model: str | None = None) -> list[Record]:
    """The records a cluster's finished Workflows carry in their status (of one model, or all),
    oldest first."""
    records = [r for r in (_from_workflow_status(wf, environment) for wf in workflows) if r]
    return sorted((r for r in records if model is None or r.model == model), key=lambda r: (r.registered_at, r.model))
