"""`forgectl doctor`: check what a cluster must provide for the rendered objects to run — the
requirements `renderers.prerequisites.cluster_requirements` derives — against the live cluster.

Each requirement comes out `ok`, `missing`, `unknown` (the check was not allowed: the message
says which right would let it run) or `manual` (no API answers it; the docs say how to check).
Only reads: discovery, and GETs of cluster-scoped objects granted by the
`forgectl-namespace-reader` ClusterRole in docs/rbac/forgectl-role.yaml.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from reconciler.errors import ForbiddenError, TargetError, TargetNotAvailable
from reconciler.targets.base import ClusterAPI, Target
from reconciler.traffic.gateway import condition_problem
from renderers.prerequisites import Requirement
from specs import Environment, SpecSet

DEFAULT_CLASS = "storageclass.kubernetes.io/is-default-class"


@dataclass(frozen=True)
class Finding:
    """The outcome of checking one requirement."""

    requirement: Requirement
    status: str  # ok | missing | unknown | manual
    detail: str

    def to_json(self) -> dict[str, str]:
        """A plain dict for `-o json`."""
        return {**self.requirement.to_json(), "status": self.status, "detail": self.detail}


def _crd(api: ClusterAPI, req: Requirement) -> Finding:
    plural = req.name.split(".", 1)[0]
    found = api.read_path(req.api_path, what=f"API {req.api_path}")
    served = {r.get("name") for r in (found or {}).get("resources", [])}
    if plural in served:
        return Finding(req, "ok", f"{req.api_path} serves {plural}")
    return Finding(req, "missing", f"{req.api_path} does not serve {plural}: install the CRD and its controller")


def _named(api: ClusterAPI, req: Requirement, path: str) -> Finding:
    if api.read_path(path, what=f"{req.kind} {req.name}") is None:
        return Finding(req, "missing", f"no {req.kind} {req.name!r} in the cluster")
    return Finding(req, "ok", "present")


def _secret(api: ClusterAPI, req: Requirement) -> Finding:
    """Whether the Secret holds the keys the pods read (their names only: no value is kept or shown)."""
    namespace, _, name = req.name.partition("/")
    try:
        found = api.read_path(f"/api/v1/namespaces/{namespace}/secrets/{name}", what=f"Secret {req.name}")
    except ForbiddenError:
        # Forge's roles never grant reading Secrets (their values): an admin's credentials can check.
        return Finding(req, "unknown", f"not allowed to read Secrets (Forge's roles do not grant it): check that "
                                       f"{name!r} exists in {namespace} with the key(s) {', '.join(req.keys)}")
    if found is None:
        return Finding(req, "missing", f"no Secret {name!r} in {namespace}: create it with the key(s) {', '.join(req.keys)}")
    lacking = [k for k in req.keys if k not in (found.get("data") or {}) and k not in (found.get("stringData") or {})]
    if lacking:
        return Finding(req, "missing", f"Secret {name!r} has no key {', '.join(lacking)}")
    return Finding(req, "ok", f"holds {', '.join(req.keys)}")


def _storage_class(api: ClusterAPI, req: Requirement) -> Finding:
    if req.name != "(default)":
        return _named(api, req, f"/apis/storage.k8s.io/v1/storageclasses/{req.name}")
    classes = (api.read_path("/apis/storage.k8s.io/v1/storageclasses", what="StorageClasses") or {}).get("items", [])
    default = [c["metadata"]["name"] for c in classes if (c["metadata"].get("annotations") or {}).get(DEFAULT_CLASS) == "true"]
    if default:
        return Finding(req, "ok", f"default class {default[0]!r}")
    return Finding(req, "missing", "no default StorageClass: mark one default or set `spec.kubernetes.workspace.storageClassName`")


def _extended_resource(api: ClusterAPI, req: Requirement) -> Finding:
    nodes = (api.read_path("/api/v1/nodes", what="Nodes") or {}).get("items", [])
    having = [n["metadata"]["name"] for n in nodes if req.name in (n.get("status", {}).get("allocatable") or {})]
    if having:
        return Finding(req, "ok", f"{len(having)} node(s) advertise it")
    return Finding(req, "missing", f"no node advertises {req.name}: install the vendor's device plugin on the GPU nodes")


#: API paths whose resources show an ingress Seldon can split traffic with (the operator's
#: ISTIO_ENABLED / AMBASSADOR_ENABLED must match; that setting is not visible through the API).
TRAFFIC_SPLITTERS = (("/apis/networking.istio.io/v1alpha3", "virtualservices", "Istio"),
                     ("/apis/getambassador.io/v2", "mappings", "Ambassador"))


def _traffic_splitter(api: ClusterAPI, req: Requirement) -> Finding:
    for path, plural, name in TRAFFIC_SPLITTERS:
        found = api.read_path(path, what=f"API {path}")
        if plural in {r.get("name") for r in (found or {}).get("resources", [])}:
            return Finding(req, "ok", f"{name} is installed ({path}); the Seldon operator must have it enabled")
    return Finding(req, "missing", "neither Istio's VirtualService nor Ambassador's Mapping API is served: "
                                   "canary weights would not be applied")


GATEWAY_API = "/apis/gateway.networking.k8s.io/v1"


def _condition(obj: Mapping[str, Any], kind: str) -> str | None:
    """None when ``obj``'s status has condition ``kind`` True for its current generation, else why not."""
    return condition_problem((obj.get("status") or {}).get("conditions") or [], kind,
                             (obj.get("metadata") or {}).get("generation"), f"the {obj.get('kind', 'object')}")


def _gateway(api: ClusterAPI, req: Requirement) -> Finding:
    """The Gateway the routes attach to: it exists, its GatewayClass exists and is Accepted by its
    controller, the Gateway is Programmed, and the listener the routes name is one of its own."""
    namespace, name = req.name.split("/", 1)
    gateway = api.read_path(f"{GATEWAY_API}/namespaces/{namespace}/gateways/{name}", what=f"Gateway {req.name}")
    if gateway is None:
        return Finding(req, "missing", f"no Gateway {req.name}: create it (docs/cluster-prerequisites.md)")
    class_name = (gateway.get("spec") or {}).get("gatewayClassName", "")
    gateway_class = api.read_path(f"{GATEWAY_API}/gatewayclasses/{class_name}", what=f"GatewayClass {class_name}")
    if gateway_class is None:
        return Finding(req, "missing", f"its GatewayClass {class_name!r} does not exist")
    controller = (gateway_class.get("spec") or {}).get("controllerName", "?")
    why_not = _condition(gateway_class, "Accepted")
    if why_not is not None:
        return Finding(req, "missing", f"GatewayClass {class_name!r} ({controller}) is not accepted: {why_not} "
                                       "— does its controller run?")
    why_not = _condition(gateway, "Programmed")
    if why_not is not None:
        return Finding(req, "missing", f"not programmed by {controller}: {why_not}")
    listeners = [entry.get("name") for entry in (gateway.get("spec") or {}).get("listeners", [])]
    if req.listener and req.listener not in listeners:
        return Finding(req, "missing", f"has no listener {req.listener!r} (listeners: {', '.join(map(str, listeners))})")
    on = f"listener {req.listener!r}" if req.listener else f"{len(listeners)} listener(s)"
    return Finding(req, "ok", f"GatewayClass {class_name!r} accepted by {controller}; programmed, {on}")


def check(api: ClusterAPI, requirements: list[Requirement]) -> list[Finding]:
    """Check each requirement against a cluster's API (read-only)."""
    findings = []
    for req in requirements:
        try:
            if req.kind == "CustomResourceDefinition":
                findings.append(_crd(api, req))
            elif req.kind == "PriorityClass":
                findings.append(_named(api, req, f"/apis/scheduling.k8s.io/v1/priorityclasses/{req.name}"))
            elif req.kind == "StorageClass":
                findings.append(_storage_class(api, req))
            elif req.kind == "ExtendedResource":
                findings.append(_extended_resource(api, req))
            elif req.kind == "TrafficSplitter":
                findings.append(_traffic_splitter(api, req))
            elif req.kind == "Gateway":
                findings.append(_gateway(api, req))
            elif req.kind == "Secret":
                findings.append(_secret(api, req))
            elif req.kind == "ShadowCopies":
                # Forge's own servers do it: nothing to ask of the cluster but that the live pods
                # reach the shadow's Service (the namespace's network, as for any Service)
                findings.append(Finding(req, "ok", "rendered: the live predictors copy to the shadow's Service "
                                                   "(docs/experiments.md, Shadow)"))
            elif req.kind == "TrafficMirror":
                findings.append(Finding(req, "missing", "under router gatewayAPI only the v2 servers copy requests to "
                                                        "the shadow; with `protocol: seldon` it gets none "
                                                        "(docs/cluster-prerequisites.md)"))
            else:
                findings.append(Finding(req, "manual", "not visible through the API: see docs/cluster-prerequisites.md"))
        except ForbiddenError as exc:
            findings.append(Finding(req, "unknown", f"not allowed to check ({str(exc).splitlines()[0]}); bind forgectl-namespace-reader"))
        except TargetError as exc:
            findings.append(Finding(req, "unknown", str(exc).splitlines()[0]))
    return findings


def missing_notes(findings: list[Finding]) -> list[str]:
    """One plan note per requirement the cluster lacks."""
    return [f"cluster prerequisite missing: {f.requirement.kind} {f.requirement.name} — {f.detail} ({f.requirement.why})"
            for f in findings if f.status == "missing"]


def check_environment(specs: SpecSet, env: Environment, target: Target) -> list[Finding]:
    """Render ``specs`` for ``env`` and check what the rendered objects need of ``target``'s
    cluster; :class:`TargetNotAvailable` when the target has none (the local target)."""
    from renderers import RenderContext, render
    from renderers.prerequisites import cluster_requirements

    api = target.cluster_api()
    if api is None:
        raise TargetNotAvailable(f"environment {env.name!r} runs on the {target.name} target: there is no cluster to check "
                                 "(`forgectl doctor --env <a kubernetes environment>`)")
    level = env.spec.kubernetes.pod_security if env.spec.kubernetes else None
    return check(api, cluster_requirements(render(specs, RenderContext(env)).manifests, level))
