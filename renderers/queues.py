"""A `Compute` pool with a `queue` → Kueue objects (pure), and the labels that put training in it.

Per pool, on a `kubernetes` target (sigs.k8s.io/kueue v0.17.0, API `kueue.x-k8s.io/v1beta2`):

| object | scope | name | holds |
| --- | --- | --- | --- |
| `ResourceFlavor` | cluster | `<accelerator>-<digest>` | the pool's `nodeSelector` as `nodeLabels`, its tolerations with a key and an effect as `nodeTaints` |
| `ClusterQueue` | cluster | `<namespace>-<pool>` | one resource group: cpu, memory and the accelerator's resource, the flavor's nominal quota, borrowing and lending limits; the cohort, preemption, fair-sharing weight; only the environment's namespace may submit to it |
| `LocalQueue` | namespace | `<pool>` | points the namespace at the ClusterQueue |
| `WorkloadPriorityClass` | cluster | `<namespace>-<level>` | the priority the pool's training runs at (:data:`WORKLOAD_PRIORITY`) |

A ClusterQueue and a WorkloadPriorityClass carry the namespace in their names: two environments
(two teams) on one cluster may name their pools alike, and each environment owns and prunes only
its own (ownership labels). A ResourceFlavor is the hardware, and Kueue lends quota between the
queues of a cohort only per (flavor, resource): two teams' pools of the same nodes must name the
same flavor. So its name is the accelerator and a digest of what it holds (same nodes, same name,
same object, whoever renders it), and it is shared: labelled as Forge's but no one environment's,
kept from pruning (`forge.dev/prune: disabled`); an environment's plan lists only those its own
ClusterQueues name (reconciler/resources.py).

What waits for quota: the train step (each trial of a search) — its pod is labelled with the queue
(`kueue.x-k8s.io/queue-name`) for Kueue's pod integration, which gates it
(`kueue.x-k8s.io/admission`) until its Workload is admitted — and a multi-node train step's
PyTorchJob, labelled for Kueue's Kubeflow integration, which keeps it suspended until every
replica fits (the gang). The light steps (prepare-data, evaluate, register…) are not queued: they
ask no accelerator, and a queued pod is steered onto the flavor's nodes (docs/queues.md).
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Any

from renderers.labels import ENVIRONMENT, GIT_REVISION, MANAGED_BY, MANAGER, PRUNE, digest, owner_metadata
from specs import Compute, Environment, SpecSet
from specs.queue import QueueResources

API_VERSION = "kueue.x-k8s.io/v1beta2"
#: Kueue's labels (pkg/controller/constants: QueueLabel, WorkloadPriorityClassLabel). Users may not
#: set them (specs/base.py reserves `x-k8s.io/`); Forge writes them.
QUEUE_NAME = "kueue.x-k8s.io/queue-name"
PRIORITY_CLASS = "kueue.x-k8s.io/priority-class"
#: The scheduling gate Kueue's pod webhook adds to a queued pod (pkg/controller/jobs/pod/constants).
ADMISSION_GATE = "kueue.x-k8s.io/admission"
#: Kubernetes' own label of a Namespace's name: the ClusterQueue admits only the environment's namespace.
NAMESPACE_NAME = "kubernetes.io/metadata.name"
#: Workload priority by the PriorityClass a pod of Forge's runs at (renderers/pods.py): Kueue
#: compares these among workloads (preemption within a queue, reclaiming across the cohort).
WORKLOAD_PRIORITY = {"forge-high": ("high", 1000), "forge-medium": ("medium", 500), "forge-low": ("low", 100)}
#: Kueue's CRD bounds a flavor's node labels and taints to 8 each.
MAX_FLAVOR_LABELS = 8

_QUANTITY = re.compile(r"^(?P<number>[0-9]+(\.[0-9]+)?)(?P<suffix>[a-zA-Z]*)$")


def queue_object_name(namespace: str, pool: str) -> str:
    """Name of a pool's ClusterQueue (cluster-scoped: the namespace keeps two environments' pools apart)."""
    return f"{namespace}-{pool}"


def flavor_spec(compute: Compute) -> dict[str, Any]:
    """The ResourceFlavor `spec` of a pool's nodes."""
    spec: dict[str, Any] = {}
    if compute.spec.node_selector:
        spec["nodeLabels"] = dict(sorted(compute.spec.node_selector.items()))
    taints = flavor_taints(compute)
    if taints:
        spec["nodeTaints"] = taints
    return spec


def flavor_name(compute: Compute) -> str:
    """Name of the ResourceFlavor of a pool's nodes: the accelerator type and a digest of the
    flavor and the resource it offers, so pools of the same nodes share it."""
    accelerator = compute.spec.accelerator
    key = {"resource": accelerator.effective_resource_name, "spec": flavor_spec(compute)}
    return f"{accelerator.type}-{digest(key)[:10]}"


def priority_class_name(namespace: str, priority_class: str) -> str:
    """Name of the WorkloadPriorityClass of pods running at PriorityClass ``priority_class``."""
    return f"{namespace}-{WORKLOAD_PRIORITY[priority_class][0]}"


def queued(compute: Compute, env: Environment) -> bool:
    """True when the pool's training is admitted through Kueue in ``env`` (a queue, on a cluster)."""
    return compute.spec.queue is not None and env.spec.target == "kubernetes"


def queue_labels(compute: Compute, env: Environment, namespace: str, priority_class: str) -> dict[str, str]:
    """The labels that submit a training pod or PyTorchJob to the pool's LocalQueue at its
    priority; empty when the pool is not queued in ``env``."""
    if not queued(compute, env):
        return {}
    return {PRIORITY_CLASS: priority_class_name(namespace, priority_class), QUEUE_NAME: compute.name}


def scale_quantity(value: str, factor: int) -> str:
    """A Kubernetes quantity times a whole number, in the same unit (``"1800Gi"`` × 8 = ``"14400Gi"``)."""
    match = _QUANTITY.match(value)
    if match is None:
        raise ValueError(f"not a quantity: {value!r}")
    number = Decimal(match["number"]) * factor
    text = format(number.normalize(), "f") if number != number.to_integral() else str(int(number))
    return text + match["suffix"]


def nominal_quota(compute: Compute) -> dict[str, str]:
    """Resource → nominal quota of the pool's flavor: the spec's, with cpu and memory derived from
    the nodes the GPU quota fills (one node on a CPU pool) where the spec leaves them out."""
    spec = compute.spec
    queue = spec.queue
    assert queue is not None
    quota = queue.quota
    resource = spec.accelerator.effective_resource_name
    gpus = quota.gpus or 0
    nodes = max(1, math.ceil(gpus / spec.gpus_per_node)) if spec.gpus_per_node else 1
    out = {"cpu": quota.cpu or scale_quantity(spec.node.cpu, nodes),
           "memory": quota.memory or scale_quantity(spec.node.memory, nodes)}
    if resource is not None:
        out[resource] = str(gpus)
    return out


def _limits(compute: Compute, limit: QueueResources | None) -> dict[str, str]:
    if limit is None:
        return {}
    out = {k: v for k, v in (("cpu", limit.cpu), ("memory", limit.memory)) if v is not None}
    resource = compute.spec.accelerator.effective_resource_name
    if resource is not None and limit.gpus is not None:
        out[resource] = str(limit.gpus)
    return out


def admission_ceiling(compute: Compute) -> int | None:
    """The most GPUs one workload of the pool can ever be admitted with: the nominal quota, plus
    the borrowing limit in a cohort; None when the queue may borrow without limit from a cohort
    whose other members Forge cannot see (other teams' repositories), or has no queue."""
    queue = compute.spec.queue
    if queue is None or queue.quota.gpus is None:
        return None
    if queue.cohort is None:
        return queue.quota.gpus
    borrow = queue.borrowing_limit.gpus if queue.borrowing_limit is not None else None
    return None if borrow is None else queue.quota.gpus + borrow


def flavor_taints(compute: Compute) -> list[dict[str, str]]:
    """The taints the pool's nodes carry, as far as its tolerations say (those with a key and an
    effect): Kueue admits onto the flavor only workloads that tolerate them."""
    taints = []
    for t in compute.spec.tolerations:
        if t.key is None or t.effect is None:
            continue
        taint = {"key": t.key, "effect": t.effect}
        if t.operator == "Equal" and t.value:
            taint["value"] = t.value
        taints.append(taint)
    return taints


def _cluster_metadata(compute: Compute, name: str, env: Environment, revision: str | None) -> dict[str, Any]:
    meta = owner_metadata(compute, name=name, namespace="", environment=env.name, revision=revision)
    del meta["namespace"]
    return meta


def render_pool_queue(compute: Compute, env: Environment, namespace: str, revision: str | None) -> list[dict[str, Any]]:
    """The ResourceFlavor (shared, see the module docstring), ClusterQueue and LocalQueue of one queued pool."""
    queue = compute.spec.queue
    assert queue is not None
    name = queue_object_name(namespace, compute.name)
    flavor = flavor_name(compute)
    quota = nominal_quota(compute)
    borrow, lend = _limits(compute, queue.borrowing_limit), _limits(compute, queue.lending_limit)
    covered = list(quota)
    resources = []
    for resource in covered:
        entry = {"name": resource, "nominalQuota": quota[resource]}
        if resource in borrow:
            entry["borrowingLimit"] = borrow[resource]
        if resource in lend:
            entry["lendingLimit"] = lend[resource]
        resources.append(entry)
    p = queue.preemption
    preemption: dict[str, Any] = {"reclaimWithinCohort": p.reclaim_within_cohort,
                                  "withinClusterQueue": p.within_cluster_queue,
                                  "borrowWithinCohort": {"policy": p.borrow_within_cohort.policy}}
    if p.borrow_within_cohort.max_priority_threshold is not None:
        preemption["borrowWithinCohort"]["maxPriorityThreshold"] = p.borrow_within_cohort.max_priority_threshold
    cq_spec: dict[str, Any] = {
        "namespaceSelector": {"matchLabels": {NAMESPACE_NAME: namespace}},
        "resourceGroups": [{"coveredResources": covered, "flavors": [{"name": flavor, "resources": resources}]}],
        "preemption": preemption,
    }
    if queue.cohort is not None:
        cq_spec["cohortName"] = queue.cohort
    if queue.fair_sharing is not None:
        cq_spec["fairSharing"] = {"weight": queue.fair_sharing.weight}
    local_meta = owner_metadata(compute, name=compute.name, namespace=namespace, environment=env.name, revision=revision)
    return [
        {"apiVersion": API_VERSION, "kind": "ResourceFlavor",
         "metadata": {"name": flavor, "labels": {MANAGED_BY: MANAGER}, "annotations": {PRUNE: "disabled"}},
         "spec": flavor_spec(compute)},
        {"apiVersion": API_VERSION, "kind": "ClusterQueue", "metadata": _cluster_metadata(compute, name, env, revision),
         "spec": cq_spec},
        {"apiVersion": API_VERSION, "kind": "LocalQueue", "metadata": local_meta, "spec": {"clusterQueue": name}},
    ]


def render_priority_class(priority_class: str, env: Environment, namespace: str, revision: str | None) -> dict[str, Any]:
    """The WorkloadPriorityClass of the environment's queued pods at ``priority_class``."""
    level, value = WORKLOAD_PRIORITY[priority_class]
    labels = {MANAGED_BY: MANAGER, ENVIRONMENT: env.name}
    meta: dict[str, Any] = {"name": priority_class_name(namespace, priority_class), "labels": dict(sorted(labels.items()))}
    if revision:
        meta["annotations"] = {GIT_REVISION: revision}
    return {"apiVersion": API_VERSION, "kind": "WorkloadPriorityClass", "metadata": meta, "value": value,
            "description": f"Forge: {level}-priority training of namespace {namespace} ({priority_class})"}


def render_queues(specs: SpecSet, env: Environment, namespace: str, revision: str | None,
                  priority_classes: set[str]) -> list[dict[str, Any]]:
    """Every queued pool's objects in ``env``, and a WorkloadPriorityClass for each PriorityClass
    in ``priority_classes`` (those the queued training runs at); nothing off a cluster."""
    if env.spec.target != "kubernetes":
        return []
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for compute in specs.of(Compute):
        if queued(compute, env):
            for obj in render_pool_queue(compute, env, namespace, revision):
                out[(obj["kind"], obj["metadata"]["name"])] = obj  # pools of the same nodes: one flavor
    return [*out.values(), *(render_priority_class(p, env, namespace, revision) for p in sorted(priority_classes))]
