"""The kubelet's part for a model server run as a local process (the rollout tests and benches have
an API server but no node): a Pod in the API server, labelled as Seldon labels a predictor's pods
(endpoint, role, model version: what the kubernetes rollout backend selects), whose `Ready`
condition follows the server — its process running and its readiness path answering 200, looked
at every ``period`` seconds. That is what the kubelet reports: a container that exits is NotReady
at once (the PLEG sees the exit), a failing readiness probe soon after.

    pod = ServerPod(kubeconfig, namespace, endpoint="digits", role="canary", version=v, url=server.url,
                    alive=lambda: server.proc.poll() is None)
    pod.start()   # created (NotReady), then Ready once the server answers
    ...
    pod.stop()    # the pod deleted, as when its ReplicaSet scales it away

Only the status subresource is written for the condition (no scheduler or kubelet runs to
contend with). The pod's spec is a placeholder container: nothing runs it.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable
from contextlib import suppress
from typing import Any

from renderers.labels import ENDPOINT, MODEL_VERSION, ROLE

READY_PATH = "/v2/health/ready"


def _answers(url: str, timeout: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return bool(resp.status == 200)
    except (OSError, ValueError):
        return False


class ServerPod:
    """One pod standing for one local model server (see the module docstring)."""

    def __init__(self, kubeconfig: str, namespace: str, *, endpoint: str, role: str, version: str, url: str,
                 alive: Callable[[], bool], period: float = 0.2, health: str = READY_PATH) -> None:
        from kubernetes import client, config

        self.api = client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))
        self.namespace, self.url, self.alive, self.period, self.health = namespace, url, alive, period, health
        self.name = f"{endpoint}-{role}-{version[:10]}-0"
        self.labels = {ENDPOINT: endpoint, ROLE: role, MODEL_VERSION: version}
        self.ready: bool | None = None
        #: (time of the change on the monotonic clock, Ready) each time the condition was written
        self.changes: list[tuple[float, bool]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> ServerPod:
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": self.name, "namespace": self.namespace, "labels": self.labels},
                "spec": {"containers": [{"name": "model", "image": "forge.dev/stand-in:0", "ports": [{"name": "http", "containerPort": 9000}]}]}}
        with suppress(Exception):  # a pod left by an earlier run of the same server: replaced
            self.api.delete_namespaced_pod(self.name, self.namespace, grace_period_seconds=0)
        self.api.create_namespaced_pod(self.namespace, body)
        self._write(False)
        self._thread = threading.Thread(target=self._follow, name=f"pod-{self.name}", daemon=True)
        self._thread.start()
        return self

    def _follow(self) -> None:
        while not self._stop.wait(self.period):
            alive = self.alive()
            ready = alive and _answers(self.url + self.health)
            if ready != self.ready:
                with suppress(Exception):  # the namespace may be going away at the end of a run
                    self._write(ready)
            if not alive and self.ready is False:
                return  # its process is gone for good: a server started again gets a pod of its own

    def _write(self, ready: bool) -> None:
        status = "True" if ready else "False"
        conditions: list[dict[str, Any]] = [{"type": t, "status": status, **({} if ready else {"reason": "ContainersNotReady"})}
                                            for t in ("Ready", "ContainersReady")]
        self.api.patch_namespaced_pod_status(self.name, self.namespace, {"status": {
            "phase": "Running", "podIP": "127.0.0.1", "conditions": conditions}})
        self.ready = ready
        self.changes.append((time.monotonic(), ready))

    def stop(self) -> None:
        """Stop following the server and delete the pod."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with suppress(Exception):
            self.api.delete_namespaced_pod(self.name, self.namespace, grace_period_seconds=0)
