"""The steps of a Workflow as Argo's controller reports them in ``status.nodes``, in the shape the
local target records its own (:class:`~reconciler.targets.base.StepRun`), so `forgectl status`
shows a cluster's runs the way it shows local ones. Pure: reads the object, nothing else.

Argo's node graph for one DAG task: a ``DAG`` node named after the task, of its memoized template
(``memoized-<task>``: renderers.workflow.memoized) — with ``memoizationStatus.hit: true`` and no
child when the step cache served it — holding the task's own node: a ``Retry`` node with one
``Pod`` child per attempt (``train(0)``, ``train(1)``, …), or a single ``Pod`` without a
``retryStrategy``. Workflows rendered before that wrapper have the ``Retry``/``Pod`` node as the
task's node. A task's node lies in the entry DAG's boundary; an attempt's ``children`` are the
tasks that depend on it, not attempts. Skipped and omitted tasks are nodes of their own; the exit
handler is ``<workflow>.onExit``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from reconciler.targets.base import StepRun

#: Argo node phase → the step status the local target records.
_STATUS = {"Succeeded": "succeeded", "Failed": "failed", "Error": "failed", "Running": "running",
           "Pending": "pending", "Skipped": "omitted", "Omitted": "omitted"}
#: Node types that stand for a task of the DAG (the rest are the DAG itself, step groups, …).
_TASK_TYPES = frozenset({"DAG", "Retry", "Pod", "Skipped", "Container"})


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


@dataclass(frozen=True)
class TaskNodes:
    """The nodes Argo made for one task: ``node`` is the task's (the memoized DAG, with the
    ``memoizationStatus``, or the exit handler's pod), ``run`` the node that ran it (the ``Retry``
    or ``Pod`` inside; ``node`` itself for a hit or an omitted task) and ``attempts`` its pods."""

    node: Mapping[str, Any]
    run: Mapping[str, Any]
    attempts: list[Mapping[str, Any]]


def task_nodes(workflow: Mapping[str, Any]) -> dict[str, TaskNodes]:
    """Each task of ``workflow`` by its name (the exit handler by its template's name, as the local
    target names it) with its nodes, in the order of ``status.nodes``."""
    nodes: Mapping[str, Mapping[str, Any]] = (workflow.get("status") or {}).get("nodes") or {}
    name = (workflow.get("metadata") or {}).get("name")
    root = name if name in nodes else next((i for i, n in nodes.items() if not n.get("boundaryID")), None)
    attempt_ids = {child for node in nodes.values() if node.get("type") == "Retry" for child in node.get("children") or []}
    tasks: dict[str, TaskNodes] = {}
    for node_id, node in nodes.items():
        on_exit = str(node.get("name", "")).endswith(".onExit")
        if node_id in attempt_ids or node.get("type") not in _TASK_TYPES or node_id == root \
                or not (on_exit or node.get("boundaryID") == root):
            continue
        run = node
        if node.get("type") == "DAG":  # the memoized wrapper: the task's own node is its child in its boundary
            run = next((nodes[c] for c in node.get("children") or [] if nodes.get(c, {}).get("boundaryID") == node_id), node)
        attempts = [nodes[c] for c in run.get("children") or [] if c in nodes and nodes[c].get("type") == "Pod"] \
            if run.get("type") == "Retry" else ([run] if run.get("type") == "Pod" else [])
        step = node.get("displayName") or node.get("name", node_id)
        if on_exit:
            step = node.get("templateName") or step
        tasks[step] = TaskNodes(node, run, attempts)
    return tasks


def steps_of(workflow: Mapping[str, Any]) -> list[StepRun]:
    """Each task of ``workflow`` (the exit handler included) with its status (``cached`` for a
    memoization hit), attempts, times, the last attempt's exit code and message, in the order
    they started."""
    steps = []
    for step, task in task_nodes(workflow).items():
        node, run, attempts = task.node, task.run, task.attempts
        hit = bool((node.get("memoizationStatus") or {}).get("hit"))
        phase = node.get("phase", "Pending")
        status = "cached" if hit and phase == "Succeeded" else _STATUS.get(phase, phase.lower())
        last = attempts[-1] if attempts else run
        steps.append(StepRun(
            step=step,
            status=status,
            attempts=0 if hit else len(attempts),
            started=_epoch(node.get("startedAt")),
            finished=_epoch(node.get("finishedAt")),
            exit_code=_exit_code(last),
            message=last.get("message") or run.get("message") or node.get("message") or None,
        ))
    return sorted(steps, key=lambda s: (s.started is None, s.started or 0.0, s.step))


def failure_of(workflow: Mapping[str, Any]) -> str | None:
    """Why a finished Workflow failed, worded as the local target words it: its first failed step
    and that step's exit code and message (Argo's own ``status.message`` is often empty)."""
    for step in steps_of(workflow):
        if step.status == "failed":
            code = f" (exit {step.exit_code})" if step.exit_code is not None else ""
            return f"step {step.step} failed{code}: {step.message or 'no message'}"
    return (workflow.get("status") or {}).get("message") or None
