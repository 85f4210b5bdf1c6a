"""`forgectl install --dry-run -o yaml`: the committed deploy/ is what it renders, and the real API
server takes every object (server-side dry run), the controller's pod included under Pod Security
`restricted` as the API server's own admission enforces it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from reconciler.controller.install import install_objects, sync_crd
from reconciler.present.manifests import to_yaml

ROOT = Path(__file__).resolve().parents[2]
FORGECTL = [sys.executable, "-m", "forgectl"]


def install(*args: str) -> str:
    done = subprocess.run([*FORGECTL, "install", "--dry-run", "-o", "yaml", *args], capture_output=True, text=True,
                          check=True, timeout=60, env={**os.environ, "NO_COLOR": "1"})
    return done.stdout


def body(path: Path) -> str:
    """A committed file without its header comment."""
    return "".join(line for line in path.read_text().splitlines(keepends=True) if not line.startswith("# "))


def test_deploy_is_what_install_renders() -> None:
    assert body(ROOT / "deploy" / "install.yaml") == install(), "deploy/install.yaml is stale: render it again"
    assert body(ROOT / "deploy" / "crds" / "syncs.forge.dev.yaml") == to_yaml(sync_crd())
    kinds = [d["kind"] for d in yaml.safe_load_all(install())]
    assert kinds == ["Namespace", "CustomResourceDefinition", "ServiceAccount", "Role", "RoleBinding", "ClusterRoleBinding",
                     "Deployment", "Service", "PodDisruptionBudget"]


def test_install_without_dry_run_says_what_to_do() -> None:
    done = subprocess.run([*FORGECTL, "install"], capture_output=True, text=True, timeout=60, env={**os.environ, "NO_COLOR": "1"})
    assert done.returncode == 1 and "--dry-run -o yaml" in done.stderr


def kubectl(kubeconfig: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["kubectl", "--kubeconfig", kubeconfig, *args], input=stdin, capture_output=True, text=True,
                          timeout=120)


def test_the_api_server_takes_every_object_and_the_pod_is_restricted(kube_cluster, namespace) -> None:
    """Rendered into the test's namespace (which exists), applied as a server-side dry run."""
    kubeconfig = kube_cluster.kubeconfig
    objects = [o for o in yaml.safe_load_all(install("--namespace", namespace, "--manage", namespace)) if o["kind"] != "Namespace"]
    stream = "".join("---\n" + yaml.safe_dump(o) for o in objects)
    done = kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "--field-manager=forge-install-test",
                   "--dry-run=server", "-f", "-", stdin=stream)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("serverside-applied") == len(objects), done.stdout

    # the Deployment's pod under the API server's PodSecurity admission at `restricted`
    label = kubectl(kubeconfig, "label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted",
                    "pod-security.kubernetes.io/enforce-version=latest")
    assert label.returncode == 0, label.stderr
    [deployment] = [o for o in objects if o["kind"] == "Deployment"]
    assert deployment["spec"]["replicas"] == 2

    def pod(spec: dict[str, Any]) -> str:
        return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "forge-controller", "namespace": namespace},
                           "spec": spec})

    spec = deployment["spec"]["template"]["spec"]
    done = kubectl(kubeconfig, "create", "--dry-run=server", "-f", "-", stdin=pod(spec))
    assert done.returncode == 0, done.stderr
    # the admission bites: the same pod allowed to escalate is refused
    loose = json.loads(json.dumps(spec))
    loose["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True
    refused = kubectl(kubeconfig, "create", "--dry-run=server", "-f", "-", stdin=pod(loose))
    assert refused.returncode != 0 and "violates PodSecurity" in refused.stderr, refused.stderr


def test_manage_binds_the_forgectl_role_in_each_namespace() -> None:
    from reconciler.controller.install import InstallOptions

    bindings = [o for o in install_objects(InstallOptions(manage=("team-a", "team-b"))) if o["kind"] == "RoleBinding"
                and o["roleRef"]["name"] == "forgectl"]
    assert [b["metadata"]["namespace"] for b in bindings] == ["team-a", "team-b"]
    assert all(b["subjects"] == [{"kind": "ServiceAccount", "name": "forge-controller", "namespace": "forge-system"}]
               for b in bindings)
