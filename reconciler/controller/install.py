"""What `forgectl install` puts in a cluster, as plain manifests (like `flux install --export`):
the `forge-system` Namespace, the Sync CRD, the controller's ServiceAccount and RBAC, a Deployment
of two replicas (probes, resources, non-root, read-only root filesystem), its metrics and webhook
Service, a PodDisruptionBudget, and for the Prometheus Operator a PodMonitor and a PrometheusRule
(sync failing, rollout stuck, no leader). Pure: options in, objects out; `deploy/` holds them rendered
with the defaults (a test keeps it equal).

Least privilege: the controller does in an environment's namespace what `forgectl apply` does,
so it is bound (a RoleBinding per managed namespace, `--manage NS`) to the ClusterRole `forgectl`
of docs/rbac/forgectl-role.yaml, and cluster-wide to its read-only `forgectl-namespace-reader`;
those ClusterRoles are applied from that file, as for the CLI. Of its own it needs only its Sync
objects, their status and Events, in its namespace (a Role).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING, Any

import yaml

from reconciler.diagnostics import ForgeError
from specs.base import quantity_value

if TYPE_CHECKING:
    from reconciler.controller.config import ControllerConfig

NAME = "forge-controller"
#: The Sync CRD (package data, so an installed forgectl renders it too).
CRD_FILE = "syncs.forge.dev.yaml"
PORT = 8080
LABELS = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/part-of": "forge"}
#: The controller's configuration: a ConfigMap the user writes (docs/controller.md), mounted here.
CONFIG_MAP = f"{NAME}-config"
CONFIG_PATH = "/etc/forge/config.yaml"
CACHE_PATH = "/var/cache/forge"


#: The controller container's memory request (idle, a small environment: 61–69 MiB measured).
MEMORY_REQUEST = "128Mi"


@dataclass(frozen=True)
class InstallOptions:
    """`forgectl install`'s flags."""

    namespace: str = "forge-system"
    image: str = "forge-controller:0.1.0"
    replicas: int = 2
    #: Namespaces the controller applies to (a RoleBinding to ClusterRole `forgectl` in each).
    manage: tuple[str, ...] = field(default_factory=tuple)
    #: The Prometheus Operator's PodMonitor and PrometheusRule for the controller (its CRDs needed).
    monitoring: bool = True
    #: Secrets (in its namespace) the sources' and the webhook's `secretRef`s name: the controller may get those alone.
    secrets: tuple[str, ...] = field(default_factory=tuple)
    #: The controller container's memory limit: a sync holds the specs, their render and the live
    #: objects at once, so it grows with the environment (bench/controller_scale.py: peak 310 MiB at
    #: 1,000 endpoints, 2.4 GiB at 10,000; docs/controller.md sizes it).
    memory_limit: str = "1Gi"

    def __post_init__(self) -> None:
        try:
            limit = quantity_value(self.memory_limit)
        except ValueError as exc:
            raise ForgeError(f"--memory-limit: {exc}") from None
        if limit < quantity_value(MEMORY_REQUEST):
            raise ForgeError(f"--memory-limit {self.memory_limit}: below the container's request of {MEMORY_REQUEST}")


def installed_secrets(config: ControllerConfig, where: str) -> tuple[str, ...]:
    """The Secrets the installed controller may get (the `secretRef`s of ``config``'s sources and
    webhook: the Role names these alone). A configuration that cannot work in the pods is refused
    (:class:`ForgeError` naming ``where``, its file): a webhook `secretFile` names a file they do
    not have."""
    if config.webhook is not None and config.webhook.secret_file is not None:
        raise ForgeError(f"{where}: webhook.secretFile names a file the controller's pods do not have; "
                         "installed, the webhook takes its secret from a Secret: webhook.secretRef")
    return config.secret_refs()


def sync_crd() -> dict[str, Any]:
    """The Sync CustomResourceDefinition."""
    text = resources.files("reconciler.controller").joinpath(CRD_FILE).read_text()
    crd: dict[str, Any] = yaml.safe_load(text)
    return crd


def _meta(name: str, namespace: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    meta["labels"] = dict(LABELS)
    return meta


def _labelled(obj: dict[str, Any]) -> dict[str, Any]:
    return {**obj, "metadata": {**obj["metadata"], "labels": {**(obj["metadata"].get("labels") or {}), **LABELS}}}


def _subject(options: InstallOptions) -> list[dict[str, str]]:
    return [{"kind": "ServiceAccount", "name": NAME, "namespace": options.namespace}]


def rbac(options: InstallOptions) -> list[dict[str, Any]]:
    """The ServiceAccount, its own Role (Syncs, their status, Events) and the bindings to docs/rbac's ClusterRoles."""
    ns = options.namespace
    role_ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": NAME}
    objects: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(NAME, ns)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": _meta(NAME, ns), "rules": [
            {"apiGroups": ["forge.dev"], "resources": ["syncs"], "verbs": ["get", "list", "watch", "create", "patch"]},
            {"apiGroups": ["forge.dev"], "resources": ["syncs/status"], "verbs": ["get", "patch"]},
            {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
            # the git credentials its sources name, and no other Secret
            *([{"apiGroups": [""], "resources": ["secrets"], "resourceNames": sorted(options.secrets), "verbs": ["get"]}]
              if options.secrets else []),
        ]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": _meta(NAME, ns),
         "roleRef": role_ref, "subjects": _subject(options)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": _meta(f"{NAME}-namespace-reader"),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "forgectl-namespace-reader"},
         "subjects": _subject(options)},
    ]
    for managed in options.manage:
        # named apart from the controller's own RoleBinding: its namespace may be a managed one too
        objects.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                        "metadata": _meta(f"{NAME}-forgectl", managed),
                        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "forgectl"},
                        "subjects": _subject(options)})
    return objects


def deployment(options: InstallOptions) -> dict[str, Any]:
    """Two replicas (one leads each environment), probes on /healthz and /readyz, non-root with a
    read-only root filesystem; the configuration from a ConfigMap, git's cache in an emptyDir."""
    probe = {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 10, "failureThreshold": 3}
    container = {
        "name": "controller", "image": options.image, "imagePullPolicy": "IfNotPresent",
        "args": ["controller", "run", "--config", CONFIG_PATH],
        "ports": [{"name": "http", "containerPort": PORT, "protocol": "TCP"}],
        "livenessProbe": probe,
        "readinessProbe": {**probe, "httpGet": {"path": "/readyz", "port": "http"}, "periodSeconds": 5},
        "resources": {"requests": {"cpu": "50m", "memory": MEMORY_REQUEST}, "limits": {"memory": options.memory_limit}},
        "securityContext": {"runAsNonRoot": True, "readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "config", "mountPath": "/etc/forge", "readOnly": True},
                         {"name": "cache", "mountPath": CACHE_PATH}, {"name": "tmp", "mountPath": "/tmp"}],
    }
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(NAME, options.namespace),
        "spec": {
            "replicas": options.replicas,
            "selector": {"matchLabels": {"app.kubernetes.io/name": NAME}},
            "template": {
                "metadata": {"labels": dict(LABELS)},
                "spec": {
                    "serviceAccountName": NAME,
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532, "fsGroup": 65532,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "terminationGracePeriodSeconds": 30,
                    "containers": [container],
                    "volumes": [{"name": "config", "configMap": {"name": CONFIG_MAP}},
                                {"name": "cache", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}}],
                },
            },
        },
    }


#: How long a Sync may stay not Ready before `ForgeSyncFailing` fires (a fetch retried every interval, an
#: invalid revision waiting for the next commit).
SYNC_FAILING_FOR = "10m"
#: How long a rollout may stay at one step in Progressing or Holding before `ForgeRolloutStuck` fires
#: (the quick-start's three steps take under a minute each; a policy with long pauses raises it).
ROLLOUT_DEADLINE = "30m"
#: How long every replica may follow before `ForgeControllerNoLeader` fires (a failover takes ≤ 17 s).
NO_LEADER_FOR = "1m"
#: Only the leader's series speak for a source: a deposed replica keeps its last values.
_LEADER = "on (namespace, pod, source) (forge_controller_leader == 1)"


def pod_monitor(options: InstallOptions) -> dict[str, Any]:
    """The Prometheus Operator's PodMonitor scraping every replica's `/metrics` (each replica's own
    series: whether it leads, what it last did)."""
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor", "metadata": _meta(NAME, options.namespace),
            "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": NAME}},
                     "podMetricsEndpoints": [{"port": "http", "path": "/metrics", "interval": "15s"}]}}


def prometheus_rule(options: InstallOptions) -> dict[str, Any]:
    """The controller's alerts: a Sync failing (not Ready for :data:`SYNC_FAILING_FOR`), a rollout
    stuck at one step past :data:`ROLLOUT_DEADLINE`, no replica leading a source's environment
    (or no replica up at all) for :data:`NO_LEADER_FOR`."""
    rules = [
        {"alert": "ForgeSyncFailing",
         "expr": f"(forge_controller_sync_ready == 0) and {_LEADER}",
         "for": SYNC_FAILING_FOR, "labels": {"severity": "warning"},
         "annotations": {"summary": "Forge source {{ $labels.source }}: sync failing",
                         "description": f"The Sync {{{{ $labels.source }}}} has not been Ready for {SYNC_FAILING_FOR}: "
                                        "`kubectl get sync {{ $labels.source }} -o yaml` (or `forgectl status`) says why "
                                        "(FetchFailed, ValidationFailed with file:line, Blocked, ApplyFailed)."}},
        {"alert": "ForgeRolloutStuck",
         "expr": f'(forge_controller_rollout_phase{{phase=~"Progressing|Holding"}} == 1) and {_LEADER} '
                 f"unless on (namespace, pod, source, endpoint) (changes(forge_controller_rollout_step[{ROLLOUT_DEADLINE}]) > 0)",
         "for": "5m", "labels": {"severity": "warning"},
         "annotations": {"summary": "Forge rollout of {{ $labels.endpoint }} stuck",
                         "description": f"The rollout of endpoint {{{{ $labels.endpoint }}}} (source {{{{ $labels.source }}}}) "
                                        f"has been {{{{ $labels.phase }}}} at one step for over {ROLLOUT_DEADLINE}: "
                                        "`forgectl rollout status` shows the last analysis."}},
        {"alert": "ForgeControllerNoLeader",
         "expr": 'sum by (source) (forge_controller_leader) == 0 or absent(up{job=~".*' + NAME + '.*"} == 1)',
         "for": NO_LEADER_FOR, "labels": {"severity": "critical"},
         "annotations": {"summary": "No Forge controller leads",
                         "description": "No replica has held the environment Lease for " + NO_LEADER_FOR + ": nothing "
                                        "pulls git and no rollout is walked (a breached canary keeps its traffic)."}},
    ]
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule", "metadata": _meta(NAME, options.namespace),
            "spec": {"groups": [{"name": "forge-controller", "rules": rules}]}}


def config_map(namespace: str, text: str) -> dict[str, Any]:
    """The ConfigMap holding the controller's configuration file (``text``: a ControllerConfig,
    checked by :func:`reconciler.controller.config.load_config` before it is put here)."""
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(CONFIG_MAP, namespace), "data": {"config.yaml": text}}


def install_objects(options: InstallOptions = InstallOptions(), config: str | None = None) -> list[dict[str, Any]]:
    """Everything `forgectl install` applies, in apply order; with ``config`` (the text of a
    ControllerConfig, already checked) its ConfigMap too, which the Deployment waits for."""
    ns = options.namespace
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": _meta(ns)},
        _labelled(sync_crd()),  # so that uninstall knows it for its own
        *rbac(options),
        deployment(options),
        {"apiVersion": "v1", "kind": "Service", "metadata": _meta(NAME, ns), "spec": {
            "selector": {"app.kubernetes.io/name": NAME},
            "ports": [{"name": "http", "port": PORT, "targetPort": "http", "protocol": "TCP"}]}},
        {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": _meta(NAME, ns), "spec": {
            "minAvailable": 1, "selector": {"matchLabels": {"app.kubernetes.io/name": NAME}}}},
        *((pod_monitor(options), prometheus_rule(options)) if options.monitoring else ()),
        *((config_map(ns, config),) if config is not None else ()),
    ]
