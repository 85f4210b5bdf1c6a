"""Real git repositories of the examples for pull-request plans: copy an example, commit it, edit
it as a pull request would, and run the real `forgectl plan --base` on it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import git

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parent / "golden"
#: No cluster is ever reached: a kubeconfig that does not exist.
NO_KUBECONFIG = "/nonexistent/forge-plan-tests/kubeconfig"
#: Digests and versions: 10 to 64 hex digits with at least one letter (a number is left alone).
_HEX = re.compile(r"\b(?=[0-9]*[a-f])[0-9a-f]{10,64}\b")


@dataclass
class Run:
    """One `forgectl` run."""

    returncode: int
    stdout: str
    stderr: str

    def json(self) -> dict[str, Any]:
        return json.loads(self.stdout)


@dataclass
class PlanRepo:
    """An example committed as the base revision of a repository, edited in its working tree."""

    root: Path
    repo: git.Repo

    @classmethod
    def of(cls, tmp_path: Path, example: str) -> PlanRepo:
        root = tmp_path / example
        shutil.copytree(ROOT / "examples" / example, root)
        repo = git.Repo.init(root)
        with repo.config_writer() as config:
            config.set_value("user", "name", "Forge Tests").set_value("user", "email", "tests@forge.invalid")
        repo.git.add(".")
        repo.index.commit(f"{example} as in examples/")
        return cls(root, repo)

    def edit(self, file: str, old: str, new: str, count: int = 1) -> None:
        path = self.root / file
        text = path.read_text()
        assert text.count(old) >= count, f"{file}: {old!r} not found"
        path.write_text(text.replace(old, new, count))

    def commit(self, message: str) -> None:
        self.repo.git.add(".")
        self.repo.index.commit(message)

    def forgectl(self, *args: str, timeout: int = 120) -> Run:
        env = {**os.environ, "KUBECONFIG": NO_KUBECONFIG, "COLUMNS": "200", "NO_COLOR": "1"}
        env.pop("FORGE_DEBUG", None)
        proc = subprocess.run([sys.executable, "-m", "forgectl", *args], cwd=self.root, capture_output=True, text=True,
                              env=env, timeout=timeout)
        return Run(proc.returncode, proc.stdout, proc.stderr)


def normalize(text: str) -> str:
    """Content digests and versions (which move with every renderer change) as `<hex>`."""
    return _HEX.sub("<hex>", text)


def review_json(plan: dict[str, Any]) -> str:
    """The review part of a plan's JSON (what the golden files pin), normalized."""
    keep = {k: plan.get(k) for k in ("environment", "target", "base", "head", "summary", "blockers", "risks",
                                     "specChanges", "cost", "rollouts")}
    return normalize(json.dumps(keep, indent=2, ensure_ascii=False, sort_keys=False)) + "\n"


def check_golden(name: str, text: str, update: bool) -> None:
    path = GOLDEN / name
    if update:
        path.write_text(text)
        return
    assert path.is_file(), f"missing {path}; run with --update-golden"
    assert text == path.read_text(), f"{path} differs; if intended, refresh with --update-golden"
