"""`forgectl install` and `forgectl uninstall` against a cluster (like `flux install` and `flux
uninstall`): the objects :mod:`.install` renders, applied server-side; and taken away again.

**Install** checks first what it cannot create itself (the ClusterRoles of
docs/rbac/forgectl-role.yaml it binds to; the Prometheus Operator's CRDs when the PodMonitor and
PrometheusRule are wanted), creates the Namespace, then has the API server dry-run every other
object (server-side apply, `dryRun=All`) before it writes one: a refused object is named and
nothing else is applied. Applying again is a no-op (server-side apply, one field manager).

**Uninstall** removes the controller — Deployment first (its pods give the environment Leases back
on SIGTERM), Service, PodDisruptionBudget, PodMonitor, PrometheusRule, the bindings, the Role, the
ServiceAccount, the ConfigMap, the Sync CRD (and with it the Syncs) — and leaves every workload it
applied. With ``remove_workloads`` the environments its Syncs name are torn down first, as
`forgectl down` does there (only what Forge owns, under each environment's Lease). Only objects
carrying the install's labels are deleted; one without them is left and named. The Namespace is
left unless asked for (``delete_namespace``: deleting it deletes whatever is in it, which only the
user can judge), and never deleted while a kept workload lives in it. Running it twice is a no-op.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from reconciler.controller.install import LABELS, NAME, InstallOptions, config_map, install_objects
from reconciler.controller.manager import environment_named
from reconciler.diagnostics import ForgeError
from reconciler.errors import TargetError
from reconciler.plan.session import TargetOptions, open_target
from reconciler.resources import BY_KIND, SYNC, Resource
from reconciler.targets.base import ClusterAPI, ControllerAPI, Target

#: The field manager of what install applies.
MANAGER = "forge-install"
#: Every kind install writes, by kind: those Forge also renders, and the controller's own.
KINDS: dict[str, Resource] = {
    **{kind: BY_KIND[kind] for kind in ("Namespace", "ServiceAccount", "Role", "RoleBinding", "ConfigMap", "PodMonitor",
                                        "PrometheusRule")},
    "CustomResourceDefinition": Resource("apiextensions.k8s.io", "v1", "CustomResourceDefinition",
                                         "customresourcedefinitions", namespaced=False),
    "ClusterRoleBinding": Resource("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding", "clusterrolebindings",
                                   namespaced=False),
    "Deployment": Resource("apps", "v1", "Deployment", "deployments"),
    "Service": Resource("", "v1", "Service", "services"),
    "PodDisruptionBudget": Resource("policy", "v1", "PodDisruptionBudget", "poddisruptionbudgets"),
}
#: What install binds to and cannot create itself (docs/rbac/forgectl-role.yaml).
CLUSTER_ROLES = ("forgectl", "forgectl-namespace-reader")
#: The Prometheus Operator's CRDs the monitoring objects need.
MONITORING_CRDS = ("podmonitors.monitoring.coreos.com", "prometheusrules.monitoring.coreos.com")


def _ref(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{obj['kind']} {meta['namespace'] + '/' if meta.get('namespace') else ''}{meta['name']}"


def missing_prerequisites(cluster: ClusterAPI, options: InstallOptions) -> list[str]:
    """What the cluster lacks for install: each a sentence saying what to do."""
    problems = []
    for role in CLUSTER_ROLES:
        if cluster.read_path(f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{role}", what=f"ClusterRole {role}") is None:
            problems.append(f"ClusterRole {role} is missing: apply docs/rbac/forgectl-role.yaml first "
                            "(`kubectl apply --server-side -f docs/rbac/forgectl-role.yaml`)")
    if options.monitoring:
        for crd in MONITORING_CRDS:
            if cluster.read_path(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}", what=f"CRD {crd}") is None:
                problems.append(f"CRD {crd} is missing (the Prometheus Operator is not installed): install it, or "
                                "pass --no-monitoring to leave out the PodMonitor and PrometheusRule")
    return problems


def install(api: ControllerAPI, cluster: ClusterAPI, objects: list[dict[str, Any]], options: InstallOptions,
            on_line: Callable[[str], None] = lambda _: None) -> list[str]:
    """Apply ``objects`` (:func:`.install.install_objects`, and the configuration's ConfigMap when
    given); what was applied, in order. :class:`ForgeError` naming every missing prerequisite or
    the first object the API server refuses (then nothing but the Namespace was written)."""
    problems = missing_prerequisites(cluster, options)
    if problems:
        raise ForgeError("cannot install the controller:\n  " + "\n  ".join(problems))
    unknown = sorted({o["kind"] for o in objects} - set(KINDS))
    if unknown:
        raise ForgeError(f"install cannot write kind(s) {', '.join(unknown)}")
    namespaces = [o for o in objects if o["kind"] == "Namespace"]
    rest = [o for o in objects if o["kind"] != "Namespace"]
    applied = []
    for obj in namespaces:  # first: the others are dry-run inside it
        api.apply_object(KINDS["Namespace"], obj, manager=MANAGER)
        applied.append(_ref(obj))
        on_line(f"applied {_ref(obj)}")
    for obj in rest:
        try:
            api.apply_object(KINDS[obj["kind"]], obj, manager=MANAGER, dry_run=True)
        except TargetError as exc:
            raise ForgeError(f"the API server refuses {_ref(obj)}: {str(exc).splitlines()[0]} — nothing else was "
                             "applied") from exc
    for obj in rest:
        api.apply_object(KINDS[obj["kind"]], obj, manager=MANAGER)
        applied.append(_ref(obj))
        on_line(f"applied {_ref(obj)}")
    return applied


@dataclass(frozen=True)
class Applied:
    """One environment a Sync says the controller applies (its workloads)."""

    sync: str
    environment: str
    namespace: str


def synced_environments(cluster: ClusterAPI, namespace: str) -> list[Applied]:
    """The environments the controller's Syncs in ``namespace`` apply (none without the CRD)."""
    data = cluster.read_path(SYNC.path(namespace), what=f"syncs.forge.dev in {namespace}")
    found = []
    for obj in (data or {}).get("items") or []:
        spec = obj.get("spec") or {}
        if spec.get("environment") and spec.get("namespace"):
            found.append(Applied(obj["metadata"]["name"], str(spec["environment"]), str(spec["namespace"])))
    return found


def _ours(obj: Mapping[str, Any]) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in LABELS.items())


@dataclass(frozen=True)
class Uninstalled:
    """What uninstall did: deleted, left (not the install's own, or holding kept workloads), and
    the environments whose workloads were torn down."""

    deleted: tuple[str, ...]
    left: tuple[str, ...]
    torn_down: tuple[str, ...]


def uninstall(api: ControllerAPI, cluster: ClusterAPI, options: InstallOptions, *, remove_workloads: bool,
              tear_down: Callable[[Applied], None], delete_namespace: bool = False,
              on_line: Callable[[str], None] = lambda _: None) -> Uninstalled:
    """Delete what install applied for ``options`` (with the bindings of every namespace a Sync
    applies to): the Deployment first, then — with ``remove_workloads`` — each environment a Sync
    names torn down (``tear_down``), then the rest in reverse install order, the Sync CRD last. The
    Namespace only with ``delete_namespace``, and never while a kept workload lives in it."""
    synced = synced_environments(cluster, options.namespace)
    manage = tuple(dict.fromkeys((*options.manage, *(a.namespace for a in synced))))
    objects = [*install_objects(replace(options, manage=manage, monitoring=True)),
               config_map(options.namespace, "")]  # whatever was installed: a missing one is skipped
    deleted: list[str] = []
    left: list[str] = []

    def delete(obj: Mapping[str, Any]) -> None:
        resource, meta = KINDS[obj["kind"]], obj["metadata"]
        live = api.get_object(resource, meta.get("namespace") or "", meta["name"])  # None: gone, or its kind not served
        if live is None:
            return
        if not _ours(live):
            left.append(f"{_ref(obj)} (not installed by forgectl: it lacks the labels {LABELS})")
            return
        if api.delete_object(resource, meta.get("namespace") or "", meta["name"], uid=live["metadata"].get("uid")):
            deleted.append(_ref(obj))
            on_line(f"deleted {_ref(obj)}")

    for obj in objects:  # the controller stops first: its pods give the environment Leases back
        if obj["kind"] == "Deployment":
            delete(obj)
    # ... which they can only do while their RBAC and ServiceAccount still exist: the pods end after
    # the Deployment's deletion (the garbage collector, then SIGTERM), so wait for them before the rest
    _wait_for_pods_gone(cluster, options.namespace, on_line)
    torn: list[str] = []
    if remove_workloads:
        for applied in synced:
            tear_down(applied)
            torn.append(f"{applied.environment} ({applied.namespace})")
            on_line(f"removed the workloads of environment {applied.environment} in namespace {applied.namespace}")
    last = ("Deployment", "CustomResourceDefinition", "Namespace")
    for obj in reversed(objects):
        if obj["kind"] not in last:
            delete(obj)
    for kind in last[1:]:
        for obj in objects:
            if obj["kind"] != kind:
                continue
            if kind == "Namespace" and not delete_namespace:
                left.append(f"{_ref(obj)} (anything else in it is not the install's to judge: --delete-namespace deletes it)")
                continue
            if kind == "Namespace" and not remove_workloads and any(a.namespace == obj["metadata"]["name"] for a in synced):
                left.append(f"{_ref(obj)} (the workloads the controller applied live in it)")
                continue
            others = sorted({o["metadata"]["namespace"] for o in (cluster.read_path(SYNC.path(), what="syncs.forge.dev")
                                                                   or {}).get("items") or []} - {options.namespace})
            if kind == "CustomResourceDefinition" and others:
                left.append(f"{_ref(obj)} (Syncs of another controller live in {', '.join(others)})")
                continue
            delete(obj)
    return Uninstalled(tuple(deleted), tuple(left), tuple(torn))


#: How long uninstall waits for the controller's pods to end (their grace period is 30 s).
PODS_GONE_SECONDS = 90.0


def _wait_for_pods_gone(cluster: ClusterAPI, namespace: str, on_line: Callable[[str], None]) -> None:
    """Wait until no pod of the controller is left in ``namespace`` (none at once on a cluster
    without a node), saying so when it takes a while or runs out of time."""
    path = f"/api/v1/namespaces/{namespace}/pods?labelSelector=app.kubernetes.io%2Fname%3D{NAME}"
    deadline = time.monotonic() + PODS_GONE_SECONDS
    said = False
    while True:
        pods = [p["metadata"]["name"] for p in (cluster.read_path(path, what="pods") or {}).get("items") or []]
        if not pods:
            return
        if time.monotonic() > deadline:
            on_line(f"the controller's pods {', '.join(pods)} are still there after {PODS_GONE_SECONDS:.0f} s; "
                    "deleting its RBAC anyway (a Lease they hold expires by itself)")
            return
        if not said:
            on_line(f"waiting for the controller's pods to end ({', '.join(pods)}): they give their Leases back")
            said = True
        time.sleep(0.5)


def open_cluster(namespace: str, kubeconfig: str | None, context: str | None, environment: str = NAME) -> Target:
    """The cluster (``kubeconfig``, ``context``; default $KUBECONFIG, ~/.kube/config, the pod's
    ServiceAccount) as a target in ``namespace``, for ``environment``."""
    return open_target(environment_named(environment, namespace), TargetOptions(kubeconfig, context))


def install_cluster(options: InstallOptions, objects: list[dict[str, Any]], kubeconfig: str | None, context: str | None,
                    on_line: Callable[[str], None] = lambda _: None) -> list[str]:
    """`forgectl install`: :func:`install` on the cluster ``kubeconfig`` and ``context`` name."""
    target = open_cluster(options.namespace, kubeconfig, context)
    api, cluster = target.controller_api(), target.cluster_api()
    if api is None or cluster is None:
        raise ForgeError("forgectl install needs a cluster")
    return install(api, cluster, objects, options, on_line)


def uninstall_cluster(options: InstallOptions, kubeconfig: str | None, context: str | None, *, remove_workloads: bool,
                      delete_namespace: bool = False, on_line: Callable[[str], None] = lambda _: None) -> Uninstalled:
    """`forgectl uninstall`: :func:`uninstall` on the cluster ``kubeconfig`` and ``context`` name;
    a workload environment is torn down as `forgectl down` does, under its Lease."""
    from reconciler.plan.apply import apply_plan
    from reconciler.plan.live import teardown_plan

    target = open_cluster(options.namespace, kubeconfig, context)
    api, cluster = target.controller_api(), target.cluster_api()
    if api is None or cluster is None:
        raise ForgeError("forgectl uninstall needs a cluster")

    def tear_down(applied: Applied) -> None:
        workloads = open_cluster(applied.namespace, kubeconfig, context, applied.environment)
        with workloads.lock():
            apply_plan(teardown_plan(environment_named(applied.environment, applied.namespace), workloads), workloads)

    return uninstall(api, cluster, options, remove_workloads=remove_workloads, tear_down=tear_down,
                     delete_namespace=delete_namespace, on_line=on_line)
