"""Fixtures of the registry tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reconciler.targets.local.records import ingest_local
from reconciler.targets.local.state import StateDB
from tests.registry.sample import V1, V2, project, rendered, write_run


@pytest.fixture()
def local_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A project folder whose local target holds two finished quick-start runs (one recorded when
    it finished, one only as a live Workflow: the registry backfills it) and the endpoint serving."""
    specs = project(tmp_path, "0.003")
    wf1, _, _ = rendered(project(tmp_path / "old"), "1111111aaaaa")
    wf2, manifests, _ = rendered(specs, "2222222bbbbb")
    monkeypatch.chdir(tmp_path)
    state = tmp_path / ".forge" / "local"
    db = StateDB(state / "state.db")
    workspace = state / "workspace"
    write_run(workspace, wf1, V1, 0.9638)
    write_run(workspace, wf2, V2, 0.9738)
    ingest_local(db, workspace, wf1, "local", registered=1000.0)
    db.put({**wf1, "status": {"phase": "Succeeded"}})
    db.put({**wf2, "status": {"phase": "Succeeded"}})  # not ingested: `models` backfills it
    seldon = next(m for m in manifests if m["kind"] == "SeldonDeployment")
    db.put(seldon)
    db.set_rollout("digits", {"phase": "Promoted", "stable": wf2["metadata"]["labels"]["forge.dev/model-version"], "canary": None})
    return {"v1": wf1["metadata"]["labels"]["forge.dev/model-version"], "v2": wf2["metadata"]["labels"]["forge.dev/model-version"]}
