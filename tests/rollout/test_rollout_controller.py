"""The rollout controller against the real API server, a real Prometheus and real model servers.

The serving runtime runs as local processes (stable and canary, labelled as Seldon would label
them); a small traffic generator sends requests to them in the proportions the live
SeldonDeployment says (what the mesh does in a cluster); Prometheus scrapes them every second.

The state machine's every transition is unit-tested on fakes in test_rollout_core.py; these tests
check what only the real components can: the kubernetes backend, real metrics and a real outage,
events, git write-back, and a controller killed mid-rollout. They wait by polling under deadlines.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import git
import pytest

from devkit.pods import ServerPod
from devkit.rollout import PacedTraffic, Traffic
from devkit.rollout_harness import Rollout
from reconciler.rollout.controller import Phase, RolloutState
from tests.polling import WaitTimeout, wait_until

ROOT = Path(__file__).resolve().parents[2]


def _set(specs_dir: Path, old: str, new: str, file: str = "model.yaml") -> None:
    path = specs_dir / file
    path.write_text(path.read_text().replace(old, new))


@pytest.fixture
def rollout(kube_cluster, namespace, prometheus, digits, tmp_path) -> Rollout:  # noqa: F811
    """Quick-start applied at version 1 (stable, workflow done), then a hyperparameter change
    applied: version 2 is the canary at weight 0, its workflow done. In a real git repository."""
    specs_dir = tmp_path / "repo" / "specs"
    shutil.copytree(ROOT / "examples" / "quickstart", specs_dir)
    _set(specs_dir, "url: http://prometheus-operated.monitoring.svc:9090", f"url: {prometheus.url}", "environments.yaml")
    # Quicker analysis for tests: same shape as the example, shorter pauses. The latency bound is
    # loosened: these tests are about the state machine, and a loaded 2-core CI machine can push a
    # healthy canary's p99 past 200 ms.
    _set(specs_dir, "pause: 5s", "pause: 2s", "rollout.yaml")
    _set(specs_dir, "max: 0.2", "max: 2.0", "rollout.yaml")
    repo = git.Repo.init(specs_dir.parent)
    repo.config_writer().set_value("user", "name", "T").set_value("user", "email", "t@example.com").release()
    repo.index.add(["specs"])
    repo.index.commit("version 1")
    r = Rollout(specs_dir, namespace, kube_cluster.kubeconfig, prometheus, digits)
    r.apply()
    _, _, _, _, r.stable = r.controller()
    r.finish_workflow(r.stable)
    _set(specs_dir, "learningRate: 0.002", "learningRate: 0.003")
    repo.index.add(["specs/model.yaml"])
    repo.index.commit("version 2: learning rate 0.003")
    r.apply()
    _, _, _, _, r.canary = r.controller()
    assert r.canary != r.stable
    return r


def serve(r: Rollout, server_factory, role: str, version: str, error_rate: float = 0.0,  # noqa: F811
          delay: dict[str, object] | None = None):
    """A model server of ``role``; ``error_rate`` injected, after ``delay`` (`after`, `afterRequests`) when given."""
    config = {"endpoint": "digits", "namespace": r.namespace, "model": "digits-mlp", "version": version, "variant": "base",
              "role": role, "modelDir": "models/base", "host": "127.0.0.1", "port": 0,
              "batching": {"enabled": True, "maxBatchSize": 8, "maxLatencyMs": 2}}
    if error_rate:
        config["faultInjection"] = {"errorRate": error_rate, "addedLatencyMs": 0, **(delay or {})}
    return server_factory(r.runner, "serve", config)


def start_traffic(r: Rollout, server_factory, canary_error_rate: float = 0.0,  # noqa: F811
                  canary_delay: dict[str, object] | None = None, paced: bool = False) -> Traffic:
    """Stable and canary served, their pods Ready, Prometheus scraping them, and requests sent by
    the live weight: one after another (as fast as the servers answer, so fewer on a loaded
    machine), or ``paced`` at a steady 40 a second by a few workers, for a test that counts on
    how many requests a step sends."""
    stable = serve(r, server_factory, "stable", r.stable)
    canary = serve(r, server_factory, "canary", r.canary, canary_error_rate, canary_delay)
    # Their pods, Ready while they answer (the kubelet's part: no node runs here): the controller
    # raises the canary's weight only while its pods are Ready.
    for role, version, server in (("stable", r.stable, stable), ("canary", r.canary, canary)):
        ServerPod(r.kubeconfig, r.namespace, endpoint="digits", role=role, version=version, url=server.url,
                  alive=lambda s=server: s.proc.poll() is None).start()
    r.prometheus.set_targets([stable.url.removeprefix("http://"), canary.url.removeprefix("http://")])
    if paced:
        traffic: Traffic = PacedTraffic(stable.url, canary.url)
        # 8 workers: the rate holds while an answer takes up to 200 ms on a loaded machine
        threading.Thread(target=traffic.run, kwargs={"rate": 40.0, "workers": 8}, daemon=True).start()
    else:
        traffic = Traffic(stable.url, canary.url)
        threading.Thread(target=traffic.run, daemon=True).start()
    return traffic


def reached(*phases: Phase) -> Callable[[RolloutState], bool]:
    return lambda state: state.phase in phases


def drive(r: Rollout, traffic: Traffic, until: Callable[[RolloutState], bool], timeout: float, on_rollback=None, hook=None):
    """Run the controller a pass every 0.5 s, the traffic following the live weights, until ``until`` holds."""
    controller, backend, endpoint, policy, version = r.controller(on_rollback)
    seen: list[RolloutState | None] = [None]

    def one_pass() -> bool:
        backend.refresh()
        state = seen[0] = controller.reconcile(endpoint, version, "digits-mlp", policy)
        serving = backend.serving("digits")
        traffic.weight = serving.canary_weight if serving and serving.canary else 0
        if hook:
            hook(state, r)
        return state is not None and until(state)

    try:
        wait_until(one_pass, timeout, "the rollout to reach the awaited state", interval=0.5)
    except WaitTimeout as exc:
        raise AssertionError(f"{exc}; the last state: {seen[0]}") from None
    assert seen[0] is not None
    return seen[0], backend


def test_offline_gate_holds_traffic_until_the_workflow_succeeds(rollout: Rollout) -> None:
    controller, backend, endpoint, policy, version = rollout.controller()
    backend.refresh()
    state = controller.reconcile(endpoint, version, "digits-mlp", policy)
    assert state is not None and state.phase is Phase.WAITING and state.weight == 0
    assert "waiting for the offline gate" in state.reason
    rollout.finish_workflow(rollout.canary, "Failed")
    backend.refresh()
    state = controller.reconcile(endpoint, version, "digits-mlp", policy)
    assert state is not None and state.phase is Phase.ROLLED_BACK
    assert "offline evaluation failed" in state.reason and "accuracy 0.91 < 0.95" in state.reason


def test_healthy_canary_promotes_through_every_step(rollout: Rollout, server_factory) -> None:  # noqa: F811
    rollout.finish_workflow(rollout.canary)
    traffic = start_traffic(rollout, server_factory)
    try:
        state, backend = drive(rollout, traffic, reached(Phase.PROMOTED, Phase.ROLLED_BACK), timeout=150)
    finally:
        traffic.stop.set()
    assert state.phase is Phase.PROMOTED, state.reason
    # Each step entered once, at its weight, and each of the first two passed on measured values.
    assert [h["weight"] for h in state.history if "/3: canary" in h["reason"]] == [10, 50, 100]
    passed = [h["reason"] for h in state.history if h["reason"].startswith(("step 1 passed", "step 2 passed"))]
    assert len(passed) == 2 and all("success-rate=1" in reason for reason in passed), passed
    serving = backend.serving("digits")
    assert serving.stable == rollout.canary and serving.canary is None
    assert traffic.count("canary", ok=True) > 0  # the canary did take traffic …
    assert traffic.count("stable", ok=False) == 0 and traffic.count("canary", ok=False) == 0  # … and nothing failed
    status = subprocess.run([sys.executable, "-m", "forgectl", "rollout", "status", "digits", "--specs", str(rollout.specs_dir),
                             "--env", "cluster", "-n", rollout.namespace, "--kubeconfig", rollout.kubeconfig, "-o", "json"],
                            capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    data = json.loads(status.stdout)
    assert data["rollout"]["phase"] == "Promoted" and data["serving"]["weights"] == {"stable": 100, "canary": 0}


def test_failing_canary_rolls_back_and_stable_keeps_serving(rollout: Rollout, server_factory) -> None:  # noqa: F811
    rollout.finish_workflow(rollout.canary)
    traffic = start_traffic(rollout, server_factory, canary_error_rate=0.5)
    repo = git.Repo(rollout.specs_dir.parent)

    def writeback(endpoint, state) -> str:
        from reconciler.rollout.writeback import write_back

        sha = write_back(rollout.specs_dir, [str(rollout.specs_dir / "model.yaml")], repo.commit("HEAD~1").hexsha[:12],
                         "forge/rollback-digits", f"Revert model digits-mlp to {state.stable}")
        return f"committed {sha[:12]} on branch forge/rollback-digits"

    try:
        state, backend = drive(rollout, traffic, reached(Phase.PROMOTED, Phase.ROLLED_BACK), timeout=90, on_rollback=writeback)
        rolled_back_at = time.monotonic()  # the traffic follows the rolled-back weights from here on
        wait_until(lambda: traffic.count("stable", ok=True, since=rolled_back_at) >= 40, 30, "40 answers from stable after the rollback")
        ended = time.monotonic()
    finally:
        traffic.stop.set()
    assert state.phase is Phase.ROLLED_BACK, state.reason
    assert "success-rate" in state.reason and "failureLimit 1" in state.reason and "query: sum(rate(forge_requests_total" in state.reason
    assert state.history[-1]["measurement"]["cause"] == "below-min"
    serving = backend.serving("digits")
    assert serving.stable == rollout.stable and serving.canary is None and serving.canary_weight == 0
    # Stable served throughout: no request to it failed (a stopped or hung server fails them: refused,
    # or the 5 s timeout), and every 3 s window from the first request to the end holds answers from
    # it (traffic to stable never stopped for 6 s or more, before, during or after the rollback).
    assert traffic.count("stable", ok=False) == 0
    gaps = traffic.silent_windows("stable", traffic.log[0][0], ended, width=3.0)
    assert gaps == [], f"stable answered nothing in the 3 s windows starting at {gaps} s"
    # The canary took its share and failed until the rollback, and no request went to it after.
    assert traffic.count("canary", ok=False, until=rolled_back_at) > 0
    assert traffic.count("canary", since=rolled_back_at) == 0
    # The rollback is a Kubernetes Event …
    events = subprocess.run(["kubectl", "--kubeconfig", rollout.kubeconfig, "-n", rollout.namespace, "get", "events",
                             "-o", "json"], capture_output=True, text=True, check=True)
    reasons = {e["reason"] for e in json.loads(events.stdout)["items"]}
    assert "RolledBack" in reasons
    # … and git agrees: the revert is committed on its branch, the user's checkout untouched.
    branch = repo.heads["forge/rollback-digits"]
    assert "learningRate: 0.002" in (branch.commit.tree / "specs" / "model.yaml").data_stream.read().decode()
    assert "learningRate: 0.003" in (rollout.specs_dir / "model.yaml").read_text()
    assert state.writeback.startswith("committed ")
    # `apply` now keeps the rolled-back version out of traffic until `rollout retry`.
    rollout.apply()
    _, backend, *_ = rollout.controller()
    backend.refresh()
    assert backend.serving("digits").canary is None


def test_prometheus_down_holds_then_resumes(rollout: Rollout, server_factory) -> None:  # noqa: F811
    rollout.finish_workflow(rollout.canary)
    traffic = start_traffic(rollout, server_factory)
    paused = {}

    def outage(state, r) -> None:
        if state is not None and state.phase is Phase.PROGRESSING and state.step == 0 and not paused:
            r.prometheus.pause()
            paused["at"] = time.monotonic()

    def measured_at(state: RolloutState) -> float:  # when success-rate was last measured (any verdict)
        run = state.runs.get("success-rate")
        return run.last_at if run is not None else 0.0

    try:
        state, backend = drive(rollout, traffic, reached(Phase.HOLDING, Phase.PROMOTED, Phase.ROLLED_BACK), timeout=60, hook=outage)
        assert state.phase is Phase.HOLDING and "Prometheus unreachable" in state.reason
        assert state.last_analysis[-1]["cause"] == "unreachable"  # the real client's failure, typed
        weight, seen = state.weight, {measured_at(state)}
        # Holding: the controller keeps measuring, and each pass neither promotes, rolls back nor moves traffic.
        controller, backend, endpoint, policy, version = rollout.controller()

        def measured_again_and_held() -> bool:
            backend.refresh()
            held = controller.reconcile(endpoint, version, "digits-mlp", policy)
            assert held is not None and held.phase is Phase.HOLDING and held.weight == weight, held
            assert held.last_analysis[-1]["cause"] == "unreachable", held.last_analysis[-1]
            # under `hold` an outage does not count toward inconclusiveLimit: the counter stays put
            assert held.runs["success-rate"].inconclusive_in_a_row == state.runs["success-rate"].inconclusive_in_a_row
            seen.add(measured_at(held))
            return len(seen) >= 3

        wait_until(measured_again_and_held, 30, "two more unreachable success-rate measurements while Prometheus is down",
                   interval=0.5)
        rollout.prometheus.resume()
        # Data again: the rollout leaves Holding by itself, at the same step (promotion is the healthy test's).
        state, backend = drive(rollout, traffic, reached(Phase.PROGRESSING, Phase.PROMOTED, Phase.ROLLED_BACK), timeout=60)
    finally:
        traffic.stop.set()
        rollout.prometheus.resume()  # a no-op when it runs; if it cannot start again, that must show
    assert state.phase is Phase.PROGRESSING and state.step == 0 and state.weight == weight, state.reason
    assert "has data again" in state.reason and state.history[-1]["from"] == "Holding"


def test_controller_killed_mid_rollout_resumes_from_the_same_step(rollout: Rollout, server_factory) -> None:  # noqa: F811
    rollout.finish_workflow(rollout.canary)
    traffic = start_traffic(rollout, server_factory)
    env = {**os.environ, "NO_COLOR": "1"}
    cmd = [sys.executable, "-m", "forgectl", "reconcile", str(rollout.specs_dir), "--env", "cluster", "-n", rollout.namespace,
           "--kubeconfig", rollout.kubeconfig, "--watch", "--interval", "0.5"]
    _, backend, *_ = rollout.controller()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)

    def at_the_second_step() -> bool:
        if proc.poll() is not None:  # it died by itself: no use waiting
            raise AssertionError(f"forgectl reconcile exited {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}")
        backend.refresh()
        serving = backend.serving("digits")
        traffic.weight = serving.canary_weight if serving and serving.canary else 0
        state = backend.load_state("digits")
        return state is not None and state.phase is Phase.PROGRESSING and state.step == 1

    try:
        wait_until(at_the_second_step, 90, "`forgectl reconcile --watch` to enter the second step", interval=0.3)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        backend.refresh()
        saved = backend.load_state("digits")
        assert saved is not None and saved.step == 1 and saved.weight == 50
        entered = [h for h in saved.history if h["to"] == "Progressing" and "step 2/3" in h["reason"]]
        assert len(entered) == 1
        # A new controller continues from the saved step: it finishes step 2 and enters step 3.
        state, backend = drive(rollout, traffic, lambda s: s.step == 2 or s.phase in (Phase.PROMOTED, Phase.ROLLED_BACK),
                               timeout=120)
    finally:
        traffic.stop.set()
        if proc.poll() is None:
            proc.kill()
    assert state.phase is Phase.PROGRESSING and state.step == 2 and state.weight == 100, state.reason
    # Step 2 was entered once, before the kill, never again; the same entry is still there.
    assert [h for h in state.history if h["to"] == "Progressing" and "step 2/3" in h["reason"]] == entered
    assert "step 2 passed" in state.reason
