"""Where a Dataset's data is read on a cluster: each `pvc://` claim its source and auto-labeling's
`unlabelled` rows name is a read-only Workflow volume, mounted at the workspace's `pvc/<claim>`
by the steps that read the data — and by no other; Argo's own validator accepts the Workflow."""

from __future__ import annotations

import hashlib
from typing import Any

from reconciler.load.loader import LoadResult, load_files
from reconciler.load.sources import SourceFile
from reconciler.targets.local import upstream
from renderers import RenderContext, render
from tests.trust.test_autolabel_workflow import CLASSES, SCANS, SPECS


def _load(source: str, unlabelled: str) -> LoadResult:
    text = SPECS.format(labeller="labeller", model_ref="labeller", classes=CLASSES,
                        digest="sha256:" + hashlib.sha256(SCANS.encode()).hexdigest())
    text = text.replace('uri: "file://data/scans.csv"', f'uri: "{source}"').replace(
        "unlabelled: file://data/unlabelled.csv", f"unlabelled: {unlabelled}")
    return load_files([SourceFile("specs.yaml", text.encode())])


def _student(result: LoadResult) -> dict[str, Any]:
    assert result.ok, result.diagnostics
    env = result.specs.environment("cluster")
    assert env is not None
    return next(m for m in render(result.specs, RenderContext(env, revision="0123456789ab")).manifests
                if m["kind"] == "Workflow" and m["metadata"]["name"].startswith("student-"))


def _mounted(wf: dict[str, Any]) -> dict[str, list[str]]:
    """Step template → the paths of the claims it mounts."""
    return {t["name"]: sorted(m["mountPath"] for m in t["container"]["volumeMounts"] if m["name"].startswith("dataset-source"))
            for t in wf["spec"]["templates"] if "container" in t and any(
                m["name"].startswith("dataset-source") for m in t["container"].get("volumeMounts", []))}


def test_the_claims_of_the_source_and_the_unlabelled_rows_are_mounted_read_only_by_the_readers() -> None:
    wf = _student(_load("pvc://scans/data/scans.csv", "pvc://inbox/unlabelled.csv"))
    volumes = [v for v in wf["spec"]["volumes"] if v["name"].startswith("dataset-source")]
    assert volumes == [{"name": "dataset-source", "persistentVolumeClaim": {"claimName": "scans", "readOnly": True}},
                       {"name": "dataset-source-1", "persistentVolumeClaim": {"claimName": "inbox", "readOnly": True}}]
    both = ["/forge/workspace/pvc/inbox", "/forge/workspace/pvc/scans"]
    assert _mounted(wf) == {"prepare-data": both, "autolabel": both}
    assert all(m.get("readOnly") for t in wf["spec"]["templates"] if "container" in t
               for m in t["container"]["volumeMounts"] if m["name"].startswith("dataset-source"))
    # one claim for both: one volume
    one = _student(_load("pvc://scans/data/scans.csv", "pvc://scans/data/unlabelled.csv"))
    assert [v["name"] for v in one["spec"]["volumes"] if v["name"].startswith("dataset-source")] == ["dataset-source"]
    # files of the repository: nothing mounted
    assert _mounted(_student(_load("file://data/scans.csv", "file://data/unlabelled.csv"))) == {}
    assert upstream.argo_validate_many([wf, one]) == [[], []]
