"""Auto-labeling in the Workflow (issue 31), in the control plane: `labeling.auto` renders an
`autolabel` step (after the labelling model's registration, or after this version's own
evaluation when a Model labels its own data), Argo's validator accepts the Workflow, the registry's
lineage names the labelling model's version as a parent, `forgectl labels merge` rewrites the
source and the Dataset's `digest:` line (and refuses bad rows with their file and line), and the
plan then retrains. The runtimes' side: tests/trust/test_autolabel.py, tests/local/test_autolabel_workflow.py."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import git
import pytest

from reconciler.load.loader import load_or_raise
from reconciler.registry.records import Parent, lineage
from reconciler.targets.local import upstream
from renderers import RenderContext, render
from renderers.versions import model_version
from renderers.workflow import registry_dir, workflow_steps
from specs import Model, SpecSet

SCANS = "a,b,digit\n1,2,0\n3,4,1\n5,6,0\n"
UNLABELLED = "a,b,truth\n7,8,1\n9,10,0\n11,12,1\n"
CLASSES = '["0", "1"]'

#: Two Models: `labeller` (on scikit-learn's digits) labels the `scans` the `student` trains on
#: (format with labeller, model_ref, digest and classes; tests/local/test_autolabel_workflow.py runs it).
SPECS = """\
apiVersion: forge.dev/v1alpha1
kind: Environment
metadata: {{name: local}}
spec: {{target: local, default: true, defaults: {{computeRef: cpu}}}}
---
apiVersion: forge.dev/v1alpha1
kind: Environment
metadata: {{name: cluster}}
spec: {{target: kubernetes, kubernetes: {{namespace: forge-labels}}, defaults: {{computeRef: cpu}}}}
---
apiVersion: forge.dev/v1alpha1
kind: Compute
metadata: {{name: cpu}}
spec: {{accelerator: {{type: cpu}}, node: {{cpu: "2", memory: 4Gi}}}}
---
apiVersion: forge.dev/v1alpha1
kind: Dataset
metadata: {{name: digits}}
spec:
  source: {{uri: "sklearn://digits", format: sklearn}}
  version: "1"
  digest: sha256:4eca0a80f7990df18560bf7c80f03e0893a8868820f1ee4405e0402527902353
---
apiVersion: forge.dev/v1alpha1
kind: Model
metadata: {{name: {labeller}}}
spec:
  datasetRef: digits
  architecture: {{type: mlp, hiddenSizes: [64]}}
  hyperparameters: {{epochs: 15, learningRate: 0.005, seed: 3}}
---
apiVersion: forge.dev/v1alpha1
kind: Dataset
metadata: {{name: scans}}
spec:
  source: {{uri: "file://data/scans.csv", format: csv}}
  version: "1"
  digest: {digest}
  labeling:
    column: digit
    classes: {classes}
    auto:
      modelRef: {model_ref}
      confidence: 0.9
      unlabelled: file://data/unlabelled.csv
      heldBackColumn: truth
      minAgreement: 0.8
---
apiVersion: forge.dev/v1alpha1
kind: Model
metadata: {{name: student}}
spec:
  datasetRef: scans
  architecture: {{type: mlp, hiddenSizes: [8]}}
"""


def _digest(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _repo(tmp_path: Path, model_ref: str = "labeller") -> Path:
    """A git repository with the specs in `specs.yaml` and the data under `data/`, committed."""
    (tmp_path / "data").mkdir(parents=True)
    (tmp_path / "data" / "scans.csv").write_text(SCANS)
    (tmp_path / "data" / "unlabelled.csv").write_text(UNLABELLED)
    (tmp_path / "specs.yaml").write_text(SPECS.format(labeller="labeller", model_ref=model_ref, digest=_digest(SCANS), classes=CLASSES))
    repo = git.Repo.init(tmp_path)
    repo.config_writer().set_value("user", "name", "T").set_value("user", "email", "t@example.com").release()
    repo.index.add(["specs.yaml", "data/scans.csv", "data/unlabelled.csv"])
    repo.index.commit("scans")
    return tmp_path


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = _repo(tmp_path / "repo")
    monkeypatch.chdir(path)
    return path


def _specs(path: Path) -> SpecSet:
    return load_or_raise([str(path / "specs.yaml")]).specs


def _workflow(specs: SpecSet, model: str, env: str = "local") -> dict[str, Any]:
    environment = specs.environment(env)
    assert environment is not None
    [wf] = [m for m in render(specs, RenderContext(environment, revision="0123456789ab")).manifests
            if m["kind"] == "Workflow" and m["metadata"]["name"].startswith(model)]
    return wf


def _tasks(wf: dict[str, Any]) -> dict[str, dict[str, Any]]:
    [pipeline] = [t for t in wf["spec"]["templates"] if t["name"] == "pipeline"]
    return {t["name"]: t for t in pipeline["dag"]["tasks"]}


def test_the_student_pre_labels_with_the_labellers_registered_version(repo: Path) -> None:
    specs = _specs(repo)
    wf = _workflow(specs, "student")
    labeller = specs.get(Model, "labeller")
    assert labeller is not None
    version = model_version(specs, labeller, specs.environment("local"))  # type: ignore[arg-type]
    tasks, steps = _tasks(wf), workflow_steps(wf)
    # waits for the labeller's registration, runs beside prepare-data and training; register waits for it
    assert "depends" not in tasks["await-labeller-labeller"]
    assert tasks["autolabel"]["depends"] == "await-labeller-labeller.Succeeded"
    assert "autolabel.Succeeded" in tasks["register"]["depends"]
    wait = steps["await-labeller-labeller"]["config"]
    assert wait["paths"] == [f"{registry_dir('labeller', version)}/registry.json"]
    config = steps["autolabel"]["config"]
    assert config["modelDir"] == registry_dir("labeller", version, "base")
    assert config["output"].endswith("/labels") and config["spec"]["labeling"]["auto"]["minAgreement"] == 0.8
    [template] = [t for t in wf["spec"]["templates"] if t["name"] == "autolabel"]
    assert template["container"]["args"][0] == "autolabel"
    assert template["outputs"]["parameters"][0]["valueFrom"]["path"].endswith(f"{config['output']}/metrics.json")
    # the labeller's own Workflow has no labelling step, and is applied first (its training stage)
    assert "autolabel" not in workflow_steps(_workflow(specs, "labeller"))
    assert wf["metadata"]["annotations"]["forge.dev/training-stage"] == "1"


def test_the_lineage_names_the_labelling_model_as_a_parent(repo: Path) -> None:
    specs = _specs(repo)
    labeller = specs.get(Model, "labeller")
    assert labeller is not None
    version = model_version(specs, labeller, specs.environment("local"))  # type: ignore[arg-type]
    line = lineage(_workflow(specs, "student"))
    assert line.parents == (Parent("labeller", version, "labelling model"),)
    assert lineage(_workflow(specs, "labeller")).parents == ()


def test_a_cluster_record_carries_the_agreement_and_the_labelling_parent(repo: Path) -> None:
    """On a cluster the autolabel node's `metrics` output (the step's report) is the record's `labeling`."""
    from reconciler.registry.records import Record
    from reconciler.targets.kubernetes.records import _from_workflow_status

    wf = _workflow(_specs(repo), "student", "cluster")
    version = wf["metadata"]["labels"]["forge.dev/model-version"]
    report = {"model": "labeller", "rows": 3, "autoLabelled": 2, "toReview": 1, "confidence": 0.9,
              "agreement": {"autoLabels": 1.0, "column": "truth"}, "gate": {"minAgreement": 0.8, "agreement": 1.0, "passed": True}}
    summary = {"model": "student", "version": version, "registry": {"base": {"kind": "state_dict"}}}
    wf = {**wf, "status": {"phase": "Succeeded", "nodes": {
        "n1": {"templateName": "autolabel", "phase": "Succeeded",
               "outputs": {"parameters": [{"name": "metrics", "value": json.dumps(report)}]}},
        "n2": {"templateName": "register", "phase": "Succeeded", "finishedAt": "2026-01-02T03:04:05Z",
               "outputs": {"parameters": [{"name": "metrics", "value": json.dumps(summary)}]}}}}}
    record = _from_workflow_status(wf, "cluster")
    assert record is not None and record.labeling == report
    assert [p.relation for p in record.lineage.parents] == ["labelling model"]
    assert Record.from_json(record.to_json()) == record


def test_a_model_labelling_its_own_data_labels_after_its_evaluation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _repo(tmp_path / "repo", model_ref="student")
    monkeypatch.chdir(path)
    wf = _workflow(_specs(path), "student")
    tasks, steps = _tasks(wf), workflow_steps(wf)
    assert tasks["autolabel"]["depends"] == "evaluate.Succeeded"
    assert not any(n.startswith("await-") for n in tasks)
    assert steps["autolabel"]["config"]["modelDir"] == steps["evaluate"]["config"]["modelDir"]
    assert lineage(wf).parents == ()  # the version labels with itself: no parent


def test_unset_min_agreement_stays_out_of_the_dump_and_needs_held_back_labels() -> None:
    from pydantic import ValidationError

    from specs.dataset import AutoLabel

    auto = {"modelRef": "m", "confidence": 0.9, "unlabelled": "file://u.csv"}
    assert "minAgreement" not in AutoLabel.model_validate(auto).model_dump(mode="json", by_alias=True)
    with pytest.raises(ValidationError, match="needs `heldBackColumn`"):
        AutoLabel.model_validate({**auto, "minAgreement": 0.9})


def test_an_unknown_labelling_model_and_a_labelling_cycle_are_refused(tmp_path: Path) -> None:
    from reconciler.diagnostics import SpecError

    (tmp_path / "specs.yaml").write_text(SPECS.format(labeller="labeller", model_ref="nobody", digest=_digest(SCANS), classes=CLASSES))
    with pytest.raises(SpecError) as info:
        load_or_raise([str(tmp_path / "specs.yaml")])
    assert "Model 'nobody' is not defined" in str(info.value.diagnostics)
    # the labeller trains on data the student labels: each would wait for the other
    text = SPECS.format(labeller="labeller", model_ref="labeller", digest=_digest(SCANS), classes=CLASSES).replace(
        "datasetRef: digits", "datasetRef: other")
    text += ("---\napiVersion: forge.dev/v1alpha1\nkind: Dataset\nmetadata: {name: other}\nspec:\n"
             "  source: {uri: 'sklearn://digits', format: sklearn}\n  version: '1'\n"
             "  digest: sha256:4eca0a80f7990df18560bf7c80f03e0893a8868820f1ee4405e0402527902353\n"
             "  labeling: {auto: {modelRef: student, confidence: 0.9, unlabelled: 'file://data/unlabelled.csv'}}\n")
    (tmp_path / "specs.yaml").write_text(text)
    with pytest.raises(SpecError) as info:
        load_or_raise([str(tmp_path / "specs.yaml")])
    assert "reference cycle" in str(info.value.diagnostics) and "labelling model" in str(info.value.diagnostics)


@pytest.mark.judges
@pytest.mark.parametrize("env", ["local", "cluster"])
def test_argo_accepts_the_autolabel_workflow(repo: Path, env: str) -> None:
    try:
        upstream.judge_binary()
    except upstream.UpstreamError as exc:
        pytest.fail(str(exc))
    specs = _specs(repo)
    assert upstream.argo_validate_many([_workflow(specs, "student", env), _workflow(specs, "labeller", env)]) == [[], []]


# -- forgectl labels merge -------------------------------------------------------------------------

def _forgectl(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "forgectl", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200"})


def _review(repo: Path, auto: str, reviewed: str) -> Path:
    """The `autolabel` step's files, as a reviewer left them (its report names the digest labelled for)."""
    folder = repo / ".forge" / "workspace" / "labels"
    folder.mkdir(parents=True)
    (folder / "auto-labels.csv").write_text(auto)
    (folder / "review.csv").write_text(reviewed)
    (folder / "report.json").write_text(json.dumps({"dataset": "scans", "datasetDigest": _digest(SCANS)}))
    return folder / "review.csv"


def test_labels_merge_appends_the_rows_rewrites_the_digest_line_and_commits(repo: Path) -> None:
    review = _review(repo, "a,b,digit\n7,8,1\n", "row,a,b,top1,p1,digit\n1,9,10,0,0.6,0\n2,11,12,1,0.55,\n")
    before = (repo / "specs.yaml").read_text()
    done = _forgectl(repo, "labels", "merge", "scans", "--reviewed", str(review), "--specs", "specs.yaml", "--commit",
                     "-o", "json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    merged = SCANS + "7,8,1\n9,10,0\n"
    assert (repo / "data/scans.csv").read_text() == merged  # the source's lines unchanged, the rows appended
    assert result["autoLabelled"] == 1 and result["accepted"] == 1 and result["rejected"] == 1
    assert result["oldDigest"] == _digest(SCANS) and result["newDigest"] == _digest(merged)
    after = (repo / "specs.yaml").read_text()
    assert after == before.replace(_digest(SCANS), _digest(merged))  # one line changed, in place
    assert after.splitlines()[result["specLine"] - 1] == f"  digest: {_digest(merged)}"
    r = git.Repo(repo)
    assert r.head.commit.hexsha == result["commit"] and not r.is_dirty()
    assert sorted(r.head.commit.stats.files) == ["data/scans.csv", "specs.yaml"]
    # the plan retrains the student (the labeller's data did not move)
    plan = _forgectl(repo, "plan", "specs.yaml", "--base", "HEAD~1")
    out = plan.stdout + plan.stderr
    assert "dataset `scans` digest changed" in out and "retrain model `student`" in out, out[-3000:]
    assert "retrain model `labeller`" not in out
    # the same review again: made for the old digest, refused
    again = _forgectl(repo, "labels", "merge", "scans", "--reviewed", str(review), "--specs", "specs.yaml")
    assert again.returncode == 1 and "were made for" in again.stderr and "merged already" in again.stderr, again.stderr
    assert (repo / "data/scans.csv").read_text() == merged


@pytest.mark.parametrize(("auto", "reviewed", "where", "message"), [
    ("a,b,digit\n7,8,1\n", "row,a,b,digit\n1,9,,0\n", "review.csv:2", "empty 'b'"),
    ("a,b,digit\n7,8,1\n", "row,a,b,digit\n1,9,10,0\n2,11,12,7\n", "review.csv:3", "label '7' is not one of the Dataset's classes"),
    ("a,digit\n7,1\n", "row,a,b,digit\n", "auto-labels.csv:1", "no column 'b'"),
    ("a,b,digit\n7,8,1\n", "row,a,b,digit\n1,9,10\n", "review.csv:2", "3 field(s), the header has 4"),
    ("a,b,digit\n7,8,1\n", "row,a,b,b,digit\n1,9,10,0.5,0\n", "review.csv:1", "'b' appear more than once"),
])
def test_labels_merge_refuses_bad_rows_with_file_and_line_and_writes_nothing(
        repo: Path, auto: str, reviewed: str, where: str, message: str) -> None:
    review = _review(repo, auto, reviewed)
    before = {p: (repo / p).read_bytes() for p in ("specs.yaml", "data/scans.csv")}
    done = _forgectl(repo, "labels", "merge", "scans", "--reviewed", str(review), "--specs", "specs.yaml")
    assert done.returncode == 1 and where in done.stderr and message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert {p: (repo / p).read_bytes() for p in before} == before


def test_labels_merge_refuses_a_source_that_moved_and_a_dataset_without_auto_labeling(repo: Path) -> None:
    review = _review(repo, "a,b,digit\n7,8,1\n", "row,a,b,digit\n")
    (repo / "data/scans.csv").write_text(SCANS + "1,1,1\n")
    done = _forgectl(repo, "labels", "merge", "scans", "--reviewed", str(review), "--specs", "specs.yaml")
    assert done.returncode == 1 and "specs.yaml:" in done.stderr and "the Dataset pins" in done.stderr, done.stderr
    done = _forgectl(repo, "labels", "merge", "digits", "--reviewed", str(review), "--specs", "specs.yaml")
    assert done.returncode == 1 and "writes a `file://` CSV source" in done.stderr or "no `labeling.auto`" in done.stderr, done.stderr


WRITE_PARQUET = ("import sys, pandas as pd; pd.DataFrame({'a': [1, 3, 5], 'b': [2.0, 4.0, 6.0], 'digit': [0, 1, 0]})"
                 ".to_parquet(sys.argv[1], index=False, compression='zstd')")
READ_PARQUET = r'''
import json, sys
import pyarrow.parquet as pq
f = pq.ParquetFile(sys.argv[1])
frame = pq.read_table(sys.argv[1]).to_pandas()  # not pd.read_parquet: see runtimes.data.read_parquet
print(json.dumps({"types": [str(t) for t in f.schema_arrow.types], "names": f.schema_arrow.names,
                  "compression": f.metadata.row_group(0).column(0).compression, "rows": frame.values.tolist(),
                  "index": frame.index.tolist()}))
'''


@pytest.mark.runtime
def test_labels_merge_rewrites_a_parquet_source_with_its_types_and_commits(
        tmp_path: Path, runtime_python: str, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = _repo(tmp_path / "repo")
    monkeypatch.setenv("FORGE_RUNTIME_PYTHON", runtime_python)  # the Parquet is written by the runtime environment
    source = repo / "data" / "scans.parquet"
    subprocess.run([runtime_python, "-c", WRITE_PARQUET, str(source)], check=True, timeout=120)
    old = "sha256:" + hashlib.sha256(source.read_bytes()).hexdigest()
    text = (repo / "specs.yaml").read_text().replace('source: {uri: "file://data/scans.csv", format: csv}',
                                                     'source: {uri: "file://data/scans.parquet", format: parquet}')
    (repo / "specs.yaml").write_text(text.replace(_digest(SCANS), old))
    r = git.Repo(repo)
    r.index.add(["specs.yaml", "data/scans.parquet"])
    r.index.commit("scans as Parquet")
    folder = repo / ".forge" / "workspace" / "labels"
    folder.mkdir(parents=True)
    (folder / "auto-labels.csv").write_text("a,b,digit\n7,8,1\n")
    (folder / "report.json").write_text(json.dumps({"dataset": "scans", "datasetDigest": old}))
    review = folder / "review.csv"
    before = {p: (repo / p).read_bytes() for p in ("specs.yaml", "data/scans.parquet")}
    # a bad row: refused with its file and line by the runtime's merge, nothing written
    review.write_text("row,a,b,top1,p1,digit\n1,9,10,0,0.6,7\n")
    done = _forgectl(repo, "labels", "merge", "scans", "--reviewed", str(review), "--specs", "specs.yaml")
    assert done.returncode == 1 and "review.csv:2:" in done.stderr and "not one of the Dataset's classes" in done.stderr, done.stderr
    assert {p: (repo / p).read_bytes() for p in before} == before and "Traceback" not in done.stderr

    review.write_text("row,a,b,top1,p1,digit\n1,9,10,0,0.6,0\n2,11,12,1,0.55,\n")
    done = _forgectl(repo, "labels", "merge", "scans", "--reviewed", str(review), "--specs", "specs.yaml", "--commit",
                     "-o", "json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    new = "sha256:" + hashlib.sha256(source.read_bytes()).hexdigest()
    assert (result["autoLabelled"], result["accepted"], result["rejected"], result["rows"]) == (1, 1, 1, 5)
    assert result["oldDigest"] == old != new == result["newDigest"]
    after = (repo / "specs.yaml").read_text()
    assert after == before["specs.yaml"].decode().replace(old, new)  # one line changed, in place
    assert after.splitlines()[result["specLine"] - 1] == f"  digest: {new}"
    read = json.loads(subprocess.run([runtime_python, "-c", READ_PARQUET, str(source)], check=True, capture_output=True,
                                     text=True, timeout=120).stdout)
    assert read["names"] == ["a", "b", "digit"] and read["types"] == ["int64", "double", "int64"]  # the source's types
    assert read["rows"] == [[1, 2, 0], [3, 4, 1], [5, 6, 0], [7, 8, 1], [9, 10, 0]] and read["index"] == [0, 1, 2, 3, 4]
    assert read["compression"] == "ZSTD"
    assert r.head.commit.hexsha == result["commit"] and not r.is_dirty()
    assert sorted(r.head.commit.stats.files) == ["data/scans.parquet", "specs.yaml"]
    plan = _forgectl(repo, "plan", "specs.yaml", "--base", "HEAD~1")
    assert "dataset `scans` digest changed" in plan.stdout + plan.stderr and "retrain model `student`" in plan.stdout + plan.stderr
    again = _forgectl(repo, "labels", "merge", "scans", "--reviewed", str(review), "--specs", "specs.yaml")
    assert again.returncode == 1 and "were made for" in again.stderr, again.stderr
