"""The digest an apply records (`forge.dev/desired-digest`) and the plan that reads metadata first:
unchanged objects cost no body read, changed ones are compared as before, and a live edit made
outside Forge is found by the full compare (`forgectl diff`, `plan --refresh`), never lost.
The cluster tests run against the real kube-apiserver with the real CRDs."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from reconciler.applied import DESIRED_DIGEST, desired_digest, recorded_digest, with_desired_digest
from reconciler.load.loader import load_or_raise
from reconciler.plan.apply import apply_plan
from reconciler.plan.plan import Action, Plan
from reconciler.plan.session import TargetOptions, make_plan, open_target
from reconciler.resources import OWNED, ObjectRef
from reconciler.targets.kubernetes.target import PARTIAL_METADATA
from renderers.labels import GIT_REVISION
from specs import Environment
from tests.reconciler.test_kubernetes_target import copy_example, forgectl, set_learning_rate

# -- the digest (pure) ----------------------------------------------------------------------------

CONFIG_MAP = {"apiVersion": "v1", "kind": "ConfigMap",
              "metadata": {"name": "d", "namespace": "n", "labels": {"a": "1"}, "annotations": {"x": "1"}},
              "data": {"k": "v"}}


def test_digest_leaves_out_itself_the_revision_and_the_resource_version() -> None:
    base = desired_digest(CONFIG_MAP)
    stamped = {**CONFIG_MAP, "metadata": {**CONFIG_MAP["metadata"], "resourceVersion": "42",
                                          "annotations": {"x": "1", GIT_REVISION: "abc123", DESIRED_DIGEST: "old"}}}
    assert desired_digest(stamped) == base
    reordered = {"data": {"k": "v"}, "metadata": dict(reversed(list(CONFIG_MAP["metadata"].items()))), "kind": "ConfigMap",
                 "apiVersion": "v1"}
    assert desired_digest(reordered) == base
    sent = with_desired_digest(CONFIG_MAP)
    assert recorded_digest(sent) == base and recorded_digest(CONFIG_MAP) is None
    assert "annotations" in CONFIG_MAP["metadata"] and DESIRED_DIGEST not in CONFIG_MAP["metadata"]["annotations"]  # a copy
    for changed in ({**CONFIG_MAP, "data": {"k": "w"}},
                    {**CONFIG_MAP, "metadata": {**CONFIG_MAP["metadata"], "labels": {"a": "2"}}},
                    {**CONFIG_MAP, "metadata": {**CONFIG_MAP["metadata"], "annotations": {"x": "2"}}}):
        assert desired_digest(changed) != base


# -- against the real API server ------------------------------------------------------------------

def _open(specs_dir: Path, kubeconfig: str, namespace: str) -> tuple[Any, Environment, Any]:
    result = load_or_raise([str(specs_dir)])
    env = result.specs.get(Environment, "cluster")
    assert env is not None
    return result, env, open_target(env, TargetOptions(kubeconfig=kubeconfig, namespace=namespace))


def _counted(target: Any) -> list[tuple[str, str, str]]:
    """Record every request the target sends: (method, path, Accept)."""
    calls: list[tuple[str, str, str]] = []
    original = target._call

    def call(method: str, path: str, **kw: Any) -> Any:
        calls.append((method, path, kw.get("accept", "application/json")))
        return original(method, path, **kw)

    target._call = call
    return calls


def _single_reads(calls: list[tuple[str, str, str]]) -> list[str]:
    """The GETs of one object (a LIST's path ends in its kind's plural), as `plural/name`."""
    plurals = {r.plural for r in OWNED}
    return ["/".join(path.rsplit("/", 2)[-2:]) for method, path, _ in calls
            if method == "GET" and path.rsplit("/", 1)[-1] not in plurals]


def _comparable(plan: Plan) -> list[dict[str, Any]]:
    """The plan's changes as JSON, a no-op's `before` left out (the fast path keeps its metadata only)."""
    return [{k: v for k, v in c.to_json().items() if not (k == "before" and c.action is Action.NOOP)}
            for c in plan.changes]


def test_apply_records_the_digest_and_an_unchanged_plan_reads_no_body(kube_cluster, namespace, tmp_path) -> None:
    specs = copy_example(tmp_path)
    result, env, target = _open(specs, kube_cluster.kubeconfig, namespace)
    plan, rendered = make_plan(result.specs, env, target, namespace, None)
    apply_plan(plan, target)
    live = {ObjectRef.of(o): o for o in target.read_live()}
    for manifest in rendered.manifests:
        ref = ObjectRef.of(manifest)
        if ref.kind != "Namespace":  # the test made the namespace; Forge only ensures it
            assert recorded_digest(live[ref]) == desired_digest(manifest), ref

    result, env, target = _open(specs, kube_cluster.kubeconfig, namespace)
    calls = _counted(target)
    fast, _ = make_plan(result.specs, env, target, namespace, None)
    assert not fast.has_changes
    # Nothing read whole but the namespace, which the test made without Forge (so without a digest).
    assert _single_reads(calls) == [f"namespaces/{namespace}"]
    lists = {path.rsplit("/", 1)[-1]: accept for method, path, accept in calls if method == "GET"}
    assert lists["seldondeployments"] == "application/json"  # what the render reads: whole
    for plural in ("workflows", "podmonitors", "prometheusrules", "configmaps", "roles", "rolebindings", "serviceaccounts",
                   "persistentvolumeclaims"):
        assert lists[plural] == PARTIAL_METADATA, plural
    workflow = next(c for c in fast.changes if c.ref.kind == "Workflow")
    assert set(workflow.before or {}) == {"apiVersion", "kind", "metadata"}  # its metadata only
    assert "managedFields" not in (workflow.before or {})["metadata"]

    _, _, again = _open(specs, kube_cluster.kubeconfig, namespace)
    full, _ = make_plan(result.specs, env, again, namespace, None, refresh=True)
    assert _comparable(full) == _comparable(fast) and full.live_fingerprint == fast.live_fingerprint


def test_a_changed_model_plans_as_the_full_compare_does(kube_cluster, namespace, tmp_path) -> None:
    """Only what can have changed is read whole, and the plan is the full compare's, reasons and
    field diffs included (the new Workflow's reasons compare with the serving version's steps)."""
    specs = copy_example(tmp_path)
    result, env, target = _open(specs, kube_cluster.kubeconfig, namespace)
    apply_plan(make_plan(result.specs, env, target, namespace, None)[0], target)
    set_learning_rate(specs, "0.005")
    result, env, target = _open(specs, kube_cluster.kubeconfig, namespace)
    calls = _counted(target)
    fast, _ = make_plan(result.specs, env, target, namespace, None)
    _, _, again = _open(specs, kube_cluster.kubeconfig, namespace)
    full, _ = make_plan(result.specs, env, again, namespace, None, refresh=True)
    assert fast.has_changes and _comparable(fast) == _comparable(full)
    created = next(c for c in fast.changes if c.ref.kind == "Workflow" and c.action is Action.CREATE)
    assert "`hyperparameters.learningRate` 0.002 → 0.005" in created.reasons
    assert "cache hit (unchanged since the last run): prepare-data" in created.reasons
    old = next(c.ref.name for c in fast.changes if c.ref.kind == "Workflow" and c.action is Action.NOOP)
    # The serving version's Workflow (the new one's reasons compare with it), and the PrometheusRule and
    # dashboard whose desired digest moved with the canary; the rest by their digests.
    assert sorted(_single_reads(calls)) == sorted([f"namespaces/{namespace}", f"workflows/{old}", *[f"{c.ref.resource.plural}/{c.ref.name}" for c in fast.changes
                                                                       if c.action is Action.UPDATE and c.ref.kind != "SeldonDeployment"]])


def test_object_without_a_digest_is_read_whole_and_compared(kube_cluster, namespace, tmp_path) -> None:
    """An object written before digests (or whose annotation someone removed) is read whole and
    compared field by field: no change when it is as rendered."""
    specs = copy_example(tmp_path)
    result, env, target = _open(specs, kube_cluster.kubeconfig, namespace)
    apply_plan(make_plan(result.specs, env, target, namespace, None)[0], target)
    subprocess.run(["kubectl", "--kubeconfig", kube_cluster.kubeconfig, "-n", namespace, "annotate", "podmonitor", "digits",
                    f"{DESIRED_DIGEST}-"], check=True, capture_output=True)
    result, env, target = _open(specs, kube_cluster.kubeconfig, namespace)
    calls = _counted(target)
    fast, _ = make_plan(result.specs, env, target, namespace, None)
    assert not fast.has_changes
    assert sorted(_single_reads(calls)) == [f"namespaces/{namespace}", "podmonitors/digits"]
    monitor = next(c for c in fast.changes if c.ref == ObjectRef("PodMonitor", namespace, "digits"))
    assert "spec" in (monitor.before or {})  # read whole


def test_outside_edit_is_found_by_the_full_compare_and_not_lost(kube_cluster, namespace, tmp_path) -> None:
    """A live edit made outside Forge keeps the digest annotation: the fast plan does not read that
    body (as documented), `forgectl diff` and `plan --refresh` find it, `apply --refresh` restores it."""
    specs = copy_example(tmp_path)
    common = ("--env", "cluster", "-n", namespace)
    forgectl("apply", str(specs), *common, "--auto-approve", kubeconfig=kube_cluster.kubeconfig, check=True)
    edit = [{"op": "replace", "path": "/spec/podMetricsEndpoints/0/interval", "value": "59s"}]
    subprocess.run(["kubectl", "--kubeconfig", kube_cluster.kubeconfig, "-n", namespace, "patch", "podmonitor", "digits",
                    "--type", "json", "-p", json.dumps(edit)], check=True, capture_output=True)
    live = json.loads(subprocess.run(["kubectl", "--kubeconfig", kube_cluster.kubeconfig, "-n", namespace, "get", "podmonitor",
                                      "digits", "-o", "json"], check=True, capture_output=True, text=True).stdout)
    assert live["metadata"]["annotations"].get(DESIRED_DIGEST)  # the digest still says "as Forge sent it"

    fast = forgectl("plan", str(specs), *common, "--detailed-exitcode", kubeconfig=kube_cluster.kubeconfig)
    assert fast.returncode == 0, fast.stdout + fast.stderr  # documented: the fast plan compares digests only

    for command in (("diff", str(specs), *common, "--output", "json"),
                    ("plan", str(specs), *common, "--refresh", "--detailed-exitcode", "--output", "json")):
        drift = forgectl(*command, kubeconfig=kube_cluster.kubeconfig)
        assert drift.returncode == 2, drift.stdout + drift.stderr
        [change] = [c for c in json.loads(drift.stdout)["changes"] if c["action"] != "no-op"]
        assert change["ref"] == {"kind": "PodMonitor", "namespace": namespace, "name": "digits"}
        assert any(d["path"] == "spec.podMetricsEndpoints[0].interval" and d["old"] == "59s" for d in change["diff"]), change

    forgectl("apply", str(specs), *common, "--refresh", "--auto-approve", kubeconfig=kube_cluster.kubeconfig, check=True)
    clean = forgectl("diff", str(specs), *common, kubeconfig=kube_cluster.kubeconfig)
    assert clean.returncode == 0, clean.stdout + clean.stderr
