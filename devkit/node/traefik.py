"""Traefik v3 on the node: the real gateway (``TRAEFIK_VERSION``, its Kubernetes Gateway provider)
as a host process against the node's cluster, as Argo's, Seldon's and the Prometheus Operator's
controllers run, and the GatewayClass and Gateway it accepts.

:func:`ensure_binary` builds it with ``scripts/cluster/build.sh traefik`` (upstream's ``go build
./cmd/traefik`` in the module's own tree, from the module proxy; cached by version). :func:`start`
applies upstream's RBAC for the provider (the module's
``docs/content/reference/dynamic-configuration/kubernetes-gateway-rbac.yml``: ClusterRole
``gateway-role``, bound to ServiceAccount ``traefik-controller``, here in namespace ``traefik``
instead of upstream's ``default``), runs Traefik as that ServiceAccount (a client certificate; the
provider reads ``$KUBECONFIG``), then creates the GatewayClass ``traefik`` (controller
``traefik.io/gateway-controller``, what the provider reconciles) and the Gateway ``forge`` with one
HTTP listener ``http`` that takes routes from every namespace, and returns once Traefik reports the
GatewayClass Accepted and the Gateway Accepted and Programmed.

Traefik maps a Gateway listener to the entry point with the listener's port, so the entry point
``web`` listens on a free port of 127.0.0.1 and the listener names that port. Traefik on the host
reaches the predictors at their pod IPs (the provider load-balances over the Services'
EndpointSlices itself, as upstream does by default), which the host routes to over the node's
bridge. The ``traefik`` entry point (ping, for readiness) is on another free loopback port.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devkit.node import paths
from devkit.node.controllers import (
    HostController,
    answers_ok,
    apply_docs,
    ensure_built,
    kubectl,
    manifest_docs,
    service_account_kubeconfig,
    spawn,
)
from devkit.node.node import Node, NodeError, _stderr_log

NAMESPACE = "traefik"
ACCOUNT = "traefik-controller"  # upstream's ClusterRoleBinding subject
CONTROLLER_NAME = "traefik.io/gateway-controller"
GATEWAY_CLASS = "traefik"
GATEWAY = "forge"
LISTENER = "http"
RBAC = "docs/content/reference/dynamic-configuration/kubernetes-gateway-rbac.yml"
#: Traefik's providers throttle: how long it waits after a change before it applies the next one
#: (upstream's default is 2 s, which every weight move would wait out; the node's is shorter).
THROTTLE = "200ms"


def version() -> str:
    return paths.versions()["TRAEFIK_VERSION"]


def binary_path() -> Path:
    """Where ``build.sh traefik`` puts the binary (may not exist yet)."""
    return paths.cache_dir() / "bin" / f"traefik-{version()}" / "traefik"


def ensure_binary(log: Callable[[str], None] = _stderr_log) -> Path:
    """Traefik's binary, built by ``scripts/cluster/build.sh traefik`` when missing (minutes)."""
    return ensure_built("traefik", binary_path(), f"Traefik {version()}", log)


def rbac_docs() -> list[dict[str, Any]]:
    """Upstream's RBAC for the Gateway provider, its ServiceAccount subject in :data:`NAMESPACE`."""
    v = paths.versions()
    docs = manifest_docs(paths.go_mod_download(v["TRAEFIK_MODULE"], version()) / RBAC)
    for d in docs:
        for s in d.get("subjects") or []:
            if s.get("kind") == "ServiceAccount" and s.get("name") == ACCOUNT:
                s["namespace"] = NAMESPACE
    return [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": ACCOUNT, "namespace": NAMESPACE}},
            *docs]


def gateway_docs(port: int) -> list[dict[str, Any]]:
    """The GatewayClass for Traefik's controller and the Gateway with one HTTP listener on ``port``."""
    return [
        {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass", "metadata": {"name": GATEWAY_CLASS},
         "spec": {"controllerName": CONTROLLER_NAME}},
        {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
         "metadata": {"name": GATEWAY, "namespace": NAMESPACE},
         "spec": {"gatewayClassName": GATEWAY_CLASS,
                  "listeners": [{"name": LISTENER, "protocol": "HTTP", "port": port,
                                 "allowedRoutes": {"namespaces": {"from": "All"}}}]}},
    ]


@dataclass
class TraefikGateway:
    """Traefik running for the node's cluster, and the Gateway it serves."""

    controller: HostController
    url: str  # the Gateway's listener, e.g. http://127.0.0.1:41234
    namespace: str = NAMESPACE
    name: str = GATEWAY
    listener: str = LISTENER

    def parent_ref(self) -> dict[str, str]:
        return {"name": self.name, "namespace": self.namespace, "sectionName": self.listener}


def _conditions(obj: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in (obj.get("status") or {}).get("conditions") or []}


def _get(node: Node, *args: str) -> dict[str, Any]:
    return json.loads(kubectl(node, "get", *args, "-o", "json"))


def start(cluster: Any, node: Node, *, die_with_parent: bool = False, log=_stderr_log,
          timeout: float = 90.0) -> TraefikGateway:
    """Install upstream's RBAC, start Traefik as ``traefik-controller`` and create the GatewayClass
    and Gateway; returns once Traefik has accepted both (and programmed the Gateway)."""
    t0 = time.monotonic()
    binary = ensure_binary(log)
    apply_docs(node, rbac_docs())
    kubeconfig = service_account_kubeconfig(cluster, node, NAMESPACE, ACCOUNT, "traefik")
    web, admin = paths.free_port(), paths.free_port()
    argv = [
        str(binary),
        f"--entryPoints.web.address=127.0.0.1:{web}",
        f"--entryPoints.traefik.address=127.0.0.1:{admin}",
        "--ping=true", "--ping.entryPoint=traefik",
        "--providers.kubernetesGateway=true",
        # the address a Gateway's status reports (the provider has no Service of its own to read it from)
        "--providers.kubernetesGateway.statusAddress.ip=127.0.0.1",
        f"--providers.providersThrottleDuration={THROTTLE}",
        "--global.checkNewVersion=false", "--global.sendAnonymousUsage=false",
        "--log.level=INFO",
    ]
    env = dict(os.environ, KUBECONFIG=str(kubeconfig))
    ctl = spawn(node, "traefik", argv, env=env, ready=lambda c: answers_ok(f"http://127.0.0.1:{admin}/ping"),
                timeout=timeout, die_with_parent=die_with_parent, log=log)
    apply_docs(node, gateway_docs(web))
    deadline = time.monotonic() + timeout
    while True:
        klass = _conditions(_get(node, "gatewayclass", GATEWAY_CLASS))
        gw = _conditions(_get(node, "-n", NAMESPACE, "gateway", GATEWAY))
        if klass.get("Accepted") == "True" and gw.get("Accepted") == "True" and gw.get("Programmed") == "True":
            break
        if not ctl.running():
            raise NodeError(f"traefik exited:\n{ctl.log_tail()[-4000:]}")
        if time.monotonic() > deadline:
            raise NodeError(f"Traefik did not accept GatewayClass {GATEWAY_CLASS} ({klass}) and Gateway "
                            f"{NAMESPACE}/{GATEWAY} ({gw}) in {timeout:.0f} s:\n{ctl.log_tail()[-4000:]}")
        time.sleep(0.3)
    log(f"Traefik {version()} running (pid {ctl.pid}), GatewayClass {GATEWAY_CLASS} and Gateway "
        f"{NAMESPACE}/{GATEWAY} accepted after {time.monotonic() - t0:.1f} s; listener at 127.0.0.1:{web}")
    return TraefikGateway(ctl, f"http://127.0.0.1:{web}")
