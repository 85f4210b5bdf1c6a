"""`forgectl status` of a cluster: a Workflow's steps read from what Argo's controller wrote.

The data are Workflows the real Argo v4.0.5 controller finished on the test node (the end-to-end
test keeps each as `workflow-<version>-<phase>.json`), trimmed by `data/trim_workflow.py`: the
quick-start's first version (every step ran) and its second, after a `learningRate` change
(prepare-data served by the step cache)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from reconciler.targets.kubernetes.workflow_status import failure_of, steps_of

DATA = Path(__file__).parent / "data"
TASKS = {"prepare-data", "train", "evaluate", "compress-pruned", "compress-int8", "export-base", "benchmark", "register"}


def _workflow(name: str = "argo-workflow-succeeded.json") -> dict[str, Any]:
    return json.loads((DATA / name).read_text())


def _node(wf: dict[str, Any], display: str, kind: str) -> dict[str, Any]:
    [node] = [n for n in wf["status"]["nodes"].values() if n["displayName"] == display and n["type"] == kind]
    return node


def test_every_task_once_in_start_order_with_the_exit_handler_by_its_template() -> None:
    steps = steps_of(_workflow())
    names = [s.step for s in steps]
    assert names[:3] == ["prepare-data", "train", "evaluate"] and names[-2:] == ["register", "record-outcome"]
    assert set(names) == TASKS | {"record-outcome"} and len(names) == len(set(names))
    assert all(s.status == "succeeded" and s.attempts == 1 and s.exit_code == 0 for s in steps)
    train = next(s for s in steps if s.step == "train")
    assert train.started is not None and train.finished is not None and train.finished > train.started


def test_a_memoization_hit_is_cached_with_no_attempt() -> None:
    wf = _workflow("argo-workflow-cached.json")
    # as Argo wrote it: the memoized task's DAG node is the hit, with no pod under it
    hit = _node(wf, "prepare-data", "DAG")
    assert hit["memoizationStatus"]["hit"] is True and not any(
        n.get("boundaryID") == hit["id"] for n in wf["status"]["nodes"].values())
    steps = {s.step: s for s in steps_of(wf)}
    assert set(steps) == TASKS | {"record-outcome"}
    assert steps["prepare-data"].status == "cached" and steps["prepare-data"].attempts == 0
    assert all(s.status == "succeeded" and s.attempts == 1 for n, s in steps.items() if n != "prepare-data")


def test_a_retried_attempt_and_a_failure() -> None:
    wf = copy.deepcopy(_workflow())
    nodes = wf["status"]["nodes"]
    # retried: a second attempt under the Retry node, the first one killed
    first = _node(wf, "train(0)", "Pod")
    first.update(phase="Failed", message="Error (exit code 137)", outputs={"exitCode": "137"})
    second = dict(copy.deepcopy(first), id="retry-1", name=first["name"].replace("(0)", "(1)"),
                  displayName="train(1)", phase="Succeeded", message=None, outputs={"exitCode": "0"})
    nodes["retry-1"] = second
    _node(wf, "train", "Retry")["children"] = [first["id"], "retry-1"]
    # failed for good: exit code 2, one attempt
    _node(wf, "evaluate(0)", "Pod").update(phase="Failed", message="accuracy 0.97 < 0.9999", outputs={"exitCode": "2"})
    for kind in ("Retry", "DAG"):
        _node(wf, "evaluate", kind)["phase"] = "Failed"
    steps = {s.step: s for s in steps_of(wf)}
    assert steps["train"].status == "succeeded" and steps["train"].attempts == 2 and steps["train"].exit_code == 0
    assert steps["evaluate"].status == "failed" and steps["evaluate"].attempts == 1
    assert steps["evaluate"].exit_code == 2 and steps["evaluate"].message == "accuracy 0.97 < 0.9999"
    assert "train(1)" not in steps  # an attempt is not a step


def test_a_workflow_rendered_before_the_memoized_wrapper() -> None:
    """Workflows already on a cluster keep their shape: the Retry node is the task's node."""
    wf = copy.deepcopy(_workflow())
    nodes = wf["status"]["nodes"]
    root = wf["metadata"]["name"]
    for wrapper in [n for n in nodes.values() if n["type"] == "DAG" and n["id"] != root]:
        [inner] = wrapper["children"][:1]
        nodes[inner]["boundaryID"] = root
        for child in nodes[inner].get("children") or []:
            nodes[child]["boundaryID"] = root
        del nodes[wrapper["id"]]
    steps = {s.step: s for s in steps_of(wf)}
    assert set(steps) == TASKS | {"record-outcome"}
    assert all(s.status == "succeeded" and s.attempts == 1 for s in steps.values())


def test_the_failure_is_the_first_failed_step_as_the_local_target_words_it() -> None:
    wf = copy.deepcopy(_workflow())
    assert failure_of(wf) is None
    _node(wf, "evaluate(0)", "Pod").update(phase="Failed", message="main: Error (exit code 3)", outputs={"exitCode": "3"})
    for kind in ("Retry", "DAG"):
        _node(wf, "evaluate", kind)["phase"] = "Failed"
    assert failure_of(wf) == "step evaluate failed (exit 3): main: Error (exit code 3)"
