"""The kinds Forge renders and owns: their API group, version, plural and scope, and object
identities (`ObjectRef`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Resource:
    """Where a kind lives in the Kubernetes API."""

    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool = True
    #: Cluster-scoped and shared by environments (Kueue's ResourceFlavor: the hardware): listed by
    #: Forge's managed-by label alone, kept only where the environment's own objects name it
    #: (:func:`shared_in_use`), applied rather than created-only, pruned by none (the renderer
    #: marks it `forge.dev/prune: disabled`).
    shared: bool = False

    @property
    def api_version(self) -> str:
        """`group/version`, or `version` for the core group."""
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        """REST path of the collection (or of one object when ``name`` is given)."""
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        return f"{base}/{name}" if name else base


#: Every kind Forge may own, in apply order (the renderers' sort key is the same order).
OWNED: tuple[Resource, ...] = (
    Resource("", "v1", "Namespace", "namespaces", namespaced=False),
    Resource("", "v1", "PersistentVolumeClaim", "persistentvolumeclaims"),
    Resource("", "v1", "ServiceAccount", "serviceaccounts"),
    Resource("rbac.authorization.k8s.io", "v1", "Role", "roles"),
    Resource("rbac.authorization.k8s.io", "v1", "RoleBinding", "rolebindings"),
    # Kueue, for a Compute pool with a queue (renderers/queues.py): ClusterQueues and
    # WorkloadPriorityClasses carry the environment's namespace in their names and its ownership
    # labels, so each environment lists and prunes only its own; a ResourceFlavor is shared.
    Resource("kueue.x-k8s.io", "v1beta2", "ResourceFlavor", "resourceflavors", namespaced=False, shared=True),
    Resource("kueue.x-k8s.io", "v1beta2", "WorkloadPriorityClass", "workloadpriorityclasses", namespaced=False),
    Resource("kueue.x-k8s.io", "v1beta2", "ClusterQueue", "clusterqueues", namespaced=False),
    Resource("kueue.x-k8s.io", "v1beta2", "LocalQueue", "localqueues"),
    Resource("argoproj.io", "v1alpha1", "Workflow", "workflows"),
    Resource("monitoring.coreos.com", "v1", "PodMonitor", "podmonitors"),
    Resource("monitoring.coreos.com", "v1", "PrometheusRule", "prometheusrules"),
    Resource("machinelearning.seldon.io", "v1", "SeldonDeployment", "seldondeployments"),
    Resource("gateway.networking.k8s.io", "v1", "HTTPRoute", "httproutes"),  # router gatewayAPI (renderers/gateway.py)
    Resource("", "v1", "ConfigMap", "configmaps"),  # Grafana dashboards (renderers/dashboards.py)
)
BY_KIND: dict[str, Resource] = {r.kind: r for r in OWNED}
#: The kinds whose objects name the shared objects an environment uses: its ClusterQueues name
#: their ResourceFlavors. A target reads them whole, for :func:`shared_in_use`.
SHARED_REFERRERS = frozenset({"ClusterQueue"})


def shared_in_use(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``objects`` (an environment's live objects) without the shared ones (:attr:`Resource.shared`)
    that none of its own ClusterQueues names: another team's hardware is none of this
    environment's business, so its plan neither shows nor reads it."""
    named = {flavor.get("name") for obj in objects if obj.get("kind") == "ClusterQueue"
             for group in (obj.get("spec") or {}).get("resourceGroups") or [] for flavor in group.get("flavors") or []}
    return [obj for obj in objects
            if not (obj.get("kind") in BY_KIND and BY_KIND[obj["kind"]].shared) or obj["metadata"]["name"] in named]
LEASE = Resource("coordination.k8s.io", "v1", "Lease", "leases")
EVENT = Resource("", "v1", "Event", "events")
#: Read only: the rollout controller asks whether a canary's pods are Ready.
POD = Resource("", "v1", "Pod", "pods")
#: The in-cluster controller's status of one git source (deploy/crds/syncs.forge.dev.yaml).
SYNC = Resource("forge.dev", "v1alpha1", "Sync", "syncs")


@dataclass(frozen=True, order=True)
class ObjectRef:
    """Identity of an object: kind, namespace and name (the API group follows from the kind)."""

    kind: str
    namespace: str
    name: str

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> ObjectRef:
        """The identity of a manifest."""
        meta = obj.get("metadata", {})
        return cls(obj["kind"], meta.get("namespace", "") or "", meta["name"])

    @property
    def resource(self) -> Resource:
        """The API resource of this kind."""
        return BY_KIND[self.kind]

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}" if self.namespace else f"{self.kind} {self.name}"

    def to_json(self) -> dict[str, str]:
        """A plain dict for saved plans."""
        return {"kind": self.kind, "namespace": self.namespace, "name": self.name}
