"""The `kubernetes` target: a real cluster through the `kubernetes` client.

* reads what Forge owns with one LIST per kind and a label selector — never a GET per object;
* writes with server-side apply (field manager `forgectl`, forced, so drift made by hand is
  taken back), and server-side dry runs to settle apparent differences;
* guards each apply with a `coordination.k8s.io` Lease per environment, and fences every write by it:
  while the Lease is held, each request is checked against its fencing deadline before it is sent
  (:mod:`.lease`; a lost Lease raises :class:`~reconciler.errors.LeaseLost`), and the writes an apply
  makes carry the preconditions its plan read — the `resourceVersion` of an update, create-only
  for an object the plan saw absent — so the API server refuses one that a check let through just
  before a pause (HTTP 409);
* retries transient failures (connection errors, 429, 5xx) with backoff, decided by error type:
  ``retries`` times, and beyond them while ``retry_window`` seconds have not passed since the
  request's first attempt (a one-shot command's window bridges an API server's restart; a
  controller's passes keep none: its next pass is the retry).
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from reconciler.applied import with_desired_digest
from reconciler.errors import (
    ConflictError,
    ForbiddenError,
    InvalidObjectError,
    LeaseLost,
    LockHeldError,
    StorageFullError,
    TargetError,
    TargetNotAvailable,
    TransientError,
    UnreachableError,
)
from reconciler.registry.records import Record
from reconciler.resources import BY_KIND, LEASE, OWNED, POD, SHARED_REFERRERS, ObjectRef, Resource, shared_in_use
from reconciler.rollout.controller import RolloutState
from reconciler.targets.base import (
    ClusterAPI,
    ControllerAPI,
    LeaseTiming,
    LiveRead,
    PodAPI,
    Precondition,
    RolloutBackend,
    RunDetails,
    StepEvents,
)
from reconciler.targets.kubernetes.informer import Informer, Snapshot, WatchExpired
from reconciler.targets.kubernetes.kubeconfig import load_client_config
from reconciler.targets.kubernetes.lease import FenceToken, LeaseFence
from reconciler.targets.kubernetes.records import records_from_workflows
from reconciler.targets.kubernetes.rollout import KubernetesRolloutBackend, rollout_state_of
from reconciler.targets.kubernetes.workflow_status import steps_of
from renderers.labels import ENDPOINT, MANAGED_BY, MANAGER, owner_selector
from specs import Environment, SpecSet

#: Statuses worth retrying. A 500 is retried only with a timeout reason: the API server also answers
#: 500 for objects it cannot convert (e.g. a server-side apply of a wrongly typed field).
TRANSIENT_STATUS = frozenset({429, 502, 503, 504})
TRANSIENT_REASONS = frozenset({"ServerTimeout", "Timeout", "TooManyRequests"})
#: A 500 is also retried when its message is the API server passing on that its storage (etcd) did
#: not answer — etcd restarting, or electing a leader: etcd's gRPC `Unavailable` and its own
#: transient errors, as the API server words them. etcd out of space is not among them: it refuses
#: every write until an operator frees space and disarms the alarm, so it is named, not retried.
TRANSIENT_STORAGE = ("code = Unavailable", "etcdserver: request timed out", "etcdserver: leader changed",
                     "etcdserver: too many requests", "etcdserver: server stopped")
STORAGE_FULL = "etcdserver: mvcc: database space exceeded"
#: The environment Lease's duration, renewed every LEASE_RENEW_SECONDS while an apply holds it:
#: an apply of any length keeps its lock, and the lock of a killed one is free again within
#: LEASE_SECONDS (client-go's leader election uses 15 s / 10 s; an apply is not that critical).
LEASE_SECONDS = 30
LEASE_RENEW_SECONDS = 10
#: A holder stops writing this long before its Lease would expire as the server last confirmed it:
#: room for clock skew between holders and for a request in flight (:mod:`.lease`).
LEASE_MARGIN_SECONDS = 5.0
#: Server-side applies in flight at once within one wave of an apply (reconciler/plan/apply.py):
#: enough to hide round trips over thousands of objects, well under the API server's default
#: max-requests-inflight (400) and the client's connection pool.
APPLY_PARALLELISM = 8
#: The longest pause between two attempts of a request once its backoff has doubled that far.
MAX_BACKOFF_SECONDS = 4.0
#: Objects per LIST page (kubectl's default chunk size).
LIST_PAGE = 500
#: The representation of a LIST as metadata only (what client-go's metadata client asks for); the
#: server falls back to JSON after the comma where it cannot (it always can since Kubernetes 1.15).
PARTIAL_METADATA = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
#: Up to this many objects of one kind are read whole by a GET each; more by one LIST of the kind.
WHOLE_BY_GET = 200



def _now() -> datetime:
    return datetime.now(UTC)


def _micro(ts: datetime) -> str:
    return ts.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse_micro(text: str) -> datetime:
    return datetime.strptime(text.replace("Z", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z")


def _decoded(payload: bytes) -> Any:
    """An API server's JSON answer, by orjson: a LIST of thousands of objects is most of a rollout
    walk's time, and the standard library's decoder several times slower. (The API server writes
    Go's int64 at most, which orjson keeps as int; its errors are ValueErrors, as json's.)"""
    return orjson.loads(payload)


class _Watch:
    """One open watch: the response's lines, each an event ``{"type": …, "object": …}``."""

    def __init__(self, response: urllib3.BaseHTTPResponse, resource: Resource) -> None:
        self._response = response
        self._resource = resource

    def __iter__(self) -> Iterator[tuple[str, dict[str, Any]]]:
        for line in self._response:
            if not line.strip():
                continue
            event = orjson.loads(line)
            obj = event.get("object") or {}
            if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                obj.setdefault("apiVersion", self._resource.api_version)
                obj.setdefault("kind", self._resource.kind)
            yield event.get("type") or "", obj

    def close(self) -> None:
        """End the watch from any thread: a read blocked on its socket returns."""
        with suppress(Exception):
            self._response.shutdown()
        with suppress(Exception):
            self._response.close()


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
        retry_window: float = 0.0,
        timeout: float = 30.0,
        untrusted_root: Path | None = None,
        lease: LeaseTiming | None = None,
    ) -> None:
        self.environment = environment
        #: How :meth:`lock` holds its Lease; None: LEASE_SECONDS, LEASE_RENEW_SECONDS and
        #: LEASE_MARGIN_SECONDS (an apply's). The controller holds it as a leader would (15/10/2 s).
        self.lease_timing = lease
        self.namespace = namespace
        self.retries = retries
        self.backoff = backoff
        self.retry_window = retry_window
        self.timeout = timeout
        # Parsed and checked by us (a non-mapping file is a clear error), never written back; with
        # `untrusted_root` (pull-request mode) a kubeconfig from the tree under review is refused.
        cfg = load_client_config(kubeconfig, context, untrusted_root=untrusted_root)
        cfg.retries = False  # retries are ours, by error type
        self.server = cfg.host
        self.api = k8s.ApiClient(cfg)
        #: The fence of the Lease this target holds (inside :meth:`lock`), checked before each write.
        self._fence: LeaseFence | None = None
        #: The monotonic clock its fencing deadlines are measured on (a paused process sees it jump).
        self.clock: Callable[[], float] = time.monotonic
        #: Called with (method, what) right before each request goes out, after its fence check: where
        #: a process paused between check and send (SIGSTOP, a GC pause, a frozen VM) stops. None in
        #: use; a test hands a pause here to hold the request at that point for as long as it likes.
        self.pause_before_send: Callable[[str, str], None] | None = None
        #: The kinds :meth:`list_current` reads from a watch-fed cache (inside :meth:`watching`), and
        #: the caches, by (kind, label selector).
        self._watched: set[str] = set()
        self._informers: dict[tuple[str, str], Informer] = {}

    # -- transport --------------------------------------------------------------------------
    def _call(self, method: str, path: str, *, verb: str, ref: str, namespace: str | None,
              query: list[tuple[str, str]] | None = None, body: Any = None,
              content_type: str = "application/json", fenced: bool = False, accept: str = "application/json",
              text: bool = False) -> Any:
        """One API request with bounded retries of transient failures (``retries``, then until
        ``retry_window`` seconds since the first attempt); errors become typed. A ``fenced`` one (a
        write) is checked against the held Lease before every attempt: after a lost Lease nothing is
        sent (:class:`~reconciler.errors.LeaseLost`), so a long window cannot land a deposed write."""
        attempt = 0
        started = time.monotonic()
        while True:
            fence = self._fence
            if fenced and fence is not None:
                fence.check(f"{verb} {ref}")
            if self.pause_before_send is not None:
                self.pause_before_send(method, f"{verb} {ref}")
            try:
                method_, url, headers, data, post = self.api.param_serialize(
                    method, path, query_params=query or [],
                    header_params={"Content-Type": content_type, "Accept": accept},
                    body=body, auth_settings=["BearerToken"],
                )
                resp = self.api.call_api(method_, url, headers, data, post, _request_timeout=self.timeout)
                payload = resp.read()
                if resp.status < 400:
                    if text:
                        return payload.decode("utf-8", errors="replace") if payload else ""
                    return _decoded(payload) if payload else None
                error = self._translate(resp.status, payload, resp.reason, verb, ref, namespace)
            except ApiException as exc:
                error = self._translate(exc.status or 0, exc.body, exc.reason, verb, ref, namespace)
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                error = UnreachableError(
                    f"the Kubernetes API server at {self.server} did not answer ({method} {path}: "
                    f"{exc.__class__.__name__}) after {attempt + 1} attempt{'s' if attempt else ''}"
                )
            pause = min(self.backoff * (2**attempt), MAX_BACKOFF_SECONDS)
            out_of_budget = attempt >= self.retries and time.monotonic() + pause - started > self.retry_window
            if not isinstance(error, TransientError) or out_of_budget:
                if isinstance(error, TransientError) and not isinstance(error, UnreachableError):
                    # past its retries: say which server kept failing (a restarting one answers 503
                    # "before all known HTTP paths have been installed"; the drill found it unnamed)
                    raise TransientError(f"the Kubernetes API server at {self.server} kept failing: {error} "
                                         f"(after {attempt + 1} attempts)", status=error.status, ref=error.ref) from error
                raise error
            time.sleep(pause)
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
        if status == 500 and any(m in message for m in TRANSIENT_STORAGE):
            return TransientError(f"{verb} {ref}: HTTP 500: the API server's storage (etcd) did not answer: {message}",
                                  status=status)
        if status == 500 and STORAGE_FULL in message:
            return StorageFullError(f"{verb} {ref}: HTTP 500: the cluster's etcd is out of space ({message}): it refuses "
                               "every write until its operator frees space (compaction, defragmentation or a larger "
                               "quota) and disarms its NOSPACE alarm; a plain rerun then converges", status=status)
        return TargetError(f"{verb} {ref}: HTTP {status}: {message}", status=status)

    # -- Target -------------------------------------------------------------------------------
    def list_kind(self, resource: Resource, selector: str, *, accept: str = "application/json") -> list[dict[str, Any]]:
        """LIST one kind with a label selector (in this namespace, or cluster-wide for cluster-scoped kinds),
        in pages of at most LIST_PAGE objects (`limit`/`continue`, kubectl's chunking): the
        response held at once stays bounded however many objects there are, and the pages are
        one consistent snapshot. A continue token that expired meanwhile (410) restarts the LIST.
        ``accept``: the representation asked for (:data:`PARTIAL_METADATA` for metadata only)."""
        return self.list_snapshot(resource, selector, accept=accept).items

    def list_snapshot(self, resource: Resource, selector: str, *, accept: str = "application/json") -> Snapshot:
        """:meth:`list_kind`, with the `resourceVersion` of its snapshot (where a watch continues)."""
        # The environment's Namespace is found by name: Forge ensures it exists, never owns it. A
        # shared kind (Kueue's ResourceFlavor) by Forge's label alone; the other cluster-scoped
        # kinds (Kueue's) cluster-wide by the ownership labels.
        if resource.kind == "Namespace":
            query = [("fieldSelector", f"metadata.name={self.namespace}")]
        else:
            query = [("labelSelector", f"{MANAGED_BY}={MANAGER}" if resource.shared else selector)]
        items: list[dict[str, Any]] = []
        token, version = "", ""
        restarts = 0
        while True:
            page = [*query, ("limit", str(LIST_PAGE))] + ([("continue", token)] if token else [])
            try:
                data = self._call(
                    "GET", resource.path(self.namespace), verb="list", ref=resource.plural,
                    namespace=self.namespace if resource.namespaced else None, query=page, accept=accept,
                )
            except TargetError as exc:
                if exc.status != 410 or not token or restarts >= 2:
                    raise
                items, token, restarts = [], "", restarts + 1  # the snapshot expired: from the start
                continue
            items.extend((data.get("items") or []) if data else [])  # a metadata-only empty page says null
            token = ((data or {}).get("metadata") or {}).get("continue") or ""
            version = ((data or {}).get("metadata") or {}).get("resourceVersion") or version
            if not token:
                break
        for item in items:  # LIST responses leave out apiVersion/kind on items
            item.setdefault("apiVersion", resource.api_version)
            item.setdefault("kind", resource.kind)
        return Snapshot(items, version)

    def watch_kind(self, resource: Resource, selector: str, resource_version: str, seconds: int) -> _Watch:
        """WATCH one namespaced kind with a label selector from ``resource_version``, bookmarks
        asked for, for ``seconds`` (the server then ends it): the open stream of its events. A
        `resourceVersion` the server no longer has history for is :class:`WatchExpired`."""
        query = [("labelSelector", selector), ("watch", "1"), ("allowWatchBookmarks", "true"),
                 ("resourceVersion", resource_version), ("timeoutSeconds", str(seconds))]
        method, url, headers, data, post = self.api.param_serialize(
            "GET", resource.path(self.namespace), query_params=query, header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"])
        try:
            # read timeout past the server's own end of the watch: a connection that died silently
            # is given up then (and the informer lists again)
            resp = self.api.call_api(method, url, headers, data, post, _request_timeout=(self.timeout, seconds + 30))
        except ApiException as exc:
            raise self._translate(exc.status or 0, exc.body, exc.reason, "watch", resource.plural, self.namespace) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise UnreachableError(f"the Kubernetes API server at {self.server} did not answer (watch "
                                   f"{resource.plural}: {exc.__class__.__name__})") from exc
        if resp.status == 410:
            raise WatchExpired(f"watch {resource.plural} from resourceVersion {resource_version}: 410 Gone")
        if resp.status >= 400:
            raise self._translate(resp.status, resp.read(), resp.reason, "watch", resource.plural, self.namespace)
        return _Watch(resp.response, resource)

    @contextmanager
    def watching(self, resources: Collection[Resource]) -> Iterator[None]:
        """While inside, :meth:`list_current` of one of ``resources`` reads a watch-fed cache
        (:mod:`.informer`) instead of LISTing: the controller's rollout walk, as leader. The
        watches end when it is left."""
        self._watched = {r.kind for r in resources}
        try:
            yield
        finally:
            informers, self._informers, self._watched = list(self._informers.values()), {}, set()
            for informer in informers:
                informer.stop()

    def list_current(self, resource: Resource, selector: str) -> list[dict[str, Any]]:
        """The objects of one kind with a label selector as they stand: from the kind's watch-fed
        cache inside :meth:`watching` (started here by its first LIST), else (or while the cache is
        not in step with the server) by a LIST."""
        if resource.kind not in self._watched:
            return self.list_kind(resource, selector)
        key = (resource.kind, selector)
        informer = self._informers.get(key)
        if informer is None:
            first = self.list_snapshot(resource, selector)
            informer = Informer(f"{resource.plural} {selector}", lambda: self.list_snapshot(resource, selector),
                                lambda version, seconds: self.watch_kind(resource, selector, version, seconds))
            self._informers[key] = informer
            informer.start(first)
            return first.items
        items = informer.items()
        return items if items is not None else self.list_kind(resource, selector)

    def cache_mark(self, resource: Resource, selector: str) -> int | None:
        """The :meth:`Informer.mark` of the cache :meth:`list_current` reads for this kind and
        selector; None without one in step (a LIST each time)."""
        informer = self._informers.get((resource.kind, selector))
        return informer.mark() if informer is not None else None

    def remember(self, obj: dict[str, Any]) -> None:
        """An object as this process wrote it (the server's answer), for the cache of its kind."""
        for (kind, _), informer in list(self._informers.items()):
            if kind == obj.get("kind"):
                informer.observe(obj)

    def read_live(self) -> list[dict[str, Any]]:
        """Every object Forge owns in this environment, whole: one LIST per kind."""
        return self.read_live_metadata(BY_KIND).objects

    def list_metadata(self, resource: Resource, selector: str) -> list[dict[str, Any]]:
        """LIST one kind as metadata only (`PartialObjectMetadataList`, in pages as :meth:`list_kind`):
        each object's identity and metadata, without `managedFields` — a fraction of the bytes to
        send, decode and keep. The items carry the kind's own apiVersion and kind."""
        items = self.list_kind(resource, selector, accept=PARTIAL_METADATA)
        for item in items:
            item["apiVersion"], item["kind"] = resource.api_version, resource.kind
            item.get("metadata", {}).pop("managedFields", None)
        return items

    def read_live_metadata(self, whole: Collection[str]) -> LiveRead:
        """Every object Forge owns: the kinds in ``whole`` LISTed whole, the others as metadata
        only (:meth:`list_metadata`), named in ``partial``. One LIST per kind, side by side."""
        selector = owner_selector(self.environment)

        def one(resource: Resource) -> list[dict[str, Any]]:
            try:
                if resource.kind in whole or resource.kind in SHARED_REFERRERS:
                    return self.list_kind(resource, selector)
                return self.list_metadata(resource, selector)
            except TargetError as exc:
                if exc.status == 404 and resource.kind != "Namespace":
                    return []  # the namespace (or the CRD) does not exist yet: nothing of ours there
                raise

        # The LISTs are independent: run them side by side (the client's pool is thread-safe).
        with ThreadPoolExecutor(max_workers=len(OWNED)) as pool:
            objects = [obj for items in pool.map(one, OWNED) for obj in items]
        # The shared Kueue flavors listed are every environment's: keep those this one's queues name.
        objects = shared_in_use(objects)
        partial = {ObjectRef.of(o) for o in objects if o["kind"] not in whole and o["kind"] not in SHARED_REFERRERS}
        return LiveRead(objects, frozenset(partial))

    def read_whole(self, refs: Collection[ObjectRef]) -> list[dict[str, Any]]:
        """These objects whole: a GET each (APPLY_PARALLELISM at once), or, for a kind with more than
        WHOLE_BY_GET of them, one LIST of that kind filtered here (thousands of GETs cost more than a
        LIST). One gone since (404) is left out."""
        by_kind: dict[str, list[ObjectRef]] = {}
        for ref in refs:
            by_kind.setdefault(ref.kind, []).append(ref)
        out: list[dict[str, Any]] = []
        gets: list[ObjectRef] = []
        selector = owner_selector(self.environment)
        for kind, some in by_kind.items():
            if len(some) <= WHOLE_BY_GET:
                gets.extend(some)
                continue
            wanted = set(some)
            resource = BY_KIND[kind]
            try:
                listed = self.list_kind(resource, selector)
            except TargetError as exc:
                if exc.status != 404:
                    raise
                listed = []
            out.extend(o for o in listed if ObjectRef.of(o) in wanted)
        if gets:
            with ThreadPoolExecutor(max_workers=APPLY_PARALLELISM) as pool:
                out.extend(o for o in pool.map(self.get, gets) if o is not None)
        return out

    def apply(self, obj: Mapping[str, Any], *, dry_run: bool = False,
              precondition: Precondition | None = None) -> dict[str, Any]:
        """Server-side apply with field manager `forgectl`, forced: Forge owns what it renders.

        ``precondition`` (what the plan read): ``resource_version`` is sent as the object's
        `metadata.resourceVersion`, which the API server enforces on an apply (409 once the object
        moved on); ``absent`` creates only (POST: 409 when it exists), then marks the fields the
        create set as applied by `forgectl` (:meth:`_owned_as_applied`), as a server-side apply
        would have. Either refusal raises :class:`ConflictError`; nothing was written. Every write
        records the digest of ``obj`` (:mod:`reconciler.applied`), a dry run too (so its result
        compares with what the write would store)."""
        ref = ObjectRef.of(obj)
        obj = with_desired_digest(obj)  # what a later plan compares from the metadata alone
        # A shared object (a Kueue flavor: the same name is the same content, whoever renders it)
        # may exist though this environment's plan did not list it yet: applied, not create-only.
        if precondition is not None and precondition.absent and not dry_run and not ref.resource.shared:
            return self._create_only(ref, obj)
        version = precondition.resource_version if precondition is not None else None
        body = dict(obj)
        if version:
            body["metadata"] = {**(body.get("metadata") or {}), "resourceVersion": version}
        query = [("fieldManager", MANAGER), ("force", "true")]
        if dry_run:
            query.append(("dryRun", "All"))
        try:
            return self._call(
                "PATCH", ref.resource.path(ref.namespace, ref.name), verb="patch", ref=str(ref),
                namespace=ref.namespace or None, query=query, body=json.dumps(body),
                content_type="application/apply-patch+yaml", fenced=not dry_run,
            )
        except ConflictError as exc:
            if not version:
                raise
            raise ConflictError(f"{ref}: changed since the plan read it (resourceVersion {version} is not the current "
                                f"one): not written; plan again", status=409, ref=ref) from exc

    def _create_only(self, ref: ObjectRef, obj: Mapping[str, Any]) -> dict[str, Any]:
        """POST ``obj`` (refused with 409 when it exists), as `forgectl`'s own."""
        try:
            created = self._call("POST", ref.resource.path(ref.namespace), verb="create", ref=str(ref),
                                 namespace=ref.namespace or None, query=[("fieldManager", MANAGER)], body=dict(obj),
                                 fenced=True)
        except ConflictError as exc:
            raise ConflictError(f"{ref}: exists, though the plan saw none (created since it read the cluster): not "
                                "written; plan again", status=409, ref=ref) from exc
        return self._owned_as_applied(ref, created)

    def _owned_as_applied(self, ref: ObjectRef, created: dict[str, Any]) -> dict[str, Any]:
        """A create records its fields under `forgectl` with operation `Update`; server-side apply
        would have recorded them as `Apply`, and only fields owned by `Apply` are removed when a
        later apply leaves them out. So the entry's operation is rewritten to `Apply` (a JSON patch
        that tests the resourceVersion the create returned): the object is then as an apply would
        have made it. Changed meanwhile, or the patch refused, it is left as created."""
        fields = (created.get("metadata") or {}).get("managedFields") or []
        index = next((i for i, f in enumerate(fields) if f.get("manager") == MANAGER and f.get("operation") == "Update"), None)
        version = (created.get("metadata") or {}).get("resourceVersion")
        if index is None or not version:
            return created
        patch = [{"op": "test", "path": "/metadata/resourceVersion", "value": version},
                 {"op": "replace", "path": f"/metadata/managedFields/{index}/operation", "value": "Apply"}]
        try:
            stored: dict[str, Any] = self._call(
                "PATCH", ref.resource.path(ref.namespace, ref.name), verb="patch", ref=str(ref),
                namespace=ref.namespace or None, query=[("fieldManager", MANAGER)], body=patch,
                content_type="application/json-patch+json", fenced=True)
        except LeaseLost:
            raise
        except TargetError:  # changed meanwhile (409), or the patch refused: the object stays as created
            return created
        return stored

    def create(self, resource: Resource, body: Mapping[str, Any]) -> dict[str, Any]:
        """POST one object into this namespace (events)."""
        return self._call("POST", resource.path(self.namespace), verb="create", ref=resource.plural,
                          namespace=self.namespace, body=dict(body), fenced=True)

    def merge_patch(self, ref: ObjectRef, body: Mapping[str, Any], manager: str, *,
                    resource_version: str | None = None) -> dict[str, Any]:
        """A JSON merge patch under field manager ``manager`` (the rollout state annotation). With
        ``resource_version`` (the object as last read), the patch carries it as
        `metadata.resourceVersion`, which the API server takes as a precondition: 409
        (:class:`ConflictError`) once the object moved on, nothing written."""
        body = dict(body)
        if resource_version:
            body["metadata"] = {**(body.get("metadata") or {}), "resourceVersion": resource_version}
        try:
            return self._call("PATCH", ref.resource.path(ref.namespace, ref.name), verb="patch", ref=str(ref),
                              namespace=ref.namespace or None, query=[("fieldManager", manager)], body=body,
                              content_type="application/merge-patch+json", fenced=True)
        except ConflictError as exc:
            if not resource_version:
                raise
            raise ConflictError(f"{ref}: changed since it was read (resourceVersion {resource_version} is not the "
                                "current one): not written", status=409, ref=ref) from exc

    def delete(self, ref: ObjectRef, *, uid: str | None = None) -> None:
        """Delete one object, only while its uid matches (so a re-created object is never hit)."""
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            self._call("DELETE", ref.resource.path(ref.namespace, ref.name), verb="delete", ref=str(ref),
                       namespace=ref.namespace or None, body=body, fenced=True)
        except TargetError as exc:
            if exc.status != 404:
                raise

    def get(self, ref: ObjectRef) -> dict[str, Any] | None:
        """One object, or None (the lease; a plan's objects whose digest differs, :meth:`read_whole`)."""
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

    def read_log(self, pod: str) -> str:
        """The log of the one container of ``pod`` in this namespace (stdout and stderr, as the
        kubelet keeps them): what a one-off pod of `forgectl labels` answered."""
        return str(self._call("GET", POD.path(self.namespace, pod) + "/log", verb="get", ref=f"pods/{pod}/log",
                              namespace=self.namespace, accept="*/*", text=True))

    # -- locking ------------------------------------------------------------------------------
    @property
    def holder(self) -> str | None:
        """Who holds the environment's Lease through this target now (None outside :meth:`lock`)."""
        fence = self._fence
        return fence.holder if fence is not None else None

    @property
    def fence_token(self) -> FenceToken | None:
        """The tenure of the Lease this target holds now (None outside :meth:`lock`)."""
        fence = self._fence
        return fence.token if fence is not None else None

    def confirm_lease(self, what: str) -> None:
        """Re-read the held Lease right before ``what`` is written: it must still name this holder
        in the same tenure (`leaseTransitions`) with a `renewTime` + `leaseDurationSeconds` not yet
        past; otherwise the fence is lost for good and :class:`LeaseLost` is raised, ``what`` unsent.
        The fence's own deadline is checked too. Outside :meth:`lock` nothing is checked (a write
        by hand relies on its preconditions alone). What a pause after this check lets through is
        the API server's to refuse: the write's `resourceVersion` (see :mod:`.rollout`)."""
        fence = self._fence
        if fence is None:
            return
        name = f"forgectl-{self.environment}"
        try:
            current = self._call("GET", self._lease_path(name), verb="get", ref=fence.ref, namespace=self.namespace)
        except TargetError as exc:
            if exc.status != 404:
                raise
            current = None
        mine = fence.token
        if current is None:
            fence.lose("the Lease was deleted")
        else:
            spec = current.get("spec") or {}
            found = FenceToken.of(current)
            renewed = spec.get("renewTime") or spec.get("acquireTime")
            duration = int(spec.get("leaseDurationSeconds") or 0)
            if found is None or mine is None or found != mine:
                who = found.holder if found is not None else "nobody"
                fence.lose(f"taken over by {who} (leaseTransitions {found.transitions if found else '?'})")
            elif renewed and _parse_micro(renewed) + timedelta(seconds=duration) <= _now():
                fence.lose(f"expired: renewed last at {renewed}, for {duration} s")
        fence.check(what)

    def _lease_path(self, name: str | None = None) -> str:
        return LEASE.path(self.namespace, name)

    def _ensure_namespace(self) -> None:
        self.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.namespace}})

    @contextmanager
    def lock(self, holder: str | None = None) -> Iterator[LeaseFence]:
        """Hold the Lease `forgectl-<environment>` while applying. A live lease held by someone
        else refuses the apply, naming the holder and since when; an expired one is taken over.
        While it is held, every write of this target is fenced by it (:mod:`.lease`); the fence
        is what the block is given."""
        holder = holder or f"{getpass.getuser()}@{socket.gethostname()}:{os.getpid()}"
        name = f"forgectl-{self.environment}"
        ref = f"Lease {self.namespace}/{name}"
        now = _now()
        spec = {"holderIdentity": holder, "leaseDurationSeconds": LEASE_SECONDS,
                "acquireTime": _micro(now), "renewTime": _micro(now)}
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": name, "namespace": self.namespace, "labels": {"app.kubernetes.io/managed-by": MANAGER}},
                "spec": spec}
        timing = self.lease_timing or LeaseTiming(LEASE_SECONDS, LEASE_RENEW_SECONDS, LEASE_MARGIN_SECONDS)
        spec["leaseDurationSeconds"] = max(1, round(timing.duration))
        fence = LeaseFence(ref, holder, timing.margin, self.clock)
        sent = self.clock()
        try:
            stored = self._call("POST", self._lease_path(), verb="create", ref=ref, namespace=self.namespace, body=body)
        except TargetError as exc:
            if exc.status == 404:  # the namespace does not exist yet
                self._ensure_namespace()
                sent = self.clock()
                stored = self._call("POST", self._lease_path(), verb="create", ref=ref, namespace=self.namespace, body=body)
            elif exc.status == 409:
                stored, sent = self._take_over(name, ref, body)
            else:
                raise
        fence.confirmed(stored, sent)
        stop = threading.Event()
        renewer = threading.Thread(target=self._renew, args=(name, ref, fence, stop, timing.renew), name="forge-lease", daemon=True)
        self._fence = fence
        renewer.start()
        try:
            yield fence
        finally:
            stop.set()
            renewer.join()
            self._fence = None
            if fence.held:  # only a Lease surely still ours is released (at the version we stored)
                try:
                    self._call("DELETE", self._lease_path(name), verb="delete", ref=ref, namespace=self.namespace,
                               body={"preconditions": {"resourceVersion": fence.stored["metadata"]["resourceVersion"]}})
                except TargetError:
                    pass  # the lease expires by itself

    def _renew(self, name: str, ref: str, fence: LeaseFence, stop: threading.Event, every: float) -> None:
        """Move the held Lease's renewTime forward every ``every`` seconds until ``stop``, each
        renewal a PUT at the resourceVersion last stored (so it fails once anyone else wrote the
        Lease), each success moving the fence's deadline. The Lease is lost — for good — when it is
        found deleted or with another holder, or when the renewer wakes past the deadline (the
        process was paused): it is not renewed then, whoever may have taken it meanwhile. A failed
        renewal is tried again at the next tick; the deadline alone decides until then."""
        while not stop.wait(every):
            if not fence.held:
                return
            body = json.loads(json.dumps(fence.stored))
            body["spec"]["renewTime"] = _micro(_now())
            sent = self.clock()
            try:
                stored = self._call("PUT", self._lease_path(name), verb="update", ref=ref, namespace=self.namespace, body=body)
            except ConflictError:
                try:
                    current = self._call("GET", self._lease_path(name), verb="get", ref=ref, namespace=self.namespace)
                except TargetError as exc:
                    if exc.status == 404:
                        fence.lose("the Lease was deleted")
                        return
                    continue
                other = (current.get("spec") or {}).get("holderIdentity")
                if other != fence.holder:
                    fence.lose(f"taken over by {other}")
                    return
                fence.seen(current)
                continue
            except TargetError as exc:
                if exc.status == 404:
                    fence.lose("the Lease was deleted")
                    return
                continue
            fence.confirmed(stored, sent)

    def _take_over(self, name: str, ref: str, body: dict[str, Any]) -> tuple[dict[str, Any], float]:
        """Take over an expired Lease (the Lease as stored, and when the request was sent)."""
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
        # A new tenure: the fencing token's order (.lease.FenceToken). client-go counts a change of
        # holder only; a holder taking its own expired Lease back counts too, since writes of its
        # earlier tenure may still be in flight.
        body["spec"]["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        sent = self.clock()
        try:  # optimistic concurrency: only one taker wins
            stored = self._call("PUT", self._lease_path(name), verb="update", ref=ref, namespace=self.namespace, body=body)
        except ConflictError as exc:
            raise LockHeldError(f"environment {self.environment!r}: another apply took the expired lock first") from exc
        return stored, sent


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
                      backfill: bool = True) -> list[Record]:
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

    def controller_api(self) -> ControllerAPI:
        """This target: :meth:`apply_object`, :meth:`create_object`, :meth:`get_object`."""
        return self

    # -- the controller's own objects (ControllerAPI) ---------------------------------------------
    def apply_object(self, resource: Resource, obj: Mapping[str, Any], *, manager: str,
                     subresource: str | None = None, dry_run: bool = False) -> dict[str, Any]:
        """Server-side apply of one object of ``resource`` (or its ``subresource``), forced, as
        ``manager``; fenced by the held Lease like every write (a ``dry_run`` writes nothing)."""
        meta = obj.get("metadata") or {}
        namespace, name = meta.get("namespace") or "", meta["name"]
        path = resource.path(namespace, name) + (f"/{subresource}" if subresource else "")
        ref = f"{resource.kind} {namespace}/{name}" + (f" ({subresource})" if subresource else "")
        query = [("fieldManager", manager), ("force", "true")] + ([("dryRun", "All")] if dry_run else [])
        stored: dict[str, Any] = self._call(
            "PATCH", path, verb="patch", ref=ref, namespace=namespace or None,
            query=query, body=json.dumps(dict(obj)),
            content_type="application/apply-patch+yaml", fenced=not dry_run)
        return stored

    def delete_object(self, resource: Resource, namespace: str, name: str, *, uid: str | None = None) -> bool:
        """Delete one object of ``resource`` (only while its uid is ``uid``, when given); False when
        it was not there. Fenced."""
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            self._call("DELETE", resource.path(namespace, name), verb="delete", ref=f"{resource.kind} {namespace}/{name}",
                       namespace=namespace or None, body=body, fenced=True)
        except TargetError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def create_object(self, resource: Resource, body: Mapping[str, Any]) -> dict[str, Any]:
        """POST ``body`` into the namespace its metadata names; fenced."""
        namespace = (body.get("metadata") or {}).get("namespace") or self.namespace
        created: dict[str, Any] = self._call("POST", resource.path(namespace), verb="create", ref=resource.plural,
                                             namespace=namespace, body=dict(body), fenced=True)
        return created

    def get_object(self, resource: Resource, namespace: str, name: str) -> dict[str, Any] | None:
        """One object of ``resource``, or None when there is none."""
        try:
            found: dict[str, Any] = self._call("GET", resource.path(namespace, name), verb="get",
                                               ref=f"{resource.kind} {namespace}/{name}", namespace=namespace or None)
            return found
        except TargetError as exc:
            if exc.status == 404:
                return None
            raise

    def pod_api(self) -> PodAPI | None:
        """This target: pods in its namespace (:meth:`create_object`, :meth:`read_log`, …)."""
        return self

    def workspace_files(self, folder: str) -> dict[str, bytes] | None:
        """None: the workspace is a claim of the cluster, read by a pod (:meth:`pod_api`)."""
        return None

    def log_files(self, name: str) -> list[Path]:
        """Logs of a cluster live in the cluster."""
        raise TargetNotAvailable("in a cluster, use `kubectl logs` (or `argo logs`) for steps and servers")

    def down(self) -> list[str] | None:
        """None: nothing runs on this machine for a cluster environment (`forgectl down` deletes
        what Forge owns there instead: :func:`reconciler.plan.live.teardown_plan`)."""
        return None
