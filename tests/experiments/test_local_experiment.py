"""An A/B experiment end to end on the local target: two real model servers (the serve runtime)
behind the endpoint's HAProxy, Debian's Prometheus scraping them, load through the router, and the
experiment controller deciding from Prometheus's counters.

Run 1: the control arm fails 8 % of its requests (injected errors), the treatment none: the
controller must decide for the treatment within the sample bound, and the treatment's variant
then serves all traffic. Run 2: two identical arms and a short deadline: inconclusive, control
kept.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from devkit.runtime_steps import Runner
from reconciler.experiment.controller import DECIDED, INCONCLUSIVE, RUNNING, ExperimentController
from reconciler.load.loader import load_or_raise
from reconciler.metrics.prometheus import Prometheus
from reconciler.plan.session import serving_states
from reconciler.rollout.controller import RolloutState
from reconciler.targets.local import processes
from reconciler.targets.local.load import generate
from reconciler.targets.local.monitoring import LocalPrometheus
from reconciler.targets.local.serving import LocalServing
from reconciler.targets.local.state import StateDB
from renderers.labels import STICKY
from renderers.seldon import ServingState, render_seldon
from specs import Endpoint
from specs.experiment import ArmFaults
from tests.polling import wait_until
from tests.runtimes.helpers import ROOT

EXAMPLE = ROOT / "examples" / "experiments"
MODEL = "digits-mlp"
VERSION = "0123456789ab"


class LocalBackend:
    """The controller's backend over LocalServing: what the local target does on apply (render
    the SeldonDeployment, serve its predictors, point Prometheus at the servers)."""

    def __init__(self, specs: Any, env: Any, serving: LocalServing, prom: LocalPrometheus) -> None:
        self.specs, self.env, self.local, self.prom = specs, env, serving, prom
        self.objects: dict[str, dict[str, Any]] = {}
        self.states: dict[str, RolloutState] = {}
        self.events: list[tuple[str, str]] = []

    def serving(self, endpoint: str) -> ServingState | None:
        obj = self.objects.get(endpoint)
        return serving_states([obj]).get(endpoint) if obj else None

    def load_state(self, endpoint: str) -> RolloutState | None:
        return self.states.get(endpoint)

    def model_gate(self, model: str, version: str, variant: str | None) -> tuple[bool, bool, str]:
        # the arms' bundles are the ones this module's fixture trained and registered
        return True, True, f"version {version} registered by the fixture"

    def save_state(self, endpoint: str, state: RolloutState) -> None:
        self.states[endpoint] = RolloutState.from_json(state.to_json())

    def set_serving(self, endpoint: Endpoint, state: ServingState) -> None:
        obj = render_seldon(self.specs, endpoint, self.env, "default", None, state)
        sticky = (obj["metadata"].get("annotations") or {}).get(STICKY)
        self.url = self.local.ensure_endpoint(endpoint.name, obj["spec"]["predictors"],
                                                tuple(sticky.split(":", 1)) if sticky else None)
        self.prom.set_targets(self.local.scrape_targets())
        self.objects[endpoint.name] = obj

    def event(self, endpoint: str, kind: str, reason: str, message: str) -> None:
        self.events.append((reason, message))


def _endpoint(control_errors: float, max_duration: str, treatment_errors: float = 0.0,
              shadow: bool = False, min_samples: int = 400) -> tuple[Any, Endpoint]:
    specs = load_or_raise([str(EXAMPLE)]).specs
    ep = next(e for e in specs.of(Endpoint) if e.name == "digits-ab")
    exp = ep.spec.experiment
    assert exp is not None
    arms = [exp.arms[0].model_copy(update={"fault_injection": ArmFaults(error_rate=control_errors) if control_errors else None}),
            exp.arms[1].model_copy(update={"fault_injection": ArmFaults(error_rate=treatment_errors) if treatment_errors else None})]
    exp = exp.model_copy(update={"arms": arms, "guardrails": [], "min_samples_per_arm": min_samples, "interval": "1s",
                                 "max_duration": max_duration,
                                 # α 1 %: run 2 (no difference) may falsely decide with at most this probability
                                 "decision": exp.decision.model_copy(update={"minimum_effect": 0.0, "alpha": 0.01})})
    ep = ep.model_copy(update={"spec": ep.spec.model_copy(update={"experiment": exp,
                                                                  "shadow": ep.spec.shadow if shadow else None})})
    return specs, ep


def _run(specs: Any, ep: Endpoint, serving: LocalServing, prom: LocalPrometheus, budget: float) -> tuple[LocalBackend, Any, dict[str, Any]]:
    env = specs.environment("local")
    backend = LocalBackend(specs, env, serving, prom)
    backend.set_serving(ep, ServingState(VERSION))  # what serves before the experiment: the stable version
    controller = ExperimentController(backend, Prometheus(prom.url), "default")
    state = controller.reconcile(ep, VERSION)
    assert state is not None and state.phase == RUNNING
    stop = threading.Event()
    result: dict[str, Any] = {}
    url = backend.url
    loader = threading.Thread(target=lambda: result.update(
        generate(url, MODEL, rate=80, seconds=budget, concurrency=4, stop=stop)))
    loader.start()
    deadline = time.monotonic() + budget
    try:
        while state.phase == RUNNING and time.monotonic() < deadline:
            time.sleep(1.0)
            state = controller.reconcile(ep, VERSION)
    finally:
        stop.set()
        loader.join()
    return backend, state, result


@pytest.mark.runtime
@pytest.mark.slow
def test_ab_experiment_decides_for_the_better_arm_and_identical_arms_are_inconclusive(
        digits: Runner, runtime_python: str, tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    for variant in ("base", "int8", "pruned"):  # both arms (and the shadow) serve the trained digits model
        target = workspace / "registry" / MODEL / VERSION / variant
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(digits.workspace / "models" / "base", target_is_directory=True)
    state_dir = tmp_path / ".forge"
    db = StateDB(state_dir / "state.db")
    serving = LocalServing(db, state_dir, runtime_python, workspace, ROOT)
    prom = LocalPrometheus(db, state_dir, scrape_interval="1s")
    prom.ensure()
    try:
        # run 1: control fails 8 % of requests
        specs, ep = _endpoint(0.08, "10m")
        backend, state, load = _run(specs, ep, serving, prom, budget=150)
        assert state.phase == DECIDED and state.winner == "int8", (state.reason, state.counts)
        counts = state.counts
        assert all(c["trials"] >= 400 for c in counts.values()), counts  # not before the minimum sample
        assert counts["base"]["successes"] / counts["base"]["trials"] < 0.97 < counts["int8"]["successes"] / counts["int8"]["trials"]
        comparison = state.decision["comparisons"][0]
        assert comparison["pValue"] <= 0.01 and comparison["low"] > 0, comparison
        # the winner serves all traffic, as the stable predictor with its variant
        roles = serving.status("digits-ab")["roles"]
        assert set(roles) == {"stable"}
        assert [p["labels"]["forge.dev/variant"] for p in backend.objects["digits-ab"]["spec"]["predictors"]] == ["int8"]
        assert load["by_version"] and load["failed"] > 0  # the injected errors reached the clients of the control arm

        # run 2: identical arms (both fail 5 %), a 45 s deadline: the test runs and finds nothing;
        # a shadow (the `pruned` variant) gets a copy of every request through the router. A
        # minimum sample of 200 per arm: a loaded 2-core machine served ~800 requests in 45 s
        # (all three servers answer each), which a minimum of 400 per arm left just short.
        specs, ep = _endpoint(0.05, "45s", treatment_errors=0.05, shadow=True, min_samples=200)
        backend, state, load = _run(specs, ep, serving, prom, budget=90)
        assert state.phase == INCONCLUSIVE and state.winner is None, (state.reason, state.counts)
        assert "deadline reached without" in state.reason and "control base kept" in state.reason, state.reason
        assert all(c["trials"] >= 200 for c in state.counts.values()), state.counts
        assert [(p["labels"]["forge.dev/variant"], p.get("shadow")) for p in backend.objects["digits-ab"]["spec"]["predictors"]] == [
            ("base", None), ("pruned", True)]

        def mirror_settled() -> dict[str, Any] | None:
            """The mirror's counts once no copy is in flight (each mirrored one answered or failed)."""
            stats = serving.status("digits-ab").get("shadow")
            return stats if stats and stats["answered"] + stats["failed"] == stats["mirrored"] else None

        shadow = wait_until(mirror_settled, timeout=30, what="every mirrored copy answered or failed")
        # every request the clients sent was mirrored once (the errors are the arms' injected 500s:
        # mirrored too), the shadow answered, and it agrees with the live answers (same model)
        assert shadow["mirrored"] >= 0.95 * load["requests"] and shadow["answered"] >= 0.95 * shadow["mirrored"], (shadow, load["requests"])
        assert shadow["compared"] > 0 and shadow["agreement"] == 1.0 and shadow["maxProbabilityDistance"] < 1e-4, shadow
        # the shadow's own series, as Prometheus scraped them (role `shadow`)
        query = 'sum(forge_requests_total{forge_endpoint="digits-ab",forge_role="shadow"})'
        wait_until(lambda: [r for r in prom.query(query) if float(r["value"][1]) >= 0.9 * shadow["answered"]],
                   timeout=30, what=f"Prometheus to have scraped >= 90 % of the {shadow['answered']} shadow answers")
        # (that clients never see a shadow's answer: tests/experiments/test_local_router.py)
        from forgectl.experiment_cli import experiment_lines

        lines = experiment_lines({"endpoint": "digits-ab", "rollout": backend.states["digits-ab"].to_json(), "shadow": shadow})
        assert lines[0].startswith("experiment: Inconclusive") and "agreement 100.00%" in lines[1], lines
    finally:
        records = db.processes()
        serving.stop_all()
        prom.stop()
        assert [r.name for r in records if processes.alive(r)] == []
