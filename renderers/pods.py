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

from specs import Compute, Model

#: The uid of the runtime images (`runtimes/Dockerfile`: `USER 1000`). `fsGroup` makes the
#: workspace volume writable by it on storage that honours fsGroup (most block and NFS drivers).
RUNTIME_UID = 1000
#: Every pod Forge renders meets the Pod Security Standards' `restricted` level (the level the
#: Kubernetes project recommends for workloads; judged by the upstream evaluator in
#: tests/judges/test_pod_security_judge.py): it runs as the images' non-root user and under the
#: container runtime's default seccomp profile. Pod-level, so Argo's executor containers (which
#: the workflow-controller adds; their own fields come from its ConfigMap, see
#: docs/cluster-prerequisites.md) run as that user too.
SECURITY_CONTEXT: dict[str, Any] = {"runAsNonRoot": True, "runAsUser": RUNTIME_UID, "runAsGroup": RUNTIME_UID,
                                    "fsGroup": RUNTIME_UID, "seccompProfile": {"type": "RuntimeDefault"}}
#: ... and each container Forge writes gives up every capability and any way to gain privileges
#: (setuid binaries, file capabilities), and cannot write its image: what the runtimes write goes
#: to the workspace volume or to the scratch volumes below.
CONTAINER_SECURITY_CONTEXT: dict[str, Any] = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                              "readOnlyRootFilesystem": True}

#: Where the runtimes write outside the workspace, each an `emptyDir` (allowed by `restricted`;
#: it lives as long as the pod) so that the root filesystem can stay read-only. (volume name,
#: mount path): why.
SCRATCH_VOLUMES: dict[tuple[str, str], str] = {
    ("tmp", "/tmp"): "Python's tempfile default, torch.compile's Inductor cache (/tmp/torchinductor_<user>), "
                     "the socket of the seldon-core wrapper's multiprocessing Manager (its metrics)",
    ("cache", "/forge/cache"): "FORGE_CACHE of the runtime images: DeepSpeed's JIT-compiled ops "
                               "(TORCH_EXTENSIONS_DIR=/forge/cache/torch_extensions)",
    ("home", "/home/forge"): "HOME of uid 1000 in the runtime images (`useradd --create-home forge`): "
                             "~/.cache (Triton's compiled kernels, Hugging Face and torch hub downloads), "
                             "~/.config/matplotlib (the explain step's plots), ~/.nv (CUDA's JIT cache)",
}
SCRATCH_MOUNTS: list[dict[str, Any]] = [{"name": name, "mountPath": path} for name, path in SCRATCH_VOLUMES]


def scratch_volumes() -> list[dict[str, Any]]:
    """The pod volumes behind :data:`SCRATCH_MOUNTS` (fresh dicts: a manifest owns its copy)."""
    return [{"name": name, "emptyDir": {}} for name, _ in SCRATCH_VOLUMES]


def secured(container: dict[str, Any]) -> dict[str, Any]:
    """``container`` with Forge's container security context and the scratch volumes mounted."""
    mounts = [*container.get("volumeMounts", []), *SCRATCH_MOUNTS]
    return {**container, "securityContext": CONTAINER_SECURITY_CONTEXT, "volumeMounts": mounts}


#: PriorityClasses the manifests name (cluster-scoped: the cluster admin creates them, see
#: docs/cluster-prerequisites.md). Training runs `high` unless its pool says `low`; inference
#: `medium` unless its pool says `low`.
TRAINING_PRIORITY = {"high": "forge-high", "medium": "forge-high", "low": "forge-low"}
INFERENCE_PRIORITY = {"high": "forge-medium", "medium": "forge-medium", "low": "forge-low"}
PRIORITY_CLASSES = ("forge-high", "forge-medium", "forge-low")


def training_priority(model: Model, compute: Compute) -> str:
    """The PriorityClass a Model's training runs at: its own `priority` when it sets one (so two
    models of one queued pool can preempt one another), else its pool's training priority."""
    if model.spec.priority is not None:
        return f"forge-{model.spec.priority}"
    return TRAINING_PRIORITY[compute.spec.priority]

#: `/dev/shm` for NCCL and DataLoader workers: the container runtime's default is 64 MiB, which
#: multi-GPU PyTorch exhausts. A memory-backed `emptyDir`, which `restricted` allows (it forbids
#: host paths, not memory volumes); its size counts against the pod's memory limit.
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
