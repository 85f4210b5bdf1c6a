"""The pure core: pairing, normalising and comparing; plans round-trip through JSON; pull-request
mode works in a real git repository with no cluster."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import git

from reconciler.plan.diff import field_diff, owned_paths
from reconciler.plan.plan import Action, Plan, build_plan
from reconciler.present.views import markdown, text

ROOT = Path(__file__).resolve().parents[2]


def obj(name: str, spec: dict, labels: dict | None = None, **meta) -> dict:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": "ns", "labels": {"app.kubernetes.io/managed-by": "forgectl", **(labels or {})}, **meta},
            "spec": spec}


def test_server_defaults_are_not_changes() -> None:
    desired = obj("a", {"accessModes": ["ReadWriteOnce"]})
    live = obj("a", {"accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem", "storageClassName": "standard"},
               resourceVersion="7", uid="u")
    live["status"] = {"phase": "Bound"}
    assert field_diff(desired, live) == []


def test_removed_field_found_through_managed_fields() -> None:
    desired = obj("a", {"accessModes": ["ReadWriteOnce"]})
    live = obj("a", {"accessModes": ["ReadWriteOnce"], "volumeName": "pv-1"})
    live["metadata"]["managedFields"] = [{"manager": "forgectl", "operation": "Apply", "fieldsV1": {
        "f:spec": {"f:accessModes": {}, "f:volumeName": {}}}}]
    assert owned_paths(live) == {("spec", "accessModes"), ("spec", "volumeName")}
    [change] = field_diff(desired, live)
    assert (change.op, change.path, change.old) == ("remove", "spec.volumeName", "pv-1")
    # The same field owned by another manager is not ours to remove.
    live["metadata"]["managedFields"][0]["manager"] = "kube-controller-manager"
    assert field_diff(desired, live) == []


def test_exact_compare_finds_removals_at_any_depth() -> None:
    """Two renders (a pull request's base and head): a key only the base has is a removal, however
    deep, named by its path; equal subtrees and one object compared with itself are no change."""
    base = obj("a", {"selector": {"matchLabels": {"app": "x", "tier": "web"}}, "resources": {"requests": {"storage": "1Gi"}}})
    head = obj("a", {"selector": {"matchLabels": {"app": "x"}}, "resources": {"requests": {"storage": "1Gi"}}})
    [change] = field_diff(head, base, exact=True)
    assert (change.op, change.path, change.old) == ("remove", "spec.selector.matchLabels.tier", "web")
    assert field_diff(base, base, exact=True) == [] and field_diff(base, obj("a", dict(base["spec"])), exact=True) == []


def test_build_plan_pairs_and_orders() -> None:
    desired = [obj("keep", {"x": 1}), obj("new", {"x": 1}), obj("changed", {"x": 2})]
    live = [obj("keep", {"x": 1}), obj("changed", {"x": 1}), obj("gone", {"x": 1}),
            obj("pinned", {"x": 1}, annotations={"forge.dev/prune": "disabled"})]
    plan = build_plan(desired, live, environment="e", target="t")
    actions = {c.ref.name: c.action for c in plan.changes}
    assert actions == {"keep": Action.NOOP, "new": Action.CREATE, "changed": Action.UPDATE,
                       "gone": Action.DELETE, "pinned": Action.NOOP}
    assert plan.changes[-1].ref.name == "gone"  # deletions last
    again = Plan.from_json(json.loads(json.dumps(plan.to_json())))
    assert again == plan


def test_views_render_from_json() -> None:
    plan = build_plan([obj("a", {"x": 2})], [obj("a", {"x": 1})], environment="e", target="t").to_json()
    assert "~ update" in text(plan) and "spec.x: 1 → 2" in text(plan)
    md = markdown(plan)
    assert md.startswith("### Forge plan — `e`") and "- spec.x: 1" in md and "+ spec.x: 2" in md


def test_pull_request_plan_in_a_real_repository_without_a_cluster(tmp_path: Path) -> None:
    work = tmp_path / "repo"
    shutil.copytree(ROOT / "examples" / "quickstart", work / "specs")
    repo = git.Repo.init(work)
    repo.config_writer().set_value("user", "name", "T").set_value("user", "email", "t@example.com").release()
    repo.index.add(["specs"])
    repo.index.commit("quickstart")
    model = work / "specs" / "model.yaml"
    model.write_text(model.read_text().replace("learningRate: 0.002", "learningRate: 0.005"))
    repo.index.add(["specs/model.yaml"])
    repo.index.commit("faster learning")
    env = {**os.environ, "KUBECONFIG": str(tmp_path / "no-such-kubeconfig")}
    proc = subprocess.run([sys.executable, "-m", "forgectl", "plan", "specs", "--base", "HEAD~1", "--head", "HEAD",
                           "--output", "markdown"], cwd=work, capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    body = proc.stdout
    assert "**Plan: 1 to create, 1 to update, 1 to delete" in body
    assert "`hyperparameters.learningRate` 0.002 → 0.005" in body
    assert "cache hit (unchanged since the last run): prepare-data" in body
    assert "- Model `digits-mlp`: `hyperparameters.learningRate` 0.002 → 0.005 (`specs/model.yaml:15`)" in body
    as_json = subprocess.run([sys.executable, "-m", "forgectl", "plan", "specs", "--base", "HEAD~1", "--env", "cluster",
                              "--output", "json", "--detailed-exitcode"], cwd=work, capture_output=True, text=True, env=env, timeout=60)
    assert as_json.returncode == 2, as_json.stderr
    data = json.loads(as_json.stdout)
    assert data["base"] == "HEAD~1" and any(n.startswith("no live diff:") for n in data["notes"])


def test_named_list_items_are_paired_by_name() -> None:
    stable = {"name": "stable", "traffic": 100}
    canary = {"name": "canary", "traffic": 0}
    added = field_diff(obj("a", {"predictors": [{**stable, "traffic": 100}, canary]}), obj("a", {"predictors": [stable]}))
    assert [(c.op, c.path) for c in added] == [("add", "spec.predictors[1](name=canary)")]
    removed = field_diff(obj("a", {"predictors": [stable]}), obj("a", {"predictors": [stable, canary]}))
    assert [(c.op, c.path, c.old) for c in removed] == [("remove", "spec.predictors[1](name=canary)", canary)]
