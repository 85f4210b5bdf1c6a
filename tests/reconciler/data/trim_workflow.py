"""Trim a Workflow written by Argo's controller (the end-to-end test keeps each beside its work
folder) to what reconciler.targets.kubernetes.workflow_status reads, for tests/reconciler/data.

    python tests/reconciler/data/trim_workflow.py workflow-<version>-<phase>.json out.json
"""

import json
import sys

KEEP = ("id", "name", "displayName", "type", "templateName", "boundaryID", "phase", "startedAt", "finishedAt", "children",
        "memoizationStatus", "message")


def trim(w: dict) -> dict:
    nodes = {}
    for k, n in w["status"]["nodes"].items():
        m = {f: n[f] for f in KEEP if f in n}
        if (n.get("outputs") or {}).get("exitCode") is not None:
            m["outputs"] = {"exitCode": n["outputs"]["exitCode"]}
        nodes[k] = m
    labels = {k: v for k, v in w["metadata"]["labels"].items() if k.startswith("forge.dev/")}
    return {"apiVersion": w["apiVersion"], "kind": w["kind"], "metadata": {"name": w["metadata"]["name"], "labels": labels},
            "status": {"phase": w["status"]["phase"], "message": w["status"].get("message"), "nodes": nodes}}


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        trimmed = trim(json.load(f))
    with open(sys.argv[2], "w") as f:
        json.dump(trimmed, f, indent=1, sort_keys=True)
