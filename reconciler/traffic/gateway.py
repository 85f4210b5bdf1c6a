"""Whether a Gateway took an Endpoint's HTTPRoute: its `status.parents` entry for the Gateway Forge
attached it to, read back through the target after each weight move.

A weight written is not yet traffic moved: the Gateway's controller has to accept the route for
that parent (`Accepted`) and resolve every backend (`ResolvedRefs`: the predictors' Services
exist), both for the generation Forge wrote (`observedGeneration`). Until then the rollout step
does not count (:func:`reconciler.traffic.serving.apply_serving` waits for it and otherwise fails
the pass, so the step is taken again on the next one). :func:`route_admission` is pure;
:func:`wait_admitted` polls through the reader it is given.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from reconciler.errors import TargetError
from reconciler.resources import ObjectRef

#: How long a weight move waits for the Gateway to report the route, by default (seconds).
ADMISSION_TIMEOUT = 30.0
POLL_INTERVAL = 0.1
REQUIRED = ("Accepted", "ResolvedRefs")


@dataclass(frozen=True)
class RouteAdmission:
    """What the route's status says for one parent: ``admitted`` when both conditions are True for
    the route's current generation; ``detail`` says which controller did, or what is missing."""

    admitted: bool
    detail: str


class RouteNotAdmitted(TargetError):
    """The Gateway did not report the route Accepted with ResolvedRefs in time (the step does not count)."""


def _same_parent(ref: Mapping[str, Any], parent: Mapping[str, Any], route_namespace: str) -> bool:
    def key(r: Mapping[str, Any]) -> tuple[str, str, str, str, str]:
        return (r.get("group", "gateway.networking.k8s.io"), r.get("kind", "Gateway"), r.get("name", ""),
                r.get("namespace") or route_namespace, r.get("sectionName") or "")
    return key(ref) == key(parent)


def condition_problem(conditions: Iterable[Mapping[str, Any]], kind: str, generation: int | None,
                      what: str = "the object") -> str | None:
    """None when ``conditions`` (a Gateway API `status.conditions` list) hold ``kind`` True for
    ``generation`` (the object's `metadata.generation`; None: any), else what is wrong, in the
    status's own words. ``what`` names the object in the message."""
    cond = next((c for c in conditions if c.get("type") == kind), None)
    if cond is None:
        return f"no {kind} condition"
    seen = cond.get("observedGeneration")
    if generation is not None and seen is not None and int(seen) < int(generation):
        return f"{kind} is of generation {seen}, {what} is at {generation}"
    if cond.get("status") != "True":
        message = cond.get("message")
        return f"{kind} {cond.get('status')} ({cond.get('reason') or '?'}{': ' + message if message else ''})"
    return None


def route_admission(route: Mapping[str, Any], parent: Mapping[str, Any]) -> RouteAdmission:
    """Whether ``route`` (as stored, with its status) is Accepted and has ResolvedRefs for ``parent``
    (one of its `spec.parentRefs`), for its current `metadata.generation`."""
    meta = route.get("metadata") or {}
    namespace = meta.get("namespace") or ""
    generation = meta.get("generation")
    where = f"Gateway {parent.get('namespace') or namespace}/{parent.get('name')}"
    if parent.get("sectionName"):
        where += f" listener {parent['sectionName']}"
    for entry in (route.get("status") or {}).get("parents") or []:
        if not _same_parent(entry.get("parentRef") or {}, parent, namespace):
            continue
        controller = entry.get("controllerName") or "the Gateway's controller"
        missing = [problem for kind in REQUIRED
                   if (problem := condition_problem(entry.get("conditions") or [], kind, generation, "the route")) is not None]
        if not missing:
            return RouteAdmission(True, f"Accepted and ResolvedRefs by {controller} for {where}")
        return RouteAdmission(False, f"{where} ({controller}): " + "; ".join(missing))
    return RouteAdmission(False, f"no status from {where} yet (does the Gateway exist, and does a controller "
                                 "of its GatewayClass run?)")


def wait_admitted(read: Callable[[ObjectRef], dict[str, Any] | None], route: Mapping[str, Any], *,
                  timeout: float = ADMISSION_TIMEOUT, clock: Callable[[], float] = time.monotonic,
                  sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """Read ``route`` back (``read``: the target's GET) until its status admits it for every parent
    of its spec; the route as read. Raises :class:`RouteNotAdmitted` with the status's own words
    after ``timeout`` seconds."""
    ref = ObjectRef.of(route)
    parents = list((route.get("spec") or {}).get("parentRefs") or [])
    began = clock()
    while True:
        stored = read(ref)
        if stored is None:
            raise RouteNotAdmitted(f"{ref} is gone (deleted while its weights moved?)", ref=ref)
        verdicts = [route_admission(stored, parent) for parent in parents]
        waiting = [v.detail for v in verdicts if not v.admitted]
        if not waiting:
            return stored
        if clock() - began >= timeout:
            raise RouteNotAdmitted(f"{ref} not admitted after {timeout:g} s, so the traffic step does not count: "
                                   + "; ".join(waiting), ref=ref)
        sleep(POLL_INTERVAL)
