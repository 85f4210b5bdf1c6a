"""The steps of a Workflow as Argo's controller reports them in ``status.nodes``, in the shape the
local target records its own (:class:`~reconciler.targets.base.StepRun`), so `forgectl status`
shows a cluster's runs the way it shows local ones. Pure: reads the object, nothing else.

Argo's node graph for one DAG task with a ``retryStrategy``: a node of type ``Retry`` named after
the task, with one ``Pod`` child per attempt (``train(0)``, ``train(1)``, …); a task without one is
a single ``Pod`` node (an attempt's ``children`` are the tasks that depend on it, not attempts). A
memoized task served from the cache is a node with ``memoizationStatus.hit: true`` and no pod.
Skipped and omitted tasks are nodes of their own; the exit handler is ``<workflow>.onExit``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from reconciler.targets.base import StepRun

#: Argo node phase → the step status the local target records.
_STATUS = {"Succeeded": "succeeded", "Failed": "failed", "Error": "failed", "Running": "running",
           "Pending": "pending", "Skipped": "omitted", "Omitted": "omitted"}
#: Node types that stand for a task of the DAG (the rest are the DAG itself, step groups, …).
_TASK_TYPES = frozenset({"Retry", "Pod", "Skipped", "Container"})


def _epoch(stamp: str | None) -> float | None:
    if not stamp:
        return None
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _exit_code(node: Mapping[str, Any]) -> int | None:
    code = (node.get("outputs") or {}).get("exitCode")
    try:
        return int(code) if code is not None else None
    except ValueError:
        return None


def steps_of(workflow: Mapping[str, Any]) -> list[StepRun]:
    """Each task of ``workflow`` (the exit handler included) with its status (``cached`` for a
    memoization hit), attempts, times, the last attempt's exit code and message, in the order
    they started."""
    nodes: Mapping[str, Mapping[str, Any]] = (workflow.get("status") or {}).get("nodes") or {}
    attempt_ids = {child for node in nodes.values() if node.get("type") == "Retry" for child in node.get("children") or []}
    steps = []
    for node_id, node in nodes.items():
        if node.get("type") not in _TASK_TYPES or node_id in attempt_ids:
            continue
        attempts = [nodes[c] for c in node.get("children") or [] if c in nodes and nodes[c].get("type") == "Pod"] \
            if node.get("type") == "Retry" else ([node] if node.get("type") == "Pod" else [])
        hit = bool((node.get("memoizationStatus") or {}).get("hit"))
        phase = node.get("phase", "Pending")
        status = "cached" if hit and phase == "Succeeded" else _STATUS.get(phase, phase.lower())
        last = attempts[-1] if attempts else node
        name = node.get("displayName") or node.get("name", node_id)
        if name.endswith(".onExit"):  # the exit handler: named by its template, as the local target names it
            name = node.get("templateName") or name
        steps.append(StepRun(
            step=name,
            status=status,
            attempts=0 if hit else len(attempts),
            started=_epoch(node.get("startedAt")),
            finished=_epoch(node.get("finishedAt")),
            exit_code=_exit_code(last),
            message=last.get("message") or node.get("message") or None,
        ))
    return sorted(steps, key=lambda s: (s.started is None, s.started or 0.0, s.step))
