"""The pull-request plan (`forgectl plan --base`, `reconciler/plan/pullrequest.py`) of a real git
repository: its notes on the live diff."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.diagnostics import ForgeError
from reconciler.plan.pullrequest import pull_request_plan
from tests.reconciler.quickstart_repo import committed_quickstart


def test_pull_request_plan_of_a_local_environment_has_no_live_diff(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, repo, _ = committed_quickstart(tmp_path, writeback=False)
    monkeypatch.chdir(root)
    plan = pull_request_plan(["."], "HEAD~1", "HEAD", None)
    assert (plan["base"], plan["head"]) == ("HEAD~1", "HEAD")
    assert "no live diff: the environment's target is not a cluster" in plan["notes"]
    assert "live" not in plan
    assert plan["summary"]["create"] >= 1  # the learning rate's new model version: a new Workflow
    assert any(c["path"].endswith("learningRate") for c in plan["specChanges"])
    working = pull_request_plan(["."], "HEAD", None, None)
    assert working["head"] == "working tree" and working["specChanges"] == []
    assert (working["summary"]["create"], working["summary"]["update"], working["summary"]["delete"]) == (0, 0, 0)


def test_pull_request_plan_reads_the_cluster_only_where_the_base_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, repo, _ = committed_quickstart(tmp_path, writeback=False)
    monkeypatch.chdir(root)
    envs = root / "environments.yaml"
    envs.write_text(envs.read_text().replace("namespace: forge-quickstart", "namespace: elsewhere"))
    from reconciler.plan.session import TargetOptions

    plan = pull_request_plan(["."], "HEAD", None, "cluster", TargetOptions(kubeconfig="/nonexistent/forge-tests/kubeconfig"))
    notes = "\n".join(plan["notes"])
    assert "environment `cluster` changes its cluster settings; the live diff uses those at HEAD" in notes
    assert "no live diff: " in notes and "live" not in plan  # no cluster answers at a kubeconfig that does not exist
    with pytest.raises(ForgeError, match="no environment 'nope' in the specs"):
        pull_request_plan(["."], "HEAD", None, "nope")
