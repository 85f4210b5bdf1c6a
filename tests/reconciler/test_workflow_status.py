"""`forgectl status` of a cluster: a Workflow's steps read from what Argo's controller wrote.

The data are Workflows the real Argo v4.0.5 controller finished on the test node (the end-to-end
test keeps each as `workflow-<version>-<phase>.json`), trimmed by `data/trim_workflow.py`."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from reconciler.workflow_status import steps_of

DATA = Path(__file__).parent / "data"


def _workflow() -> dict[str, Any]:
    return json.loads((DATA / "argo-workflow-succeeded.json").read_text())


def test_every_task_once_in_start_order_with_the_exit_handler_by_its_template() -> None:
    steps = steps_of(_workflow())
    names = [s.step for s in steps]
    assert names[:3] == ["prepare-data", "train", "evaluate"] and names[-2:] == ["register", "record-outcome"]
    assert set(names) == {"prepare-data", "train", "evaluate", "compress-pruned", "compress-int8", "export-base",
                          "benchmark", "register", "record-outcome"}
    assert all(s.status == "succeeded" and s.attempts == 1 and s.exit_code == 0 for s in steps)
    train = next(s for s in steps if s.step == "train")
    assert train.started is not None and train.finished is not None and train.finished - train.started == 41.0


def test_a_cache_hit_a_retried_attempt_and_a_failure() -> None:
    wf = copy.deepcopy(_workflow())
    nodes = wf["status"]["nodes"]
    by_name = {n["displayName"]: n for n in nodes.values()}
    # memoized: the controller marks the task's node a hit and makes no pod for it
    by_name["prepare-data"]["memoizationStatus"]["hit"] = True
    by_name["prepare-data"]["children"] = []
    # retried: a second attempt under the Retry node, the first one killed
    first = by_name["train(0)"]
    first.update(phase="Failed", message="Error (exit code 137)", outputs={"exitCode": "137"})
    second = dict(copy.deepcopy(first), id="retry-1", name=first["name"].replace("(0)", "(1)"),
                  displayName="train(1)", phase="Succeeded", message=None, outputs={"exitCode": "0"})
    nodes["retry-1"] = second
    by_name["train"]["children"] = [first["id"], "retry-1"]
    # failed for good: exit code 2, one attempt
    by_name["evaluate(0)"].update(phase="Failed", message="accuracy 0.97 < 0.9999", outputs={"exitCode": "2"})
    by_name["evaluate"]["phase"] = "Failed"
    steps = {s.step: s for s in steps_of(wf)}
    assert steps["prepare-data"].status == "cached" and steps["prepare-data"].attempts == 0
    assert steps["train"].status == "succeeded" and steps["train"].attempts == 2 and steps["train"].exit_code == 0
    assert steps["evaluate"].status == "failed" and steps["evaluate"].attempts == 1
    assert steps["evaluate"].exit_code == 2 and steps["evaluate"].message == "accuracy 0.97 < 0.9999"
    assert "train(1)" not in steps  # an attempt is not a step
