"""What a cluster needs before Forge's objects can run, split by who owns it.

Forge renders what lives in the environment's namespace and only its steps use: the workspace
PersistentVolumeClaim (sized from the models it will hold) and the workflow ServiceAccount with
the Role its pods need. What is cluster-wide or shared with other teams — the controllers and
their CRDs, PriorityClasses, StorageClasses, GPU device plugins — belongs to the cluster admin:
:func:`cluster_requirements` lists it from the rendered objects, `forgectl doctor` checks it
against the cluster, and docs/cluster-prerequisites.md says how to provide it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from renderers.errors import RenderError
from renderers.labels import TRAFFIC_ROUTER
from renderers.scheduling import parameter_count
from specs import Environment, Model, SpecSet
from specs.base import quantity_value

GIB = 2**30
WORKSPACE_PVC = "forge-workspace"
WORKFLOW_SERVICE_ACCOUNT = "forge-workflow"
#: Bytes a training checkpoint holds per parameter: fp32 master weights (or weights) and Adam's
#: two moments (12), plus the bf16/fp16 weights (2) and headroom for the scheduler/RNG state.
CHECKPOINT_BYTES_PER_PARAMETER = 16
MIN_WORKSPACE_GIB = 20
WORKSPACE_HEADROOM = 1.5


class PrerequisiteError(RenderError):
    """A setting the cluster cannot satisfy, found from the specs alone (e.g. a workspace smaller
    than one checkpoint); the message names the numbers."""


def checkpoint_bytes(specs: SpecSet, model: Model) -> int:
    """Estimated size of one training checkpoint of ``model``."""
    return parameter_count(model, specs.dataset_of(model)) * CHECKPOINT_BYTES_PER_PARAMETER


def workspace_claim(specs: SpecSet, env: Environment, namespace: str, metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The workspace PersistentVolumeClaim: the Environment's class, size and access mode; the
    size defaults to 1.5 × the largest checkpoint (at least 20Gi), and a smaller explicit size
    is refused rather than discovered when a training step runs out of disk."""
    settings = env.spec.kubernetes.workspace if env.spec.kubernetes else None
    largest = max(((checkpoint_bytes(specs, m), m.name) for m in specs.of(Model)), default=(0, ""))
    wanted_gib = max(MIN_WORKSPACE_GIB, math.ceil(largest[0] * WORKSPACE_HEADROOM / GIB))
    size = settings.size if settings and settings.size else f"{wanted_gib}Gi"
    if largest[0] and quantity_value(size) < largest[0]:
        raise PrerequisiteError(
            f"Environment {env.name!r}: workspace size {size} is smaller than one training checkpoint of model "
            f"{largest[1]!r} (~{largest[0] / GIB:.0f} GiB: {CHECKPOINT_BYTES_PER_PARAMETER} bytes per parameter); "
            f"set `spec.kubernetes.workspace.size` to at least {wanted_gib}Gi"
        )
    spec: dict[str, Any] = {"accessModes": [settings.access_mode if settings else "ReadWriteMany"],
                            "resources": {"requests": {"storage": size}}}
    if settings and settings.storage_class_name:
        spec["storageClassName"] = settings.storage_class_name
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": WORKSPACE_PVC, "namespace": namespace, **metadata}, "spec": spec}


def workflow_service_account(env: Environment) -> str:
    """The ServiceAccount the workflow pods run as."""
    k8s = env.spec.kubernetes
    return (k8s.service_account if k8s and k8s.service_account else None) or WORKFLOW_SERVICE_ACCOUNT


def workflow_rbac(env: Environment, namespace: str, metadata: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The workflow ServiceAccount, its Role and the RoleBinding between them (namespaced: Forge
    owns and prunes them like its other objects)."""
    name = workflow_service_account(env)

    def meta(kind_name: str) -> dict[str, Any]:
        return {"name": kind_name, "namespace": namespace, **metadata}

    rules = [
        # Argo's executor (emissary) reports each step's outputs and outcome through these.
        {"apiGroups": ["argoproj.io"], "resources": ["workflowtaskresults"], "verbs": ["create", "patch"]},
        # Multi-node training: the resource template creates the PyTorchJob and watches its status.
        {"apiGroups": ["kubeflow.org"], "resources": ["pytorchjobs"], "verbs": ["create", "get", "list", "watch", "patch", "delete"]},
    ]
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(name)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta(f"{name}-steps"), "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta(f"{name}-steps"),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": f"{name}-steps"},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]},
    ]


#: Pod Security: every pod Forge renders meets `restricted` (renderers/pods.py). The containers the
#: controllers add to those pods take their settings from the controllers' configuration, which
#: the cluster admin owns; for a namespace that enforces `restricted` these are what they set
#: (docs/cluster-prerequisites.md shows both; the test node sets them, devkit/node/argo.py; the
#: upstream evaluator judges the pods with them, tests/judges/test_pod_security_judge.py).
#:
#: Argo's `workflow-controller-configmap`, key `executor` (a container spec): its
#: `securityContext` goes on the `init` and `wait` containers of every step pod and on the `main`
#: container of a resource template's pod (the one that creates a PyTorchJob). `restricted` asks
#: of each container what the pod cannot say for it: no privilege escalation, no capabilities. The
#: rest comes from Forge's pod (non-root uid 1000, seccomp RuntimeDefault), so this does not set
#: `runAsNonRoot`: the setting is cluster-wide, and on other teams' Workflows, whose pods say no
#: user, the kubelet would refuse the executor's image, which runs as root. No
#: `readOnlyRootFilesystem` either: `restricted` does not ask for it, and Argo's own default for
#: resource pods leaves it off `init` and `wait` (argoproj/argo-workflows#10787).
ARGO_EXECUTOR_SECURITY_CONTEXT: dict[str, Any] = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
#: The Kubeflow Training Operator adds an `init-pytorch` container (it waits for the master's DNS
#: name) to every worker pod of a multi-node PyTorchJob, from the template file named by its
#: `--pytorch-init-container-template-file` flag (default /etc/config/initContainer.yaml, else its
#: built-in template, which sets no security context). This is that built-in template (v1.9.4,
#: pkg/controller.v1/pytorch/initcontainer.go) with what `restricted` asks of a container (as for
#: the executor, the user comes from the pod); the `{{...}}` fields are the operator's Go template.
PYTORCH_INIT_CONTAINER_TEMPLATE = """\
- name: init-pytorch
  image: {{.InitContainerImage}}
  imagePullPolicy: IfNotPresent
  resources:
    limits:
      cpu: 100m
      memory: 20Mi
    requests:
      cpu: 50m
      memory: 10Mi
  securityContext:
    allowPrivilegeEscalation: false
    capabilities:
      drop: [ALL]
  command: ['sh', '-c', 'for i in $(seq {{.MaxTries}}); do if getent hosts {{.MasterAddr}}; then exit 0; fi; echo waiting for master; sleep 2; done; exit 1']
"""
POD_SECURITY_ENFORCE = "pod-security.kubernetes.io/enforce"


def pod_security_note(env: Environment, namespace: str) -> str | None:
    """The plan's line on the Pod Security level of the environment's namespace (a cluster only)."""
    if env.spec.target != "kubernetes" or env.spec.kubernetes is None:
        return None
    level = env.spec.kubernetes.pod_security
    note = (f"Pod Security: namespace {namespace} enforces `{level}` (`spec.kubernetes.podSecurity`; the admin's "
            f"`{POD_SECURITY_ENFORCE}` label); every pod Forge renders meets `restricted`")
    if level == "restricted":
        return note + (", the containers Argo's executor and the Training Operator add with the controller settings "
                       "of docs/cluster-prerequisites.md")
    return note + f", so `{level}` admits them"


@dataclass(frozen=True)
class Requirement:
    """One thing the cluster admin provides, and why Forge needs it."""

    kind: str  # "CustomResourceDefinition", "PriorityClass", "StorageClass", "ExtendedResource", "ControllerRights",
    #            "PodSecurity", "TrafficSplitter", "Gateway", "TrafficMirror", "Secret"
    name: str
    why: str
    #: For a CRD: the API group/version path the objects use (`/apis/<group>/<version>`).
    api_path: str = ""
    #: For a Gateway: the listener the routes attach to (`sectionName`), if one is named.
    listener: str = ""
    #: For a Secret: the keys the pods read from it.
    keys: tuple[str, ...] = ()

    def to_json(self) -> dict[str, str]:
        """A plain dict for `-o json`."""
        return {"kind": self.kind, "name": self.name, "why": self.why}


_CRDS = {
    "Workflow": ("workflows.argoproj.io", "/apis/argoproj.io/v1alpha1", "Argo Workflows runs training and compression"),
    "SeldonDeployment": ("seldondeployments.machinelearning.seldon.io", "/apis/machinelearning.seldon.io/v1",
                         "Seldon Core v1 runs the model servers"),
    "PodMonitor": ("podmonitors.monitoring.coreos.com", "/apis/monitoring.coreos.com/v1",
                   "the Prometheus Operator scrapes the model servers"),
    "PrometheusRule": ("prometheusrules.monitoring.coreos.com", "/apis/monitoring.coreos.com/v1",
                       "the Prometheus Operator loads the rollout alerts"),
    "PyTorchJob": ("pytorchjobs.kubeflow.org", "/apis/kubeflow.org/v1", "the Kubeflow Training Operator runs multi-node training"),
    # A Compute pool with a queue (renderers/queues.py, docs/queues.md).
    **{kind: (f"{plural}.kueue.x-k8s.io", "/apis/kueue.x-k8s.io/v1beta2", "Kueue admits the queued pools' training by quota")
       for kind, plural in (("ResourceFlavor", "resourceflavors"), ("ClusterQueue", "clusterqueues"),
                            ("LocalQueue", "localqueues"), ("WorkloadPriorityClass", "workloadpriorityclasses"))},
}


def _pods(obj: Mapping[str, Any]) -> Iterable[tuple[str, Mapping[str, Any]]]:
    """(what, pod-spec-like mapping) of every pod an object makes."""
    kind = obj.get("kind")
    spec = obj.get("spec") or {}
    if kind == "Workflow":
        for template in spec.get("templates", []):
            yield f"Workflow {obj['metadata']['name']} step {template['name']}", template
            manifest = (template.get("resource") or {}).get("manifest")
            if manifest:
                job = json.loads(manifest)
                for role, replica in (job.get("spec", {}).get("pytorchReplicaSpecs") or {}).items():
                    yield f"PyTorchJob of {obj['metadata']['name']} ({role})", replica["template"]["spec"]
    elif kind == "SeldonDeployment":
        for predictor in spec.get("predictors", []):
            for component in predictor.get("componentSpecs", []):
                yield f"SeldonDeployment {obj['metadata']['name']} predictor {predictor['name']}", component["spec"]


def _secret_refs(container: Mapping[str, Any]) -> Iterable[Mapping[str, str]]:
    """The Secret keys a container's environment needs (an `optional` one does not stop the pod)."""
    for env in container.get("env") or ():
        ref = (env.get("valueFrom") or {}).get("secretKeyRef")
        if ref and not ref.get("optional"):
            yield ref


def cluster_requirements(manifests: Iterable[Mapping[str, Any]], pod_security: str | None = None) -> list[Requirement]:
    """What the rendered objects need of the cluster that Forge does not render (pure).
    ``pod_security``: the level the namespace enforces (`spec.kubernetes.podSecurity`); at
    `restricted`, the controllers' settings for the containers they add to Forge's pods."""
    found: dict[tuple[str, str], Requirement] = {}

    def need(req: Requirement) -> None:
        found.setdefault((req.kind, req.name), req)

    for obj in manifests:
        kind = obj.get("kind", "")
        if kind in _CRDS:
            crd, path, why = _CRDS[kind]
            need(Requirement("CustomResourceDefinition", crd, why, path))
        routed = ((obj.get("metadata") or {}).get("annotations") or {}).get(TRAFFIC_ROUTER) == "gatewayAPI"
        if kind == "SeldonDeployment" and not routed:
            # Seldon v1 applies the predictors' `traffic` only through an ingress it drives: with
            # neither, every predictor gets its own Service and no weight is enforced.
            need(Requirement("TrafficSplitter", "istio-or-ambassador",
                             "Seldon splits traffic between stable and canary by `traffic` only through Istio "
                             "(VirtualService) or Ambassador (Mapping); the operator must run with one enabled"))
        spec = obj.get("spec") or {}
        if kind == "SeldonDeployment" and routed and any(p.get("shadow") for p in spec.get("predictors", [])):
            # Under an HTTPRoute the v2 servers copy requests to the shadow themselves
            # (runtimes/serving/mirror.py); the Seldon v1 wrapper does not.
            if spec.get("protocol") == "seldon":
                need(Requirement("TrafficMirror", obj["metadata"]["name"],
                                 "the shadow predictor gets copies of requests only through a mirror; with `router: "
                                 "gatewayAPI` the v2 servers copy them, but this Endpoint serves `protocol: seldon`, "
                                 "whose wrapper does not"))
            else:
                need(Requirement("ShadowCopies", obj["metadata"]["name"],
                                 "the live predictors' servers copy what they answered to the shadow's Service and "
                                 "compare the answers (forge_shadow_* series); the gateway mirrors nothing (Traefik's "
                                 "provider has no RequestMirror, and a gateway's mirror drops the shadow's answers)"))
        if kind == "HTTPRoute":
            need(Requirement("CustomResourceDefinition", "httproutes.gateway.networking.k8s.io",
                             "a Gateway API implementation splits the Endpoints' traffic (`traffic.router: gatewayAPI`)",
                             "/apis/gateway.networking.k8s.io/v1"))
            for ref in (obj.get("spec") or {}).get("parentRefs", []):
                need(Requirement("Gateway", f"{ref.get('namespace') or obj['metadata']['namespace']}/{ref['name']}",
                                 "the Endpoints' HTTPRoutes attach to it; its GatewayClass's controller must accept "
                                 "it and program the listener", listener=ref.get("sectionName") or ""))
        if kind == "Workflow" and pod_security == "restricted":
            need(Requirement("PodSecurity", "argo-executor",
                             "the namespace enforces Pod Security `restricted`: the workflow-controller's ConfigMap "
                             "must give its executor (the `init` and `wait` containers of every step pod) "
                             f"`executor.securityContext: {json.dumps(ARGO_EXECUTOR_SECURITY_CONTEXT)}`"))
        if kind == "Workflow":
            need(Requirement("ControllerRights", "configmaps",
                             "the Argo controller writes the step cache (memoize) as ConfigMaps in its own "
                             "namespace (v4.0.5; upstream's docs/memoization.md: grant it create and update on "
                             "configmaps)"))
        if kind == "PersistentVolumeClaim":
            cls = obj["spec"].get("storageClassName")
            mode = obj["spec"]["accessModes"][0]
            need(Requirement("StorageClass", cls or "(default)",
                             f"the workspace claim ({obj['spec']['resources']['requests']['storage']}, {mode}) binds to it"))
        for what, pod in _pods(obj):
            priority = pod.get("priorityClassName")
            if priority:
                need(Requirement("PriorityClass", priority, f"{what} runs at this priority"))
            manifest = (pod.get("resource") or {}).get("manifest")
            if manifest:
                crd, path, why = _CRDS["PyTorchJob"]
                need(Requirement("CustomResourceDefinition", crd, why, path))
                if pod_security == "restricted":
                    need(Requirement("PodSecurity", "pytorch-init-container",
                                     "the namespace enforces Pod Security `restricted`: the Training Operator adds an "
                                     "`init-pytorch` container to every worker pod; its "
                                     "`--pytorch-init-container-template-file` must give it the security context "
                                     "of docs/cluster-prerequisites.md"))
            containers = [pod["container"]] if "container" in pod else list(pod.get("containers", []))
            for container in containers:
                for ref in _secret_refs(container):
                    name = f"{(obj.get('metadata') or {}).get('namespace', '')}/{ref['name']}"
                    had = found.get(("Secret", name))
                    keys = tuple(sorted({*(had.keys if had else ()), ref["key"]}))
                    found[("Secret", name)] = Requirement("Secret", name, had.why if had else f"{what} reads it", keys=keys)
                for resource in (container.get("resources") or {}).get("limits", {}):
                    if "/" in resource:
                        need(Requirement("ExtendedResource", resource, f"{what} requests it (a device plugin advertises it)"))
    order = {"CustomResourceDefinition": 0, "TrafficSplitter": 1, "Gateway": 1, "TrafficMirror": 1, "ControllerRights": 2,
             "PodSecurity": 3, "PriorityClass": 4, "StorageClass": 5, "ExtendedResource": 6, "Secret": 7}
    return sorted(found.values(), key=lambda r: (order.get(r.kind, 9), r.name))

