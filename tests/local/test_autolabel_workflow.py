"""Auto-labeling as a rendered Workflow on the local target (issue 31): `forgectl apply` trains the
labelling model, then the student's Workflow waits for its registration, pre-labels the
unlabelled rows with its registered `base`, writes the review file and gates the agreement with
the held-back labels; the registry names the labeller's version as the student's parent; a
reviewer's labels go back through `forgectl labels merge --commit`, and the plan retrains the
student. The gate failing: the same step with a `minAgreement` the labeller cannot reach."""

from __future__ import annotations

import csv
import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

import git
import pytest

from tests.local.test_local_target import Workspace
from tests.trust.test_autolabel import SourceRunner
from tests.trust.test_autolabel_workflow import SPECS

pytestmark = pytest.mark.runtime

CLASSES = '["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"]'

# The scans: 300 labelled rows of scikit-learn's digits, and 300 more without their label (held back as `truth`).
WRITE_CSVS = """
import sys
import pandas as pd
from sklearn.datasets import load_digits
d = load_digits()
cols = [f"f{i}" for i in range(64)]
labelled = pd.DataFrame(d.data[1400:1700].astype(int), columns=cols)
labelled["digit"] = d.target[1400:1700]
labelled.to_csv(sys.argv[1] + "/scans.csv", index=False)
rest = pd.DataFrame(d.data[1100:1400].astype(int), columns=cols)
rest["truth"] = d.target[1100:1400]
rest.to_csv(sys.argv[1] + "/unlabelled.csv", index=False)
"""


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def test_autolabel_runs_in_the_workflow_and_its_labels_retrain_the_student(tmp_path: Path, runtime_python: str) -> None:
    path = tmp_path / "repo"
    (path / "data").mkdir(parents=True)
    (path / "specs").mkdir()
    subprocess.run([runtime_python, "-c", WRITE_CSVS, str(path / "data")], check=True, timeout=120)
    digest = "sha256:" + hashlib.sha256((path / "data/scans.csv").read_bytes()).hexdigest()
    (path / "specs/specs.yaml").write_text(SPECS.format(labeller="labeller", model_ref="labeller", digest=digest, classes=CLASSES))
    repo = git.Repo.init(path)
    repo.config_writer().set_value("user", "name", "T").set_value("user", "email", "t@example.com").release()
    repo.index.add(["specs/specs.yaml", "data/scans.csv", "data/unlabelled.csv"])
    repo.index.commit("scans")
    ws = Workspace(path, runtime_python)
    try:
        applied = ws.forgectl("apply", "specs", "--auto-approve").stdout
        assert "prepare-data → train → evaluate → await-labeller-labeller → autolabel → register will run" in applied, applied
        records = {r["model"]: r for r in json.loads(ws.forgectl("models", "list", "--specs", "specs", "-o", "json").stdout)["versions"]}
        labeller, student = records["labeller"], records["student"]
        # the registry: the labeller's version is the student's parent
        assert student["lineage"]["parents"] == [{"model": "labeller", "version": labeller["version"],
                                                  "relation": "labelling model", "variant": None}]
        assert "autolabel" in student["lineage"]["steps"]
        assert student["labeling"]["gate"]["passed"] is True and student["labeling"]["model"] == "labeller"
        shown = ws.forgectl("models", "show", "student", "--specs", "specs").stdout
        assert f"labeller@{labeller['version'][:12]} (labelling model)" in shown and "agreement with held-back labels" in shown
        # the step's files in the workspace: report (agreement, the gate), auto-labels, review file
        labels = path / ".forge" / "local" / "workspace" / "models" / "student" / student["version"] / "labels"
        report = json.loads((labels / "report.json").read_text())
        assert report["datasetDigest"] == digest and report["modelDir"] == f"registry/labeller/{labeller['version']}/base"
        assert report["rows"] == 300 and report["autoLabelled"] + report["toReview"] == 300 and report["toReview"] > 0
        assert report["gate"] == {"minAgreement": 0.8, "agreement": report["agreement"]["autoLabels"], "passed": True}
        assert report["agreement"]["autoLabels"] >= 0.8
        review = _rows(labels / "review.csv")
        assert len(review) == report["toReview"] and all(r["digit"] == "" for r in review)
        # a reviewer accepts the first half (the true labels) and leaves the rest; merged and committed
        truth = [r["truth"] for r in _rows(path / "data/unlabelled.csv")]
        half = len(review) // 2
        for i, r in enumerate(review):
            r["digit"] = truth[int(r["row"])] if i < half else ""
        reviewed = tmp_path / "reviewed.csv"
        with reviewed.open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(review[0]))
            writer.writeheader()
            writer.writerows(review)
        merged = json.loads(ws.forgectl("labels", "merge", "scans", "--reviewed", str(reviewed), "--auto-labels",
                                        str(labels / "auto-labels.csv"), "--specs", "specs", "--commit", "-o", "json").stdout)
        assert merged["accepted"] == half and merged["autoLabelled"] == report["autoLabelled"]
        assert merged["rows"] == 300 + report["autoLabelled"] + half and merged["oldDigest"] == digest
        assert repo.head.commit.hexsha == merged["commit"] and not repo.is_dirty()
        plan = ws.forgectl("plan", "specs").stdout
        assert "retrain model `student`" in plan and "Workflow forge-local/labeller" not in plan, plan
        # the gate: held-back labels the labeller disagrees with on 30 % of the rows fail the step
        # (exit 3, not retried), its files written
        rows = _rows(path / "data/unlabelled.csv")
        for r in rows[:90]:
            r["truth"] = str((int(r["truth"]) + 1) % 10)
        with (path / "data/noisy.csv").open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        runner = SourceRunner(runtime_python, path / ".forge" / "local" / "workspace", path)
        spec = _dataset_spec(path, digest)
        spec["labeling"]["auto"]["unlabelled"] = "file://data/noisy.csv"
        # against the data before the merge: after it, the merged rows are in the source and the
        # step would not offer them again (the confident ones among them)
        (path / "data/before.csv").write_text(repo.git.show("HEAD~1:data/scans.csv") + "\n")
        spec["source"] = {**spec["source"], "uri": "file://data/before.csv"}
        failed = runner.run("autolabel", {"step": "autolabel", "dataset": "scans", "spec": spec,
                                          "modelDir": report["modelDir"], "output": "gate"}, check=False)
        gate = json.loads((path / ".forge/local/workspace/gate/report.json").read_text())
        assert failed.returncode == 3 and gate["gate"]["passed"] is False, failed.stderr
        assert gate["gate"]["agreement"] < 0.75 and "< `labeling.auto.minAgreement` 0.8" in failed.stderr and (path / ".forge/local/workspace/gate/review.csv").exists()
    finally:
        ws.forgectl("down", "specs", check=False)


def _dataset_spec(path: Path, digest: str) -> dict[str, Any]:
    import yaml

    [doc] = [d for d in yaml.safe_load_all((path / "specs/specs.yaml").read_text()) if d["metadata"]["name"] == "scans"]
    spec = dict(doc["spec"])
    spec["digest"] = digest  # the data the autolabel step reads is the committed one: the gate does not check it
    return spec
