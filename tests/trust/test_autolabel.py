"""Auto-labeling round trip (issue 18): a model trained on the labelled part of a CSV pre-labels
the unlabelled rows; the rows under the confidence go to a review file with the model's top-k;
accepted reviews and the auto-labels merge back into the source, whose digest changes; pinned in
the Dataset, that digest change is what the plan shows as the reason to retrain."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import git
import pytest

from devkit.runtime_steps import Runner

pytestmark = pytest.mark.runtime

SPECS = """\
apiVersion: forge.dev/v1alpha1
kind: Environment
metadata: {{name: cluster}}
spec:
  target: kubernetes
  default: true
  kubernetes: {{namespace: forge-labels}}
  defaults: {{computeRef: cpu}}
---
apiVersion: forge.dev/v1alpha1
kind: Compute
metadata: {{name: cpu}}
spec: {{accelerator: {{type: cpu}}, node: {{cpu: "2", memory: 4Gi}}}}
---
apiVersion: forge.dev/v1alpha1
kind: Dataset
metadata: {{name: scans}}
spec: {dataset}
---
apiVersion: forge.dev/v1alpha1
kind: Model
metadata: {{name: scan-classifier}}
spec:
  datasetRef: scans
  architecture: {{type: mlp, hiddenSizes: [64]}}
  hyperparameters: {{epochs: 20, learningRate: 0.005, seed: 3}}
"""


WRITE_CSVS = """
import sys
import pandas as pd
from sklearn.datasets import load_digits
d = load_digits()
cols = [f"f{i}" for i in range(64)]
labelled = pd.DataFrame(d.data[:700].astype(int), columns=cols)
labelled["digit"] = d.target[:700]
labelled.to_csv(sys.argv[1] + "/scans.csv", index=False)
rest = pd.DataFrame(d.data[700:1300].astype(int), columns=cols)
rest["truth"] = d.target[700:1300]
rest.to_csv(sys.argv[1] + "/unlabelled.csv", index=False)
"""


class SourceRunner(Runner):
    """Runs the steps with the repository's specs folder as the source root (the local target's way)."""

    def __init__(self, python: str, workspace: Path, source_root: Path):
        super().__init__(python, workspace)
        self.source_root = source_root

    def env(self) -> dict[str, str]:
        return {**super().env(), "FORGE_SOURCE_ROOT": str(self.source_root)}


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def _dataset(digest: str) -> dict:
    return {"source": {"uri": "file://data/scans.csv", "format": "csv"}, "version": "1", "digest": digest,
            "splits": {"train": 0.8, "validation": 0.1, "test": 0.1, "seed": 3},
            "labeling": {"column": "digit", "auto": {"modelRef": "scan-classifier", "confidence": 0.9, "topK": 3,
                                                      "unlabelled": "file://data/unlabelled.csv",
                                                      "heldBackColumn": "truth"}}}


def test_pre_label_review_merge_changes_the_digest_and_the_plan_retrains(runtime_python: str, tmp_path: Path) -> None:
    import hashlib

    repo = tmp_path / "repo"
    (repo / "specs" / "data").mkdir(parents=True)
    # scikit-learn's digits as two CSV files (the runtime environment has scikit-learn; this one not)
    subprocess.run([runtime_python, "-c", WRITE_CSVS, str(repo / "specs" / "data")], check=True, timeout=120)
    digest = "sha256:" + hashlib.sha256((repo / "specs/data/scans.csv").read_bytes()).hexdigest()
    spec = _dataset(digest)
    (repo / "specs" / "specs.yaml").write_text(SPECS.format(dataset=json.dumps(spec)))
    r = git.Repo.init(repo)
    r.index.add(["specs/specs.yaml", "specs/data/scans.csv", "specs/data/unlabelled.csv"])
    r.index.commit("scans")

    runner = SourceRunner(runtime_python, tmp_path / "ws", repo / "specs")
    if True:
        runner.run("prepare", {"step": "prepare", "dataset": "scans", "spec": spec, "output": "data/scans"})
        model = {"datasetRef": "scans", "architecture": {"type": "mlp", "hiddenSizes": [64]},
                 "hyperparameters": {"epochs": 20, "learningRate": 0.005, "seed": 3}}
        runner.run("train", {"step": "train", "model": "scan-classifier", "version": "v1", "spec": model,
                             "data": "data/scans", "output": "models/labeller"}, timeout=600)
        # 1. pre-label
        runner.run("autolabel", {"step": "autolabel", "dataset": "scans", "spec": spec, "modelDir": "models/labeller",
                                 "output": "labels"})
        report = runner.read("labels/report.json")
        assert report["rows"] == 600 and report["autoLabelled"] + report["toReview"] == 600
        assert report["autoLabelled"] > 300 and report["toReview"] > 0
        agreement = report["agreement"]
        assert agreement["autoLabels"] >= 0.95  # confident labels agree with the held-back truth
        assert agreement["autoLabels"] >= agreement["allRowsTop1"]  # the confidence filter helps
        assert agreement["reviewRowsTopK"] >= 0.8
        # 2. the review file: the rows under the confidence, with the top-3 and an empty label
        review = _rows(runner.workspace / "labels/review.csv")
        assert len(review) == report["toReview"]
        assert {"row", "top1", "p1", "top2", "p2", "top3", "p3", "digit"} <= set(review[0])
        assert all(float(r["p1"]) < 0.9 and float(r["p1"]) >= float(r["p2"]) and r["digit"] == "" for r in review)
        auto = _rows(runner.workspace / "labels/auto-labels.csv")
        assert "truth" not in auto[0] and len(auto) == report["autoLabelled"]
        # 3. a reviewer accepts half the rows (with the true label) and leaves the rest
        truth = [r["truth"] for r in _rows(repo / "specs/data/unlabelled.csv")]
        half = len(review) // 2
        for i, r in enumerate(review):
            r["digit"] = truth[int(r["row"])] if i < half else ""
        with (runner.workspace / "labels/reviewed.csv").open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(review[0]))
            writer.writeheader()
            writer.writerows(review)
        # 4. merge: the source grows and its digest changes
        proc = runner.run("merge-labels", {"step": "merge-labels", "dataset": "scans", "spec": spec, "labels": "labels",
                                           "review": "labels/reviewed.csv", "output": "merged"})
        merge = runner.read("merged/merge.json")
        assert merge["oldDigest"] == digest != merge["newDigest"] == proc.stdout.strip().splitlines()[-1]
        assert merge["accepted"] == half and merge["rows"] == 700 + report["autoLabelled"] + half
        merged = _rows(runner.workspace / "merged/scans.csv")
        assert list(merged[0]) == [*[f"f{i}" for i in range(64)], "digit"] and all(r["digit"].isdigit() for r in merged)
    # 5. the merged file and its digest, committed: the plan retrains the model and says why
    (repo / "specs/data/scans.csv").write_bytes((runner.workspace / "merged/scans.csv").read_bytes())
    text = (repo / "specs/specs.yaml").read_text().replace(digest, merge["newDigest"])
    (repo / "specs/specs.yaml").write_text(text)
    plan = subprocess.run([sys.executable, "-m", "forgectl", "plan", "specs", "--base", "HEAD"], cwd=repo,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200"})
    out = plan.stdout + plan.stderr
    assert "dataset `scans` digest changed" in out and "retrain model `scan-classifier`" in out, out[-3000:]

    # 6. the next version's autolabel step: the rows merged are in the data set now, not offered again
    runner.run("autolabel", {"step": "autolabel", "dataset": "scans", "spec": {**spec, "digest": merge["newDigest"]},
                             "modelDir": "models/labeller", "output": "labels-next"})
    again = runner.read("labels-next/report.json")
    merged_rows = merge["autoLabelled"] + merge["accepted"]
    assert again["alreadyInDataset"] == merged_rows and again["unlabelledRows"] == 600
    assert again["rows"] == 600 - merged_rows == again["autoLabelled"] + again["toReview"] == len(review) - half
    features = [f"f{i}" for i in range(64)]
    merged_keys = {tuple(float(r[f]) for f in features) for r in merged[700:]}
    offered = _rows(runner.workspace / "labels-next/auto-labels.csv") + _rows(runner.workspace / "labels-next/review.csv")
    assert offered and not {tuple(float(r[f]) for f in features) for r in offered} & merged_keys
    # a review row still names its place in the unlabelled file: one of the rows the reviewer left out
    left_out = {int(r["row"]) for r in review[half:]}
    assert {int(r["row"]) for r in _rows(runner.workspace / "labels-next/review.csv")} <= left_out


def test_the_gate_passes_when_every_row_is_in_the_data_set_already() -> None:
    """After a merge of every row, the next version has nothing to label: no label to distrust, so
    `minAgreement` does not fail its Workflow (rows left but none confident still fails it)."""
    from runtimes.autolabel import gate

    report: dict = {"rows": 0, "autoLabelled": 0, "confidence": 0.9, "model": "m"}
    assert gate(report, 0.8) == "" and report["gate"] == {"minAgreement": 0.8, "agreement": None, "passed": True}
    report = {"rows": 5, "autoLabelled": 0, "confidence": 0.9, "model": "m"}
    assert "no row reached confidence 0.9" in gate(report, 0.8) and report["gate"]["passed"] is False


def test_the_review_columns_never_take_a_features_name() -> None:
    """Pixels named p0…p63 (examples/sharded-labelled): the probabilities may not overwrite p1…p3."""
    from runtimes.autolabel import review_columns

    assert review_columns(["f0", "f1"], "digit", 2) == ("row", ["top1", "top2"], ["p1", "p2"])
    assert review_columns([f"p{i}" for i in range(64)], "digit", 3) == ("row", ["_top1", "_top2", "_top3"],
                                                                        ["_p1", "_p2", "_p3"])
    assert review_columns(["row", "_p2"], "top1", 2) == ("_row", ["__top1", "__top2"], ["__p1", "__p2"])


def test_labels_export_prints_the_folder_as_one_line_that_forgectl_checks(tmp_path: Path) -> None:
    """`python -m runtimes labels-export` (the pod `forgectl labels pull` runs on a cluster): every
    file of the folder, base64 with its sha256, on one line after the result prefix; the step's
    log lines beside it do not disturb it; a folder that is not there is one clear error."""
    import base64
    import hashlib

    from specs.stepconfig import RESULT_PREFIX

    labels = tmp_path / "models" / "m" / "v" / "labels"
    labels.mkdir(parents=True)
    files = {"review.csv": b"row,digit\n3,\n", "auto-labels.csv": b"row,digit\n1,7\n", "report.json": b"{}"}
    for name, data in files.items():
        (labels / name).write_bytes(data)
    (labels / ".partial").write_bytes(b"x")  # hidden files stay behind
    env = {**os.environ, "FORGE_WORKSPACE": str(tmp_path)}
    config = json.dumps({"step": "labels-export", "labels": "models/m/v/labels"})
    done = subprocess.run([sys.executable, "-m", "runtimes", "labels-export", "--config-json", config], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    [line] = [ln for ln in done.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    answer = json.loads(line[len(RESULT_PREFIX):])
    got = {e["name"]: base64.b64decode(e["base64"]) for e in answer["files"]}
    assert got == files and all(e["sha256"] == hashlib.sha256(got[e["name"]]).hexdigest() for e in answer["files"])
    missing = subprocess.run([sys.executable, "-m", "runtimes", "labels-export", "--config-json",
                              json.dumps({"step": "labels-export", "labels": "models/m/other/labels"})],
                             env=env, capture_output=True, text=True, timeout=120)
    assert missing.returncode == 1 and "models/m/other/labels: no such folder on the workspace" in missing.stderr


def test_merge_labels_then_publish_replaces_a_single_file_and_withdraw_puts_it_back(tmp_path: Path,
                                                                                    runtime_python: str) -> None:
    """What the merge pod does to a single `pvc://` file on a cluster (here a `file://` one on this
    machine, the same code): `--then-publish` replaces the source with the merged file, keeping its
    bytes on the workspace, and prints merge.json on the result line; `--withdraw NAME` puts the
    original back — and refuses once the source is no longer the merged file."""
    import hashlib

    from specs.stepconfig import RESULT_PREFIX

    source = tmp_path / "data" / "scans.csv"
    source.parent.mkdir()
    original = b"a,b,digit\n1,2,3\n4,5,6\n"
    source.write_bytes(original)
    workspace = tmp_path / "ws"
    (workspace / "in").mkdir(parents=True)
    (workspace / "in" / "auto-labels.csv").write_bytes(b"a,b,digit\n7,8,1\n")
    (workspace / "in" / "review.csv").write_bytes(b"a,b,digit\n9,10,2\n11,12,\n")
    digest = "sha256:" + hashlib.sha256(original).hexdigest()
    spec = {"source": {"uri": "file://data/scans.csv", "format": "csv"}, "version": "1", "digest": digest,
            "labeling": {"column": "digit", "classes": [str(d) for d in range(10)],
                         "auto": {"modelRef": "labeller", "confidence": 0.9, "unlabelled": "file://data/unlabelled.csv"}}}
    config = json.dumps({"step": "merge-labels", "dataset": "scans", "spec": spec, "labels": "in",
                         "review": "in/review.csv", "output": "merges/1"})
    env = {**os.environ, "FORGE_WORKSPACE": str(workspace), "FORGE_SOURCE_ROOT": str(tmp_path)}

    def step(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([runtime_python, "-m", "runtimes", "merge-labels", "--config-json", config, *args],
                              env=env, capture_output=True, text=True, timeout=300)

    done = step("--then-publish")
    assert done.returncode == 0, done.stderr
    [line] = [ln for ln in done.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    merged = json.loads(line[len(RESULT_PREFIX):])
    assert source.read_bytes() == original + b"7,8,1\n9,10,2\n"  # its own lines kept, the rows appended
    assert merged["newDigest"] == "sha256:" + hashlib.sha256(source.read_bytes()).hexdigest()
    assert (merged["oldDigest"], merged["autoLabelled"], merged["accepted"], merged["rejected"]) == (digest, 1, 1, 1)
    assert (workspace / "merges" / "1" / "scans.csv.before").read_bytes() == original
    undone = step("--withdraw", "scans.csv")
    assert undone.returncode == 0, undone.stderr
    assert source.read_bytes() == original
    again = step("--withdraw", "scans.csv")  # the source is not the merged file any more
    assert again.returncode == 1 and "not the file the merge in merges/1 wrote" in again.stderr, again.stderr
