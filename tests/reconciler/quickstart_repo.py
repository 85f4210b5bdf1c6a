"""The quick-start example copied into a test's folder: as specs, or committed twice in a real git
repository (the second commit changes the learning rate)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import git

from reconciler.load.loader import load_or_raise

ROOT = Path(__file__).resolve().parents[2]


def copied_example(tmp_path: Path, example: str = "quickstart") -> Any:
    """The example copied into ``tmp_path``, loaded (a LoadResult)."""
    root = tmp_path / example
    shutil.copytree(ROOT / "examples" / example, root)
    return load_or_raise([str(root)])


def committed_quickstart(tmp_path: Path, writeback: bool) -> tuple[Path, git.Repo, str]:
    """The quick-start committed twice: the second commit changes the learning rate."""
    root = tmp_path / "quickstart"
    shutil.copytree(ROOT / "examples" / "quickstart", root)
    if writeback:
        policy = root / "rollout.yaml"
        policy.write_text(policy.read_text().replace("  onPrometheusUnreachable: hold",
                                                     "  onPrometheusUnreachable: hold\n  gitWriteback:\n    enabled: true"))
    repo = git.Repo.init(root)
    with repo.config_writer() as config:
        config.set_value("user", "name", "Forge Tests").set_value("user", "email", "tests@forge.invalid")
    repo.git.add(".")
    first = repo.index.commit("quick-start").hexsha
    model = root / "model.yaml"
    model.write_text(model.read_text().replace("learningRate: 0.002", "learningRate: 0.003"))
    repo.git.add(".")
    repo.index.commit("learning rate 0.003")
    return root, repo, first
