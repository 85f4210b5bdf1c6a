"""Promise 7, for odd scalars and paths: integers of any base beyond the 4300-digit bound, base-60
numbers PyYAML would build in quadratic time, and symlink loops in a data source, an Environment's
root or the state folder are each one diagnostic with file:line and exit 1 — never "internal
error" (the helper refuses any run whose output holds one, or a traceback).

The scalar errors are raised before PyYAML builds the value (parts and digits are counted on the
text), so the time is bounded by construction; the subprocess timeout only turns a regression into
a failure instead of a hang."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from reconciler.budgets import MAX_BASE60_PARTS, MAX_INT_DIGITS
from tests.security.helpers import BASE, DIGEST, Project, assert_diagnostic, doc, snapshot

MODEL = "datasetRef: digits\narchitecture: {type: mlp}\n"
TOO_LONG = f"the integer has more than {MAX_INT_DIGITS} digits"

CASES = [
    # Every base Python converts without its own digit limit (powers of two), in fields of every kind.
    ("hex-retries", doc("Model", MODEL + "retries: 0x" + "f" * 4000 + "\n"), 8, TOO_LONG),
    ("hex-negative", doc("Model", MODEL + "retries: -0x" + "f" * 4000 + "\n"), 8, TOO_LONG),
    ("octal-seed", doc("Model", MODEL + "hyperparameters: {seed: 0" + "7" * 5000 + "}\n"), 8, TOO_LONG),
    ("binary-max-gpus", doc("Compute", "accelerator: {type: cpu}\nmaxGpus: 0b" + "1" * 15000 + "\n"), 7, TOO_LONG),
    ("hex-underscores", doc("Endpoint", "modelRef: base-model\nreplicas: 0x" + "f_" * 3600 + "f\n"), 7, TOO_LONG),
    ("hex-in-a-list", doc("Model", "datasetRef: digits\narchitecture: {type: mlp, hiddenSizes: [8, 0x" + "f" * 4000 + "]}\n"), 7,
     TOO_LONG),
    ("hex-in-a-string-field", doc("Dataset", f'source: {{uri: "sklearn://digits", format: sklearn}}\nversion: 0x{"f" * 4000}\n'
                                  f"digest: {DIGEST}\n"), 7, TOO_LONG),
    ("hex-in-a-number-field", doc("Model", MODEL + "hyperparameters: {learningRate: 0x" + "f" * 4000 + "}\n"), 8, TOO_LONG),
    ("hex-tagged", doc("Model", MODEL + "retries: !!int 0x" + "f" * 4000 + "\n"), 8, TOO_LONG),
    ("decimal-tagged", doc("Model", MODEL + "retries: !!int " + "9" * 5000 + "\n"), 8, TOO_LONG),
    # Base 60 (YAML 1.1): many parts (PyYAML multiplies an ever larger integer per part), or few
    # parts with a huge leading one.
    ("base60-parts", doc("Model", MODEL + "retries: " + "1:" * 200_000 + "1\n"), 8, f"at most {MAX_BASE60_PARTS} are read"),
    ("base60-tagged", doc("Model", MODEL + "retries: !!int " + "1:" * 50_000 + "1\n"), 8, "a base-60 number of 50,001 parts"),
    ("base60-float", doc("Model", MODEL + "hyperparameters: {learningRate: " + "1:" * 50_000 + "1.5}\n"), 8,
     f"at most {MAX_BASE60_PARTS} are read"),
    ("base60-big-head", doc("Model", MODEL + "retries: " + "1" * 5000 + ":30\n"), 8, TOO_LONG),
    ("base60-label-value", doc("Model", MODEL, metadata="labels:\n  team: " + "1:" * 10_000 + "1\n"), 6,
     f"at most {MAX_BASE60_PARTS} are read"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_odd_integer_is_a_diagnostic(tmp_path: Path, case: tuple[str, str, int, str]) -> None:
    _, text, line, message = case
    project = Project.create(tmp_path)
    project.write("case.yaml", text)
    before = snapshot(project.outside), snapshot(project.root)
    assert_diagnostic(project.run("validate", "specs", timeout=60), "case.yaml", line, message)
    project.assert_untouched(*before)


def test_odd_integer_as_a_key(tmp_path: Path) -> None:
    project = Project.create(tmp_path)
    project.write("hex.yaml", doc("Model", MODEL) + "? 0x" + "f" * 4000 + "\n: 1\n")
    project.write("sexagesimal.yaml", doc("Model", MODEL, name="y") + "? " + "1:" * 100_000 + "1\n: 1\n")
    run = project.run("validate", "specs", timeout=60)
    assert_diagnostic(run, "hex.yaml", 8, "cannot read this key as `!!int`: " + TOO_LONG)
    assert_diagnostic(run, "sexagesimal.yaml", 8, "cannot read this key as `!!int`: a base-60 number of 100,001 parts")


def test_odd_integers_in_every_command(tmp_path: Path) -> None:
    """`render` and `plan --base` read the same way: the same diagnostic, exit 1."""
    project = Project.create(tmp_path)
    project.git_init()
    project.write("case.yaml", doc("Model", MODEL + "retries: 0x" + "f" * 4000 + "\n"))
    for args in (("render", "specs"), ("plan", "specs", "--base", "HEAD")):
        assert_diagnostic(project.run(*args, timeout=60), "case.yaml", 8, TOO_LONG)


def test_small_numbers_of_every_base_still_read() -> None:
    """The bounds change no honest number: `0x10`, `010`, `0b11` and `1:30` are what PyYAML (and
    Kubernetes' YAML 1.1 reader) make of them."""
    from reconciler.load.yamlsource import parse_documents

    [raw], problems = parse_documents("a: 0x10\nb: 010\nc: 0b11\nd: 1:30\ne: 1:30.5\nf: -0x1f\n", "f.yaml")
    assert problems == []
    assert raw.data == {"a": 16, "b": 8, "c": 3, "d": 90, "e": 90.5, "f": -31}


# -- symlink loops --------------------------------------------------------------------------------

LOCAL_WITH_STATE = "spec: {target: local, default: true, defaults: {computeRef: cpu, rolloutPolicyRef: canary}}"
CSV_DATASET = f"""---
apiVersion: forge.dev/v1alpha1
kind: Dataset
metadata: {{name: table}}
spec:
  source: {{uri: "file://data/loop/rows.csv", format: csv}}
  labeling: {{column: y}}
  version: "1"
  digest: {DIGEST}
"""


def _line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def test_symlink_loop_in_a_data_source(tmp_path: Path) -> None:
    project = Project.create(tmp_path, BASE + CSV_DATASET)
    (project.root / "data").mkdir()
    os.symlink("loop2", project.root / "data" / "loop")
    os.symlink("loop", project.root / "data" / "loop2")
    text = BASE + CSV_DATASET
    line = _line_of(text, "file://data/loop/rows.csv")
    for args in (("validate", "specs"), ("plan", "specs")):
        run = project.run(*args, timeout=60)
        assert_diagnostic(run, "base.yaml", line, "source 'data/loop/rows.csv' cannot be resolved: a symlink loop")


def test_symlink_loop_as_the_state_folder(tmp_path: Path) -> None:
    """`.forge`, the local target's default state folder, a link to itself: validate, plan and
    apply (which would create it) all answer with the Environment's file:line."""
    text = BASE.replace(LOCAL_WITH_STATE, LOCAL_WITH_STATE.replace("default: true,", "default: true, local: {stateDir: state},"))
    assert text != BASE
    project = Project.create(tmp_path, text)
    os.symlink("state", project.root / "state")
    line = _line_of(text, "stateDir: state")
    for args in (("validate", "specs"), ("plan", "specs"), ("apply", "specs", "--auto-approve")):
        run = project.run(*args, timeout=60)
        assert_diagnostic(run, "base.yaml", line, "stateDir 'state/local' cannot be resolved: a symlink loop")
    assert (project.root / "state").is_symlink()  # nothing was created through it


def test_symlink_loop_as_the_default_state_folder(tmp_path: Path) -> None:
    project = Project.create(tmp_path)
    os.symlink(".forge", project.root / ".forge")
    run = project.run("validate", "specs", timeout=60)
    assert_diagnostic(run, "base.yaml", 4, "stateDir '.forge/local' cannot be resolved: a symlink loop")


def test_symlink_loop_as_an_environment_root(tmp_path: Path) -> None:
    text = BASE.replace(LOCAL_WITH_STATE, LOCAL_WITH_STATE.replace("default: true,", "default: true, root: tree,"))
    project = Project.create(tmp_path, text)
    os.symlink("tree", project.root / "tree")
    line = _line_of(text, "root: tree")
    assert_diagnostic(project.run("validate", "specs", timeout=60), "base.yaml", line,
                      "root 'tree' cannot be resolved: a symlink loop")
