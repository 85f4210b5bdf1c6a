"""What every pod Forge renders needs on a cluster, in one place: where it may run (a Compute
pool's node selector, tolerations and priority), who it runs as, and shared memory for
multi-process training.

Workflow steps, the pods of a multi-node `PyTorchJob` and the model servers of a
`SeldonDeployment` all take these from here, so a pool's placement reaches every pod that uses
its accelerators — and only those: the small pod an Argo resource template runs to create a
`PyTorchJob` gets none of it.
"""

from __future__ import annotations

from typing import Any

from specs import Compute

#: The uid of the runtime images (`runtimes/Dockerfile`: `USER 1000`). `fsGroup` makes the
#: workspace volume writable by it on storage that honours fsGroup (most block and NFS drivers).
RUNTIME_UID = 1000
SECURITY_CONTEXT: dict[str, Any] = {"runAsNonRoot": True, "runAsUser": RUNTIME_UID, "runAsGroup": RUNTIME_UID,
                                    "fsGroup": RUNTIME_UID}

#: PriorityClasses the manifests name (cluster-scoped: the cluster admin creates them, see
#: docs/cluster-prerequisites.md). Training runs `high` unless its pool says `low`; inference
#: `medium` unless its pool says `low`.
TRAINING_PRIORITY = {"high": "forge-high", "medium": "forge-high", "low": "forge-low"}
INFERENCE_PRIORITY = {"high": "forge-medium", "medium": "forge-medium", "low": "forge-low"}
PRIORITY_CLASSES = ("forge-high", "forge-medium", "forge-low")

#: `/dev/shm` for NCCL and DataLoader workers: the container runtime's default is 64 MiB, which
#: multi-GPU PyTorch exhausts.
SHM_VOLUME = "dshm"


def placement(compute: Compute | None, priority_class: str) -> dict[str, Any]:
    """Pod-spec fields that put a pod on the pool: priority, node selector and tolerations."""
    fields: dict[str, Any] = {"priorityClassName": priority_class}
    if compute is not None and compute.spec.node_selector:
        fields["nodeSelector"] = dict(sorted(compute.spec.node_selector.items()))
    if compute is not None and compute.spec.tolerations:
        fields["tolerations"] = [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in compute.spec.tolerations]
    return fields


def shm_volume(size: str) -> dict[str, Any]:
    """A memory-backed `/dev/shm` volume of at most ``size``."""
    return {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": size}}


SHM_MOUNT: dict[str, Any] = {"name": SHM_VOLUME, "mountPath": "/dev/shm"}
