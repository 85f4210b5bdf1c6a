"""The one-off pods `forgectl labels` runs on a cluster (pure).

The `autolabel` step leaves its review file on the workspace claim, and a `pvc://` sharded
source lives on a claim of its own: neither is reachable from the reviewer's machine. So
`forgectl labels pull` runs `python -m runtimes labels-export` in a pod that mounts the workspace
read-only, and `forgectl labels merge` runs `python -m runtimes merge-labels` in a pod that mounts
the workspace and the source's claim writable, the reviewed files handed in by a ConfigMap the pod
owns. Both pods are the runtime image under the Workflow steps' security context (`restricted`),
with no API token, no retries (a person is waiting for the answer) and a deadline.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from renderers.pods import SECURITY_CONTEXT, scratch_volumes, secured
from renderers.prerequisites import WORKSPACE_PVC
from renderers.stepargs import step_args
from renderers.workflow import image
from specs import Environment
from specs.stepconfig import DEFAULT_WORKSPACE, WORKSPACE_ENV, LabelsExportConfig, MergeLabelsConfig, StepConfig

#: The label on the pods and ConfigMaps of `forgectl labels` (`pull`, `merge`, `withdraw`): not
#: Forge's managed-by label, so no apply lists or prunes them.
LABELS_POD = "forge.dev/labels"
#: Where a merge pod finds the reviewed file and the auto-labels (the ConfigMap's keys).
INPUTS_PATH = "/forge/inputs"
#: A one-off pod that has not finished by then is stopped by the kubelet.
DEADLINE_SECONDS = 900
#: What a ConfigMap may hold (the API server's limit on one object is 1 MiB, its metadata included).
MAX_INPUT_BYTES = 1024 * 1024 - 16 * 1024


def _json(config: StepConfig) -> dict[str, Any]:
    return config.model_dump(mode="json", by_alias=True)


def _pod(env: Environment, namespace: str, name: str, role: str, args: list[str], *,
         volumes: list[dict[str, Any]], mounts: list[dict[str, Any]], workspace_read_only: bool) -> dict[str, Any]:
    container = secured({
        "name": "labels",
        "image": image(env, "forge-train"),
        "command": ["python", "-m", "runtimes"],
        "args": args,
        "env": [{"name": WORKSPACE_ENV, "value": DEFAULT_WORKSPACE}],
        "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
        "volumeMounts": [{"name": "workspace", "mountPath": DEFAULT_WORKSPACE, "readOnly": workspace_read_only},
                         *mounts],
    })
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {LABELS_POD: role}},
        "spec": {
            "restartPolicy": "Never",
            "activeDeadlineSeconds": DEADLINE_SECONDS,
            "automountServiceAccountToken": False,
            "securityContext": SECURITY_CONTEXT,
            "containers": [container],
            "volumes": [{"name": "workspace", "persistentVolumeClaim": {"claimName": WORKSPACE_PVC,
                                                                         "readOnly": workspace_read_only}},
                        *scratch_volumes(), *volumes],
        },
    }


def pull_pod(env: Environment, namespace: str, name: str, labels: str) -> dict[str, Any]:
    """The pod that prints the `autolabel` output folder ``labels`` (workspace-relative) as one
    line of its log, the workspace claim mounted read-only."""
    return _pod(env, namespace, name, "pull", step_args("labels-export", _json(LabelsExportConfig(labels=labels))),
                volumes=[], mounts=[], workspace_read_only=True)


def merge_pod(env: Environment, namespace: str, name: str, config: MergeLabelsConfig, claim: str, inputs: str, *,
              withdraw: str | None = None) -> dict[str, Any]:
    """The pod that merges the reviewed labels as a new shard of a `pvc://` source on ``claim`` and
    writes it there (``--then-publish``: it prints merge.json as one line of its log), or, with
    ``withdraw``, removes that shard again. The source's claim is mounted writable where the
    runtimes look for it, the workspace (where the merge is staged) writable, and the ConfigMap
    ``inputs`` (the reviewed file and the auto-labels) read-only at :data:`INPUTS_PATH`."""
    args = [*step_args("merge-labels", _json(config)), *(["--withdraw", withdraw] if withdraw else ["--then-publish"])]
    return _pod(env, namespace, name, "withdraw" if withdraw else "merge", args,
                volumes=[{"name": "source", "persistentVolumeClaim": {"claimName": claim}},
                         {"name": "inputs", "configMap": {"name": inputs}}],
                mounts=[{"name": "source", "mountPath": f"{DEFAULT_WORKSPACE}/pvc/{claim}"},
                        {"name": "inputs", "mountPath": INPUTS_PATH, "readOnly": True}],
                workspace_read_only=False)


def inputs_config_map(namespace: str, name: str, files: Mapping[str, bytes], pod: Mapping[str, Any]) -> dict[str, Any]:
    """The ConfigMap that hands a merge pod its files (bytes as given: `binaryData`), owned by the
    live ``pod`` so that the API server's garbage collector removes it with the pod."""
    meta = pod["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "labels": {LABELS_POD: meta["labels"][LABELS_POD]},
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}]},
        "binaryData": {key: base64.b64encode(data).decode("ascii") for key, data in files.items()},
    }
