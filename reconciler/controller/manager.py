"""`forgectl controller run`: the long-running controller. For each configured source it holds the
environment's Lease as a leader would, and while it holds it, pulls git on an interval (with
jitter) or when the push webhook says so, applies a new revision (:mod:`.sync`), walks every
rollout and experiment with the existing controllers (:func:`reconciler.controller.watch.reconcile_pass`)
and writes what it did to the source's Sync object and, for a failed sync, an Event on it.

A push webhook reaches whichever replica the Service picks. The leader syncs at once; a follower
passes the push on through the cluster, as Flux's receiver does: it sets the Sync's
`forge.dev/requested-at` annotation, which the leader reads at each tick (every retry period), and a
new value is a sync at once. A person can ask the same with `kubectl annotate`.

Leader election **is** the environment Lease (`forgectl-<environment>` in the environment's
namespace, the one `forgectl apply` takes): a replica acts for an environment only while it holds
that Lease, held with client-go's timings (15 s duration, 10 s renew deadline, 2 s retry), so two
replicas never both act, and a CLI apply and the controller never interleave (the CLI is refused,
naming the controller, while it leads). Every write the leader makes — an apply, a traffic move, a
rollout state, its own status — goes through the target, which checks the Lease's fencing deadline
before it is sent (:mod:`reconciler.targets.kubernetes.lease`): a deposed leader writes nothing. A new
leader resumes: the rollout state lives in the cluster, and the revision last applied in the Sync's
status, so it neither re-applies nor takes a step twice.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from reconciler.controller.config import ControllerConfig, Source
from reconciler.controller.credentials import WEBHOOK_REFRESH, WebhookSecret, read_credentials, read_webhook_secret
from reconciler.controller.metrics import ControllerMetrics
from reconciler.controller.sync import Loaded, Outcome, apply_revision, diagnostics_message, inside, load_revision
from reconciler.controller.syncstatus import (
    MANAGER,
    WEBHOOK_MANAGER,
    RolloutLine,
    SyncReport,
    request_object,
    requested_at,
    status_object,
    sync_object,
)
from reconciler.controller.watch import Controllers, controllers_for, prometheus_for, reconcile_pass
from reconciler.diagnostics import ForgeError, SpecError
from reconciler.errors import ConflictError, LeaseLost, LockHeldError, TargetError
from reconciler.load.gitrepo import GitCredentials, fetch_source, newest_tag, remote_tags
from reconciler.load.semverrange import highest_admitted
from reconciler.plan.session import TargetOptions, open_target
from reconciler.resources import BY_KIND, EVENT, SYNC
from reconciler.rollout.controller import RolloutState
from reconciler.rollout.writeback import NoWriteback, SourcePush, WritebackSite
from reconciler.targets.base import Fence, LeaseTiming, Target
from specs import Environment, duration_seconds

log = logging.getLogger("forge.controller")

#: What each rollout walk reads whole (see KubernetesRolloutBackend.refresh): watched while leading.
WALKED = (BY_KIND["SeldonDeployment"], BY_KIND["HTTPRoute"])

#: Seconds between walks that reconcile every endpoint, those at rest with nothing changed too
#: (client-go's resync): the other walks skip those (:func:`reconcile_pass`).
FULL_WALK_SECONDS = 300.0
#: Jitter added to each poll interval, as a fraction of it (Flux: 5 %, Argo CD: up to a minute).
JITTER = 0.1


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def default_identity() -> str:
    """This replica's holder name: the pod's name (its host name) and the process."""
    return f"forge-controller/{socket.gethostname()}:{os.getpid()}"


def lease_timing(config: ControllerConfig) -> LeaseTiming:
    """The Lease held as client-go's leader election holds it: renewed every retry period, no
    write after the renew deadline (the duration less the margin)."""
    election = config.election
    duration = duration_seconds(election.lease_duration)
    return LeaseTiming(duration=duration, renew=duration_seconds(election.retry_period),
                       margin=duration - duration_seconds(election.renew_deadline))


def environment_of(source: Source) -> Environment:
    """The environment as far as the controller's configuration names it (a cluster namespace): what
    the Lease and the Sync status need before any revision has been read."""
    return environment_named(source.environment, source.namespace)


def environment_named(name: str, namespace: str) -> Environment:
    """A cluster Environment known by its name and namespace alone (no specs read)."""
    return Environment.model_validate({"apiVersion": "forge.dev/v1alpha1", "kind": "Environment",
                                       "metadata": {"name": name},
                                       "spec": {"target": "kubernetes", "kubernetes": {"namespace": namespace}}})


@dataclass
class Worker:
    """One source: its target, its Lease while held, and what it last fetched, applied and walked."""

    source: Source
    config: ControllerConfig
    identity: str
    metrics: ControllerMetrics
    target: Target
    cache: Path
    rng: random.Random
    stack: ExitStack = field(default_factory=ExitStack)
    fence: Fence | None = None
    next_sync: float = 0.0
    next_walk: float = 0.0
    next_full_walk: float = 0.0
    triggered: bool = False
    #: A push this replica was told of (its time), to be acted on, or passed on while following.
    pushed: str | None = None
    #: The Sync's `forge.dev/requested-at` last acted on (or found on taking the Lease).
    handled_request: str | None = None
    #: The revision last applied (read back from the Sync status on taking the Lease).
    applied: str | None = None
    #: The revision last attempted, and what its sync said (repeated failures are reported once).
    attempted: str | None = None
    last_reason: str | None = None
    #: The specs of the applied revision, and their controllers, for the rollout passes.
    loaded: Loaded | None = None
    controllers: Controllers | None = None
    #: The last sync's message, repeated by the status a rollout pass writes.
    _last_message: str | None = None
    #: The rollout lines this replica last wrote to the Sync's status: a walk that changed none
    #: writes nothing (one write every rollout interval, of every endpoint, is what it saves).
    _reported: tuple[RolloutLine, ...] | None = None
    #: Each endpoint's rollout state of the last walk and its line, as the process's gauges hold it.
    _metered: dict[str, tuple[RolloutState, RolloutLine]] = field(default_factory=dict)
    #: The lines of the last walk, in endpoint order.
    _lines: tuple[RolloutLine, ...] = ()

    # -- leadership --------------------------------------------------------------------------------
    def leading(self) -> bool:
        """Whether this replica holds the environment's Lease now (taking it when it is free)."""
        if self.fence is not None and not self.fence.held:
            log.warning("%s: lost the Lease of environment %s; following", self.source.name, self.source.environment)
            self.stack.close()
            self.fence, self.controllers, self.loaded, self._reported = None, None, None, None
            self.metrics.leader.labels(self.source.name).set(0)
        if self.fence is None:
            try:
                self.fence = self.stack.enter_context(self.target.lock(holder=self.identity))
                # the leader's walks read what they walk from caches kept by watches, not a LIST each
                self.stack.enter_context(self.target.watching(WALKED))
            except LockHeldError:
                # a follower says 0, not nothing: the "no leader" alert sums the replicas' gauges
                self.metrics.leader.labels(self.source.name).set(0)
                return False
            except TargetError as exc:
                log.warning("%s: cannot take the Lease: %s", self.source.name, exc)
                self.metrics.errors.labels(self.source.name, type(exc).__name__).inc()
                self.metrics.leader.labels(self.source.name).set(0)
                return False
            log.info("%s: leading environment %s as %s", self.source.name, self.source.environment, self.identity)
            self.metrics.leader.labels(self.source.name).set(1)
            self.next_sync = 0.0  # a new leader syncs at once, resuming from the Sync's status
            self.applied = self._resume()
        return True

    def release(self) -> None:
        """Give the Lease back (a shutdown): the other replica takes it at its next retry."""
        self.stack.close()
        self.fence = None
        self.metrics.leader.labels(self.source.name).set(0)

    def _resume(self) -> str | None:
        """Make sure the Sync object exists (its spec: this source) and read the revision it last applied."""
        api = self.target.controller_api()
        if api is None:
            return None
        followed = {"semver": self.source.semver} if self.source.semver else {"tag": self.source.tag} if self.source.tag else {}
        spec = {"url": self.source.url, "branch": self.source.branch, **followed, "path": self.source.path,
                "environment": self.source.environment, "namespace": self.source.namespace,
                "interval": self.source.interval, "selfHeal": self.source.self_heal}
        stored = api.apply_object(SYNC, sync_object(self.source.name, self.config.namespace, spec), manager=MANAGER)
        self.handled_request = requested_at(stored)  # a new leader syncs at once anyway
        applied = (stored.get("status") or {}).get("lastAppliedRevision")
        return str(applied) if applied else None

    def _pass_push_on(self) -> None:
        """A follower told of a push: ask the leader through the Sync's annotation (once; a Sync
        not made yet has no leader to ask, and the first leader syncs at once anyway)."""
        stamp, self.pushed = self.pushed, None
        api = self.target.controller_api()
        if stamp is None or api is None:
            return
        try:
            api.apply_object(SYNC, request_object(self.source.name, self.config.namespace, stamp), manager=WEBHOOK_MANAGER)
            log.info("%s: a push, passed on to the leader (Sync annotation %s)", self.source.name, stamp)
        except TargetError as exc:
            log.warning("%s: a push could not be passed on to the leader: %s", self.source.name, exc)
            self.metrics.errors.labels(self.source.name, type(exc).__name__).inc()

    def _requested(self) -> bool:
        """Whether the Sync asks for a sync now (a new `forge.dev/requested-at`)."""
        api = self.target.controller_api()
        if api is None:
            return False
        try:
            stamp = requested_at(api.get_object(SYNC, self.config.namespace, self.source.name))
        except TargetError:
            return False  # the API server did not answer: the interval still syncs
        if stamp is None or stamp == self.handled_request:
            return False
        self.handled_request = stamp
        log.info("%s: a sync requested (Sync annotation %s)", self.source.name, stamp)
        return True

    # -- one tick ----------------------------------------------------------------------------------
    def tick(self, now: float) -> None:
        """Act when leading: sync when due (or triggered), walk the rollouts when due."""
        if not self.leading():
            self._pass_push_on()
            return
        if self.pushed is not None:
            self.pushed, self.triggered = None, True
        try:
            if self._requested():
                self.triggered = True
            if self.triggered or now >= self.next_sync:
                self.triggered = False
                interval = self.source.interval_seconds
                self.next_sync = now + interval * (1 + JITTER * self.rng.random())
                self.sync()
            if self.loaded is not None and time.monotonic() >= self.next_walk:
                self.next_walk = time.monotonic() + self.source.rollout_seconds
                self.walk()
        except LeaseLost as exc:
            log.warning("%s: %s", self.source.name, exc)
            self.metrics.errors.labels(self.source.name, "LeaseLost").inc()
        except ConflictError as exc:  # a rollout write refused as stale (409): the next walk reads again
            log.warning("%s: %s", self.source.name, exc)
            self.metrics.errors.labels(self.source.name, "ConflictError").inc()

    def sync(self) -> None:
        """Fetch; load and apply a revision not applied yet (or every time, with selfHeal)."""
        name = self.source.name
        began = time.monotonic()
        try:
            credentials = self._credentials()
            tag = self.source.tag
            if self.source.semver is not None:
                tags = remote_tags(self.cache, self.source.url, timeout=self.source.timeout_seconds, credentials=credentials)
                highest = highest_admitted(tags, self.source.semver)
                if not highest:
                    raise ForgeError(f"no tag is in the range {self.source.semver} (tags: {', '.join(tags[-10:]) or 'none'})")
                tag = highest[0] if len(highest) == 1 else newest_tag(
                    self.cache, self.source.url, highest, timeout=self.source.timeout_seconds, credentials=credentials)
            revision = fetch_source(self.cache, self.source.url, self.source.branch, timeout=self.source.timeout_seconds,
                                    credentials=credentials, tag=tag)
        except ForgeError as exc:
            self.metrics.fetch_seconds.labels(name).observe(time.monotonic() - began)
            self._finish(Outcome("FetchFailed", f"fetching {self.source.ref} of {self.source.url}: {exc}", self.attempted or ""),
                         began)
            return
        self.metrics.fetch_seconds.labels(name).observe(time.monotonic() - began)
        if revision == self.applied and self.loaded is not None and self.loaded.revision == revision and not self.source.self_heal:
            if self.last_reason != "Succeeded":  # nothing moved, but the last sync failed (git was down): Ready again
                self._finish(Outcome("Succeeded", f"revision {revision[:12]} is applied", revision, self.loaded), began)
            return  # nothing moved
        if revision == self.attempted and self.last_reason in ("ValidationFailed", "Blocked"):
            return  # the same revision fails the same way: reported once
        self._report(SyncReport("Progressing", f"syncing revision {revision[:12]}", attempted=revision, leader=self.identity,
                                time=_now()))
        try:
            loaded = load_revision(self.source, self.cache, revision)
        except SpecError as exc:
            self._finish(Outcome("ValidationFailed", diagnostics_message(exc, revision), revision), began)
            return
        except ForgeError as exc:
            self._finish(Outcome("ValidationFailed", f"revision {revision[:12]} not applied: {exc}", revision), began)
            return
        if revision == self.applied and not self.source.self_heal:
            outcome = Outcome("Succeeded", f"revision {revision[:12]} is applied", revision, loaded)
        else:
            try:
                outcome = apply_revision(self.source, self.cache, loaded, self.target,
                                         refresh=self.source.self_heal)
            except LeaseLost:
                raise
            except ForgeError as exc:
                outcome = Outcome("ApplyFailed", f"revision {revision[:12]}: {exc}", revision, loaded)
        self._finish(outcome, began)

    def _finish(self, outcome: Outcome, began: float) -> None:
        name = self.source.name
        self.metrics.sync_seconds.labels(name, outcome.reason).observe(time.monotonic() - began)
        self.metrics.syncs.labels(name, outcome.reason).inc()
        if outcome.reason != "Progressing":  # the Sync's Ready condition, for the SyncFailing alert
            self.metrics.ready.labels(name).set(1 if outcome.reason == "Succeeded" else 0)
        if outcome.reason != "Succeeded":
            self.metrics.errors.labels(name, outcome.reason).inc()
            log.warning("%s: %s: %s", name, outcome.reason, outcome.message)
        else:
            log.info("%s: %s", name, outcome.message)
        if outcome.revision:
            self.attempted = outcome.revision
        self.last_reason = outcome.reason
        if outcome.applied and outcome.loaded is not None:
            self.applied = outcome.revision
            self.metrics.applied.labels(name).info({"revision": outcome.revision})
            if self.loaded is None or self.loaded.revision != outcome.revision:
                self.loaded, self.controllers = outcome.loaded, None
        self._report(SyncReport(outcome.reason, outcome.message, attempted=outcome.revision or None,
                                applied=self.applied if outcome.applied else None, leader=self.identity,
                                summary=outcome.summary, time=_now()))
        if outcome.reason not in ("Succeeded", "Progressing"):
            self._event("Warning", outcome.reason, outcome.message)

    def _credentials(self) -> GitCredentials | None:
        """The source's credentials, read from its Secret now (None: it names none)."""
        if not self.source.secret_ref:
            return None
        return read_credentials(self.target.controller_api(), self.config.namespace, self.source.secret_ref)

    def _writeback_site(self, revision: str) -> WritebackSite:
        """Where this source's write-backs go: pushed to it on top of ``revision`` where it allows."""
        if not self.source.push_writebacks:
            return NoWriteback(f"source {self.source.name} does not push write-backs (its `pushWritebacks` is off)")
        return SourcePush(self.cache, self.source.url, revision, self.source.timeout_seconds, self._credentials)

    def walk(self) -> None:
        """One pass of the rollout and experiment controllers over the applied revision's endpoints."""
        loaded = self.loaded
        if loaded is None:
            return
        began = time.monotonic()
        if self.controllers is None:
            backend = self.target.rollout_backend(loaded.result.specs, loaded.environment, loaded.revision[:12])
            url = prometheus_for(loaded.environment, self.target)
            self.controllers = controllers_for(loaded.result, loaded.environment, backend, url, self.source.namespace,
                                               self._writeback_site(loaded.revision))
        if began >= self.next_full_walk:
            self.next_full_walk = began + FULL_WALK_SECONDS
            self.controllers.at_rest.clear()
        with inside(self.cache):  # a write-back names the spec files relative to the cache repository
            states, _ = reconcile_pass(self.controllers, loaded.endpoints)
        self.metrics.walk_seconds.labels(self.source.name).observe(time.monotonic() - began)
        # Only the lines of states this walk made anew are built and compared (at rest, with
        # nothing changed, it hands back the very states of the last one): at 10,000 endpoints,
        # building, sorting and comparing them all took longer than the walk.
        metered: dict[str, tuple[RolloutState, RolloutLine]] = {}
        changed = len(states) != len(self._metered)
        for endpoint, st in states.items():
            held = self._metered.get(endpoint)
            if held is not None and held[0] is st:
                metered[endpoint] = held
                continue
            line = RolloutLine(endpoint, st.phase.value, st.step, st.weight, st.reason)
            if held is None or held[1] != line:  # the gauges of the lines this walk changed
                changed = True
                self.metrics.rollout(self.source.name, line.endpoint, line.phase, line.step, line.weight)
            metered[endpoint] = (st, line)
        self._metered = metered
        if changed:
            self._lines = tuple(line for _, (_, line) in sorted(metered.items()))
        lines = self._lines
        if lines and lines != self._reported and self._report(SyncReport(
                self.last_reason or "Succeeded", self._last_message or "", leader=self.identity, rollouts=lines, time=_now())):
            self._reported = lines

    # -- the Sync object and its Events ------------------------------------------------------------
    def _report(self, report: SyncReport) -> bool:
        """Write ``report`` to the Sync's status; whether it was written."""
        if report.reason != "Progressing":
            self._last_message = report.message
        api = self.target.controller_api()
        if api is None:
            return False
        try:
            stored = api.get_object(SYNC, self.config.namespace, self.source.name)
            if stored is None:
                self._resume()
                stored = api.get_object(SYNC, self.config.namespace, self.source.name)
            if stored is not None:
                api.apply_object(SYNC, status_object(stored, report), manager=MANAGER, subresource="status")
                return True
        except LeaseLost:
            raise
        except TargetError as exc:
            log.warning("%s: cannot write the Sync status: %s", self.source.name, exc)
            self.metrics.errors.labels(self.source.name, "StatusWriteFailed").inc()
        return False

    def _event(self, kind: str, reason: str, message: str) -> None:
        api = self.target.controller_api()
        if api is None:
            return
        stored = api.get_object(SYNC, self.config.namespace, self.source.name)
        if stored is None:
            return
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body: dict[str, Any] = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{self.source.name}.", "namespace": self.config.namespace},
            "involvedObject": {"apiVersion": SYNC.api_version, "kind": SYNC.kind, "name": self.source.name,
                               "namespace": self.config.namespace, "uid": stored["metadata"].get("uid")},
            "reason": reason, "message": message[:1000], "type": kind, "firstTimestamp": stamp, "lastTimestamp": stamp,
            "count": 1, "source": {"component": MANAGER},
        }
        try:
            api.create_object(EVENT, body)
        except LeaseLost:
            raise
        except TargetError:
            pass  # an Event is a courtesy: the status holds the record


class Manager:
    """Every source's worker, ticked by one loop (one sync at a time), woken early by the webhook."""

    def __init__(self, config: ControllerConfig, *, metrics: ControllerMetrics | None = None,
                 open_target_for: Callable[[Source], Target] | None = None, webhook: WebhookSecret | None = None) -> None:
        self.config = config
        self.webhook = webhook
        self.identity = config.identity or default_identity()
        self.metrics = metrics or ControllerMetrics()
        timing = lease_timing(config)
        opener = open_target_for or (lambda source: open_target(
            environment_of(source), TargetOptions(kubeconfig=config.kubeconfig, namespace=source.namespace, lease=timing)))
        rng = random.Random()
        cache = Path(config.cache_dir).absolute()
        self.workers = [Worker(s, config, self.identity, self.metrics, opener(s), cache / s.name, rng) for s in config.sources]
        self.retry = duration_seconds(config.election.retry_period)
        self.wake = threading.Event()
        self.stopping = threading.Event()
        #: Monotonic time of the last finished loop, for /healthz.
        self.last_tick = 0.0
        self.ticks = 0

    def trigger(self, branch: str | None = None) -> list[str]:
        """A push: sync the sources on ``branch`` (every source when None) at once — here when this
        replica leads, else through the leader (:meth:`Worker._pass_push_on`); their names."""
        # a push to a branch syncs the sources on it; a tag's push (no branch) every source
        hit = [w for w in self.workers if branch is None or w.source.branch == branch
               or w.source.tag is not None or w.source.semver is not None]
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        for worker in hit:
            worker.pushed = stamp
        self.wake.set()
        return [w.source.name for w in hit]

    def leading(self) -> dict[str, bool]:
        """Source → whether this replica leads its environment."""
        return {w.source.name: w.fence is not None and w.fence.held for w in self.workers}

    def run(self) -> None:
        """Tick every retry period (or at once when woken) until :meth:`stop`; then give the Leases back."""
        try:
            while not self.stopping.is_set():
                self._read_webhook_secret()
                for worker in self.workers:
                    if self.stopping.is_set():
                        break
                    try:
                        worker.tick(time.monotonic())
                    except ForgeError as exc:  # one source's failure never stops the others
                        log.error("%s: %s", worker.source.name, exc)
                        self.metrics.errors.labels(worker.source.name, type(exc).__name__).inc()
                    except Exception:  # a bug: logged with its traceback; the other sources carry on
                        log.exception("%s: internal error", worker.source.name)
                        self.metrics.errors.labels(worker.source.name, "Internal").inc()
                self.last_tick = time.monotonic()
                self.ticks += 1
                self.wake.wait(self.retry)
                self.wake.clear()
        finally:
            for worker in self.workers:
                worker.release()

    def _read_webhook_secret(self) -> None:
        """Read the webhook's Secret (``webhook.secretRef``) when due: every :data:`WEBHOOK_REFRESH`
        seconds, every retry period while there is none. An API server that does not answer keeps
        the secret read before; a Secret deleted or emptied takes it away."""
        held = self.webhook
        ref = self.config.webhook.secret_ref if self.config.webhook is not None else None
        now = time.monotonic()
        if held is None or ref is None or now < held.next_read:
            return
        try:
            value = read_webhook_secret(self.workers[0].target.controller_api(), self.config.namespace, ref)
        except TargetError as exc:
            held.next_read = now + self.retry
            log.warning("the webhook's Secret: %s", exc)
            return
        except ForgeError as exc:
            held.next_read = now + self.retry
            if held.value is not None or held.problem != str(exc):
                log.warning("the webhook answers 503: %s", exc)
            held.value, held.problem = None, str(exc)
            return
        if held.value != value:
            log.info("the webhook's secret read from Secret %s/%s", self.config.namespace, ref)
        held.value, held.next_read = value, now + WEBHOOK_REFRESH

    def stop(self) -> None:
        self.stopping.set()
        self.wake.set()
