"""Promise 1, git's half (issue 28) — git takes no orders from the tree it reads: `validate`,
`render` and `plan --base` open exactly the repository of the working directory, refuse a spec tree
holding a git directory of its own, run every git command closed (no system, global or caller
configuration, no hooks, fsmonitor, filters, transports or replace objects), and compare the real
base commit; every git failure is a one-line diagnostic.

Each attack plants a script that leaves a marker file if anything runs it, wired to every key git
could be told to run it by (fsmonitor, hooks, remote helpers behind a lazy fetch, filters, ssh,
pager, credential helper …), then runs the real CLI under a timeout and checks the exit status,
the diagnostic and that no marker was written — the marker first, right after each run, so a run
that both fails and lets the payload run reports the payload.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.security.helpers import BASE, Project, assert_diagnostic, diagnostics, forgectl, snapshot

#: The head of a pull request: the base Model trains for 3 epochs.
HEAD_CHANGE = BASE.replace("{type: mlp}}", "{type: mlp}, hyperparameters: {epochs: 3}}")
#: Hooks git knows; each is a copy of the payload wherever a hook folder is planted.
HOOKS = ("reference-transaction", "post-checkout", "post-commit", "pre-commit", "post-index-change", "pre-auto-gc",
         "fsmonitor-watchman", "post-rewrite", "pre-push", "post-merge")


def git(*args: str, cwd: Path, input: bytes | None = None) -> str:
    """The test's own git (setting up the attack), with a fixed identity."""
    done = subprocess.run(["git", "-c", "user.name=Attacker", "-c", "user.email=a@example.com", *args], cwd=cwd,
                          input=input, capture_output=True, check=True, timeout=60)
    return done.stdout.decode().strip()


def payload(project: Project, tmp_path: Path) -> Path:
    """A script that appends its arguments to the marker when anything runs it, with a hooks folder
    of copies of it next to it."""
    folder = tmp_path / "attacker"
    (folder / "hooks").mkdir(parents=True, exist_ok=True)
    script = folder / "payload.sh"
    script.write_text(f'#!/bin/sh\necho "$0 $*" >> {project.marker}\ncat >/dev/null 2>&1 </dev/null\nexit 0\n')
    script.chmod(0o755)
    for hook in HOOKS:
        shutil.copy(script, folder / "hooks" / hook)
    return script


def hostile_config(script: Path, *, partial: bool = True) -> str:
    """A git config that would run ``script`` in every way a config can make git run a program."""
    config = f"""\
[core]
\trepositoryformatversion = 1
\tbare = false
\tfsmonitor = {script}
\thooksPath = {script.parent / "hooks"}
\tsshCommand = {script}
\tgitProxy = {script}
\taskPass = {script}
\tpager = {script}
\talternateRefsCommand = {script}
\teditor = {script}
[diff]
\texternal = {script}
[diff "evil"]
\ttextconv = {script}
[filter "evil"]
\tclean = {script}
\tsmudge = {script}
\trequired = true
[credential]
\thelper = !{script}
[uploadpack]
\tpackObjectsHook = {script}
[protocol "ext"]
\tallow = always
[protocol]
\tallow = always
[status]
\tsubmoduleSummary = true
[gpg]
\tprogram = {script}
[log]
\tshowSignature = true
[pager]
\tstatus = {script}
[remote "origin"]
\turl = ext::{script} %S
\tfetch = +refs/heads/*:refs/remotes/origin/*
"""
    if partial:
        config += """\
\tpromisor = true
\tpartialclonefilter = blob:none
[extensions]
\tpartialClone = origin
"""
    return config


def fake_git_dir(folder: Path, project: Project, config: str, *, objects: bool) -> None:
    """Plain files that make git take ``folder`` for a repository: HEAD, refs/, objects/, config.
    With ``objects``, the project's real objects are copied in (a working repository); without,
    every object is missing (a partial clone, whose missing objects git fetches from the remote).
    Bare: git run inside it takes it for the repository."""
    real = project.root / ".git"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "HEAD").write_text((real / "HEAD").read_text())
    shutil.copytree(real / "refs", folder / "refs", dirs_exist_ok=True)
    if objects:
        shutil.copytree(real / "objects", folder / "objects", dirs_exist_ok=True)
        if (real / "index").exists():
            shutil.copy(real / "index", folder / "index")
    else:
        (folder / "objects" / "info").mkdir(parents=True, exist_ok=True)
        (folder / "objects" / "pack").mkdir(exist_ok=True)
        (folder / "refs" / "heads").mkdir(parents=True, exist_ok=True)
    (folder / "config").write_text(config.replace("\tbare = false", "\tbare = true"))


def attacked(tmp_path: Path) -> tuple[Project, Path]:
    """A committed project and its attacker's payload."""
    project = Project.create(tmp_path)
    project.git_init()
    return project, payload(project, tmp_path)


COMMANDS = {
    "render": ["render", "specs"],
    "validate-rev": ["validate", "specs", "--rev", "HEAD"],
    "plan-base": ["plan", "specs", "--base", "HEAD", "-o", "json"],
}


# -- a spec tree holding a git directory of its own ------------------------------------------------

@pytest.mark.parametrize("objects", [True, False], ids=["copied-objects", "partial-clone"])
@pytest.mark.parametrize("command", ["render", "plan-base"])
def test_spec_folder_that_looks_like_a_git_directory_is_refused(tmp_path: Path, command: str, objects: bool) -> None:
    """`specs/` itself holds HEAD, objects/, refs/ and a config that runs the payload: git opened from
    the spec folder took it for the repository. The working tree is refused with a diagnostic on
    specs/HEAD, and git never runs there."""
    project, script = attacked(tmp_path)
    fake_git_dir(project.root / "specs", project, hostile_config(script, partial=not objects), objects=objects)
    project.write("base.yaml", HEAD_CHANGE)
    before = snapshot(project.outside)
    run = project.run(*COMMANDS[command])
    project.assert_untouched(before)
    assert_diagnostic(run, "HEAD", 1, "looks like a git directory (HEAD, objects/, refs/) inside the spec tree")
    assert "specs/HEAD:1:1: error:" in run.stderr
    assert len(diagnostics(run, "HEAD")) == 1, run.stderr  # one diagnostic, nothing read from that tree


@pytest.mark.parametrize("objects", [True, False], ids=["copied-objects", "partial-clone"])
def test_fake_git_directory_is_not_the_repository_read_at_a_revision(tmp_path: Path, objects: bool) -> None:
    """With `--rev`, the working tree's fake git directory is never opened: the repository is the
    working directory's, and the specs at HEAD are its (valid) ones."""
    project, script = attacked(tmp_path)
    fake_git_dir(project.root / "specs", project, hostile_config(script, partial=not objects), objects=objects)
    project.write("base.yaml", "not: [valid\n")  # what the working tree says; HEAD's is valid
    before = snapshot(project.outside)
    run = project.run("validate", "specs", "--rev", "HEAD")
    project.assert_untouched(before)
    assert run.returncode == 0, run.output


def test_committed_fake_git_directory_is_refused_at_the_revision(tmp_path: Path) -> None:
    """The fake git directory committed below the spec folder (plain files to git): `--rev` and
    `--base` refuse the revision's tree with a diagnostic on the folder's HEAD."""
    project, script = attacked(tmp_path)
    evil = project.root / "specs" / "vendor" / "evil"
    fake_git_dir(evil, project, hostile_config(script), objects=False)
    (evil / "refs" / "heads" / "main").write_text("0" * 40 + "\n")
    git("add", "-f", "specs/vendor", cwd=project.root)
    git("commit", "-q", "-m", "vendor", cwd=project.root)
    before = snapshot(project.outside)
    for args in (COMMANDS["validate-rev"], COMMANDS["plan-base"]):
        run = project.run(*args)
        project.assert_untouched(before)
        assert_diagnostic(run, "HEAD", 1, "looks like a git directory")
        assert "specs/vendor/evil/HEAD:1:1: error:" in run.stderr and "(at revision HEAD)" in run.stderr


@pytest.mark.parametrize("kind", ["gitfile", "nested-repository", "symlink"])
def test_a_git_repository_inside_the_spec_tree_is_refused(tmp_path: Path, kind: str) -> None:
    """A `.git` below the repository's root inside the spec paths: a `gitdir:` file pointing at a
    hostile git directory elsewhere in the tree, a whole nested repository, or a symlink to one."""
    project, script = attacked(tmp_path)
    hostile = project.root / "payload.git"
    fake_git_dir(hostile, project, hostile_config(script, partial=False), objects=True)
    where = project.root / "specs" / "team"
    where.mkdir()
    (where / "model.yaml").write_text("# more specs\n")
    if kind == "gitfile":
        (where / ".git").write_text("gitdir: ../../payload.git\n")
    elif kind == "nested-repository":
        shutil.copytree(hostile, where / ".git")
    else:
        (where / ".git").symlink_to(hostile)
    project.write("base.yaml", HEAD_CHANGE)
    before = snapshot(project.outside)
    for args in (COMMANDS["render"], COMMANDS["plan-base"], ["validate", "specs"], ["validate", "specs/team"],
                 ["validate", "specs/team/model.yaml"]):
        run = project.run(*args)
        project.assert_untouched(before)
        assert_diagnostic(run, ".git", 1, "a git repository (`.git`) inside the spec tree")
        assert "specs/team/.git:1:1: error:" in run.stderr


def test_the_repositorys_own_git_directory_is_not_a_problem(tmp_path: Path) -> None:
    """The spec path is the repository's root: its own `.git` is the repository, not a nested one."""
    project, _ = attacked(tmp_path)
    (project.root / "specs" / "base.yaml").rename(project.root / "all.yaml")
    shutil.rmtree(project.root / "specs")
    git("add", "-A", cwd=project.root)
    git("commit", "-q", "-m", "flat", cwd=project.root)
    for args in (["validate", "."], ["validate", ".", "--rev", "HEAD"], ["render", "."], ["plan", ".", "--base", "HEAD"]):
        run = project.run(*args)
        assert run.returncode == 0, (args, run.output)


# -- running from inside a fake git directory ------------------------------------------------------

@pytest.mark.parametrize("commondir", ["fifo", "dev-zero", "outside"])
def test_working_directory_inside_a_fake_git_directory_is_refused_without_hanging(tmp_path: Path, commondir: str) -> None:
    """The user's working directory is a folder that looks like a git directory whose `commondir` is
    a FIFO (git blocks opening it), `/dev/zero` (git reads it until memory runs out) or a path to
    an attacker's repository: refused before git runs, at once."""
    project, script = attacked(tmp_path)
    evil = project.root / "specs" / "evil"
    fake_git_dir(evil, project, hostile_config(script), objects=False)
    (evil / "base.yaml").write_text(BASE)
    if commondir == "fifo":
        os.mkfifo(evil / "commondir")
    elif commondir == "dev-zero":
        (evil / "commondir").symlink_to("/dev/zero")
    else:
        (evil / "commondir").write_text(str(project.root / "payload.git") + "\n")
    before = snapshot(project.outside)
    for args in (["validate", ".", "--rev", "HEAD"], ["render", "."], ["plan", ".", "--base", "HEAD"]):
        run = forgectl(*args, cwd=evil, timeout=60)
        project.assert_untouched(before)
        assert run.returncode == 1, run.output
        assert "looks like a git directory (HEAD, objects/, refs/)" in run.stderr, run.stderr


def test_working_directory_in_a_bare_repository_is_refused(tmp_path: Path) -> None:
    project, _ = attacked(tmp_path)
    bare = tmp_path / "bare.git"
    git("clone", "-q", "--bare", str(project.root), str(bare), cwd=tmp_path)
    (bare / "specs").mkdir()
    (bare / "specs" / "base.yaml").write_text(BASE)
    run = forgectl("validate", "specs", "--rev", "HEAD", cwd=bare)
    assert run.returncode == 1, run.output
    assert "looks like a git directory" in run.stderr, run.stderr


# -- the real repository's git directory, made hostile ----------------------------------------------

@pytest.mark.parametrize("kind", ["attacker-objects", "dev-zero", "fifo"])
def test_alternates_are_refused(tmp_path: Path, kind: str) -> None:
    """`objects/info/alternates` makes git read objects from another store (the attacker's, where a
    base commit can be other than reviewed) — or, as `/dev/zero` or a FIFO, read forever or block."""
    project, script = attacked(tmp_path)
    alternates = project.root / ".git" / "objects" / "info" / "alternates"
    alternates.parent.mkdir(parents=True, exist_ok=True)
    if kind == "attacker-objects":
        fake_git_dir(project.root / "payload.git", project, hostile_config(script, partial=False), objects=True)
        alternates.write_text(str(project.root / "payload.git" / "objects") + "\n")
    elif kind == "dev-zero":
        alternates.symlink_to("/dev/zero")
    else:
        os.mkfifo(alternates)
    project.write("base.yaml", HEAD_CHANGE)
    before = snapshot(project.outside)
    for args in COMMANDS.values():
        run = project.run(*args, timeout=60)
        project.assert_untouched(before)
        assert run.returncode == 1, run.output
        assert f"{alternates}: the repository borrows objects from another one" in run.stderr, run.stderr


@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "elsewhere"])
def test_commondir_of_the_repository_is_checked_before_git_reads_it(tmp_path: Path, kind: str) -> None:
    project, script = attacked(tmp_path)
    commondir = project.root / ".git" / "commondir"
    if kind == "dev-zero":
        commondir.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(commondir)
    else:
        fake_git_dir(tmp_path / "elsewhere.git", project, hostile_config(script), objects=False)
        commondir.write_text(str(tmp_path / "elsewhere.git") + "\n")
    before = snapshot(project.outside)
    for args in COMMANDS.values():
        run = project.run(*args, timeout=60)
        project.assert_untouched(before)
        assert run.returncode == 1, run.output
        assert f"error: {commondir}:" in run.stderr, run.stderr


def test_head_that_is_a_fifo_is_refused_without_hanging(tmp_path: Path) -> None:
    project, _ = attacked(tmp_path)
    head = project.root / ".git" / "HEAD"
    head.unlink()
    os.mkfifo(head)
    for args in COMMANDS.values():
        run = project.run(*args, timeout=60)
        assert run.returncode == 1, run.output
        assert f"{head}: HEAD is not a regular file; forgectl refuses the repository" in run.stderr, run.stderr


# -- replaced objects and grafts cannot change what the base is -------------------------------------

@pytest.mark.parametrize("replaced", ["commit", "tree", "blob"])
def test_replace_refs_cannot_make_a_change_look_like_no_change(tmp_path: Path, replaced: str) -> None:
    """The pull request brings `refs/replace/<base>` (fetched with the rest of its refs) naming an
    object that looks like its own head: the base commit, its tree or its spec blob swapped for the
    head's. Git would show the swapped object for the base's id, and the plan "No changes". The plan
    compares the real base."""
    project, _ = attacked(tmp_path)
    base = git("rev-parse", "HEAD", cwd=project.root)
    project.write("base.yaml", HEAD_CHANGE)
    git("add", "specs", cwd=project.root)
    git("commit", "-q", "-m", "head", cwd=project.root)
    head = git("rev-parse", "HEAD", cwd=project.root)
    old, new = {"commit": (base, git("commit-tree", f"{head}^{{tree}}", "-m", "base", cwd=project.root)),
                "tree": (f"{base}^{{tree}}", f"{head}^{{tree}}"),
                "blob": (f"{base}:specs/base.yaml", f"{head}:specs/base.yaml")}[replaced]
    git("replace", "-f", git("rev-parse", old, cwd=project.root), git("rev-parse", new, cwd=project.root), cwd=project.root)
    assert "epochs: 3" in git("show", f"{base}:specs/base.yaml", cwd=project.root)  # git itself is fooled
    run = project.run("plan", "specs", "--base", base, "-o", "json")
    assert run.returncode == 0, run.output
    plan = json.loads(run.stdout)
    changes = [(c["kind"], c["path"], c["new"]) for c in plan["specChanges"]]
    assert ("Model", "hyperparameters.epochs", 3) in changes, plan["specChanges"]
    assert plan["summary"]["create"] + plan["summary"]["update"] > 0, plan["summary"]
    # …and a revision that was invalid stays invalid when something valid replaces it
    project.write("base.yaml", "not: [valid\n")
    git("add", "specs", cwd=project.root)
    git("commit", "-q", "-m", "broken", cwd=project.root)
    git("replace", "-f", git("rev-parse", "HEAD", cwd=project.root), head, cwd=project.root)
    assert project.run("validate", "specs", "--rev", "HEAD").returncode == 1


def test_grafts_cannot_change_which_commit_a_relative_base_names(tmp_path: Path) -> None:
    """`info/grafts` gives a commit other parents: `--base HEAD~1` must name the real parent."""
    project, _ = attacked(tmp_path)
    first = git("rev-parse", "HEAD", cwd=project.root)
    project.write("base.yaml", HEAD_CHANGE)
    git("commit", "-q", "-am", "epochs 3", cwd=project.root)
    project.write("base.yaml", HEAD_CHANGE.replace("epochs: 3", "epochs: 4"))
    git("commit", "-q", "-am", "epochs 4", cwd=project.root)
    head = git("rev-parse", "HEAD", cwd=project.root)
    (project.root / ".git" / "info").mkdir(exist_ok=True)
    (project.root / ".git" / "info" / "grafts").write_text(f"{head} {first}\n")
    run = project.run("plan", "specs", "--base", "HEAD~1", "-o", "json")
    assert run.returncode == 0, run.output
    changes = {(c["path"], c["old"], c["new"]) for c in json.loads(run.stdout)["specChanges"]}
    assert changes == {("hyperparameters.epochs", 3, 4)}, changes


# -- configuration from outside the repository is never read -----------------------------------------

def test_global_and_system_configuration_are_ignored(tmp_path: Path) -> None:
    """$HOME/.gitconfig, $XDG_CONFIG_HOME/git/config and $GIT_CONFIG_SYSTEM/$GIT_CONFIG_GLOBAL all
    set fsmonitor, hooks, filters and includes that run the payload."""
    project, script = attacked(tmp_path)
    home = tmp_path / "home"
    (home / ".config" / "git").mkdir(parents=True)
    config = hostile_config(script, partial=False) + f"[include]\n\tpath = {home / 'more.cfg'}\n"
    (home / "more.cfg").write_text(config)
    for path in (home / ".gitconfig", home / ".config" / "git" / "config", tmp_path / "system.cfg"):
        path.write_text(config)
    (project.root / ".gitattributes").write_text("*.yaml filter=evil diff=evil\n")
    project.write("base.yaml", HEAD_CHANGE)
    env = {"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"), "GIT_CONFIG_SYSTEM": str(tmp_path / "system.cfg"),
           "GIT_CONFIG_GLOBAL": str(home / ".gitconfig")}
    before = snapshot(project.outside)
    for args in COMMANDS.values():
        run = project.run(*args, env=env)
        project.assert_untouched(before)
        assert run.returncode == 0, (args, run.output)


def test_the_callers_git_environment_is_ignored(tmp_path: Path) -> None:
    """GIT_DIR and GIT_WORK_TREE pointing at an attacker's repository (whose HEAD holds invalid
    specs), and every environment variable that carries configuration or commands: ignored — the
    repository read is the working directory's."""
    project, script = attacked(tmp_path)
    real_head = git("rev-parse", "HEAD", cwd=project.root)
    attacker = tmp_path / "attacker-repo"
    (attacker / "specs").mkdir(parents=True)
    (attacker / "specs" / "base.yaml").write_text("not: [valid\n")
    git("init", "-q", cwd=attacker)
    git("add", ".", cwd=attacker)
    git("commit", "-q", "-m", "evil", cwd=attacker)
    (attacker / ".git" / "config").write_text(hostile_config(script, partial=False))
    env = {"GIT_DIR": str(attacker / ".git"), "GIT_WORK_TREE": str(attacker), "GIT_INDEX_FILE": str(attacker / ".git" / "index"),
           "GIT_OBJECT_DIRECTORY": str(attacker / ".git" / "objects"), "GIT_COMMON_DIR": str(attacker / ".git"),
           "GIT_ALTERNATE_OBJECT_DIRECTORIES": str(attacker / ".git" / "objects"),
           "GIT_CONFIG_PARAMETERS": f"'core.fsmonitor'='{script}'", "GIT_CONFIG_COUNT": "1",
           "GIT_CONFIG_KEY_0": "core.fsmonitor", "GIT_CONFIG_VALUE_0": str(script), "GIT_EXTERNAL_DIFF": str(script),
           "GIT_SSH_COMMAND": str(script), "GIT_SSH": str(script), "GIT_ASKPASS": str(script), "GIT_PAGER": str(script),
           "GIT_EDITOR": str(script), "GIT_PROXY_COMMAND": str(script), "GIT_REPLACE_REF_BASE": "refs/heads/",
           "GIT_CEILING_DIRECTORIES": str(project.root), "GIT_DISCOVERY_ACROSS_FILESYSTEM": "1"}
    before = snapshot(project.outside)
    run = project.run("validate", "specs", "--rev", "HEAD", env=env)
    project.assert_untouched(before)
    assert run.returncode == 0, run.output
    run = project.run("render", "specs", env=env)
    project.assert_untouched(before)
    assert run.returncode == 0, run.output
    assert f"forge.dev/git-revision: {real_head[:12]}" in run.stdout
    project.write("base.yaml", HEAD_CHANGE)
    run = project.run("plan", "specs", "--base", "HEAD", "-o", "json", env=env)
    project.assert_untouched(before)
    assert run.returncode == 0, run.output
    assert json.loads(run.stdout)["specChanges"], run.stdout


# -- the repository's own configuration ------------------------------------------------------------

def test_hooks_fsmonitor_filters_and_helpers_in_the_repository_config_never_run(tmp_path: Path) -> None:
    """The repository's own config (what a misconfigured runner or a user's checkout holds) sets
    everything that runs a program, minus the refused keys; .git/hooks holds every hook; the tree's
    .gitattributes routes spec files through the filter and the textconv, and the spec files are
    stat-dirty so git has to read them."""
    project, script = attacked(tmp_path)
    (project.root / ".gitattributes").write_text("*.yaml filter=evil diff=evil\n* filter=evil\n")
    git("add", ".gitattributes", cwd=project.root)
    git("commit", "-q", "-m", "attributes", cwd=project.root)
    (project.root / ".git" / "config").write_text(hostile_config(script, partial=False).replace(
        "repositoryformatversion = 1", "repositoryformatversion = 0"))
    for hook in HOOKS:
        shutil.copy(script, project.root / ".git" / "hooks" / hook)
    for spec in (project.root / "specs").iterdir():
        os.utime(spec, (2_000_000_000, 2_000_000_000))
    before = snapshot(project.outside)
    for args in COMMANDS.values():
        run = project.run(*args)
        project.assert_untouched(before)
        assert run.returncode == 0, (args, run.output)


@pytest.mark.parametrize("key,value,message", [
    ("include.path", "../specs/more.cfg", "sets include.path; forgectl refuses a repository whose configuration includes"),
    ('includeIf "gitdir:/".path', "../specs/more.cfg", "forgectl refuses a repository whose configuration includes"),
    ("extensions.partialClone", "origin", "sets extensions.partialclone; forgectl refuses repositories with that extension"),
])
def test_repository_config_that_reads_other_files_or_fetches_is_refused(tmp_path: Path, key: str, value: str,
                                                                         message: str) -> None:
    project, script = attacked(tmp_path)
    project.write("more.cfg", f"[core]\n\tfsmonitor = {script}\n")
    section, _, name = key.rpartition(".")
    config = project.root / ".git" / "config"
    extra = f"[{section}]\n\t{name} = {value}\n"
    if "partialClone" in key:
        config.write_text(config.read_text().replace("repositoryformatversion = 0", "repositoryformatversion = 1"))
        extra += f'[remote "origin"]\n\turl = ext::{script} %S\n\tpromisor = true\n[protocol "ext"]\n\tallow = always\n'
    config.write_text(config.read_text() + extra)
    before = snapshot(project.outside)
    for args in COMMANDS.values():
        run = project.run(*args)
        project.assert_untouched(before)
        assert run.returncode == 1, (args, run.output)
        assert message in run.stderr, run.stderr
        assert f"error: {project.root / '.git' / 'config'}: sets" in run.stderr


def test_gitmodules_with_values_git_refuses(tmp_path: Path) -> None:
    """Submodules (gitlinks in the spec folder) whose .gitmodules holds what git refuses — a name
    climbing out, a URL that is an option, a command as `update`, an ext:: URL: nothing runs,
    the gitlinks are not spec files, and the plan compares as usual."""
    project, script = attacked(tmp_path)
    head = git("rev-parse", "HEAD", cwd=project.root)
    (project.root / ".gitmodules").write_text(f"""\
[submodule "../../../evil"]
\tpath = specs/sub
\turl = --upload-pack={script}
\tupdate = !{script}
[submodule "x"]
\tpath = specs/x.yaml
\turl = ext::{script} %S
\tignore = none
\tupdate = !{script}
""")
    git("add", ".gitmodules", cwd=project.root)
    git("update-index", "--add", "--cacheinfo", f"160000,{head},specs/sub", cwd=project.root)
    git("update-index", "--add", "--cacheinfo", f"160000,{head},specs/x.yaml", cwd=project.root)
    git("commit", "-q", "-m", "submodules", cwd=project.root)
    project.write("base.yaml", HEAD_CHANGE)
    before = snapshot(project.outside)
    for args in COMMANDS.values():
        run = project.run(*args)
        project.assert_untouched(before)
        assert run.returncode == 0, (args, run.output)
        assert "submodule" not in run.stderr, run.stderr
    assert json.loads(project.run(*COMMANDS["plan-base"]).stdout)["specChanges"]


# -- every git failure is a diagnostic --------------------------------------------------------------

def test_a_missing_object_is_a_diagnostic_naming_the_revision(tmp_path: Path) -> None:
    project, _ = attacked(tmp_path)
    blob = git("rev-parse", "HEAD:specs/base.yaml", cwd=project.root)
    (project.root / ".git" / "objects" / blob[:2] / blob[2:]).unlink()
    for args in (COMMANDS["validate-rev"], COMMANDS["plan-base"]):
        run = project.run(*args)
        assert run.returncode == 1, run.output
        assert "error: listing the files at revision HEAD: specs/base.yaml: object " in run.stderr, run.stderr
        assert " is missing or corrupt" in run.stderr, run.stderr


def test_a_corrupt_object_is_a_diagnostic(tmp_path: Path) -> None:
    project, _ = attacked(tmp_path)
    tree = git("rev-parse", "HEAD:specs", cwd=project.root)
    path = project.root / ".git" / "objects" / tree[:2] / tree[2:]
    path.chmod(0o644)
    path.write_bytes(b"garbage")
    run = project.run(*COMMANDS["validate-rev"])
    assert run.returncode == 1, run.output
    assert "error: listing the files at revision HEAD:" in run.stderr, run.stderr


def test_a_base_outside_a_shallow_history_is_a_diagnostic(tmp_path: Path) -> None:
    project, _ = attacked(tmp_path)
    base = git("rev-parse", "HEAD", cwd=project.root)
    project.write("base.yaml", HEAD_CHANGE)
    git("commit", "-q", "-am", "head", cwd=project.root)
    clone = tmp_path / "clone"
    git("clone", "-q", "--depth", "1", f"file://{project.root}", str(clone), cwd=tmp_path)
    run = forgectl("plan", "specs", "--base", base, cwd=clone)
    assert run.returncode == 1, run.output
    assert f"error: unknown git revision '{base}'" in run.stderr, run.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the repository to another user")
def test_a_repository_owned_by_someone_else_is_refused_unless_the_caller_trusts_it(tmp_path: Path) -> None:
    """Git's own rule (a repository owned by another user could carry any config) stays on; the
    caller's `safe.directory` (in the runner's global configuration, as actions/checkout writes it)
    is honoured, a repository's own is not."""
    project, _ = attacked(tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    for base, dirs, files in os.walk(project.root / ".git"):
        for name in (*dirs, *files):
            os.lchown(Path(base) / name, 65534, 65534)
    os.lchown(project.root, 65534, 65534)
    with open(project.root / ".git" / "config", "a") as fh:
        fh.write("[safe]\n\tdirectory = *\n")
    run = project.run(*COMMANDS["validate-rev"], env={"HOME": str(home)})
    assert run.returncode == 1, run.output
    assert "dubious ownership" in run.stderr, run.stderr
    (home / ".gitconfig").write_text(f"[safe]\n\tdirectory = {project.root}\n")
    run = project.run(*COMMANDS["validate-rev"], env={"HOME": str(home), "GIT_CONFIG_GLOBAL": str(home / ".gitconfig")})
    assert run.returncode == 0, run.output


def test_a_linked_worktree_is_read_as_usual(tmp_path: Path) -> None:
    """A `git worktree add` checkout (a `.git` file, a `commondir`) is an ordinary repository."""
    project, _ = attacked(tmp_path)
    work = tmp_path / "wt"
    git("worktree", "add", "-q", str(work), "HEAD", cwd=project.root)
    (work / "specs" / "base.yaml").write_text(HEAD_CHANGE)
    for args in COMMANDS.values():
        run = forgectl(*args, cwd=work)
        assert run.returncode == 0, (args, run.output)


# -- the write-back (apply time) obeys no configuration of the tree either ----------------------------

def test_write_back_runs_no_hook_filter_or_fsmonitor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rollback write-back commits with git's plumbing: none of the repository's hooks, its
    fsmonitor, its filters, the caller's GIT_DIR or global configuration run or count."""
    from reconciler.rollout.writeback import write_back

    project, script = attacked(tmp_path)
    first = git("rev-parse", "HEAD", cwd=project.root)
    project.write("base.yaml", HEAD_CHANGE)
    git("commit", "-q", "-am", "epochs 3", cwd=project.root)
    config = hostile_config(script, partial=False).replace("repositoryformatversion = 1", "repositoryformatversion = 0")
    (project.root / ".git" / "config").write_text(config)
    for hook in HOOKS:
        shutil.copy(script, project.root / ".git" / "hooks" / hook)
    (project.root / ".gitattributes").write_text("* filter=evil\n")
    home = tmp_path / "home"
    home.mkdir()
    (home / ".gitconfig").write_text(config)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "nowhere"))
    monkeypatch.setenv("GIT_CONFIG_PARAMETERS", f"'core.fsmonitor'='{script}'")
    before = snapshot(project.outside), (project.root / "specs" / "base.yaml").read_text()
    sha = write_back(project.root / "specs", [str(project.root / "specs" / "base.yaml")], first[:12], "forge/rollback-web",
                     "Revert base-model")
    project.assert_untouched(before[0])
    assert (project.root / "specs" / "base.yaml").read_text() == before[1]
    monkeypatch.delenv("GIT_DIR")
    monkeypatch.delenv("GIT_CONFIG_PARAMETERS")
    env = {**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}
    show = subprocess.run(["git", "-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null", "cat-file", "blob",
                           "forge/rollback-web:specs/base.yaml"], cwd=project.root, env=env, capture_output=True, text=True,
                          check=True)
    assert "epochs" not in show.stdout and sha == git("-c", "core.fsmonitor=false", "rev-parse", "forge/rollback-web",
                                                     cwd=project.root)
    assert not project.marker.exists()
