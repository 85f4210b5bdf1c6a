"""The model registry, lineage, diffs and leaderboard, and the `forgectl models` commands.

The Workflows are the real renderer's output for the example specs (the lineage is read from
them); the registrations are written in the format the `register` step writes (its own test, with
real trained models, is tests/runtimes/test_export.py; the quick-start end to end is
tests/local/test_local_target.py). No runtime environment needed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, cast

import pytest

from reconciler.load.loader import load_or_raise
from reconciler.registry.leaderboard import leaderboards, spec_metric
from reconciler.registry.records import Parent, diff, find, lineage, rejected_variant
from reconciler.rollout.regression import regression_gate
from reconciler.targets.kubernetes.records import _from_workflow_status
from reconciler.targets.kubernetes.rollout import KubernetesRolloutBackend
from reconciler.targets.local.records import ingest_local
from reconciler.targets.local.rollout import LocalRolloutBackend
from reconciler.targets.local.state import StateDB
from renderers import RenderContext, render
from specs.rollout import RegressionGate
from tests.reconciler.test_fenced_serving import FakeCluster
from tests.registry.sample import DIGITS_DIGEST, ROOT, V1, V2, cli, project, rendered, write_run


@pytest.fixture()
def two_versions(tmp_path: Path) -> dict[str, Any]:
    specs = project(tmp_path)
    wf1, _, env = rendered(specs, "1111111aaaaa")
    wf2, manifests, _ = rendered(project(tmp_path, "0.003"), "2222222bbbbb-dirty")
    db = StateDB(tmp_path / "state.db")
    workspace = tmp_path / "workspace"
    write_run(workspace, wf1, V1, 0.9638)
    write_run(workspace, wf2, V2, 0.9738)
    r1 = ingest_local(db, workspace, wf1, "local", registered=1000.0)
    r2 = ingest_local(db, workspace, wf2, "local", registered=2000.0)
    return {"db": db, "records": [r1, r2], "wf1": wf1, "wf2": wf2, "manifests": manifests}


def test_lineage_comes_from_the_rendered_workflow(tmp_path: Path) -> None:
    wf, _, _ = rendered(project(tmp_path), "abcdef123456")
    line = lineage(wf)
    assert line.model == "digits-mlp" and line.version == wf["metadata"]["labels"]["forge.dev/model-version"]
    assert line.workflow == wf["metadata"]["name"]
    assert line.dataset == "digits" and line.dataset_digest == DIGITS_DIGEST
    assert line.git_revision == line.git_commit == "abcdef123456" and not line.uncommitted
    assert line.spec_digest == wf["metadata"]["annotations"]["forge.dev/spec-digest"]
    assert line.spec["hyperparameters"]["learningRate"] == 0.002
    assert set(line.compression) == {"pruned", "int8"} and line.parents == ()
    assert line.exports["export-base"]["int8"]["calibrationSamples"] == 256  # x86 target: ORT INT8
    assert "benchmark" in line.steps


def test_a_distilled_student_names_its_teacher_and_version() -> None:
    result = load_or_raise([str(ROOT / "examples" / "edge-vision")])
    env = result.specs.environment(None)
    out = render(result.specs, RenderContext(env))
    line = lineage(out.workflows["vision-student"].manifest)
    assert line.parents == (Parent("vision-teacher", out.versions["vision-teacher"], "distillation teacher", "pruned-distilled"),)
    # the Jetson target gets a TensorRT engine step (not buildable locally) and no ONNX Runtime INT8
    engine = line.exports["build-engine-pruned-distilled"]
    assert engine["hardwareTarget"] == "jetson-orin" and engine["required"] is False
    assert "int8" not in line.exports["export-pruned-distilled"]


def test_records_are_stored_in_the_state_db(two_versions: dict[str, Any]) -> None:
    db: StateDB = two_versions["db"]
    stored = db.model_versions("digits-mlp")
    assert stored == two_versions["records"]  # read back as they were built: the record round-trips its JSON
    r1 = stored[0]
    assert r1.registered_at == "1970-01-01T00:16:40Z"
    assert r1.evaluation == {"accuracy": 0.9638, "f1": 0.9628, "passed": True}
    fig = r1.variants["base-onnx-int8"].figures
    assert fig.runtime == "onnxruntime" and fig.accuracy_from == "benchmark" and fig.p50_ms == 0.012
    assert stored[1].lineage.uncommitted and stored[1].lineage.git_commit == "2222222bbbbb"


def test_leaderboard_ranks_and_marks_the_pareto_front(two_versions: dict[str, Any]) -> None:
    [board] = leaderboards(two_versions["records"])
    assert board.group == "dataset digits" and (board.metric, board.goal) == ("accuracy", "maximize")
    rows = board.rows
    assert len(rows) == 10 and [r.rank for r in rows] == list(range(1, 11))
    v1, v2 = (r.version for r in two_versions["records"])
    # v2 is better on accuracy at equal size and latency: every v1 row is dominated
    assert {r.variant for r in rows if r.pareto} == {"pruned", "int8", "base-onnx", "base-onnx-int8"}
    assert all(r.version == v2 for r in rows if r.pareto)
    assert rows[0].version == v2 and rows[0].variant == "int8"  # the highest accuracy
    # ties on accuracy are broken by latency: ONNX (0.010) before ONNX INT8 (0.012) before PyTorch (0.037)
    tied = [r.variant for r in rows if r.version == v1 and r.metric == 0.9638]
    assert tied == ["base-onnx", "base-onnx-int8", "base"]
    # within one version alone, base is dominated by base-onnx-int8 (same accuracy, smaller, faster)
    [only] = leaderboards(two_versions["records"][:1])
    assert {r.variant: r.pareto for r in only.rows} == {
        "int8": True, "base-onnx": True, "base-onnx-int8": True, "base": False, "pruned": True}
    # latency at another batch size
    [b64] = leaderboards(two_versions["records"], batch=64)
    assert next(r for r in b64.rows if r.variant == "base").figures.p50_ms == pytest.approx(0.148)


def test_the_metric_is_the_one_the_spec_names() -> None:
    assert spec_metric({"search": {"metric": "f1", "goal": "maximize"}}) == ("f1", "maximize")
    assert spec_metric({"evaluation": {"thresholds": [{"metric": "latencyP99Ms", "max": 20}, {"metric": "loss", "max": 0.3}]}}) == ("loss", "minimize")
    assert spec_metric({}) == ("accuracy", "maximize")


def test_diff_shows_the_spec_change_and_its_effect(two_versions: dict[str, Any]) -> None:
    r1, r2 = two_versions["records"]
    d = diff(r1, r2)
    assert "model spec: `hyperparameters.learningRate` 0.002 → 0.003" in d.spec_changes
    assert "git revision 1111111aaaaa → 2222222bbbbb-dirty" in d.spec_changes
    assert d.evaluation["accuracy"].delta == pytest.approx(0.01)
    assert d.variants["int8"].figures["accuracy"].delta == pytest.approx(0.01)
    assert d.variants["int8"].figures["sizeBytes"].ratio == 1.0
    assert d.to_json()["variants"]["int8"]["sizeBytes"] == {"from": 57_553, "to": 57_553, "delta": 0, "ratio": 1.0}
    assert find(two_versions["records"], f"digits-mlp@{r2.version[:6]}") is r2
    assert find(two_versions["records"], "digits-mlp") is r2


def test_cluster_records_come_from_the_register_nodes_output() -> None:
    """On a cluster the register step's `metrics` output parameter (Argo keeps it in the
    Workflow's status) is the record; this is the shape the register step writes."""
    wf, _, _ = rendered(project(Path("/tmp") / "forge-registry-test"), "c0ffee")
    version = wf["metadata"]["labels"]["forge.dev/model-version"]
    summary = {"model": "digits-mlp", "version": version, "variants": ["base", "int8"],
               "registry": {"base": {"sizeBytes": 205_821, "kind": "state_dict", "parameters": 50_000, "accuracy": 0.96,
                                     "latency": {"1": {"p50Ms": 0.04, "p99Ms": 0.2, "throughput": 20_000}}},
                            "int8": {"sizeBytes": 57_553, "kind": "int8", "parameters": 50_000, "accuracy": 0.965, "latency": {}}},
               "hardware": {"cpu": "node CPU"}, "artifacts": {}}
    wf = {**wf, "status": {"phase": "Succeeded", "nodes": {
        "n1": {"templateName": "train", "phase": "Succeeded"},
        "n2": {"templateName": "register", "phase": "Succeeded", "finishedAt": "2026-01-02T03:04:05Z",
               "outputs": {"parameters": [{"name": "metrics", "value": json.dumps(summary)}]}}}}}
    record = _from_workflow_status(wf, "cluster")
    assert record is not None and record.version == version
    assert record.variants["base"].figures.p50_ms == 0.04
    assert record.variants["int8"].figures.accuracy == 0.965
    assert record.lineage.git_revision == "c0ffee"
    shutil.rmtree(Path("/tmp") / "forge-registry-test", ignore_errors=True)


def test_a_rejected_variant_is_recorded_and_fails_the_offline_gate_of_an_endpoint_naming_it(tmp_path: Path) -> None:
    """The register step lists a variant its step rejected under `rejected` (registry.json: with
    the reason and report; the cluster's `metrics` summary: the reason). The record keeps it out
    of the variants, and each target's offline gate fails an Endpoint that serves it."""
    wf, _, _ = rendered(project(tmp_path), "c0ffee")
    version = wf["metadata"]["labels"]["forge.dev/model-version"]
    workspace = tmp_path / "workspace"
    write_run(workspace, wf, V1, 0.9638)
    reg = workspace / "registry" / "digits-mlp" / version / "registry.json"
    why = "accuracy dropped 41.20 points, more than the allowed 0.5"
    reg.write_text(json.dumps({**json.loads(reg.read_text()), "rejected": {"gutted": {"reason": why, "report": "x/report.json"}}}))
    db = StateDB(tmp_path / "state.db")
    record = ingest_local(db, workspace, wf, "local", registered=1000.0)
    assert record is not None and record.rejected == {"gutted": why} and "gutted" not in record.variants
    assert db.model_versions("digits-mlp")[0].rejected == {"gutted": why}  # through the state DB's JSON
    db.put({**wf, "status": {"phase": "Succeeded"}})
    backend = LocalRolloutBackend(cast(Any, None), db, tmp_path / "events.jsonl", lambda _: None, cast(Any, None),
                                  cast(Any, None), cast(Any, None), None)
    finished, passed, detail = backend.model_gate("digits-mlp", version, "gutted")
    assert (finished, passed) == (True, False) and f"variant gutted of version {version} was rejected: {why}" in detail
    assert "registered: base, base-onnx, base-onnx-int8, int8, pruned" in detail
    assert backend.model_gate("digits-mlp", version, "int8")[:2] == (True, True)
    assert backend.model_gate("digits-mlp", version, None)[:2] == (True, True)  # `select: fastest`: the server picks

    summary = {"model": "digits-mlp", "version": version, "variants": ["base"], "rejected": {"gutted": why},
               "registry": {"base": {"sizeBytes": 1, "kind": "state_dict", "parameters": 1, "accuracy": 0.96, "latency": {}}}}
    cluster = {**wf, "status": {"phase": "Succeeded", "nodes": {
        "n1": {"templateName": "register", "phase": "Succeeded", "finishedAt": "2026-01-02T03:04:05Z",
               "outputs": {"parameters": [{"name": "metrics", "value": json.dumps(summary)}]}}}}}
    on_cluster = _from_workflow_status(cluster, "cluster")
    assert on_cluster is not None and on_cluster.rejected == {"gutted": why}
    assert rejected_variant(on_cluster, "gutted") == f"variant gutted of version {version} was rejected: {why} (registered: base)"
    assert rejected_variant(on_cluster, "base") is None
    db.close()


def test_models_lists_versions_with_lineage_and_the_leaderboard(local_project: dict[str, Any]) -> None:
    out = cli("models", "--specs", "specs")
    assert out.exit_code == 0, out.output
    text = out.output
    assert local_project["v1"] in text and local_project["v2"] in text
    assert "1111111aaaaa" in text and "2222222bbbbb" in text  # git revisions
    assert "digits sha256:4eca0a80f799…" in text
    assert "Leaderboard: dataset digits — accuracy" in text and "★" in text
    data = json.loads(cli("models", "--specs", "specs", "-o", "json").output)
    versions = {r["version"]: r for r in data["versions"]}
    assert set(versions) == {local_project["v1"], local_project["v2"]}
    served = versions[local_project["v2"]]["servedBy"]
    assert {"endpoint": "digits", "role": "stable", "variant": "int8", "traffic": 100, "live": True} in served
    assert len(data["leaderboards"][0]["rows"]) == 10
    # one model only
    only = json.loads(cli("models", "digits-mlp", "--specs", "specs", "-o", "json").output)
    assert len(only["versions"]) == 2
    assert "no registered model versions of other" in cli("models", "other", "--specs", "specs").output


def test_models_show_and_diff(local_project: dict[str, Any]) -> None:
    out = cli("models", "show", f"digits-mlp@{local_project['v2'][:7]}", "--specs", "specs")
    assert out.exit_code == 0, out.output
    assert "base-onnx-int8" in out.output and "onnxruntime onnx-int8" in out.output and "batch 64" in out.output
    assert "digits stable int8 100 %" in out.output
    diff_out = cli("models", "diff", f"digits-mlp@{local_project['v1']}", local_project["v2"], "--specs", "specs")
    assert diff_out.exit_code == 0, diff_out.output
    assert "`hyperparameters.learningRate` 0.002 → 0.003" in diff_out.output
    assert "96.38 % → 97.38 % (+1.00 pt)" in diff_out.output
    same = json.loads(cli("models", "diff", "digits-mlp", "--specs", "specs", "-o", "json").output)  # its last two
    assert same["a"]["version"] == local_project["v1"] and same["b"]["version"] == local_project["v2"]
    bad = cli("models", "show", "digits-mlp@ffff", "--specs", "specs")
    assert bad.exit_code != 0


def test_models_report_json_and_html(local_project: dict[str, Any], tmp_path: Path) -> None:
    data = json.loads(cli("models", "report", "--specs", "specs", "-o", "json").output)
    assert data["leaderboards"][0]["metric"] == "accuracy"
    page = tmp_path / "report.html"
    out = cli("models", "report", "--specs", "specs", "--html", str(page))
    assert out.exit_code == 0, out.output
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>") and "Content-Security-Policy" in text and "default-src 'none'" in text
    assert text.count("<svg") == 2 and text.count('<g class="point">') == 20  # two plots × ten rows
    # self-contained: nothing is fetched from anywhere
    for needle in ("http://", "https://", "<script", "<link", "@import", "url("):
        assert needle not in text.replace('xmlns="http://www.w3.org/2000/svg"', ""), needle


def _succeeded_on_cluster(wf: dict[str, Any], version: str, accuracy: float) -> dict[str, Any]:
    """``wf`` as Argo leaves a succeeded run of ``version``: the register node's `metrics` output."""
    summary = {"model": "digits-mlp", "version": version, "variants": ["base", "int8"],
               "registry": {name: {"sizeBytes": 1, "kind": name, "parameters": 1, "accuracy": accuracy, "latency": {}}
                            for name in ("base", "int8")}}
    labels = {**wf["metadata"]["labels"], "forge.dev/model-version": version}
    return {**wf, "metadata": {**wf["metadata"], "name": f"digits-mlp-{version[:10]}", "labels": labels},
            "status": {"phase": "Succeeded", "nodes": {
                "n1": {"templateName": "register", "phase": "Succeeded", "finishedAt": "2026-01-02T03:04:05Z",
                       "outputs": {"parameters": [{"name": "metrics", "value": json.dumps(summary)}]}}}}}


def test_on_a_cluster_the_regression_gate_compares_the_records_the_workflows_carry(tmp_path: Path) -> None:
    """The kubernetes rollout backend hands the regression gate the records its Workflows' status
    holds (as `models show` reads them): a candidate two points worse is refused with the numbers."""
    specs_dir = project(tmp_path)
    wf, _, _ = rendered(specs_dir, "c0ffee")
    specs = load_or_raise([str(specs_dir)]).specs
    env = specs.environment("cluster")
    assert env is not None
    live, candidate = "a" * 12, "b" * 12
    cluster = FakeCluster()
    for version, accuracy in ((live, 0.97), (candidate, 0.95)):
        cluster.put(_succeeded_on_cluster(wf, version, accuracy))
    backend = KubernetesRolloutBackend(cast(Any, cluster), specs, env, None)
    records = backend.registered("digits-mlp", candidate), backend.registered("digits-mlp", live)
    assert all(r is not None for r in records)
    result = regression_gate(RegressionGate(max_drop=0.01), *records, "int8")
    assert result.passed is False and (result.candidate, result.live) == (0.95, 0.97), result
    assert f"candidate {candidate} 0.9500, live {live} 0.9700" in result.detail
    assert backend.registered("digits-mlp", "c" * 12) is None  # no Workflow of that version


def test_on_a_cluster_a_shadow_stopped_in_its_init_container_is_held_with_its_message(tmp_path: Path) -> None:
    """`rollout status` on a cluster: a shadow pod whose await-model init container ended in an
    error (as the kubelet reports it, with the step's termination message) is shown as held."""
    specs = load_or_raise([str(project(tmp_path))]).specs
    env = specs.environment("cluster")
    assert env is not None
    cluster = FakeCluster()
    backend = KubernetesRolloutBackend(cast(Any, cluster), specs, env, None)
    assert backend.shadow_stats("digits") is None  # no shadow pod: Prometheus's figures, if any
    why = "model digits-mlp aaaaaaaaaaaa: variant gutted of version aaaaaaaaaaaa was rejected: accuracy dropped"
    ended = {"terminated": {"exitCode": 5, "reason": "Error", "message": why}}
    cluster.put({"apiVersion": "v1", "kind": "Pod",
                 "metadata": {"name": "digits-shadow-0-model-x", "namespace": cluster.namespace,
                              "labels": {"forge.dev/endpoint": "digits", "forge.dev/role": "shadow"}},
                 "status": {"phase": "Pending", "initContainerStatuses": [
                     {"name": "await-model", "state": {"waiting": {"reason": "CrashLoopBackOff"}}, "lastState": ended}]}})
    assert backend.shadow_stats("digits") == {
        "held": f"its pod digits-shadow-0-model-x stops in its await-model container: {why}"}
