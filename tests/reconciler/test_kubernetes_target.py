"""plan / apply / prune / drift against the real kube-apiserver with the real CRDs."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from reconciler.errors import ApplyFailed, ForbiddenError, LockHeldError, TargetError, UnreachableError
from reconciler.load.loader import load_or_raise
from reconciler.plan.apply import Outcome, apply_plan
from reconciler.plan.plan import Action, Plan
from reconciler.plan.session import TargetOptions, make_plan, open_target
from reconciler.resources import ObjectRef
from specs import Environment
from tests.polling import wait_until
from tests.specedits import route_by_gateway

ROOT = Path(__file__).resolve().parents[2]
FORGECTL = [sys.executable, "-m", "forgectl"]


def copy_example(tmp_path: Path, name: str = "quickstart") -> Path:
    dst = tmp_path / name
    shutil.copytree(ROOT / "examples" / name, dst)
    return dst


def plan_for(specs_dir: Path, kubeconfig: str, namespace: str) -> tuple[Plan, object]:
    result = load_or_raise([str(specs_dir)])
    env = result.specs.get(Environment, "cluster")
    assert env is not None
    target = open_target(env, TargetOptions(kubeconfig=kubeconfig, namespace=namespace))
    plan, _ = make_plan(result.specs, env, target, namespace, None)
    return plan, target


def forgectl(*args: str, kubeconfig: str, cwd: Path | None = None, check: bool = False) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": kubeconfig, "NO_COLOR": "1", "COLUMNS": "200"}
    proc = subprocess.run([*FORGECTL, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"forgectl {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def live_versions(target) -> dict[ObjectRef, str]:
    return {ObjectRef.of(o): o["metadata"]["resourceVersion"] for o in target.read_live()}


def set_learning_rate(specs_dir: Path, value: str) -> None:
    model = specs_dir / "model.yaml"
    model.write_text(model.read_text().replace("learningRate: 0.002", f"learningRate: {value}"))


def test_create_then_noop_with_zero_writes(kube_cluster, namespace, tmp_path) -> None:
    specs = copy_example(tmp_path)
    plan, target = plan_for(specs, kube_cluster.kubeconfig, namespace)
    # PVC, ServiceAccount, Role, RoleBinding, Workflow, SeldonDeployment, PodMonitor, PrometheusRule, the
    # dashboard ConfigMap
    assert plan.counts()["create"] == 9 and plan.counts()["no-op"] == 1  # the test's namespace exists
    changeset = apply_plan(plan, target)
    assert changeset.count(Outcome.CREATED) == 9
    before = live_versions(target)
    sd = next(o for o in target.read_live() if o["kind"] == "SeldonDeployment")
    managers = {(m["manager"], m["operation"]) for m in sd["metadata"]["managedFields"]}
    assert ("forgectl", "Apply") in managers

    again, target = plan_for(specs, kube_cluster.kubeconfig, namespace)
    assert not again.has_changes, [(str(c.ref), c.diff) for c in again.changes if c.action is not Action.NOOP]
    changeset = apply_plan(again, target)
    assert changeset.count(Outcome.UNCHANGED) == 10
    assert live_versions(target) == before  # nothing was written


def test_live_state_is_read_in_pages(kube_cluster, namespace, tmp_path, monkeypatch) -> None:
    """read_live LISTs in pages (`limit`/`continue`): with pages of 1 object it reads what one
    page per kind reads, in as many requests as the pages need."""
    import reconciler.targets.kubernetes.target as kubernetes_target

    specs = copy_example(tmp_path)
    plan, target = plan_for(specs, kube_cluster.kubeconfig, namespace)
    apply_plan(plan, target)
    labels = next(o for o in target.read_live() if o["kind"] == "ConfigMap")["metadata"]["labels"]
    for i in range(3):  # more objects of one kind than a page holds
        target.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"extra-{i}", "namespace": namespace,
                                                                         "labels": labels}, "data": {}})
    whole = sorted((str(ObjectRef.of(o)), o["metadata"]["resourceVersion"]) for o in target.read_live())
    calls: list[str] = []
    original = target._call
    monkeypatch.setattr(target, "_call", lambda *a, **k: calls.append(dict(k.get("query") or []).get("continue", "")) or original(*a, **k))
    monkeypatch.setattr(kubernetes_target, "LIST_PAGE", 1)
    paged = sorted((str(ObjectRef.of(o)), o["metadata"]["resourceVersion"]) for o in target.read_live())
    assert paged == whole and len(whole) == 13
    assert sum(1 for token in calls if token) >= 2  # some kinds took more than one page


def test_hyperparameter_change_explains_itself(kube_cluster, namespace, tmp_path) -> None:
    specs = copy_example(tmp_path)
    plan, target = plan_for(specs, kube_cluster.kubeconfig, namespace)
    apply_plan(plan, target)
    set_learning_rate(specs, "0.005")
    plan, target = plan_for(specs, kube_cluster.kubeconfig, namespace)
    by_kind = {(c.ref.kind, c.action) for c in plan.changes}
    assert ("Workflow", Action.CREATE) in by_kind and ("Workflow", Action.DELETE) not in by_kind
    kept = next(c for c in plan.changes if c.ref.kind == "Workflow" and c.after is None)
    assert kept.action is Action.NOOP and kept.reasons[0].endswith("still serves endpoint `digits`")
    created = next(c for c in plan.changes if c.ref.kind == "Workflow" and c.action is Action.CREATE)
    assert "`hyperparameters.learningRate` 0.002 → 0.005" in created.reasons
    assert "cache hit (unchanged since the last run): prepare-data" in created.reasons
    assert any(r.startswith("will run: train, evaluate") for r in created.reasons)
    sd = next(c for c in plan.changes if c.ref.kind == "SeldonDeployment")
    assert sd.action is Action.UPDATE and any(r.startswith("canary: version") for r in sd.reasons)
    apply_plan(plan, target)
    assert not plan_for(specs, kube_cluster.kubeconfig, namespace)[0].has_changes


def test_prune_only_what_forge_owns(kube_cluster, namespace, tmp_path) -> None:
    specs = copy_example(tmp_path)
    plan, target = plan_for(specs, kube_cluster.kubeconfig, namespace)
    apply_plan(plan, target)
    # Not Forge's: same kind, no ownership labels.
    target.apply({"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
                  "metadata": {"name": "someone-elses", "namespace": namespace},
                  "spec": {"selector": {"matchLabels": {"app": "x"}}, "podMetricsEndpoints": [{"port": "http"}]}})
    # Forge's, but opted out of pruning.
    subprocess.run(["kubectl", "--kubeconfig", kube_cluster.kubeconfig, "-n", namespace, "annotate", "prometheusrule",
                    "digits-rollout", "forge.dev/prune=disabled"], check=True, capture_output=True)
    (specs / "endpoint.yaml").unlink()
    plan, target = plan_for(specs, kube_cluster.kubeconfig, namespace)
    deleted = {str(c.ref) for c in plan.changes if c.action is Action.DELETE}
    assert deleted == {f"SeldonDeployment {namespace}/digits", f"PodMonitor {namespace}/digits",
                       f"ConfigMap {namespace}/digits-dashboard"}
    kept = next(c for c in plan.changes if c.ref.kind == "PrometheusRule")
    assert kept.action is Action.NOOP and "kept: annotated forge.dev/prune: disabled" in kept.reasons
    apply_plan(plan, target)
    kinds = {(o["kind"], o["metadata"]["name"]) for o in target.read_live()}
    assert ("SeldonDeployment", "digits") not in kinds and ("PrometheusRule", "digits-rollout") in kinds
    assert target.get(ObjectRef("PodMonitor", namespace, "someone-elses")) is not None


def test_drift_is_shown_and_repaired(kube_cluster, namespace, tmp_path) -> None:
    specs = copy_example(tmp_path)
    forgectl("apply", str(specs), "--env", "cluster", "-n", namespace, "--auto-approve", kubeconfig=kube_cluster.kubeconfig, check=True)
    subprocess.run(["kubectl", "--kubeconfig", kube_cluster.kubeconfig, "-n", namespace, "patch", "seldondeployment", "digits",
                    "--type", "json", "-p", '[{"op":"replace","path":"/spec/predictors/0/replicas","value":4}]'], check=True, capture_output=True)
    drift = forgectl("diff", str(specs), "--env", "cluster", "-n", namespace, "--output", "json", kubeconfig=kube_cluster.kubeconfig)
    assert drift.returncode == 2, drift.stderr
    [change] = [c for c in json.loads(drift.stdout)["changes"] if c["action"] != "no-op"]
    assert change["ref"]["kind"] == "SeldonDeployment"
    assert {"op": "change", "path": "spec.predictors[0].replicas", "old": 4, "new": 1} in change["diff"]
    forgectl("apply", str(specs), "--env", "cluster", "-n", namespace, "--auto-approve", kubeconfig=kube_cluster.kubeconfig, check=True)
    clean = forgectl("plan", str(specs), "--env", "cluster", "-n", namespace, "--detailed-exitcode", kubeconfig=kube_cluster.kubeconfig)
    assert clean.returncode == 0, clean.stdout


def test_stale_saved_plan_is_refused(kube_cluster, namespace, tmp_path) -> None:
    specs = copy_example(tmp_path)
    forgectl("apply", str(specs), "--env", "cluster", "-n", namespace, "--auto-approve", kubeconfig=kube_cluster.kubeconfig, check=True)
    set_learning_rate(specs, "0.004")
    saved = tmp_path / "plan.json"
    forgectl("plan", str(specs), "--env", "cluster", "-n", namespace, "-out", str(saved), kubeconfig=kube_cluster.kubeconfig, check=True)
    # Someone changes the live state after the review.
    subprocess.run(["kubectl", "--kubeconfig", kube_cluster.kubeconfig, "-n", namespace, "label", "podmonitor", "digits", "touched=yes"],
                   check=True, capture_output=True)
    stale = forgectl("apply", str(saved), "--specs", str(specs), "--env", "cluster", "-n", namespace, "--auto-approve",
                     kubeconfig=kube_cluster.kubeconfig)
    assert stale.returncode == 1
    assert "the saved plan is stale" in stale.stderr and f"PodMonitor {namespace}/digits" in stale.stderr
    # A fresh plan applies exactly as saved.
    forgectl("plan", str(specs), "--env", "cluster", "-n", namespace, "-out", str(saved), kubeconfig=kube_cluster.kubeconfig, check=True)
    ok = forgectl("apply", str(saved), "--specs", str(specs), "--env", "cluster", "-n", namespace, "--auto-approve",
                  kubeconfig=kube_cluster.kubeconfig, check=True)
    assert "Apply complete: 1 created, 1 configured, 0 deleted" in ok.stdout


def test_concurrent_apply_is_refused_and_expired_lock_taken_over(kube_cluster, namespace, tmp_path) -> None:
    specs = copy_example(tmp_path)
    _, target = plan_for(specs, kube_cluster.kubeconfig, namespace)
    with target.lock("alice@laptop:1"):
        with pytest.raises(LockHeldError, match=r"locked by alice@laptop:1 since 20"):
            with target.lock("bob@ci:2"):
                pass
        refused = forgectl("apply", str(specs), "--env", "cluster", "-n", namespace, "--auto-approve", kubeconfig=kube_cluster.kubeconfig)
        assert refused.returncode == 1 and "locked by alice@laptop:1" in refused.stderr
    # An expired lease (its holder died) is taken over.
    old = "2020-01-01T00:00:00.000000Z"
    target._call("POST", target._lease_path(), verb="create", ref="lease", namespace=namespace, body={
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "forgectl-cluster", "namespace": namespace},
        "spec": {"holderIdentity": "dead@host:9", "leaseDurationSeconds": 10, "acquireTime": old, "renewTime": old}})
    taken = datetime.now(UTC)
    with target.lock("carol@host:3"):
        lease = target._call("GET", target._lease_path("forgectl-cluster"), verb="get", ref="lease", namespace=namespace)
        assert lease["spec"]["holderIdentity"] == "carol@host:3"
        # the taker's own times, in the API's MicroTime format (the server would reject another)
        for key in ("acquireTime", "renewTime"):
            stamp = datetime.strptime(lease["spec"][key], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
            assert abs((stamp - taken).total_seconds()) < 60, (key, lease["spec"][key])
        # … and it is a live lock now: the next taker is refused, naming carol
        with pytest.raises(LockHeldError, match=r"locked by carol@host:3"):
            with target.lock("dave@host:4"):
                pass
    # released on exit: the Lease is gone
    with pytest.raises(TargetError) as gone:
        target._call("GET", target._lease_path("forgectl-cluster"), verb="get", ref="lease", namespace=namespace)
    assert gone.value.status == 404


def test_forbidden_error_names_verb_resource_and_namespace(kube_cluster, namespace, restricted_kubeconfig, tmp_path) -> None:
    specs = copy_example(tmp_path)
    other = f"{namespace}-elsewhere"[:63]
    result = load_or_raise([str(specs)])
    env = result.specs.get(Environment, "cluster")
    target = open_target(env, TargetOptions(kubeconfig=str(restricted_kubeconfig), namespace=other))
    with pytest.raises(ForbiddenError) as err:
        target.read_live()
    text = str(err.value)
    assert "cannot list" in text and f"namespace {other!r}" in text and "docs/rbac/forgectl-role.yaml" in text


def test_api_server_stopped_mid_apply_then_rerun_converges(kube_cluster, namespace, tmp_path) -> None:
    if kube_cluster.external:
        pytest.skip("needs the test's own API server process")
    specs = copy_example(tmp_path)
    result = load_or_raise([str(specs)])
    env = result.specs.get(Environment, "cluster")
    from reconciler.targets.kubernetes.target import KubernetesTarget

    target = KubernetesTarget("cluster", namespace, kubeconfig=kube_cluster.kubeconfig, retries=1, backoff=0.1, timeout=2.0)
    plan, _ = make_plan(result.specs, env, target, namespace, None)
    pid = kube_cluster.pids["kube-apiserver"]
    stopped = []

    def stop_after_first(change, outcome) -> None:
        if not stopped:
            os.kill(pid, signal.SIGSTOP)
            stopped.append(True)

    try:
        with pytest.raises(ApplyFailed) as err:
            apply_plan(plan, target, progress=stop_after_first)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert isinstance(err.value.__cause__, UnreachableError)
    assert kube_cluster.server in str(err.value)
    changeset = err.value.changeset
    assert changeset.count(Outcome.CREATED) == 1 and changeset.count(Outcome.FAILED) == 1
    assert changeset.count(Outcome.NOT_ATTEMPTED) == 7
    wait_until(lambda: target.read_live() is not None, timeout=60, what="the API server answering again after SIGCONT",
               interval=0.2, ignore=(UnreachableError,))
    plan, target = plan_for(specs, kube_cluster.kubeconfig, namespace)
    apply_plan(plan, target)
    assert not plan_for(specs, kube_cluster.kubeconfig, namespace)[0].has_changes


@pytest.mark.parametrize("example", ["quickstart", "llm-finetune", "edge-vision"])
def test_every_example_has_no_diff_after_apply(kube_cluster, namespace, tmp_path, example) -> None:
    specs = copy_example(tmp_path, example)
    forgectl("apply", str(specs), "--env", "cluster", "-n", namespace, "--auto-approve", kubeconfig=kube_cluster.kubeconfig, check=True)
    proc = forgectl("plan", str(specs), "--env", "cluster", "-n", namespace, "--detailed-exitcode", kubeconfig=kube_cluster.kubeconfig)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "No changes." in proc.stdout


def test_doctor_checks_the_gateway_the_routes_attach_to(kube_cluster, namespace, restricted_kubeconfig, tmp_path) -> None:
    """With `traffic.router: gatewayAPI`, doctor asks for the HTTPRoute CRD and the Gateway instead
    of Istio or Ambassador, and says what is wrong with the Gateway: absent, then present but its
    GatewayClass accepted by no controller (none runs here; the node test sees Traefik accept it)."""
    specs = copy_example(tmp_path)
    route_by_gateway(specs, {"name": "edge", "namespace": namespace, "sectionName": "http"})
    args = ("doctor", str(specs), "--env", "cluster", "-n", namespace, "-o", "json")

    def findings() -> dict[tuple[str, str], dict]:
        proc = forgectl(*args, kubeconfig=str(restricted_kubeconfig))
        assert proc.returncode == 1, proc.stdout + proc.stderr
        return {(f["kind"], f["name"]): f for f in json.loads(proc.stdout)["findings"]}

    found = findings()
    assert ("TrafficSplitter", "istio-or-ambassador") not in found  # the route splits, not Seldon's ingress
    assert found[("CustomResourceDefinition", "httproutes.gateway.networking.k8s.io")]["status"] == "ok"
    gateway = found[("Gateway", f"{namespace}/edge")]
    assert gateway["status"] == "missing" and gateway["detail"].startswith(f"no Gateway {namespace}/edge"), gateway

    raw = kube_cluster.raw_client()
    api = "/apis/gateway.networking.k8s.io/v1"
    gateway_class = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
                     "metadata": {"name": f"{namespace}-class"}, "spec": {"controllerName": "example.com/no-such-controller"}}
    edge = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "metadata": {"name": "edge", "namespace": namespace},
            "spec": {"gatewayClassName": f"{namespace}-class", "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]}}
    try:
        code, body = raw.request("POST", f"{api}/gatewayclasses", json.dumps(gateway_class).encode())
        assert code == 201, body
        code, body = raw.request("POST", f"{api}/namespaces/{namespace}/gateways", json.dumps(edge).encode())
        assert code == 201, body
        gateway = findings()[("Gateway", f"{namespace}/edge")]
        # the CRD's default status: Accepted Unknown, Pending, until a controller of that name answers
        assert gateway["status"] == "missing", gateway
        assert "example.com/no-such-controller) is not accepted: Accepted Unknown (Pending" in gateway["detail"], gateway
    finally:
        raw.request("DELETE", f"{api}/gatewayclasses/{namespace}-class")


def test_doctor_reports_what_the_cluster_admin_owns(kube_cluster, namespace, restricted_kubeconfig, tmp_path) -> None:
    """`forgectl doctor` with the least-privilege role: the CRDs are there, the PriorityClasses
    and a default StorageClass are not until the admin creates them; the plan says so too."""
    specs = copy_example(tmp_path)
    args = ("doctor", str(specs), "--env", "cluster", "-n", namespace, "-o", "json")
    proc = forgectl(*args, kubeconfig=str(restricted_kubeconfig))
    assert proc.returncode == 1, proc.stderr
    status = {(f["kind"], f["name"]): f["status"] for f in json.loads(proc.stdout)["findings"]}
    assert status[("CustomResourceDefinition", "workflows.argoproj.io")] == "ok"
    assert status[("CustomResourceDefinition", "seldondeployments.machinelearning.seldon.io")] == "ok"
    assert status[("CustomResourceDefinition", "podmonitors.monitoring.coreos.com")] == "ok"
    assert status[("PriorityClass", "forge-high")] == "missing"
    assert status[("StorageClass", "(default)")] == "missing"
    assert status[("ControllerRights", "configmaps")] == "manual"
    assert status[("TrafficSplitter", "istio-or-ambassador")] == "missing"  # no Istio in the test cluster
    plan = forgectl("plan", str(specs), "--env", "cluster", "-n", namespace, "-o", "json", kubeconfig=str(restricted_kubeconfig))
    assert plan.returncode == 0, plan.stderr
    assert any("cluster prerequisite missing: PriorityClass forge-high" in n for n in json.loads(plan.stdout)["notes"])

    raw = kube_cluster.raw_client()
    created = []
    try:
        for name, value in (("forge-high", 1000), ("forge-medium", 500), ("forge-low", 100)):
            body = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name}, "value": value}
            code, _ = raw.request("POST", "/apis/scheduling.k8s.io/v1/priorityclasses", json.dumps(body).encode())
            assert code in (201, 409)
            created.append(f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}")
        body = {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "provisioner": "forge.dev/test",
                "metadata": {"name": "forge-test-default", "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}}}
        code, _ = raw.request("POST", "/apis/storage.k8s.io/v1/storageclasses", json.dumps(body).encode())
        assert code in (201, 409)
        created.append("/apis/storage.k8s.io/v1/storageclasses/forge-test-default")
        proc = forgectl(*args, kubeconfig=str(restricted_kubeconfig))
        findings = {(f["kind"], f["name"]): f["status"] for f in json.loads(proc.stdout)["findings"]}
        assert proc.returncode == 1  # still: no traffic splitter
        assert {k: v for k, v in findings.items() if v not in ("ok", "manual")} == {("TrafficSplitter", "istio-or-ambassador"): "missing"}
    finally:
        for path in created:
            raw.request("DELETE", path)
