"""The quick-start's rollout against a real API server, as the rollout tests and benches drive it
(tests/rollout/test_rollout_controller.py, bench/rollback_latency.py, bench/rollout_faults.py):
specs in a folder applied to one namespace, the rollout controller over the kubernetes target's
backend and a Prometheus, and a version's Workflow ended by hand (no Argo controller runs there).
The traffic between the servers is :mod:`devkit.rollout`'s."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devkit.runtime_steps import Runner
from reconciler.load.loader import load_or_raise
from reconciler.load.sources import revision_of
from reconciler.metrics.prometheus import Prometheus
from reconciler.plan.apply import apply_plan
from reconciler.plan.session import TargetOptions, make_plan, open_target
from reconciler.rollout.controller import Controller
from reconciler.targets.kubernetes.rollout import KubernetesRolloutBackend
from renderers.versions import model_version
from specs import Endpoint, Environment, Model


@dataclass
class Rollout:
    """The specs in ``specs_dir`` (environment ``cluster``, endpoint ``digits`` of model
    ``digits-mlp``) in ``namespace``; ``prometheus`` is anything with a ``url`` (the dev
    Prometheus); ``runner`` runs the model servers; ``stable`` and ``canary`` are the versions."""

    specs_dir: Path
    namespace: str
    kubeconfig: str
    prometheus: Any
    runner: Runner
    stable: str = ""
    canary: str = ""

    def load(self):
        result = load_or_raise([str(self.specs_dir)])
        env = result.specs.get(Environment, "cluster")
        return result, env

    def apply(self) -> None:
        result, env = self.load()
        target = open_target(env, TargetOptions(kubeconfig=self.kubeconfig, namespace=self.namespace))
        plan, _ = make_plan(result.specs, env, target, self.namespace, revision_of([str(self.specs_dir)], None, repository=self.specs_dir))
        apply_plan(plan, target)

    def version(self) -> str:
        """The model version the specs want now."""
        result, env = self.load()
        return model_version(result.specs, result.specs.get(Model, "digits-mlp"), env)

    def controller(self, on_rollback=None):
        result, env = self.load()
        target = open_target(env, TargetOptions(kubeconfig=self.kubeconfig, namespace=self.namespace))
        backend = KubernetesRolloutBackend(target, result.specs, env, revision_of([str(self.specs_dir)], None, repository=self.specs_dir))
        controller = Controller(backend, Prometheus(self.prometheus.url, timeout=2), self.namespace, on_rollback=on_rollback)
        endpoint = result.specs.get(Endpoint, "digits")
        policy = result.specs.policy_of(endpoint, env)
        model = result.specs.get(Model, "digits-mlp")
        version = model_version(result.specs, model, env)
        return controller, backend, endpoint, policy, version

    def finish_workflow(self, version: str, phase: str = "Succeeded") -> None:
        """What Argo's controller would do when the version's workflow ends (no kubelet here)."""
        out = subprocess.run(["kubectl", "--kubeconfig", self.kubeconfig, "-n", self.namespace, "get", "workflows",
                              "-l", f"forge.dev/model-version={version}", "-o", "name"], capture_output=True, text=True, check=True)
        name = out.stdout.strip()
        assert name, f"no workflow for {version}"
        subprocess.run(["kubectl", "--kubeconfig", self.kubeconfig, "-n", self.namespace, "patch", name, "--type", "merge",
                        "-p", json.dumps({"status": {"phase": phase, "message": "evaluate: accuracy 0.91 < 0.95" if phase == "Failed" else ""}})],
                       check=True, capture_output=True)
