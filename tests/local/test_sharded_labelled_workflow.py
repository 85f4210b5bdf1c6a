"""examples/sharded-labelled end to end on the local target (issue 31): one data set that is
sharded, auto-labelled and searched. `forgectl apply` trains the labeller (the fan-out prepares
the three groups of shards), then the searched Model's Workflow finds the groups in the cache,
runs its TPE trials against one Optuna study with ASHA pruning, waits for the labeller's
registration, pre-labels the unlabelled rows with it (gated on the held-back labels) and
registers. A simulated review goes back through `forgectl labels merge --commit`, which writes
the merged rows as a seventh shard and pins it; the plan then counts one new shard and prepares
only its group, and so does the next `apply`, whose autolabel step no longer offers the merged
rows. Merging the same review again is refused."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.local.test_sharded_workflow import apply_example

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "sharded-labelled"
pytestmark = pytest.mark.runtime

# A reviewer fills the true label of the first half of the rows sent to review and leaves the rest.
REVIEW = r'''
import os
import sys
import pandas as pd
labels, repo, out = sys.argv[1:]
review = pd.read_csv(labels + "/review.csv", dtype=str, keep_default_na=False)
truth = pd.read_parquet(repo + "/data/unlabelled.parquet")["truth"]
half = len(review) // 2
review["digit"] = [str(truth.iloc[int(r)]) if i < half else "" for i, r in enumerate(review["row"])]
review.to_csv(out, index=False)
# Done: leave before the interpreter's teardown, where a Parquet reader's thread can abort the
# process after the work is complete (apache/arrow#34314; seen once here, exit 134).
sys.stdout.flush()
os._exit(0)
'''

SHARD_ROWS = r'''
import sys
import pyarrow.parquet as pq
new, old = pq.read_table(sys.argv[1]), pq.read_schema(sys.argv[2])
print(new.num_rows, new.schema.remove_metadata().equals(old.remove_metadata()))
'''


def test_sharded_autolabelled_search_runs_and_merged_labels_add_one_shard(tmp_path: Path, runtime_python: str) -> None:
    path = tmp_path / "repo"
    repo, ws, applied, groups = apply_example(EXAMPLE, path, runtime_python)
    assert len(groups) == 3, applied
    flat = " ".join(applied.split())
    assert "prepare-data → train-trial-0 → train-trial-1 → train-trial-2 → train-trial-3 → pick-best → evaluate → " \
           "await-labeller-digits-labeller → autolabel → register will run" in flat, applied
    assert "search: tpe, early stopping asha — 4 trials, 2 at a time" in flat, applied
    workflows = {w["name"].rsplit("-", 1)[0]: w for w in ws.status()["workflows"]}
    assert {n: w["phase"] for n, w in workflows.items()} == {"digits-labeller": "Succeeded", "digits-tpe": "Succeeded"}
    steps = {s["step"]: s["status"] for s in workflows["digits-tpe"]["steps"]}
    assert [steps[f"train-trial-{i}"] for i in range(4)] == ["succeeded"] * 4 and steps["autolabel"] == "succeeded"
    # the labeller's Workflow prepared the groups; whichever Workflow came second found them in the cache
    prepared = [(s["step"], s["status"]) for w in workflows.values() for s in w["steps"] if s["step"] in groups]
    assert sorted(prepared) == sorted((g, status) for g in groups for status in ("cached", "succeeded")), prepared

    records = {r["model"]: r for r in json.loads(ws.forgectl("models", "list", "--specs", "specs", "-o", "json").stdout)["versions"]}
    labeller, searched = records["digits-labeller"], records["digits-tpe"]
    assert searched["lineage"]["parents"] == [{"model": "digits-labeller", "version": labeller["version"],
                                               "relation": "labelling model", "variant": None}]
    workspace = path / ".forge" / "local" / "workspace"
    version = workspace / "models" / "digits-tpe" / searched["version"]
    study = json.loads((version / "train" / "trials.json").read_text())["study"]
    assert study["algorithm"] == "tpe" and study["earlyStopping"] == "asha" and sum(study["states"].values()) == 4
    assert json.loads((version / "evaluate" / "metrics.json").read_text())["accuracy"] >= 0.85
    labels = version / "labels"
    report = json.loads((labels / "report.json").read_text())
    assert report["rows"] == 597 and report["autoLabelled"] + report["toReview"] == 597 and report["toReview"] > 0
    assert report["gate"]["minAgreement"] == 0.9 and report["gate"]["passed"] is True
    assert report["modelDir"] == f"registry/digits-labeller/{labeller['version']}/base"

    # `forgectl labels pull` copies the files out of the workspace (on a cluster by a pod: node stage 10)
    pulled = json.loads(ws.forgectl("labels", "pull", "digits-tpe", "--specs", "specs", "--to", str(tmp_path / "pulled"),
                                    "-o", "json").stdout)
    assert pulled["version"] == searched["version"] and {"auto-labels.csv", "report.json", "review.csv"} <= set(pulled["files"])
    assert all((tmp_path / "pulled" / n).read_bytes() == (labels / n).read_bytes() for n in pulled["files"])
    reviewed = tmp_path / "reviewed.csv"
    subprocess.run([runtime_python, "-c", REVIEW, str(labels), str(path), str(reviewed)], check=True, timeout=120)
    merged = json.loads(ws.forgectl("labels", "merge", "digits-labelled", "--reviewed", str(reviewed), "--auto-labels",
                                    str(labels / "auto-labels.csv"), "--specs", "specs", "--commit", "-o", "json").stdout)
    half = report["toReview"] // 2
    assert merged["autoLabelled"] == report["autoLabelled"] and merged["accepted"] == half
    assert merged["rows"] == report["autoLabelled"] + half and merged["shards"] == 7
    shard = merged["shard"]
    assert re.fullmatch(r"labels-[0-9a-f]{12}\.parquet", shard) and shard[7:19] == merged["shardDigest"][7:19]
    assert repo.head.commit.hexsha == merged["commit"] and not repo.is_dirty()
    assert sorted(repo.head.commit.stats.files) == [f"data/digits/{shard}", "specs/dataset.yaml"]
    rows, same_schema = subprocess.run([runtime_python, "-c", SHARD_ROWS, str(path / "data/digits" / shard),
                                        str(path / "data/digits/part-00000.parquet")], check=True, capture_output=True,
                                       text=True, timeout=120).stdout.split()
    assert int(rows) == merged["rows"] and same_schema == "True"
    spec = yaml.safe_load((path / "specs/dataset.yaml").read_text())["spec"]
    assert spec["source"]["shards"]["files"][-1] == {"name": shard, "digest": merged["shardDigest"]}
    assert spec["digest"] == merged["newDigest"] and len(spec["source"]["shards"]["files"]) == 7
    ws.forgectl("validate", "specs")

    plan = " ".join(ws.forgectl("plan", "specs").stdout.split())
    assert plan.count(f"1 added ({shard}), 1 of 4 groups changed) → retrain model") == 2, plan
    for model in ("digits-labeller", "digits-tpe"):
        section = plan.split(f"Model {model} + create")[1]
        hits = section.split("cache hit (unchanged since the last run): ")[1].split(" why:")[0]
        runs = section.split("will run: ")[1]
        assert hits.split(", ") == groups, plan  # the three groups of the six shards: cache hits
        assert re.match(r"group\(3:[0-9a-f]{32}\), prepare-data, ", runs), plan  # only the new shard's group prepares

    again = ws.forgectl("labels", "merge", "digits-labelled", "--reviewed", str(reviewed), "--auto-labels",
                        str(labels / "auto-labels.csv"), "--specs", "specs", check=False)
    assert again.returncode == 1 and "were made for" in again.stderr and "nothing merged" in again.stderr, again.stderr
    assert not repo.is_dirty()

    # applied: the six shards' groups are cache hits in both Workflows, the new shard's group prepares once
    ws.forgectl("apply", "specs", "--auto-approve")
    second = [w for w in ws.status()["workflows"] if w["name"] not in {x["name"] for x in workflows.values()}]
    assert sorted(w["phase"] for w in second) == ["Succeeded", "Succeeded"], second
    new_group = re.search(r"will run: (group\(3:[0-9a-f]{32}\))", plan)
    assert new_group is not None
    prepared = [(s["step"], s["status"]) for w in second for s in w["steps"] if s["step"].startswith("group(")]
    assert sorted(prepared) == sorted([*((g, "cached") for g in groups for _ in range(2)),
                                       (new_group[1], "cached"), (new_group[1], "succeeded")]), prepared
    manifest = json.loads((workspace / "data" / "digits-labelled" / merged["newDigest"][7:19] / "manifest.json").read_text())
    assert manifest["digest"] == merged["newDigest"] and len(manifest["groups"]) == 4
    assert sum(manifest["rows"].values()) == 1200 + merged["rows"]  # the six shards' rows and the merged ones
    # the next version's autolabel step skips the rows merged into the data set: not offered again
    reports = [json.loads(p.read_text()) for p in (workspace / "models" / "digits-tpe").glob("*/labels/report.json")]
    [following] = [r for r in reports if r["datasetDigest"] == merged["newDigest"]]
    assert following["alreadyInDataset"] == merged["rows"] and following["unlabelledRows"] == 597
    assert following["rows"] == 597 - merged["rows"] == following["autoLabelled"] + following["toReview"]
