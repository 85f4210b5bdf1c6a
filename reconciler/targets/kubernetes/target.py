"""The `kubernetes` target: a real cluster through the `kubernetes` client.

* reads what Forge owns with one LIST per kind and a label selector — never a GET per object;
* writes with server-side apply (field manager `forgectl`, forced, so drift made by hand is
  taken back), and server-side dry runs to settle apparent differences;
* guards each apply with a `coordination.k8s.io` Lease per environment;
* retries transient failures (connection errors, 429, 5xx) with backoff, decided by error type.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from reconciler.errors import (
    ConflictError,
    ForbiddenError,
    InvalidObjectError,
    LockHeldError,
    TargetError,
    TargetNotAvailable,
    TransientError,
    UnreachableError,
)
from reconciler.resources import LEASE, OWNED, ObjectRef, Resource
from reconciler.rollout.controller import RolloutState
from reconciler.targets.base import ClusterAPI, RolloutBackend, RunDetails, StepEvents
from reconciler.targets.kubernetes.kubeconfig import load_client_config
from reconciler.targets.kubernetes.records import records_from_workflows
from reconciler.targets.kubernetes.rollout import KubernetesRolloutBackend, rollout_state_of
from reconciler.targets.kubernetes.workflow_status import steps_of
from renderers.labels import ENDPOINT, MANAGER, owner_selector
from specs import Environment, SpecSet

#: Statuses worth retrying. A 500 is retried only with a timeout reason: the API server also answers
#: 500 for objects it cannot convert (e.g. a server-side apply of a wrongly typed field).
TRANSIENT_STATUS = frozenset({429, 502, 503, 504})
TRANSIENT_REASONS = frozenset({"ServerTimeout", "Timeout", "TooManyRequests"})
#: The environment Lease's duration, renewed every LEASE_RENEW_SECONDS while an apply holds it:
#: an apply of any length keeps its lock, and the lock of a killed one is free again within
#: LEASE_SECONDS (client-go's leader election uses 15 s / 10 s; an apply is not that critical).
LEASE_SECONDS = 30
LEASE_RENEW_SECONDS = 10
#: Server-side applies in flight at once within one wave of an apply (reconciler/plan/apply.py):
#: enough to hide round trips over thousands of objects, well under the API server's default
#: max-requests-inflight (400) and the client's connection pool.
APPLY_PARALLELISM = 8
#: Objects per LIST page (kubectl's default chunk size).
LIST_PAGE = 500


def _now() -> datetime:
    return datetime.now(UTC)


def _micro(ts: datetime) -> str:
    return ts.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse_micro(text: str) -> datetime:
    return datetime.strptime(text.replace("Z", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z")


class KubernetesTarget:
    """A namespace of a real cluster (see module docstring)."""

    name = "kubernetes"
    apply_parallelism = APPLY_PARALLELISM

    def __init__(
        self,
        environment: str,
        namespace: str,
        *,
        kubeconfig: str | None = None,
        context: str | None = None,
        retries: int = 4,
        backoff: float = 0.5,
        timeout: float = 30.0,
        untrusted_root: Path | None = None,
    ) -> None:
        self.environment = environment
        self.namespace = namespace
        self.retries = retries
        self.backoff = backoff
        self.timeout = timeout
        # Parsed and checked by us (a non-mapping file is a clear error), never written back; with
        # `untrusted_root` (pull-request mode) a kubeconfig from the tree under review is refused.
        cfg = load_client_config(kubeconfig, context, untrusted_root=untrusted_root)
        cfg.retries = False  # retries are ours, by error type
        self.server = cfg.host
        self.api = k8s.ApiClient(cfg)

    # -- transport --------------------------------------------------------------------------
    def _call(self, method: str, path: str, *, verb: str, ref: str, namespace: str | None,
              query: list[tuple[str, str]] | None = None, body: Any = None,
              content_type: str = "application/json") -> Any:
        """One API request with bounded retries of transient failures; errors become typed."""
        attempt = 0
        while True:
            try:
                method_, url, headers, data, post = self.api.param_serialize(
                    method, path, query_params=query or [],
                    header_params={"Content-Type": content_type, "Accept": "application/json"},
                    body=body, auth_settings=["BearerToken"],
                )
                resp = self.api.call_api(method_, url, headers, data, post, _request_timeout=self.timeout)
                payload = resp.read()
                if resp.status < 400:
                    return json.loads(payload) if payload else None
                error = self._translate(resp.status, payload, resp.reason, verb, ref, namespace)
            except ApiException as exc:
                error = self._translate(exc.status or 0, exc.body, exc.reason, verb, ref, namespace)
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                error = UnreachableError(
                    f"the Kubernetes API server at {self.server} did not answer ({method} {path}: "
                    f"{exc.__class__.__name__}) after {attempt + 1} attempt{'s' if attempt else ''}"
                )
            if not isinstance(error, TransientError) or attempt >= self.retries:
                raise error
            time.sleep(self.backoff * (2**attempt))
            attempt += 1

    def _translate(self, status: int, body: bytes | str | None, reason: str | None, verb: str, ref: str,
                   namespace: str | None) -> TargetError:
        try:
            detail = json.loads(body or "{}")
        except (ValueError, TypeError):
            detail = {}
        message = detail.get("message") or reason or f"HTTP {status}"
        if status == 403:
            return ForbiddenError(verb, ref, namespace, message)
        if status == 409:
            return ConflictError(f"{ref}: conflict: {message}", status=409)
        if status == 422:
            causes = detail.get("details", {}).get("causes") or []
            fields = "; ".join(f"{c.get('field', '?')}: {c.get('message', '')}" for c in causes)
            return InvalidObjectError(f"{ref} rejected by the API server: {fields or message}", status=422)
        if status in TRANSIENT_STATUS or detail.get("reason") in TRANSIENT_REASONS:
            return TransientError(f"{ref}: HTTP {status}: {message}", status=status)
        return TargetError(f"{verb} {ref}: HTTP {status}: {message}", status=status)

    # -- Target -------------------------------------------------------------------------------
    def list_kind(self, resource: Resource, selector: str) -> list[dict[str, Any]]:
        """LIST one kind with a label selector (in this namespace, or cluster-wide for cluster-scoped kinds),
        in pages of at most LIST_PAGE objects (`limit`/`continue`, kubectl's chunking): the
        response held at once stays bounded however many objects there are, and the pages are
        one consistent snapshot. A continue token that expired meanwhile (410) restarts the LIST."""
        # The environment's Namespace is found by name: Forge ensures it exists, never owns it.
        query = [("labelSelector", selector)] if resource.namespaced else [("fieldSelector", f"metadata.name={self.namespace}")]
        items: list[dict[str, Any]] = []
        token = ""
        restarts = 0
        while True:
            page = [*query, ("limit", str(LIST_PAGE))] + ([("continue", token)] if token else [])
            try:
                data = self._call(
                    "GET", resource.path(self.namespace), verb="list", ref=resource.plural,
                    namespace=self.namespace if resource.namespaced else None, query=page,
                )
            except TargetError as exc:
                if exc.status != 410 or not token or restarts >= 2:
                    raise
                items, token, restarts = [], "", restarts + 1  # the snapshot expired: from the start
                continue
            items.extend(data.get("items", []) if data else [])
            token = ((data or {}).get("metadata") or {}).get("continue") or ""
            if not token:
                break
        for item in items:  # LIST responses leave out apiVersion/kind on items
            item.setdefault("apiVersion", resource.api_version)
            item.setdefault("kind", resource.kind)
        return items

    def read_live(self) -> list[dict[str, Any]]:
        """Every object Forge owns in this environment: one LIST per kind."""
        selector = owner_selector(self.environment)

        def one(resource: Resource) -> list[dict[str, Any]]:
            try:
                return self.list_kind(resource, selector)
            except TargetError as exc:
                if exc.status == 404 and resource.kind != "Namespace":
                    return []  # the namespace (or the CRD) does not exist yet: nothing of ours there
                raise

        # The LISTs are independent: run them side by side (the client's pool is thread-safe).
        with ThreadPoolExecutor(max_workers=len(OWNED)) as pool:
            return [obj for items in pool.map(one, OWNED) for obj in items]

    def apply(self, obj: Mapping[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        """Server-side apply with field manager `forgectl`, forced: Forge owns what it renders."""
        ref = ObjectRef.of(obj)
        resource = ref.resource
        query = [("fieldManager", MANAGER), ("force", "true")]
        if dry_run:
            query.append(("dryRun", "All"))
        return self._call(
            "PATCH", resource.path(ref.namespace, ref.name), verb="patch", ref=str(ref),
            namespace=ref.namespace or None, query=query, body=json.dumps(obj),
            content_type="application/apply-patch+yaml",
        )

    def create(self, resource: Resource, body: Mapping[str, Any]) -> dict[str, Any]:
        """POST one object into this namespace (events, leases)."""
        return self._call("POST", resource.path(self.namespace), verb="create", ref=resource.plural,
                          namespace=self.namespace, body=dict(body))

    def merge_patch(self, ref: ObjectRef, body: Mapping[str, Any], manager: str) -> dict[str, Any]:
        """A JSON merge patch under field manager ``manager`` (the rollout state annotation)."""
        return self._call("PATCH", ref.resource.path(ref.namespace, ref.name), verb="patch", ref=str(ref),
                          namespace=ref.namespace or None, query=[("fieldManager", manager)], body=dict(body),
                          content_type="application/merge-patch+json")

    def delete(self, ref: ObjectRef, *, uid: str | None = None) -> None:
        """Delete one object, only while its uid matches (so a re-created object is never hit)."""
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            self._call("DELETE", ref.resource.path(ref.namespace, ref.name), verb="delete", ref=str(ref),
                       namespace=ref.namespace or None, body=body)
        except TargetError as exc:
            if exc.status != 404:
                raise

    def get(self, ref: ObjectRef) -> dict[str, Any] | None:
        """One object, or None (used for the lease and by tests; plans never GET per object)."""
        try:
            return self._call("GET", ref.resource.path(ref.namespace, ref.name), verb="get", ref=str(ref),
                              namespace=ref.namespace or None)
        except TargetError as exc:
            if exc.status == 404:
                return None
            raise

    def read_path(self, path: str, *, what: str) -> Any | None:
        """GET any API path (discovery, cluster-scoped objects the doctor checks); None on 404.
        A 403 raises :class:`ForbiddenError`, so a caller can tell "absent" from "not allowed"."""
        try:
            return self._call("GET", path, verb="get", ref=what, namespace=None)
        except TargetError as exc:
            if exc.status == 404:
                return None
            raise

    # -- locking ------------------------------------------------------------------------------
    def _lease_path(self, name: str | None = None) -> str:
        return LEASE.path(self.namespace, name)

    def _ensure_namespace(self) -> None:
        self.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.namespace}})

    @contextmanager
    def lock(self, holder: str | None = None) -> Iterator[None]:
        """Hold the Lease `forgectl-<environment>` while applying. A live lease held by someone
        else refuses the apply, naming the holder and since when; an expired one is taken over."""
        holder = holder or f"{getpass.getuser()}@{socket.gethostname()}:{os.getpid()}"
        name = f"forgectl-{self.environment}"
        ref = f"Lease {self.namespace}/{name}"
        now = _now()
        spec = {"holderIdentity": holder, "leaseDurationSeconds": LEASE_SECONDS,
                "acquireTime": _micro(now), "renewTime": _micro(now)}
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": name, "namespace": self.namespace, "labels": {"app.kubernetes.io/managed-by": MANAGER}},
                "spec": spec}
        try:
            self._call("POST", self._lease_path(), verb="create", ref=ref, namespace=self.namespace, body=body)
        except TargetError as exc:
            if exc.status == 404:  # the namespace does not exist yet
                self._ensure_namespace()
                self._call("POST", self._lease_path(), verb="create", ref=ref, namespace=self.namespace, body=body)
            elif exc.status == 409:
                self._take_over(name, ref, body)
            else:
                raise
        stop = threading.Event()
        renewer = threading.Thread(target=self._renew, args=(name, ref, holder, stop), name="forge-lease", daemon=True)
        renewer.start()
        try:
            yield
        finally:
            stop.set()
            renewer.join()
            try:
                current = self._call("GET", self._lease_path(name), verb="get", ref=ref, namespace=self.namespace)
                if current and current.get("spec", {}).get("holderIdentity") == holder:
                    self._call("DELETE", self._lease_path(name), verb="delete", ref=ref, namespace=self.namespace,
                               body={"preconditions": {"resourceVersion": current["metadata"]["resourceVersion"]}})
            except TargetError:
                pass  # the lease expires by itself

    def _renew(self, name: str, ref: str, holder: str, stop: threading.Event) -> None:
        """Move the held Lease's renewTime forward every LEASE_RENEW_SECONDS until ``stop``.
        A failed renewal is tried again at the next tick: the Lease stays ours for LEASE_SECONDS
        after the last one that worked, and an apply that outlives it is the API server's to
        refuse (nothing else writes while the Lease is live)."""
        while not stop.wait(LEASE_RENEW_SECONDS):
            try:
                current = self._call("GET", self._lease_path(name), verb="get", ref=ref, namespace=self.namespace)
                if current.get("spec", {}).get("holderIdentity") != holder:
                    return  # taken over after it expired: not ours to renew any more
                current["spec"]["renewTime"] = _micro(_now())
                self._call("PUT", self._lease_path(name), verb="update", ref=ref, namespace=self.namespace, body=current)
            except TargetError:
                continue

    def _take_over(self, name: str, ref: str, body: dict[str, Any]) -> None:
        current = self._call("GET", self._lease_path(name), verb="get", ref=ref, namespace=self.namespace)
        spec = current.get("spec", {})
        renewed = spec.get("renewTime") or spec.get("acquireTime")
        duration = int(spec.get("leaseDurationSeconds") or LEASE_SECONDS)
        if spec.get("holderIdentity") and renewed and _parse_micro(renewed) + timedelta(seconds=duration) > _now():
            since = spec.get("acquireTime") or renewed
            raise LockHeldError(
                f"environment {self.environment!r} is locked by {spec['holderIdentity']} since {since} "
                f"(Lease {self.namespace}/{name}, expires {duration}s after its last renewal); "
                "wait for that apply to finish, or delete the Lease if its holder is gone"
            )
        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        try:  # optimistic concurrency: only one taker wins
            self._call("PUT", self._lease_path(name), verb="update", ref=ref, namespace=self.namespace, body=body)
        except ConflictError as exc:
            raise LockHeldError(f"environment {self.environment!r}: another apply took the expired lock first") from exc


    # -- rollouts -----------------------------------------------------------------------------
    def rollout_backend(self, specs: SpecSet, env: Environment, revision: str | None) -> RolloutBackend:
        """The rollout controller's backend for this target."""
        return KubernetesRolloutBackend(self, specs, env, revision)

    def rollout_states(self, live: list[dict[str, Any]]) -> dict[str, RolloutState]:
        """Rollout states from the `forge.dev/rollout` annotations of the live SeldonDeployments."""
        states = {}
        for obj in live:
            endpoint = (obj.get("metadata", {}).get("labels") or {}).get(ENDPOINT)
            if obj.get("kind") == "SeldonDeployment" and endpoint:
                state = rollout_state_of(obj)
                if state is not None:
                    states[endpoint] = state
        return states

    def prometheus_url(self) -> str | None:
        """A cluster's Prometheus comes from the Environment's `prometheus.url`."""
        return None

    def model_records(self, live: list[dict[str, Any]], model: str | None = None, *,
                      backfill: bool = True) -> list[dict[str, Any]]:
        """Records from the `metrics` outputs in the live Workflows' status (Argo keeps them; there
        is nothing to backfill)."""
        return records_from_workflows([o for o in live if o.get("kind") == "Workflow"], self.environment, model)

    # -- what the cluster's own tools show ------------------------------------------------------
    def run_details(self, live: list[dict[str, Any]]) -> RunDetails:
        """The steps of each live Workflow as Argo's controller reports them (``status.nodes``).
        Model files live in the cluster's volumes, and Seldon's ingress is not Forge's to name."""
        return RunDetails(steps={o["metadata"]["name"]: steps_of(o) for o in live if o.get("kind") == "Workflow"})

    def endpoint_url(self, endpoint: str) -> str | None:
        """Not on this machine: clients reach an endpoint through the cluster's Seldon ingress."""
        raise TargetNotAvailable(f"endpoint {endpoint!r} is served in the cluster, not on this machine: `load` drives a "
                                 "local endpoint; in a cluster, use your own load tool against the Seldon service")

    def follow_steps(self, events: StepEvents) -> bool:
        """Argo runs the steps in the cluster (`argo watch` follows them): no events here."""
        return False

    def cluster_api(self) -> ClusterAPI:
        """This target: :meth:`read_path` reads any API path."""
        return self

    def log_files(self, name: str) -> list[Path]:
        """Logs of a cluster live in the cluster."""
        raise TargetNotAvailable("in a cluster, use `kubectl logs` (or `argo logs`) for steps and servers")

    def down(self) -> list[str] | None:
        """None: nothing runs on this machine for a cluster environment (`forgectl down` deletes
        what Forge owns there instead: :func:`reconciler.plan.live.teardown_plan`)."""
        return None
