"""The local target's model registry: a finished Workflow's version recorded in the state DB
(`model_registry`), built from the files its steps left in the workspace — the register step's
`registry.json`, the evaluate and explain steps' `metrics.json` — by
:func:`reconciler.registry.records.build_record`. This is the local target's own storage; on a
cluster the records are read from the Workflows' status instead
(:mod:`reconciler.targets.kubernetes.records`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from reconciler.registry.records import Record, build_record
from reconciler.targets.local.state import StateDB
from renderers.workflow import workflow_steps


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def registry_path(workflow: Mapping[str, Any]) -> str | None:
    """Workspace path of the `registry.json` a Workflow's register step writes."""
    register = workflow_steps(workflow).get("register", {}).get("config", {})
    return f"{register['output'].rstrip('/')}/registry.json" if register.get("output") else None


def ingest_local(db: StateDB, workspace: Path, workflow: Mapping[str, Any], environment: str, registered: float | None = None) -> Record | None:
    """Record a finished Workflow's version in the local state DB (None when it registered nothing)."""
    relative = registry_path(workflow)
    if relative is None:
        return None
    registry = _read(workspace / relative)
    if not isinstance(registry, dict):
        return None
    evaluate = workflow_steps(workflow).get("evaluate", {}).get("config", {})
    evaluation = _read(workspace / evaluate["output"] / "metrics.json") if evaluate.get("output") else None
    explain = workflow_steps(workflow).get("explain", {}).get("config", {})
    explanations = _read(workspace / explain["output"] / "metrics.json") if explain.get("output") else None
    autolabel = workflow_steps(workflow).get("autolabel", {}).get("config", {})
    labeling = _read(workspace / autolabel["output"] / "metrics.json") if autolabel.get("output") else None
    when = registered if registered is not None else (workspace / relative).stat().st_mtime
    record = build_record(workflow, registry, evaluation if isinstance(evaluation, dict) else None, when, environment,
                          explanations if isinstance(explanations, dict) else None,
                          labeling if isinstance(labeling, dict) else None)
    db.put_model_version(when, record)
    return record
