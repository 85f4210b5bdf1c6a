"""`forgectl install --dry-run -o yaml`: the committed deploy/ is what it renders, and the real API
server takes every object (server-side dry run), the controller's pod included under Pod Security
`restricted` as the API server's own admission enforces it. `forgectl install` applies them and
`forgectl uninstall` takes them away again, keeping the workloads the real controller applied (or,
with --remove-workloads, only those Forge owns), both idempotent."""

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
                     "Deployment", "Service", "PodDisruptionBudget", "PodMonitor", "PrometheusRule"]


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


def test_the_memory_limit_is_the_operators_to_size() -> None:
    """A sync holds the environment's specs, render and live objects at once: 1Gi by default,
    `--memory-limit` for a larger environment (bench/controller_scale.py); a value that is no
    Kubernetes quantity, or one below the request, is refused with exit 1 and nothing printed."""
    [deployment] = [d for d in yaml.safe_load_all(install("--memory-limit", "3Gi")) if d["kind"] == "Deployment"]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert container["resources"] == {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "3Gi"}}
    for bad, why in (("3GB", "not a quantity: '3GB'"), ("64Mi", "below the container's request of 128Mi")):
        done = subprocess.run([*FORGECTL, "install", "--dry-run", "--memory-limit", bad], capture_output=True, text=True,
                              timeout=60, env={**os.environ, "NO_COLOR": "1"})
        assert done.returncode == 1 and done.stdout == "" and why in done.stderr, (bad, done.stderr)


def test_manage_binds_the_forgectl_role_in_each_namespace() -> None:
    from reconciler.controller.install import InstallOptions

    bindings = [o for o in install_objects(InstallOptions(manage=("team-a", "team-b"))) if o["kind"] == "RoleBinding"
                and o["roleRef"]["name"] == "forgectl"]
    assert [b["metadata"]["namespace"] for b in bindings] == ["team-a", "team-b"]
    assert all(b["subjects"] == [{"kind": "ServiceAccount", "name": "forge-controller", "namespace": "forge-system"}]
               for b in bindings)


def test_an_installed_webhook_reads_its_secret_from_a_secret(tmp_path: Path) -> None:
    """Installed, the pods have no file of the user's: `webhook.secretFile` is refused, naming the
    file; `webhook.secretRef` is a Secret the controller's Role may get (and no other)."""
    config = controller_config(tmp_path, "forge-system", "git://127.0.0.1:9418/specs.git")
    text = config.read_text()
    config.write_text(text + "webhook: {secretFile: /etc/forge/hook}\n")
    refused = forgectl("", "install", "--dry-run", "--config", str(config))
    assert refused.returncode != 0 and f"{config}: webhook.secretFile names a file" in refused.stderr, refused.stderr
    config.write_text(text + "webhook: {secretRef: git-webhook}\n")
    done = forgectl("", "install", "--dry-run", "--config", str(config))
    assert done.returncode == 0, done.stderr
    role = next(o for o in yaml.safe_load_all(done.stdout) if o and o["kind"] == "Role")
    assert {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["git-webhook"], "verbs": ["get"]} in role["rules"]


def forgectl(kubeconfig: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*FORGECTL, *args], capture_output=True, text=True, timeout=180,
                          env={**os.environ, "KUBECONFIG": kubeconfig, "NO_COLOR": "1", "COLUMNS": "200"})


def exists(kubeconfig: str, namespace: str, *refs: str) -> dict[str, bool]:
    return {ref: kubectl(kubeconfig, "-n", namespace, "get", ref, "-o", "name").returncode == 0 for ref in refs}


#: What install applies into the controller's namespace (the test's own).
INSTALLED = ("deployment/forge-controller", "service/forge-controller", "poddisruptionbudget/forge-controller",
             "podmonitor/forge-controller", "prometheusrule/forge-controller", "serviceaccount/forge-controller",
             "role/forge-controller", "rolebinding/forge-controller", "rolebinding/forge-controller-forgectl",
             "configmap/forge-controller-config")


def controller_config(tmp_path: Path, namespace: str, url: str) -> Path:
    path = tmp_path / "controller.yaml"
    path.write_text(yaml.safe_dump({
        "apiVersion": "forge.dev/v1alpha1", "kind": "ControllerConfig", "namespace": namespace,
        "http": {"address": "0.0.0.0", "port": 8080},
        "sources": [{"name": "quickstart", "url": url, "branch": "main", "path": ".", "environment": "cluster",
                     "namespace": namespace, "interval": "2s"}]}))
    return path


def other_syncs(kubeconfig: str, namespace: str) -> set[str]:
    """The namespaces besides ``namespace`` that hold Syncs (earlier tests' in this session)."""
    done = kubectl(kubeconfig, "get", "syncs", "-A", "-o", "json")
    return {o["metadata"]["namespace"] for o in json.loads(done.stdout)["items"]} - {namespace} if done.returncode == 0 else set()


def restore_sync_crd(kubeconfig: str) -> None:
    """The session's API server keeps the Sync CRD for the tests after this one."""
    if kubectl(kubeconfig, "get", "crd", "syncs.forge.dev", "-o", "jsonpath={.metadata.deletionTimestamp}").stdout:
        kubectl(kubeconfig, "wait", "--for=delete", "crd/syncs.forge.dev", "--timeout=60s")
    done = kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "deploy" / "crds" / "syncs.forge.dev.yaml"))
    assert done.returncode == 0, done.stderr
    waited = kubectl(kubeconfig, "wait", "--for=condition=Established", "crd/syncs.forge.dev", "--timeout=60s")
    assert waited.returncode == 0, waited.stderr


def test_install_applies_and_uninstall_keeps_what_the_controller_applied(kube_cluster, namespace, tmp_path) -> None:
    from devkit.gitserver import start_git_server
    from tests.controller.test_controller import Controllers, applied, live_versions
    from tests.polling import wait_until

    kubeconfig = kube_cluster.kubeconfig
    roles = kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "docs" / "rbac" / "forgectl-role.yaml"))
    assert roles.returncode == 0, roles.stderr
    git_server = start_git_server(tmp_path)
    try:
        config = controller_config(tmp_path, namespace, git_server.url)
        # a bad configuration: its file:line, nothing applied
        bad = tmp_path / "bad.yaml"
        bad.write_text(config.read_text().replace("interval: 2s", "interval: soon"))
        refused = forgectl(kubeconfig, "install", "-n", namespace, "--manage", namespace, "--config", str(bad))
        assert refused.returncode == 1 and "bad.yaml:" in refused.stderr and "interval" in refused.stderr, refused.stderr
        assert not any(exists(kubeconfig, namespace, *INSTALLED).values())

        done = forgectl(kubeconfig, "install", "-n", namespace, "--manage", namespace, "--config", str(config))
        assert done.returncode == 0, done.stderr
        assert all(exists(kubeconfig, namespace, *INSTALLED).values()), exists(kubeconfig, namespace, *INSTALLED)
        version = kubectl(kubeconfig, "-n", namespace, "get", "deployment/forge-controller", "-o", "jsonpath={.metadata.resourceVersion}").stdout
        again = forgectl(kubeconfig, "install", "-n", namespace, "--manage", namespace, "--config", str(config))
        assert again.returncode == 0, again.stderr
        assert kubectl(kubeconfig, "-n", namespace, "get", "deployment/forge-controller", "-o",
                       "jsonpath={.metadata.resourceVersion}").stdout == version  # applying again changes nothing

        # no node runs the Deployment here: the controller runs as a process, and writes its Sync
        first = git_server.push("quick-start")
        made = Controllers(tmp_path, kubeconfig, namespace, git_server.url, interval="2s")
        try:
            made.start("a")
            wait_until(lambda: applied(kubeconfig, namespace, first), timeout=120, what="the revision applied")
        finally:
            made.close()  # SIGTERM: the Lease given back
        workloads = live_versions(kubeconfig, namespace)
        assert "SeldonDeployment/digits" in workloads
        mine = kubectl(kubeconfig, "-n", namespace, "create", "configmap", "not-forges", "--from-literal=a=b")
        assert mine.returncode == 0, mine.stderr

        others = other_syncs(kubeconfig, namespace)
        try:
            gone = forgectl(kubeconfig, "uninstall", "-n", namespace, "--auto-approve")
            assert gone.returncode == 0, gone.stderr
            assert not any(exists(kubeconfig, namespace, *INSTALLED).values()), exists(kubeconfig, namespace, *INSTALLED)
            if others:  # Syncs of other namespaces (earlier tests' controllers): the shared CRD stays
                assert "left CustomResourceDefinition syncs.forge.dev (Syncs of another controller live in" in gone.stderr
            else:
                assert "deleted CustomResourceDefinition syncs.forge.dev" in gone.stderr, gone.stderr  # its Syncs with it
            assert live_versions(kubeconfig, namespace) == workloads  # the workloads stay, untouched
            assert f"left Namespace {namespace} (anything else in it" in gone.stderr, gone.stderr
            twice = forgectl(kubeconfig, "uninstall", "-n", namespace, "--auto-approve")
            assert twice.returncode == 0 and "0 objects deleted" in twice.stdout, (twice.stdout, twice.stderr)
        finally:
            restore_sync_crd(kubeconfig)

        # --remove-workloads: the environments the Syncs name are torn down, only what Forge owns
        assert forgectl(kubeconfig, "install", "-n", namespace, "--manage", namespace, "--config", str(config)).returncode == 0
        made = Controllers(tmp_path, kubeconfig, namespace, git_server.url, interval="2s")
        try:
            made.start("b")
            wait_until(lambda: applied(kubeconfig, namespace, first), timeout=120, what="the revision applied again")
        finally:
            made.close()
        try:
            gone = forgectl(kubeconfig, "uninstall", "-n", namespace, "--remove-workloads", "--auto-approve")
            assert gone.returncode == 0, gone.stderr
            assert f"removed the workloads of environment cluster in namespace {namespace}" in gone.stderr, gone.stderr
            assert live_versions(kubeconfig, namespace) == {}
            assert exists(kubeconfig, namespace, "configmap/not-forges") == {"configmap/not-forges": True}
            assert not any(exists(kubeconfig, namespace, *INSTALLED).values())
        finally:
            restore_sync_crd(kubeconfig)
    finally:
        git_server.stop()


def test_the_role_may_get_only_the_secrets_the_sources_name() -> None:
    from reconciler.controller.install import InstallOptions

    [role] = [o for o in install_objects(InstallOptions(secrets=("git-auth",))) if o["kind"] == "Role"]
    assert {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["git-auth"], "verbs": ["get"]} in role["rules"]
    [plain] = [o for o in install_objects() if o["kind"] == "Role"]
    assert not any("secrets" in r["resources"] for r in plain["rules"])
