"""Promise 3 — containment: every path a spec names (data sources, state) resolves inside the root
the Environment declares; symlinks leading out, devices and FIFOs are refused; sizes are checked
before reading. Spec files themselves are read the same way. Each case runs the real CLI with a
timeout: a FIFO that blocked a reader, or /dev/zero read to the end, would fail it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from specs.safety import OutsideRoot, resolve_inside
from tests.security.helpers import BASE, DIGEST, Project, assert_diagnostic, doc, snapshot


def dataset(uri: str, fmt: str = "csv") -> str:
    return doc("Dataset", f'source: {{uri: "{uri}", format: {fmt}}}\nversion: "1"\ndigest: {DIGEST}\nlabeling: {{column: y}}\n',
               name="data")


LEXICAL = [
    ("absolute-file", dataset("file:///etc/passwd"), "must be relative to the Environment's `root`"),
    ("dotdot-file", dataset("file://../outside/secret.csv"), "must stay inside the Environment's `root` (no `..`)"),
    ("dotdot-inner", dataset("file://data/../../outside/secret.csv"), "must stay inside the Environment's `root`"),
    ("home-text", dataset("text://~/.ssh/id_rsa", "text"), "must be relative to the Environment's `root` (no absolute path, no `~`)"),
    ("dotdot-pvc", dataset("pvc://claim/../../etc", "npz"), "(no `..`)"),
    ("backslash", dataset("file://..\\\\outside\\\\secret.csv"), "holds a backslash"),
    ("control-char", dataset("file://data/a\\x1b[2Jb.csv"), "holds a control character"),
]


@pytest.mark.parametrize("case", LEXICAL, ids=[c[0] for c in LEXICAL])
def test_source_paths_that_leave_the_root(tmp_path: Path, case: tuple[str, str, str]) -> None:
    _, text, message = case
    project = Project.create(tmp_path)
    project.write("case.yaml", text)
    before = snapshot(project.outside), snapshot(project.root)
    assert_diagnostic(project.run("validate", "specs"), "case.yaml", 6, message)
    project.assert_untouched(*before)


@pytest.mark.parametrize("field,value,line,message", [
    ("stateDir", "../outside", 7, "stateDir '../outside' must stay inside the Environment's `root`"),
    ("stateDir", "/tmp/forge-state", 7, "must be relative to the Environment's `root`"),
    ("root", "..", 6, "root '..' must stay inside"),
    ("root", "/", 6, "root '/' must be relative"),
])
def test_environment_paths_that_leave(tmp_path: Path, field: str, value: str, line: int, message: str) -> None:
    project = Project.create(tmp_path)
    body = f"root: '{value}'\n" if field == "root" else f"local:\n  stateDir: '{value}'\n"
    project.write("case.yaml", doc("Environment", body + "defaults: {computeRef: cpu}\n", name="elsewhere"))
    before = snapshot(project.outside), snapshot(project.root)
    assert_diagnostic(project.run("validate", "specs"), "case.yaml", line, message)
    project.assert_untouched(*before)


def test_symlinked_data_file_leading_out(tmp_path: Path) -> None:
    project = Project.create(tmp_path)
    (project.root / "data").mkdir()
    (project.root / "data" / "train.csv").symlink_to(project.outside / "secret.csv")
    project.write("case.yaml", dataset("file://data/train.csv"))
    before = snapshot(project.outside)
    run = project.run("validate", "specs")
    assert_diagnostic(run, "case.yaml", 6, f"source 'data/train.csv' leads to {project.outside / 'secret.csv'}, outside "
                                           f"{project.root} (through a symlink)")
    project.assert_untouched(before)


def test_symlinked_data_folder_leading_out(tmp_path: Path) -> None:
    project = Project.create(tmp_path)
    (project.root / "data").symlink_to(project.outside)
    project.write("case.yaml", dataset("file://data/secret.csv"))
    assert_diagnostic(project.run("validate", "specs"), "case.yaml", 6, "outside")


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_data_source_that_is_a_fifo_or_device(tmp_path: Path, kind: str) -> None:
    project = Project.create(tmp_path)
    (project.root / "data").mkdir()
    target = project.root / "data" / "train.csv"
    if kind == "fifo":
        os.mkfifo(target)
    else:
        (project.root / "data" / "dev").mkdir()
        target = project.root / "data" / "dev" / "zero.csv"
        # A device node needs root to create; a symlink to /dev/zero is what a PR can commit.
        target.symlink_to("/dev/zero")
    project.write("case.yaml", dataset(f"file://{target.relative_to(project.root)}"))
    run = project.run("validate", "specs", timeout=30)
    expected = "is a FIFO, not a regular file or folder" if kind == "fifo" else "outside"
    assert_diagnostic(run, "case.yaml", 6, expected)


def test_data_source_that_is_a_folder(tmp_path: Path) -> None:
    project = Project.create(tmp_path)
    (project.root / "data").mkdir()
    project.write("case.yaml", dataset("file://data"))
    assert_diagnostic(project.run("validate", "specs"), "case.yaml", 6, "source 'data' is a folder, not a file")


def test_state_dir_symlinked_out_refuses_plan_before_writing(tmp_path: Path) -> None:
    """`.forge` → a folder outside: validate names it, and `plan` (which opens the local state)
    refuses before creating anything there."""
    project = Project.create(tmp_path)
    (project.root / ".forge").symlink_to(project.outside)
    before = snapshot(project.outside)
    run = project.run("validate", "specs")
    assert_diagnostic(run, "base.yaml", 4, f"stateDir '.forge/local' leads to {project.outside / 'local'}, outside")
    plan = project.run("plan", "specs")
    assert plan.returncode == 1 and "leads to" in plan.stderr, plan.output
    project.assert_untouched(before)


def test_plan_on_the_local_target_writes_only_inside_its_state_dir(tmp_path: Path) -> None:
    """Positive control: a plan of valid specs writes its state under `<root>/.forge` and nowhere else."""
    project = Project.create(tmp_path)
    before = snapshot(project.outside)
    run = project.run("plan", "specs")
    assert run.returncode == 0, run.output
    written = {p for p in snapshot(project.root) if not p.startswith("specs")}
    assert written and all(p.startswith(".forge") for p in written), written
    project.assert_untouched(before)


def test_environment_root_moves_the_state_inside_it(tmp_path: Path) -> None:
    project = Project.create(tmp_path, BASE.replace("target: local, default: true,", "target: local, default: true, root: ml,"))
    (project.root / "ml").mkdir()
    run = project.run("plan", "specs")
    assert run.returncode == 0, run.output
    assert (project.root / "ml" / ".forge" / "local").is_dir()
    assert not (project.root / ".forge").exists()


# --- spec files themselves ---------------------------------------------------------------------

def test_spec_file_fifo_does_not_hang(tmp_path: Path) -> None:
    project = Project.create(tmp_path)
    os.mkfifo(project.root / "specs" / "pipe.yaml")
    run = project.run("validate", "specs", timeout=30)
    assert_diagnostic(run, "pipe.yaml", 1, "is a FIFO (named pipe), not a regular file")


def test_spec_file_named_on_the_command_line_as_a_fifo(tmp_path: Path) -> None:
    project = Project.create(tmp_path)
    os.mkfifo(project.root / "specs" / "pipe.yaml")
    run = project.run("validate", "specs/pipe.yaml", timeout=30)
    assert_diagnostic(run, "pipe.yaml", 1, "is a FIFO")


@pytest.mark.parametrize("target", ["/dev/zero", "/dev/urandom", "/proc/self/environ", "/etc/hostname"])
def test_spec_symlink_leading_out_is_not_read(tmp_path: Path, target: str) -> None:
    project = Project.create(tmp_path)
    (project.root / "specs" / "link.yaml").symlink_to(target)
    run = project.run("validate", "specs", timeout=30)
    assert_diagnostic(run, "link.yaml", 1, "outside the project")


def test_spec_symlink_inside_the_project_is_followed(tmp_path: Path) -> None:
    project = Project.create(tmp_path)
    shared = project.root / "shared"
    shared.mkdir()
    (shared / "extra.yaml").write_text(doc("Compute", "accelerator: {type: cpu}\n", name="other"))
    project.git_init()  # the project is the git work tree: `shared/` is inside it
    (project.root / "specs" / "extra.yaml").symlink_to(shared / "extra.yaml")
    run = project.run("validate", "specs")
    assert run.returncode == 0, run.output


def test_huge_sparse_spec_file_is_refused_before_reading(tmp_path: Path) -> None:
    project = Project.create(tmp_path)
    with open(project.root / "specs" / "huge.yaml", "wb") as fh:
        fh.truncate(8 * 1024**3)  # 8 GiB, sparse: reading it whole would take the memory
    run = project.run("validate", "specs", timeout=30)
    assert_diagnostic(run, "huge.yaml", 1, "file is 8,589,934,592 bytes; spec files may be at most 4,194,304")


def test_symlink_spec_committed_to_git_is_refused_at_a_revision(tmp_path: Path) -> None:
    project = Project.create(tmp_path)
    (project.root / "specs" / "link.yaml").symlink_to("/etc/hostname")
    project.git_init()
    run = project.run("validate", "specs", "--rev", "HEAD")
    assert_diagnostic(run, "link.yaml", 1, "is a symlink in git; spec files must be regular files")


def test_symlinked_folder_is_not_walked(tmp_path: Path) -> None:
    project = Project.create(tmp_path)
    (project.outside / "evil.yaml").write_text("not: [valid\n")
    (project.root / "specs" / "more").symlink_to(project.outside)
    run = project.run("validate", "specs")
    assert run.returncode == 0, run.output


# --- the same rule where the data is read (local target, prepare step) -----------------------------

def test_resolve_inside(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "data").mkdir(parents=True)
    (root / "data" / "ok.csv").write_text("x")
    (root / "data" / "out.csv").symlink_to(tmp_path)
    os.mkfifo(root / "data" / "pipe.csv")
    assert resolve_inside(root, "data/ok.csv") == (root / "data" / "ok.csv").resolve()
    assert resolve_inside(root, "data/missing.csv") == (root / "data" / "missing.csv").resolve()
    for bad, message in [("data/out.csv", "outside"), ("../x", "stay inside"), ("/etc/passwd", "stay inside"),
                         ("data/pipe.csv", "is a FIFO")]:
        with pytest.raises(OutsideRoot, match=message):
            resolve_inside(root, bad)


@pytest.mark.runtime
@pytest.mark.parametrize("uri,expected", [
    ("file://data/link.csv", "outside"),
    ("file://data/pipe.csv", "is a FIFO"),
])
def test_prepare_step_refuses_a_source_leading_out(tmp_path: Path, runtime_python: str, uri: str, expected: str) -> None:
    """The real prepare step (runtime environment) applies the same rule where it reads the data: a
    symlink out of the source root or a FIFO fails the step with a message, nothing is read."""
    from devkit.runtime_steps import Runner

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "link.csv").symlink_to("/etc/passwd")
    os.mkfifo(tmp_path / "data" / "pipe.csv")
    spec = {"source": {"uri": uri, "format": "csv"}, "version": "1", "digest": DIGEST, "labeling": {"column": "y"}}
    proc = Runner(runtime_python, tmp_path).run("prepare", {"step": "prepare", "dataset": "data", "spec": spec,
                                                            "output": "out"}, timeout=120, check=False)
    assert proc.returncode != 0
    assert expected in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "out").exists()


def test_specs_folder_that_is_a_symlink_out_is_not_read(tmp_path: Path) -> None:
    """A PR can make `specs` itself a symlink (to /etc, to the runner's home): the folder named on
    the command line is walked, but every file in it leads out of the project and is refused —
    its content never reaches a diagnostic."""
    project = Project.create(tmp_path)
    (project.outside / "token.yaml").write_text("apiVersion: forge.dev/v1alpha1\nkind: Secret-ghp_abcdef\n")
    (project.root / "specs" / "base.yaml").rename(project.root / "base.yaml")
    (project.root / "specs").rmdir()
    (project.root / "specs").symlink_to(project.outside)
    for git_repo in (False, True):
        if git_repo:
            project.git_init()
        run = project.run("validate", "specs")
        assert_diagnostic(run, "token.yaml", 1, "outside the project")
        assert "ghp_abcdef" not in run.output
