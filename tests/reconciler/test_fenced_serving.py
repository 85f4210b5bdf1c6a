"""The kubernetes rollout backend's fencing where an HTTPRoute splits the traffic (router
`gatewayAPI`), on a fake target that enforces preconditions as the API server does: both objects
of a traffic move written at the resourceVersion last read, a stale one refused (409) and never
sent again, and a new holder's tenure stamped on both before it decides anything. The same
fencing on the real API server, for the SeldonDeployment: tests/rollout/test_fenced_writes.py."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from reconciler.errors import ConflictError, LeaseLost
from reconciler.load.loader import load_or_raise
from reconciler.resources import ObjectRef, Resource
from reconciler.rollout.controller import STATE_ANNOTATION, Phase, RolloutState
from reconciler.targets.base import Precondition
from reconciler.targets.kubernetes.lease import FenceToken
from reconciler.targets.kubernetes.rollout import FENCE_ANNOTATION, KubernetesRolloutBackend, fence_of
from reconciler.traffic.serving import render_serving, render_serving_route
from renderers.seldon import ServingState
from specs import Endpoint
from specs.traffic import GatewayParentRef, TrafficRouting

ROOT = Path(__file__).resolve().parents[2]
NS = "forge-quickstart"
STABLE, CANARY = "a" * 12, "b" * 12
MINE = FenceToken("lease-1", 2, "me")


class FakeCluster:
    """Objects with resourceVersions; writes refused as the API server refuses them (409 on a
    resourceVersion that moved, or on a create-only of an object that exists); a Gateway that
    admits every route; the Lease ours for :attr:`taken_after` confirmations (None: always)."""

    namespace = NS

    def __init__(self) -> None:
        self.objects: dict[ObjectRef, dict[str, Any]] = {}
        self.version = 100
        self.writes: list[tuple[str, str, Precondition | None]] = []
        self.taken_after: int | None = None
        self.confirmed = 0

    def put(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        self.version += 1
        stored = copy.deepcopy(dict(obj))
        meta = stored.setdefault("metadata", {})
        meta["resourceVersion"] = str(self.version)
        meta["generation"] = meta.get("generation", 0) + 1
        self.objects[ObjectRef.of(stored)] = stored
        return copy.deepcopy(stored)

    def _check(self, ref: ObjectRef, version: str | None, absent: bool = False) -> None:
        live = self.objects.get(ref)
        if absent and live is not None:
            raise ConflictError(f"{ref}: exists", status=409, ref=ref)
        if version and (live is None or live["metadata"]["resourceVersion"] != version):
            raise ConflictError(f"{ref}: conflict: the object has been modified", status=409, ref=ref)

    # -- what the backend asks of the target ------------------------------------------------------
    def list_kind(self, resource: Resource, selector: str) -> list[dict[str, Any]]:
        return [copy.deepcopy(o) for r, o in self.objects.items() if r.kind == resource.kind]

    list_current = list_kind  # no watch-fed cache here

    def remember(self, obj: dict[str, Any]) -> None:
        pass

    def cache_mark(self, resource: Resource, selector: str) -> int | None:
        return None  # no cache: every pass reads afresh

    def apply(self, obj: Mapping[str, Any], *, dry_run: bool = False, precondition: Precondition | None = None) -> dict[str, Any]:
        ref = ObjectRef.of(obj)
        self.writes.append(("apply", ref.kind, precondition))
        self._check(ref, precondition.resource_version if precondition else None, bool(precondition and precondition.absent))
        live = self.objects.get(ref, {})
        meta = {**(live.get("metadata") or {}), **dict(obj["metadata"])}
        return self.put({**live, **dict(obj), "metadata": meta})

    def merge_patch(self, ref: ObjectRef, body: Mapping[str, Any], manager: str, *,
                    resource_version: str | None = None) -> dict[str, Any]:
        self.writes.append(("merge", ref.kind, Precondition(resource_version=resource_version)))
        self._check(ref, resource_version)
        live = copy.deepcopy(self.objects[ref])
        live["metadata"].setdefault("annotations", {}).update(body["metadata"]["annotations"])
        return self.put(live)

    def get(self, ref: ObjectRef) -> dict[str, Any] | None:
        obj = copy.deepcopy(self.objects.get(ref))
        if obj is not None and ref.kind == "HTTPRoute":
            gen = obj["metadata"]["generation"]
            conditions = [{"type": t, "status": "True", "observedGeneration": gen} for t in ("Accepted", "ResolvedRefs")]
            obj["status"] = {"parents": [{"parentRef": obj["spec"]["parentRefs"][0], "conditions": conditions}]}
        return obj

    def create(self, resource: Resource, body: Mapping[str, Any]) -> dict[str, Any]:
        return dict(body)

    @property
    def holder(self) -> str | None:
        return MINE.holder

    @property
    def fence_token(self) -> FenceToken | None:
        return MINE

    def confirm_lease(self, what: str) -> None:
        self.confirmed += 1
        if self.taken_after is not None and self.confirmed > self.taken_after:
            raise LeaseLost(f"{what}: not sent: taken over by the new leader")


@pytest.fixture
def gateway() -> tuple[Any, Any, Endpoint]:
    specs = load_or_raise([str(ROOT / "examples" / "quickstart")]).specs
    env = specs.environment("cluster")
    endpoint = specs.get(Endpoint, "digits")
    assert env is not None and endpoint is not None
    routing = TrafficRouting(router="gatewayAPI", parent_ref=GatewayParentRef(name="forge", section_name="http"))
    return specs, env.model_copy(update={"spec": env.spec.model_copy(update={"traffic": routing})}), endpoint


def live(gateway: tuple[Any, Any, Endpoint], serving: ServingState, state: RolloutState | None,
         token: FenceToken | None = None) -> tuple[FakeCluster, KubernetesRolloutBackend]:
    """A cluster serving ``serving`` through a SeldonDeployment and its HTTPRoute, with ``state``
    saved and ``token`` stamped on both; the backend after its first refresh."""
    specs, env, endpoint = gateway
    cluster = FakeCluster()
    deployment = render_serving(specs, env, NS, None, endpoint, serving)
    route = render_serving_route(env, NS, None, endpoint, serving)
    assert route is not None
    for obj in (deployment, route):
        annotations = obj["metadata"].setdefault("annotations", {})
        if token is not None:
            annotations[FENCE_ANNOTATION] = token.to_text()
        if state is not None and obj is deployment:
            annotations[STATE_ANNOTATION] = json.dumps(state.to_json())
        cluster.put(obj)
    backend = KubernetesRolloutBackend(cluster, specs, env, None)  # type: ignore[arg-type]
    backend.refresh()
    cluster.writes.clear()
    return cluster, backend


def progressing(weight: int) -> RolloutState:
    return RolloutState("digits", STABLE, canary=CANARY, phase=Phase.PROGRESSING, weight=weight)


def test_a_traffic_move_writes_both_objects_at_the_versions_read(gateway) -> None:
    cluster, backend = live(gateway, ServingState(STABLE, CANARY, 10), progressing(10), MINE)
    read = {kind: backend_obj["metadata"]["resourceVersion"]
            for kind, backend_obj in (("SeldonDeployment", backend.deployments["digits"]), ("HTTPRoute", backend.routes["digits"]))}
    backend.set_serving(gateway[2], ServingState(STABLE, CANARY, 50))
    assert [(kind, p.resource_version if p else None) for _, kind, p in cluster.writes] == [
        ("SeldonDeployment", read["SeldonDeployment"]), ("HTTPRoute", read["HTTPRoute"])]
    # what is kept is what the server stored (and the Gateway's read-back): the next write's versions
    assert backend.routes["digits"]["metadata"]["resourceVersion"] == cluster.objects[ObjectRef("HTTPRoute", NS, "digits")]["metadata"]["resourceVersion"]


@pytest.mark.parametrize("deposed", [False, True], ids=["still-leading", "deposed"])
def test_a_route_moved_since_it_was_read_refuses_the_promotion_and_nothing_is_sent_again(gateway, deposed: bool) -> None:
    cluster, backend = live(gateway, ServingState(STABLE, CANARY, 50), progressing(50), MINE)
    route = ObjectRef("HTTPRoute", NS, "digits")
    cluster.put(cluster.objects[route])  # another writer moved it after this pass read it
    before = copy.deepcopy(cluster.objects)
    if deposed:  # taken over after the write's own check (a pause between check and send)
        cluster.taken_after = 1
    # a promotion drops a predictor: the route moves first, and is refused
    with pytest.raises(LeaseLost if deposed else ConflictError, match="refused by the API server as stale"):
        backend.set_serving(gateway[2], ServingState(CANARY))
    assert [kind for _, kind, _ in cluster.writes] == ["HTTPRoute"]  # one attempt, the SeldonDeployment never sent
    assert cluster.objects == before


def test_a_new_holder_stamps_its_tenure_on_both_objects_of_a_rollout_in_progress(gateway) -> None:
    earlier = FenceToken("lease-1", 1, "the deposed one")
    cluster, backend = live(gateway, ServingState(STABLE, CANARY, 10), None, None)
    for ref in list(cluster.objects):  # the state and the previous tenure's token, written before
        obj = copy.deepcopy(cluster.objects[ref])
        obj["metadata"]["annotations"][FENCE_ANNOTATION] = earlier.to_text()
        if ref.kind == "SeldonDeployment":
            obj["metadata"]["annotations"][STATE_ANNOTATION] = json.dumps(progressing(10).to_json())
        cluster.put(obj)
    versions = {r: o["metadata"]["resourceVersion"] for r, o in cluster.objects.items()}
    backend.refresh()
    assert sorted((kind, p.resource_version if p else None) for _, kind, p in cluster.writes) == sorted(
        (r.kind, v) for r, v in versions.items())  # each stamped at the version just read
    assert all(fence_of(o) == MINE for o in cluster.objects.values())
    cluster.writes.clear()
    backend.refresh()
    assert cluster.writes == []  # stamped once per tenure


def test_a_rollout_at_rest_is_not_stamped_and_a_later_tenure_deposes(gateway) -> None:
    promoted = RolloutState("digits", CANARY, phase=Phase.PROMOTED)
    cluster, _ = live(gateway, ServingState(CANARY), promoted, FenceToken("lease-1", 0, "old"))
    assert cluster.writes == []
    later = FenceToken("lease-1", 3, "the new leader")
    _, backend = live(gateway, ServingState(STABLE, CANARY, 10), None, later)
    deployment = ObjectRef("SeldonDeployment", NS, "digits")
    obj = copy.deepcopy(backend.target.objects[deployment])  # type: ignore[attr-defined]
    obj["metadata"]["annotations"][STATE_ANNOTATION] = json.dumps(progressing(10).to_json())
    backend.target.put(obj)  # type: ignore[attr-defined]
    with pytest.raises(LeaseLost, match="a later holder of the environment's Lease"):
        backend.refresh()


class CachedCluster(FakeCluster):
    """The same, read as the controller reads it: from caches whose mark moves with every change
    (any writer's), and a Lease tenure that can change hands."""

    def __init__(self) -> None:
        super().__init__()
        self.changes, self.lists, self.token = 0, 0, MINE

    def put(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        self.changes += 1
        return super().put(obj)

    def list_kind(self, resource: Resource, selector: str) -> list[dict[str, Any]]:
        self.lists += 1
        return super().list_kind(resource, selector)

    list_current = list_kind

    def cache_mark(self, resource: Resource, selector: str) -> int | None:
        return self.changes

    @property
    def fence_token(self) -> FenceToken | None:
        return self.token


def test_a_refresh_reads_again_only_when_a_cache_or_the_tenure_moved(gateway) -> None:
    """At rest with nothing changed, a pass keeps what the last one read and fenced; another
    writer's change, the backend's own write and a new tenure each make the next pass read (and
    fence) again."""
    specs, env, endpoint = gateway
    cluster = CachedCluster()
    for obj in (render_serving(specs, env, NS, None, endpoint, ServingState(STABLE, CANARY, 10)),
                render_serving_route(env, NS, None, endpoint, ServingState(STABLE, CANARY, 10))):
        assert obj is not None
        obj["metadata"].setdefault("annotations", {})[FENCE_ANNOTATION] = MINE.to_text()
        if obj["kind"] == "SeldonDeployment":
            obj["metadata"]["annotations"][STATE_ANNOTATION] = json.dumps(progressing(10).to_json())
        cluster.put(obj)
    backend = KubernetesRolloutBackend(cluster, specs, env, None)  # type: ignore[arg-type]
    backend.refresh()
    assert cluster.lists == 2  # the SeldonDeployments and the HTTPRoutes
    backend.refresh()
    assert cluster.lists == 2 and cluster.writes == []

    deployment = ObjectRef("SeldonDeployment", NS, "digits")
    cluster.put(copy.deepcopy(cluster.objects[deployment]))  # another writer
    backend.refresh()
    assert cluster.lists == 4
    assert backend.deployments["digits"]["metadata"]["resourceVersion"] == cluster.objects[deployment]["metadata"]["resourceVersion"]

    backend.save_state("digits", progressing(10))  # its own write moves the mark as well
    backend.refresh()
    assert cluster.lists == 6 and backend.load_state("digits") == progressing(10)

    cluster.token = FenceToken("lease-1", 3, "me again")  # a new tenure: stamped before anything is decided
    backend.refresh()
    assert cluster.lists == 8 and all(fence_of(o) == cluster.token for o in cluster.objects.values())
    cluster.writes.clear()
    backend.refresh()
    assert cluster.lists == 10 and cluster.writes == []  # the stamps moved the marks: read once more, nothing to stamp
    backend.refresh()
    assert cluster.lists == 10
