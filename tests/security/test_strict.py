"""Promise 7 — strict types, clean errors: scalars are read as Kubernetes reads them (`'yes'` is a
string, not a boolean; `'30'` is not an integer); every YAML, git, kubeconfig and format error is
exit 1 with file:line where there is a file, and never a traceback (the helper refuses any run whose
output holds one); Forge's own metadata keys are refused in user labels and annotations."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.security.helpers import DIGEST, Project, assert_diagnostic, doc, snapshot

MODEL = "datasetRef: digits\narchitecture: {type: mlp}\n"

CASES = [
    # --- Kubernetes-strict scalars -------------------------------------------------------------
    ("quoted-yes-bool", doc("Environment", "default: 'yes'\ndefaults: {computeRef: cpu}\n"), 6,
     "expected true or false, got 'yes'"),
    ("quoted-true-bool", doc("Model", MODEL + "compile: 'true'\n"), 8, "expected true or false, got 'true'"),
    ("quoted-int", doc("Model", MODEL + "hyperparameters: {epochs: '30'}\n"), 8, "expected an integer, got '30'"),
    ("float-for-int", doc("Model", MODEL + "hyperparameters: {epochs: 30.0}\n"), 8, "expected an integer, got 30.0"),
    ("bool-for-int", doc("Model", MODEL + "hyperparameters: {epochs: true}\n"), 8, "expected an integer, got True"),
    ("quoted-float", doc("Model", MODEL + "hyperparameters: {learningRate: '0.1'}\n"), 8, "expected a number, got '0.1'"),
    ("int-for-string", doc("Dataset", f'source: {{uri: "sklearn://digits", format: sklearn}}\nversion: 1\ndigest: {DIGEST}\n'),
     7, "Input should be a valid string"),
    ("list-for-int", doc("Endpoint", "modelRef: base-model\nreplicas: [1]\n"), 7, "expected an integer"),
    # --- odd YAML scalars ---------------------------------------------------------------------
    ("int-tag-letters", doc("Model", MODEL + "retries: !!int abc\n"), 8, "cannot read this value as `!!int`"),
    ("float-tag-letters", doc("Model", MODEL + "hyperparameters: {learningRate: !!float fast}\n"), 8,
     "cannot read this value as `!!float`"),
    ("timestamp-tag", doc("Dataset", f'source: {{uri: "sklearn://digits", format: sklearn}}\nversion: !!timestamp 2024-13-45\n'
                          f"digest: {DIGEST}\n"), 7, "cannot read this value as `!!timestamp`"),
    ("binary-tag", doc("Model", MODEL + "retries: !!binary '*not base64*'\n"), 8, "cannot read this value as `!!binary`"),
    ("python-tag", doc("Model", MODEL + "retries: !!python/object:os.system {}\n"), 8,
     "cannot read this value as `!!python/object:os.system`"),
    ("omap-tag", doc("Model", MODEL + "hyperparameters: !!omap [{epochs: 1}]\n"), 8, "cannot read this value as `!!omap`"),
    ("unknown-tag", doc("Model", MODEL + "retries: !Ref other\n"), 8, "cannot read this value as `!Ref`"),
    ("huge-int", doc("Model", MODEL + "retries: " + "9" * 5000 + "\n"), 8, "the integer has more than 4300 digits"),
    ("huge-int-key", doc("Model", MODEL) + "? !!int " + "9" * 5000 + "\n: 1\n", 8, "cannot read this key as `!!int`"),
    ("int-key-letters", doc("Model", MODEL) + "? !!int abc\n: 1\n", 8, "cannot read this key as `!!int`"),
    ("set-for-list", doc("Dataset", f'source: {{uri: "sklearn://digits", format: sklearn}}\nversion: "1"\ndigest: {DIGEST}\n'
                         "features: !!set {a, b}\n"), 9, "cannot read this value as `!!set`"),
    # --- reserved metadata keys ------------------------------------------------------------------
    ("reserved-label-forge", doc("Model", MODEL, metadata="labels: {forge.dev/model-version: x}\n"), 5,
     "label key 'forge.dev/model-version' is reserved"),
    ("reserved-label-subdomain", doc("Model", MODEL, metadata="labels: {rollout.forge.dev/state: x}\n"), 5,
     "label key 'rollout.forge.dev/state' is reserved"),
    ("reserved-managed-by", doc("Model", MODEL, metadata="labels: {app.kubernetes.io/managed-by: forgectl}\n"), 5,
     "label key 'app.kubernetes.io/managed-by' is reserved"),
    ("reserved-annotation-rollout", doc("Endpoint", "modelRef: base-model\n", metadata="annotations: {forge.dev/rollout: '{}'}\n"),
     5, "annotation key 'forge.dev/rollout' is reserved"),
    ("reserved-annotation-prune", doc("Endpoint", "modelRef: base-model\n", metadata="annotations: {forge.dev/prune: disabled}\n"),
     5, "annotation key 'forge.dev/prune' is reserved"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_refused_at_validate(tmp_path: Path, case: tuple[str, str, int, str]) -> None:
    _, text, line, message = case
    project = Project.create(tmp_path)
    project.write("case.yaml", text)
    before = snapshot(project.outside), snapshot(project.root)
    run = project.run("validate", "specs", timeout=30)
    assert_diagnostic(run, "case.yaml", line, message)
    project.assert_untouched(*before)


def test_quoted_value_hint(tmp_path: Path) -> None:
    project = Project.create(tmp_path)
    project.write("case.yaml", doc("Model", MODEL + "hyperparameters: {epochs: '30'}\n"))
    run = project.run("validate", "specs")
    assert "hint: a quoted value is a string, as in Kubernetes; write the value without quotes" in run.stderr


def test_unquoted_yes_is_a_boolean_as_in_kubernetes(tmp_path: Path) -> None:
    """YAML 1.1's plain `yes` is true for Kubernetes' YAML reader too; only the quoted string is refused."""
    project = Project.create(tmp_path)
    project.write("case.yaml", doc("Model", MODEL + "gradientCheckpointing: yes\n", name="m2"))
    assert project.run("validate", "specs").returncode == 0


# --- git ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("rev,message", [
    ("HEAD@{nonsense}", "unknown git revision 'HEAD@{nonsense}'"),
    ("HEAD@{1000}", "unknown git revision 'HEAD@{1000}'"),
    ("HEAD~99", "unknown git revision 'HEAD~99'"),
    ("HEAD^{tree}", "unknown git revision 'HEAD^{tree}'"),
    ("--output=/tmp/x", "invalid git revision '--output=/tmp/x'"),
    ("-p", "invalid git revision '-p'"),
    ("HEAD\n::error::x", "invalid git revision 'HEAD\\n::error::x'"),
    ("0" * 40, "unknown git revision '" + "0" * 40 + "'"),
])
def test_bad_revisions_are_clean_errors(tmp_path: Path, rev: str, message: str) -> None:
    project = Project.create(tmp_path)
    project.git_init()
    before = snapshot(project.outside), snapshot(project.root)
    for args in (["validate", "specs", "--rev", rev], ["render", "specs", "--rev", rev], ["plan", "specs", "--base", rev]):
        run = project.run(*args)
        assert run.returncode == 1, run.output
        assert f"error: {message}" in run.stderr, run.stderr
    project.assert_untouched(*before)


def test_reflog_date_revisions_work(tmp_path: Path) -> None:
    project = Project.create(tmp_path)
    project.git_init()
    for rev in ("HEAD@{0}", "HEAD@{yesterday}", "HEAD@{1.minute.ago}", "@"):
        run = project.run("validate", "specs", "--rev", rev)
        assert run.returncode == 0, (rev, run.output)


def test_rev_outside_a_repository(tmp_path: Path) -> None:
    project = Project.create(tmp_path)
    run = project.run("validate", "specs", "--rev", "HEAD")
    assert run.returncode == 1
    assert "specs: not inside a git repository (needed by --rev)" in run.stderr


# --- kubeconfig -----------------------------------------------------------------------------------

@pytest.mark.parametrize("text,message", [
    ("- a\n- b\n", ":1:1: not a kubeconfig: expected a mapping with `clusters`, `contexts` and `users`, got a list"),
    ("just a string\n", ":1:1: not a kubeconfig: expected a mapping with `clusters`, `contexts` and `users`, got a str"),
    ("", ":1:1: not a kubeconfig: expected a mapping with `clusters`, `contexts` and `users`, got empty"),
    ("clusters: [\n", ":2:1: kubeconfig is not valid YAML"),
    ("users: 5\n", ": not a kubeconfig: `users` must be a list of mappings"),
    ("contexts: [a, b]\n", ": not a kubeconfig: `contexts` must be a list of mappings"),
    ("a: !!python/object:os.system {}\n", ":1:4: kubeconfig is not valid YAML"),
    ("current-context: nope\ncontexts: []\nclusters: []\nusers: []\n", "cannot load kubeconfig"),
    (b"\xff\xfe", ":1:1: kubeconfig is not valid UTF-8"),
])
def test_bad_kubeconfigs_are_clean_errors(tmp_path: Path, text: str | bytes, message: str) -> None:
    project = Project.create(tmp_path)
    config = tmp_path / "runner.kubeconfig"
    config.write_bytes(text if isinstance(text, bytes) else text.encode())
    run = project.run("plan", "specs", "--env", "cluster", "--kubeconfig", str(config))
    assert run.returncode == 1, run.output
    assert message in run.stderr, run.stderr
    assert f"{config}" in run.stderr


def test_kubeconfig_that_is_a_fifo(tmp_path: Path) -> None:
    import os

    project = Project.create(tmp_path)
    config = tmp_path / "pipe.kubeconfig"
    os.mkfifo(config)
    run = project.run("plan", "specs", "--env", "cluster", "--kubeconfig", str(config), timeout=30)
    assert run.returncode == 1
    assert f"kubeconfig {config}: is a FIFO (named pipe), not a regular file" in run.stderr


def test_write_back_branch_with_a_placeholder_is_refused_before_any_rollout(tmp_path: Path) -> None:
    """`gitWriteback.branch` is checked at validate time (it used to crash the rollback hook)."""
    project = Project.create(tmp_path)
    project.write("case.yaml", doc("RolloutPolicy", "strategy: canary\ncanary: {steps: [{weight: 100}]}\n"
                                   "gitWriteback: {enabled: true, branch: 'rollback/{endpoint}-{version}'}\n", name="wb"))
    assert_diagnostic(project.run("validate", "specs"), "case.yaml", 8, "only the placeholder `{endpoint}` is filled in")
