"""The quick-start's rollout against a real API server, as the rollout tests and benches drive it
(tests/rollout/test_rollout_controller.py, bench/rollback_latency.py, bench/rollout_faults.py):
specs in a folder applied to one namespace, the rollout controller over the kubernetes target's
backend and a Prometheus, and a version's Workflow ended by hand (no Argo controller runs there).
The traffic between the servers is :mod:`devkit.rollout`'s."""

from __future__ import annotations

import contextlib
import http.server
import json
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import git

from devkit.pods import ServerPod
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

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


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


def stage_canary(specs_dir: Path, namespace: str, kubeconfig: str, policy: str,
                 edit: Callable[[Path], None] | None = None) -> Rollout:
    """The quick-start under ``policy`` in a git repository of its own (``specs_dir``'s parent),
    edited by ``edit`` (given the specs folder) when one is given, applied twice: version 1 stable
    (its workflow finished, as Argo would), then a learningRate change whose version 2 is the
    canary at 0 % (its workflow still running)."""
    shutil.copytree(EXAMPLES / "quickstart", specs_dir)
    (specs_dir / "rollout.yaml").write_text(policy)
    if edit is not None:
        edit(specs_dir)
    repo = git.Repo.init(specs_dir.parent)
    repo.config_writer().set_value("user", "name", "T").set_value("user", "email", "t@example.com").release()
    repo.index.add(["specs"])
    repo.index.commit("version 1")
    r = Rollout(specs_dir, namespace, kubeconfig, prometheus=None, runner=None)  # type: ignore[arg-type]
    r.apply()
    r.stable = r.version()
    r.finish_workflow(r.stable)
    model = specs_dir / "model.yaml"
    model.write_text(model.read_text().replace("learningRate: 0.002", "learningRate: 0.003"))
    repo.index.add(["specs/model.yaml"])
    repo.index.commit("version 2")
    r.apply()
    r.canary = r.version()
    return r


class _Ready(http.server.BaseHTTPRequestHandler):
    """A readiness path answering 200."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def ready_canary_pod(r: Rollout) -> Iterator[ServerPod]:
    """The canary's pod, Ready: a stand-in (:class:`devkit.pods.ServerPod`) whose Ready condition
    follows a local readiness server that always answers."""
    ready = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ready)
    threading.Thread(target=ready.serve_forever, daemon=True).start()
    pod = ServerPod(r.kubeconfig, r.namespace, endpoint="digits", role="canary", version=r.canary,
                    url=f"http://127.0.0.1:{ready.server_address[1]}", alive=lambda: True).start()
    try:
        yield pod
    finally:
        pod.stop()
        ready.shutdown()
