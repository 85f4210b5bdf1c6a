"""A deposed leader's delayed rollout write is refused by the API server (issue 35).

Two controllers of one environment, each on its own kubernetes target, as two `forgectl reconcile
--watch` hold the environment's Lease (3 s here). The first leads and decides a write; its target
is paused right between the write's Lease check and its send (``pause_before_send``: every request
of that target stops there, the Lease's renewer too, as SIGSTOP would stop the process). The
second takes the expired Lease over and moves the rollout on. The first is resumed: its write goes
out — the check is behind it — carrying the `resourceVersion` it read, and the real API server
refuses it (409). The first then reads the Lease, finds it taken over, and steps down
(reconciler/targets/kubernetes/rollout.py). Once for a traffic move, once for a rollout-state write,
and once for the HTTPRoute half of a move where the Gateway API splits the traffic.

No Prometheus and no model server: the policy's steps have pauses and no analysis; the canary's
pod is a stand-in whose Ready condition follows a local readiness server (devkit.pods.ServerPod).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from devkit.rollout_harness import Rollout, ready_canary_pod, stage_canary
from reconciler.controller.leadership import Leadership, watch_lease
from reconciler.controller.watch import Controllers, WatchOptions, controllers_for, reconcile_pass, run
from reconciler.errors import ConflictError
from reconciler.load.endpoints import DesiredEndpoint, desired_endpoints
from reconciler.plan.session import TargetOptions, open_target
from reconciler.rollout.controller import STATE_ANNOTATION, Phase, RolloutState
from reconciler.targets.kubernetes.lease import FenceToken
from reconciler.targets.kubernetes.rollout import fence_of, rollout_state_of
from reconciler.targets.kubernetes.target import KubernetesTarget
from reconciler.traffic.gateway import RouteNotAdmitted
from reconciler.traffic.serving import serving_states
from tests.polling import WaitTimeout, wait_until
from tests.specedits import route_by_gateway

pytestmark = [pytest.mark.cluster]

ROOT = Path(__file__).resolve().parents[2]
LEASE_SECONDS = 3.0
POLICY = """apiVersion: forge.dev/v1alpha1
kind: RolloutPolicy
metadata:
  name: three-step-canary
spec:
  strategy: canary
  canary:
    steps:
      - {weight: 5, pause: 1s}
      - {weight: 10, pause: 1s}
      - {weight: 100}
"""
DEPLOYMENT = "SeldonDeployment"


@dataclass
class Pause:
    """A target's requests held between their Lease check and their send: once ``armed``, the first
    PATCH of a ``kind`` (the SeldonDeployment by default; made inside the function named
    ``within`` where one is named) stops there, and so does every later request of that target (its
    Lease renewer's too), until :meth:`resume`."""

    kind: str = DEPLOYMENT
    within: str | None = None
    armed: threading.Event = field(default_factory=threading.Event)
    holding: threading.Event = field(default_factory=threading.Event)
    resumed: threading.Event = field(default_factory=threading.Event)
    #: What was held first (method, what).
    held: tuple[str, str] | None = None

    def __call__(self, method: str, what: str) -> None:
        if not self.holding.is_set():
            if not (self.armed.is_set() and method == "PATCH" and f" {self.kind} " in what):
                return
            if self.within is not None and not _inside(self.within):
                return
            self.held = (method, what)
            self.holding.set()
        self.resumed.wait(120)

    def resume(self) -> None:
        self.resumed.set()


def _inside(function: str) -> bool:
    """Whether this thread is inside a call of a function named ``function`` (the write a test holds)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == function:
            return True
        frame = frame.f_back
    return False


class Stop(Exception):
    """Ends the first controller's watch once it follows."""


@dataclass
class Replica:
    """One controller of the environment: its own target, controllers and Leadership."""

    target: KubernetesTarget
    controllers: Controllers
    leadership: Leadership
    endpoints: list[DesiredEndpoint]

    def one_pass(self) -> None:
        """One reconcile pass, as the leader's watch makes it."""
        reconcile_pass(self.controllers, self.endpoints)


def replica(r: Rollout, holder: str) -> Replica:
    result, env = r.load()
    target = open_target(env, TargetOptions(kubeconfig=r.kubeconfig, namespace=r.namespace, lease=watch_lease(LEASE_SECONDS)))
    assert isinstance(target, KubernetesTarget)
    backend = target.rollout_backend(result.specs, env, None)
    return Replica(target, controllers_for(result, env, backend, None, r.namespace), Leadership(target.lock, holder),
                   desired_endpoints(result.specs, env))


@pytest.fixture
def staged(kube_cluster, namespace, tmp_path) -> Iterator[Rollout]:
    """Version 1 stable, version 2 the canary at 0 % with its pod Ready; version 1's workflow done,
    version 2's still running (each test ends it, as Argo would, when it needs the offline gate passed)."""
    r = stage_canary(tmp_path / "repo" / "specs", namespace, kube_cluster.kubeconfig, POLICY)
    with ready_canary_pod(r):
        yield r


@pytest.fixture
def routed(kube_cluster, namespace, tmp_path) -> Iterator[Rollout]:
    """As :func:`staged`, with the Environment's traffic split by an HTTPRoute of the Gateway API
    (router `gatewayAPI`): every traffic move writes the SeldonDeployment, then the route."""
    parent = {"name": "edge", "namespace": namespace, "sectionName": "http"}
    r = stage_canary(tmp_path / "repo" / "specs", namespace, kube_cluster.kubeconfig, POLICY,
                     edit=lambda specs: route_by_gateway(specs, parent))
    with ready_canary_pod(r):
        yield r


def live(kube_cluster, r: Rollout, api: str, plural: str) -> dict[str, Any]:
    """The object `digits` of ``plural`` in ``api`` (its group's path) as the API server has it."""
    status, body = kube_cluster.raw_client().request("GET", f"{api}/namespaces/{r.namespace}/{plural}/digits")
    assert status == 200, body
    return body


def deployment(kube_cluster, r: Rollout) -> dict[str, Any]:
    return live(kube_cluster, r, "/apis/machinelearning.seldon.io/v1", "seldondeployments")


def route(kube_cluster, r: Rollout) -> dict[str, Any]:
    return live(kube_cluster, r, "/apis/gateway.networking.k8s.io/v1", "httproutes")


def served(obj: dict[str, Any]) -> tuple[str, str | None, int]:
    """(stable, canary, the canary's weight) of the live SeldonDeployment."""
    state = serving_states([obj])["digits"]
    return state.stable, state.canary, state.canary_weight


def lease_holder(kube_cluster, r: Rollout) -> str | None:
    status, body = kube_cluster.raw_client().request(
        "GET", f"/apis/coordination.k8s.io/v1/namespaces/{r.namespace}/leases/forgectl-cluster")
    return (body.get("spec") or {}).get("holderIdentity") if status == 200 else None


def paused_then_deposed(kube_cluster, r: Rollout, arm_at: Phase | None, second_acts,
                        pause: Pause | None = None) -> tuple[list[str], dict[str, Any], Replica]:
    """The first replica watches (passes 0.2 s apart) with a :class:`Pause` on its target (``pause``,
    by default the first write of the SeldonDeployment), armed at once (``arm_at`` None) or after
    the pass that left the rollout in ``arm_at``. Once a write
    is held, the second replica takes the Lease over and ``second_acts`` (given it); then the
    first is resumed and watched until it follows. Returns the first's lines, the
    SeldonDeployment as the second left it, and the second replica (still leading)."""
    first, second = replica(r, "first@test:1"), replica(r, "second@test:2")
    pause = pause or Pause()
    first.target.pause_before_send = pause
    if arm_at is None:
        pause.armed.set()
    lines: list[str] = []
    outcome: list[BaseException] = []

    def on_pass(states: dict[str, RolloutState]) -> None:
        state = states.get("digits")
        if arm_at is not None and state is not None and state.phase is arm_at:
            pause.armed.set()
        if first.leadership.waiting is not None and "lost the environment's lock" in first.leadership.waiting:
            raise Stop

    def watch() -> None:
        try:
            run(first.controllers, first.endpoints, WatchOptions(watch=True, interval=0.2, timeout=90),
                leadership=first.leadership, on_line=lines.append, on_pass=on_pass)
        except BaseException as exc:  # noqa: BLE001 — Stop, or what failed: judged by the test
            outcome.append(exc)

    thread = threading.Thread(target=watch, name="first-watch", daemon=True)
    thread.start()
    try:
        try:
            wait_until(pause.holding.is_set, 30, "the first replica's write to be held between its check and its send")
        except WaitTimeout as exc:
            raise AssertionError((lines, outcome, rollout_state_of(deployment(kube_cluster, r)))) from exc
        # The first's Lease runs out (its renewer is held too); the second takes it over and acts.
        wait_until(second.leadership.leading, 4 * LEASE_SECONDS + 10, "the second replica to take the Lease over")
        second_acts(second)
        after = deployment(kube_cluster, r)
    finally:
        pause.resume()
        thread.join(60)
    assert not thread.is_alive(), lines
    assert len(outcome) == 1 and isinstance(outcome[0], Stop), (outcome, lines)
    assert pause.held is not None and pause.held[1].startswith(f"patch {pause.kind} "), pause.held
    return lines, after, second


def refused_and_deposed(lines: list[str]) -> str:
    """The first's line saying it was refused by the API server and follows; that line."""
    [line] = [x for x in lines if "following, nothing written" in x and "lost the environment's lock" in x]
    assert "refused by the API server as stale (409" in line, line
    assert "the object has been modified" in line, line  # the API server's own words
    assert "taken over by second@test:2" in line, line
    return line


def test_a_traffic_move_held_past_the_lease_is_refused_and_the_new_leaders_traffic_stands(staged: Rollout, kube_cluster) -> None:
    r = staged
    r.finish_workflow(r.canary)
    first_token: list[FenceToken | None] = []

    def second_acts(second: Replica) -> None:
        before = deployment(kube_cluster, r)
        first_token.append(fence_of(before))
        assert served(before)[2] == 5  # the first's step 1, its move to 10 % held
        second.one_pass()

    lines, after, second = paused_then_deposed(kube_cluster, r, Phase.PROGRESSING, second_acts)
    try:
        refused_and_deposed(lines)
        # The second's move stands, written once: the SeldonDeployment is as the second left it.
        now = deployment(kube_cluster, r)
        assert now["metadata"]["resourceVersion"] == after["metadata"]["resourceVersion"]
        assert served(now) == (r.stable, r.canary, 10)
        state = rollout_state_of(now)
        assert state is not None and state.phase is Phase.PROGRESSING and state.step == 1, state
        entered = [h["reason"] for h in state.history if h["to"] == "Progressing"]
        assert len(entered) == 2 and "step 2/3" in entered[-1], entered
        # Each tenure stamped its token; the second's is the later tenure of the same Lease.
        [mine] = first_token
        theirs = fence_of(now)
        assert mine is not None and theirs is not None and mine.holder == "first@test:1", (mine, theirs)
        assert theirs.holder == "second@test:2" and theirs.supersedes(mine), (mine, theirs)
        assert lease_holder(kube_cluster, r) == "second@test:2"
    finally:
        second.leadership.release()


def test_a_state_write_held_past_the_lease_is_refused_and_the_new_leaders_state_stands(staged: Rollout, kube_cluster) -> None:
    r = staged

    def second_acts(second: Replica) -> None:
        held = deployment(kube_cluster, r)
        assert rollout_state_of(held) is None  # the first's state write (waiting for the gate) is held
        r.finish_workflow(r.canary)  # the version's workflow ends (what Argo does) …
        second.one_pass()  # … and the second moves on

    lines, after, second = paused_then_deposed(kube_cluster, r, None, second_acts)
    try:
        refused_and_deposed(lines)
        now = deployment(kube_cluster, r)
        assert now["metadata"]["resourceVersion"] == after["metadata"]["resourceVersion"]
        state = rollout_state_of(now)
        # The second's state (step 1 entered), not the first's late "waiting for the offline gate".
        assert state is not None and state.phase is Phase.PROGRESSING and state.step == 0, state
        assert served(now) == (r.stable, r.canary, 5)
        assert lease_holder(kube_cluster, r) == "second@test:2"
    finally:
        second.leadership.release()


def test_a_state_save_outlives_the_operators_status_write_but_not_another_rollout_writer(staged: Rollout,
                                                                                          kube_cluster) -> None:
    """Seldon's operator writes the SeldonDeployment's status after each traffic move, which moves
    its resourceVersion: the rollout state saved after a move must not be refused for that (found
    on the node: a promotion whose state was refused, its next pass misreading the landed move).
    Saved again at the new version only while nothing a rollout owns changed; a state written by
    another writer in between is still refused (409)."""
    one = replica(staged, "one@test:1")
    assert one.leadership.leading()
    try:
        backend = one.controllers.backend
        backend.refresh()
        state = backend.load_state("digits") or RolloutState("digits", staged.stable)
        raw = kube_cluster.raw_client()
        path = f"/apis/machinelearning.seldon.io/v1/namespaces/{staged.namespace}/seldondeployments/digits"
        before = deployment(kube_cluster, staged)["metadata"]["resourceVersion"]
        # the operator's write, through the status subresource as it makes it
        status, body = raw.request("PATCH", path + "/status", json.dumps({"status": {"state": "Available"}}).encode(),
                                   content_type="application/merge-patch+json")
        assert status == 200 and body["metadata"]["resourceVersion"] != before, body
        backend.save_state("digits", dataclasses.replace(state, reason="saved after the operator's status write"))
        assert rollout_state_of(deployment(kube_cluster, staged)).reason == "saved after the operator's status write"

        # another writer's rollout state since this pass read the object: refused, never overwritten
        other = dataclasses.replace(state, reason="another writer's state")
        status, body = raw.request("PATCH", path, json.dumps({"metadata": {"annotations": {
            STATE_ANNOTATION: json.dumps(other.to_json())}}}).encode(), content_type="application/merge-patch+json")
        assert status == 200, body
        with pytest.raises(ConflictError, match="refused by the API server as stale"):
            backend.save_state("digits", dataclasses.replace(state, reason="stale"))
        assert rollout_state_of(deployment(kube_cluster, staged)).reason == "another writer's state"
    finally:
        one.leadership.release()


ROUTE = "HTTPRoute"


def canary_share(obj: dict[str, Any]) -> int:
    """The weight the live HTTPRoute gives the canary's Service (0 where it names none)."""
    [rule] = [x for x in obj["spec"]["rules"] if not x.get("matches") or not any(m.get("headers") for m in x["matches"])]
    return sum(b.get("weight", 1) for b in rule["backendRefs"] if b["name"].endswith("-canary"))


def test_a_route_write_held_past_the_lease_is_refused_and_the_new_leaders_route_stands(routed: Rollout, kube_cluster) -> None:
    """The route half of a move: the first's move to 5 % lands on the SeldonDeployment and is held
    on its way to the HTTPRoute; the second takes the Lease over and makes the same move itself,
    writing the route; the first's route write, sent once resumed with the version it read, is
    refused by the API server (409) and the first steps down. No gateway controller runs on this
    API server, so the second's move ends waiting for an admission nobody reports (its pass is
    taken again; tests/cluster/test_gateway_node.py has Traefik admit Forge's routes)."""
    r = routed
    r.finish_workflow(r.canary)
    before = route(kube_cluster, r)
    assert canary_share(before) == 0
    refused_second: list[RouteNotAdmitted] = []

    def second_acts(second: Replica) -> None:
        try:
            second.one_pass()
        except RouteNotAdmitted as exc:  # no gateway here: the route written, never reported Accepted
            refused_second.append(exc)

    # the route's write of a move (apply_route), not the first holder's fence stamp on it
    lines, _, second = paused_then_deposed(kube_cluster, r, None, second_acts, Pause(ROUTE, within="apply_route"))
    try:
        line = refused_and_deposed(lines)
        assert 'on httproutes.gateway.networking.k8s.io "digits"' in line, line  # the route's write, no later one
        assert refused_second and "not admitted" in str(refused_second[0]), refused_second
        now = route(kube_cluster, r)
        # written by the second (its move to 5 %), and by no one after it: the first's write refused
        assert now["metadata"]["resourceVersion"] != before["metadata"]["resourceVersion"]
        assert canary_share(now) == 5, now["spec"]["rules"]
        assert lease_holder(kube_cluster, r) == "second@test:2"
    finally:
        second.leadership.release()
