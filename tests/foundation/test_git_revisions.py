"""`forgectl validate --rev` reads specs from a past revision of a real git repository."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import git
import pytest
from typer.testing import CliRunner

from forgectl.cli import app

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> git.Repo:
    """A repository whose first commit holds the valid quick-start and whose second breaks it."""
    work = tmp_path / "ml-repo"
    shutil.copytree(ROOT / "examples" / "quickstart", work / "specs")
    r = git.Repo.init(work)
    r.config_writer().set_value("user", "name", "Forge Test").set_value("user", "email", "t@example.com").release()
    r.index.add(["specs"])
    r.index.commit("quickstart")
    model = work / "specs" / "model.yaml"
    model.write_text(model.read_text().replace("precision: fp32", "precision: fp8"))
    r.index.add(["specs/model.yaml"])
    r.index.commit("break precision")
    monkeypatch.chdir(work)
    return r


def test_head_is_invalid_and_previous_revision_valid(repo: git.Repo) -> None:
    head = CliRunner().invoke(app, ["validate", "specs", "--output", "json"])
    assert head.exit_code == 1
    [diag] = json.loads(head.stdout)["diagnostics"]
    assert diag["file"] == "specs/model.yaml" and diag["path"] == "spec.precision"

    previous = CliRunner().invoke(app, ["validate", "specs", "--rev", "HEAD~1", "--output", "json"])
    assert previous.exit_code == 0, previous.output
    assert json.loads(previous.stdout)["valid"] is True

    at_head = CliRunner().invoke(app, ["validate", "specs", "--rev", "HEAD", "--output", "json"])
    assert at_head.exit_code == 1


def test_rev_ignores_uncommitted_changes(repo: git.Repo) -> None:
    (Path(repo.working_dir) / "specs" / "endpoint.yaml").write_text("not: [valid\n")
    result = CliRunner().invoke(app, ["validate", "specs", "--rev", "HEAD~1"])
    assert result.exit_code == 0, result.output


def test_unknown_revision_is_a_clear_error(repo: git.Repo) -> None:
    from reconciler.diagnostics import ForgeError
    from reconciler.load.sources import files_from_git

    with pytest.raises(ForgeError, match="unknown git revision 'nope'"):
        files_from_git(["specs"], "nope")
