"""The hostile-input corpus's tools: a project folder with a valid base set of specs, the real
`forgectl` run as a subprocess with a timeout (a hang fails the test instead of blocking it), and
the evidence that nothing ran and nothing was written: marker files, folder snapshots, and a scan
of /proc for any process carrying a test's unique token."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import git

HEAD = "apiVersion: forge.dev/v1alpha1\n"
DIGEST = "sha256:" + "1" * 64

#: A valid base: a local default Environment, a cluster Environment, data, a CPU pool, a model, a
#: canary policy whose PromQL uses label matchers, and an endpoint.
BASE = f"""\
{HEAD}kind: Environment
metadata: {{name: local}}
spec: {{target: local, default: true, defaults: {{computeRef: cpu, rolloutPolicyRef: canary}}}}
---
{HEAD}kind: Environment
metadata: {{name: cluster}}
spec:
  target: kubernetes
  kubernetes: {{namespace: team-a}}
  defaults: {{computeRef: cpu, rolloutPolicyRef: canary}}
---
{HEAD}kind: Dataset
metadata: {{name: digits}}
spec:
  source: {{uri: "sklearn://digits", format: sklearn}}
  version: "1"
  digest: {DIGEST}
---
{HEAD}kind: Compute
metadata: {{name: cpu}}
spec: {{accelerator: {{type: cpu}}}}
---
{HEAD}kind: Model
metadata: {{name: base-model}}
spec: {{datasetRef: digits, architecture: {{type: mlp}}}}
---
{HEAD}kind: RolloutPolicy
metadata: {{name: canary}}
spec:
  strategy: canary
  canary: {{steps: [{{weight: 50, analysis: [errors]}}, {{weight: 100}}]}}
  metrics:
    - name: errors
      query: 'sum(rate(forge_requests_total{{endpoint="{{endpoint}}",role="{{role}}",code=~"5.."}}[{{window}}]))'
      max: 1
---
{HEAD}kind: Endpoint
metadata: {{name: web}}
spec: {{modelRef: base-model}}
"""


def doc(kind: str, body: str, name: str = "x", metadata: str = "") -> str:
    """A document whose `spec:` is ``body``; `spec:` is on line 5 (+ lines of ``metadata``), so the
    body's first line is line 6."""
    meta = textwrap.indent(textwrap.dedent(metadata), "  ") if metadata else ""
    return f"{HEAD}kind: {kind}\nmetadata:\n  name: {name}\n{meta}spec:\n" + textwrap.indent(textwrap.dedent(body), "  ")


def forgectl_command() -> list[str]:
    """The installed console script next to this Python (what CI runs), else `python -m forgectl`."""
    script = Path(sys.executable).parent / "forgectl"
    return [str(script)] if script.exists() else [sys.executable, "-m", "forgectl"]


@dataclass
class Run:
    """One finished `forgectl` run."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def forgectl(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 60,
             command: list[str] | None = None) -> Run:
    """Run the real CLI; fail (not block) past ``timeout``; never accept a traceback."""
    full = {**os.environ, "KUBECONFIG": str(cwd.parent / "runner-has-no-kubeconfig"), "NO_COLOR": "1",
            "COLUMNS": "200", **(env or {})}
    full.pop("FORGE_DEBUG", None)
    argv = [*(command or forgectl_command()), *args]
    try:
        proc = subprocess.run(argv, cwd=cwd, env=full, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:  # pragma: no cover - the failure this corpus guards against
        raise AssertionError(f"forgectl {' '.join(args)} did not finish in {timeout} s (a hang)") from exc
    run = Run(list(args), proc.returncode, proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace"))
    assert "Traceback" not in run.output, run.output
    assert "internal error" not in run.output, run.output
    return run


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``folder`` (symlinks not followed) with its size and mtime."""
    found = {}
    for base, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = Path(base) / name
            info = path.lstat()
            found[str(path.relative_to(folder))] = (info.st_size, info.st_mtime_ns)
    return found


def processes_with(token: str) -> list[int]:
    """PIDs of live processes whose command line holds ``token``."""
    pids = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if token.encode() in cmdline:
            pids.append(int(entry.name))
    return pids


@dataclass
class Project:
    """A folder of specs to attack, with a sibling `outside/` folder that must stay untouched and a
    unique token for marker files and process scans."""

    root: Path
    outside: Path
    token: str = field(default_factory=lambda: "forge-hostile-" + uuid.uuid4().hex[:12])

    @classmethod
    def create(cls, tmp_path: Path, base: str = BASE) -> Project:
        root = tmp_path / "project"
        (root / "specs").mkdir(parents=True)
        (root / "specs" / "base.yaml").write_text(base)
        outside = tmp_path / "outside"
        outside.mkdir()
        (outside / "secret.csv").write_text("a,b\n1,2\n")
        return cls(root, outside)

    def write(self, name: str, text: str | bytes) -> Path:
        path = self.root / "specs" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text)
        return path

    @property
    def marker(self) -> Path:
        """The file a hostile command or import would create (outside the project)."""
        return self.outside / f"{self.token}.ran"

    def run(self, *args: str, **kwargs) -> Run:
        return forgectl(*args, cwd=self.root, **kwargs)

    def git_init(self) -> git.Repo:
        repo = git.Repo.init(self.root)
        with repo.config_writer() as cfg:
            cfg.set_value("user", "name", "Forge Test").set_value("user", "email", "t@example.com")
        repo.git.add(A=True)
        repo.index.commit("base")
        return repo

    def assert_untouched(self, before_outside: dict, before_project: dict | None = None) -> None:
        """Nothing ran (no marker, no process with the token) and nothing was written."""
        assert not self.marker.exists(), f"{self.marker} exists: something ran"
        assert not list(self.outside.glob(f"{self.token}*")), "something wrote next to the marker"
        assert processes_with(self.token) == [], "a process started by the hostile input is alive"
        assert snapshot(self.outside) == before_outside, "the folder outside the project changed"
        if before_project is not None:
            assert snapshot(self.root) == before_project, "the project changed"


def diagnostics(run: Run, name: str) -> list[tuple[int, int, str]]:
    """(line, column, rest) of every `file:line:col: error: …` line about the spec file ``name``."""
    found = []
    for line in run.stderr.splitlines():
        match = re.match(r"^(?P<file>.+?):(?P<line>\d+):(?P<col>\d+): error: (?P<rest>.*)$", line)
        if match and Path(match["file"]).name == name:
            found.append((int(match["line"]), int(match["col"]), match["rest"]))
    return found


def assert_diagnostic(run: Run, name: str, line: int, message: str) -> None:
    """Exit 1, and an error on ``name``:``line`` whose text holds ``message``."""
    assert run.returncode == 1, run.output
    found = diagnostics(run, name)
    assert any(message in rest and at == line for at, _, rest in found), (
        f"no error with {message!r} on {name}:{line}; got {found}\n{run.stderr}"
    )


def copy_examples(target: Path, example: str = "quickstart") -> None:
    root = Path(__file__).resolve().parents[2]
    shutil.copytree(root / "examples" / example, target)
