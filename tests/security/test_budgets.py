"""Promise 6, for the whole run — no input costs more than its size: each budget of
`reconciler/budgets.py` is spent by a hostile tree that stays inside every per-item limit, and the
real CLI answers with one diagnostic naming the budget and the file:line where it ran out, exit 1.

Bounded time holds by construction, not by a clock: each error is raised before the work it
guards (a value before it is built, the trials before anything is rendered, the rendered bytes
before a byte of YAML is written, a too-long value shown whole instead of compared), and where a
run-wide budget ran out the files after it are not read at all (a later file's own error is never
reported). The subprocess timeout only turns a regression into a failure instead of a hang."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import yaml

from reconciler import budgets
from reconciler.diagnostics import SpecError
from reconciler.plan.diff import value_diff
from tests.security.helpers import BASE, HEAD, Project, assert_diagnostic, diagnostics, doc, snapshot

MODEL = "datasetRef: digits\narchitecture: {type: mlp}\n"
SEARCH = "search: {trials: 1000, space: {learningRate: {type: logUniform, min: 0.0001, max: 0.01}}}\n"
#: A file whose own error would be reported if it were read (it sorts after every attack file).
LATER = "zz-later.yaml"


def budgets_lines() -> int:
    from reconciler.plan.diff import MAX_LINES

    return MAX_LINES


def _attack(tmp_path: Path, files: dict[str, str]) -> Project:
    project = Project.create(tmp_path)
    for name, text in files.items():
        project.write(name, text)
    return project


# -- YAML: aliases, values, documents --------------------------------------------------------------


def test_alias_expansion_per_document(tmp_path: Path) -> None:
    """An anchor of 100 values referenced 101 times: 10,100 values expanded from aliases, far
    below the 100,000 values a document may hold, but past the per-document alias budget."""
    anchor = "a: &a [" + ", ".join(["x"] * 99) + "]\n"
    project = _attack(tmp_path, {"alias.yaml": anchor + "b: [" + ", ".join(["*a"] * 101) + "]\n"})
    run = project.run("validate", "specs", timeout=60)
    assert_diagnostic(run, "alias.yaml", 2, f"alias expansion per document is at most {budgets.MAX_ALIAS_VALUES_PER_DOCUMENT:,}")
    assert "docs/security.md, Budgets" in run.stderr


def test_alias_expansion_per_run_stops_reading(tmp_path: Path) -> None:
    """Each document expands 9,500 values from aliases (under the per-document budget); the
    eleventh spends the run's budget. Reading stops there: the documents after it in the same file
    and the files after it are never parsed."""
    anchor = "a: &a [" + ", ".join(["x"] * 94) + "]\n"
    one = anchor + "b: [" + ", ".join(["*a"] * 100) + "]\n"  # 100 aliases x 95 values = 9,500
    files = {f"alias{i:02d}.yaml": one for i in range(10)}
    files["alias10.yaml"] = one + "---\n" + one
    files[LATER] = "a: [\n"  # invalid YAML: an error if it were read
    project = _attack(tmp_path, files)
    run = project.run("validate", "specs", timeout=60)
    assert_diagnostic(run, "alias10.yaml", 2, f"alias expansion per run is at most {budgets.MAX_ALIAS_VALUES:,} values")
    assert "stopped reading here" in run.stderr
    assert not diagnostics(run, LATER), run.stderr
    assert [line for line, _, _ in diagnostics(run, "alias10.yaml")] == [2], run.stderr  # not its second document


def test_values_per_run(tmp_path: Path) -> None:
    """Eleven files of 99,000 plain values each: every document is under its own limit of
    100,000, the eleventh file spends the run's budget of values."""
    big = "a: [" + ",".join(["0"] * 99_000) + "]\n"
    files = {f"values{i:02d}.yaml": big for i in range(11)}
    files[LATER] = "a: [\n"
    project = _attack(tmp_path, files)
    run = project.run("validate", "specs", timeout=120)
    assert_diagnostic(run, "values10.yaml", 1, f"YAML values per run is at most {budgets.MAX_VALUES:,} values")
    assert not diagnostics(run, LATER), run.stderr


def test_values_per_document_without_an_alias(tmp_path: Path) -> None:
    project = _attack(tmp_path, {"flat.yaml": "a: [" + ",".join(["0"] * 100_001) + "]\n"})
    assert_diagnostic(project.run("validate", "specs", timeout=60), "flat.yaml", 1,
                      f"more than {budgets.MAX_NODES} values")


def test_documents_per_file_counts_empty_ones(tmp_path: Path) -> None:
    """`---` alone is a document to parse: 10,001 of them in one file (40 KB) spend the budget."""
    project = _attack(tmp_path, {"empty.yaml": "---\n" * (budgets.MAX_DOCUMENTS_PER_FILE + 1)})
    run = project.run("validate", "specs", timeout=60)
    assert run.returncode == 1
    found = diagnostics(run, "empty.yaml")
    assert any(f"documents per file is at most {budgets.MAX_DOCUMENTS_PER_FILE:,}" in rest for _, _, rest in found), run.stderr
    assert len(found) == 1, run.stderr


def test_documents_per_run(tmp_path: Path) -> None:
    """Six files of 9,000 empty documents: each under the per-file budget, the sixth spends the
    run's; the files after it are not read."""
    files = {f"docs{i}.yaml": "---\n" * 9_000 for i in range(6)}
    files[LATER] = "a: [\n"
    project = _attack(tmp_path, files)
    run = project.run("validate", "specs", timeout=60)
    assert run.returncode == 1
    found = diagnostics(run, "docs5.yaml")
    assert any(f"documents per run is at most {budgets.MAX_DOCUMENTS:,}" in rest for _, _, rest in found), run.stderr
    assert not diagnostics(run, LATER), run.stderr


# -- what the specs ask to render ---------------------------------------------------------------


def test_search_trials_per_run(tmp_path: Path) -> None:
    """Eleven Models of 1,000 trials each (the per-Model limit): the eleventh's `search.trials` line
    is named, and neither `validate` nor `render` renders anything (render refuses at load)."""
    text = "---\n".join(doc("Model", MODEL + SEARCH, name=f"m{i:02d}") for i in range(11))
    project = _attack(tmp_path, {"trials.yaml": text})
    before = snapshot(project.outside), snapshot(project.root)
    line = [i for i, text_line in enumerate(text.splitlines(), 1) if text_line.startswith("  search:")][10]  # the 11th Model's
    for command in ("validate", "render"):
        run = project.run(command, "specs", timeout=60)
        assert_diagnostic(run, "trials.yaml", line, f"search trials per run (summed over every Model) is at most "
                                                    f"{budgets.MAX_SEARCH_TRIALS:,} trials")
        assert "brings the sum to 11,000" in run.stderr
        assert "apiVersion" not in run.stdout  # nothing rendered
    project.assert_untouched(*before)


def test_search_trials_at_the_budget_still_validate(tmp_path: Path) -> None:
    text = "---\n".join(doc("Model", MODEL + SEARCH, name=f"m{i:02d}") for i in range(10))
    project = _attack(tmp_path, {"trials.yaml": text})
    run = project.run("validate", "specs", timeout=60)
    assert run.returncode == 0, run.output


def test_rendered_objects_per_run(tmp_path: Path) -> None:
    """25,000 Endpoints (4 objects each, 100,006 with the Environment's own): every document is
    valid, the one past 100,000 objects is named, and `render` refuses before rendering."""
    files = {}
    for f in range(3):
        files[f"e{f}.yaml"] = "".join(f"---\n{HEAD}kind: Endpoint\nmetadata: {{name: e{f}-{i:04d}}}\nspec: {{modelRef: base-model}}\n"
                                      for i in range(8_334))
    project = _attack(tmp_path, files)
    run = project.run("render", "specs", timeout=180)
    assert run.returncode == 1, run.output
    found = diagnostics(run, "e2.yaml")
    assert any(f"rendered objects per run is at most {budgets.MAX_RENDERED_OBJECTS:,} objects" in rest for _, _, rest in found), run.stderr
    assert run.stdout == ""


def test_rendered_bytes_are_counted_before_any_yaml_is_written() -> None:
    """The output budget itself (reaching 256 MiB through the CLI takes thousands of endpoints and
    minutes of rendering, more than a test should): objects are measured as compact JSON, and the
    one that goes past is named with its spec's file:line."""
    from reconciler.load.loader import Origin

    blob = "x" * (1024 * 1024)
    obj = {"kind": "ConfigMap", "metadata": {"name": "big", "labels": {"forge.dev/kind": "Endpoint", "forge.dev/name": "web"}},
           "data": {"a": blob}}
    origins = {("Endpoint", "web"): Origin("specs/web.yaml", 7)}
    budgets.check_rendered_bytes([obj] * 255, origins)  # 255 MiB and a little: within
    with pytest.raises(SpecError) as err:
        budgets.check_rendered_bytes([obj] * 257, origins)
    [problem] = err.value.diagnostics
    assert (problem.file, problem.line) == ("specs/web.yaml", 7)
    assert f"rendered output per run is at most {budgets.MAX_RENDERED_BYTES:,} bytes" in problem.message
    assert "ConfigMap 'big'" in problem.message


# -- the plan's comparison of long values -------------------------------------------------------


def _tokens(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("ab ,") for _ in range(n))


def test_a_long_value_rewritten_is_shown_whole(tmp_path: Path) -> None:
    """A 60,000-character annotation rewritten by a pull request: difflib on its ~40,000 tokens
    would take minutes (quadratic); the plan shows it whole, before and after, and says so."""
    rng = random.Random(1)
    project = Project.create(tmp_path)
    annotated = "metadata: {{name: base-model, annotations: {{note: '{}'}}}}"
    project.write("base.yaml", BASE.replace("metadata: {name: base-model}", annotated.format(_tokens(rng, 60_000))))
    project.git_init()
    project.write("base.yaml", BASE.replace("metadata: {name: base-model}", annotated.format(_tokens(rng, 60_000))))
    run = project.run("plan", "specs", "--base", "HEAD", "-o", "json", timeout=120)
    assert run.returncode == 0, run.output
    plan = json.loads(run.stdout)
    shown = [c["valueDiff"] for c in plan["specChanges"] if c["path"] == "metadata.annotations.note"]
    shown += [d["valueDiff"] for c in plan["changes"] for d in c["diff"] if d["path"] == "metadata.annotations.note"]
    assert len(shown) == 2, plan["specChanges"]
    for value in shown:
        assert "too long to compare token by token" in value["note"], value
        assert len(value["hunks"]) == 1 and len(value["hunks"][0]["old"]) > 50_000
    text = project.run("plan", "specs", "--base", "HEAD", timeout=120)
    assert "too long to compare token by token" in text.stdout
    markdown = project.run("plan", "specs", "--base", "HEAD", "-o", "markdown", timeout=120)
    assert markdown.returncode == 0 and "`forgectl plan -o json` has everything" in markdown.stdout  # capped, and says so


def test_the_plan_budget_for_long_values_is_shared() -> None:
    """Values each within the per-value budget, together past the plan's: the first are compared
    token by token, the rest shown whole with the note (one Spent per plan)."""
    rng = random.Random(2)
    spent = budgets.Spent()
    shown = [value_diff(_tokens(rng, 1300), _tokens(rng, 1300), spent) for _ in range(40)]
    compared = [s for s in shown if "note" not in s]
    whole = [s for s in shown if "note" in s]
    assert len(compared) >= 20 and whole, [s.get("note") for s in shown]
    assert all("budget for comparing long values" in s["note"] for s in whole)
    assert budgets.MAX_TOKEN_PAIRS_TOTAL - budgets.MAX_TOKEN_PAIRS < spent.token_pairs <= budgets.MAX_TOKEN_PAIRS_TOTAL


def test_a_plan_of_many_long_values_spends_one_budget(tmp_path: Path) -> None:
    """Thirty annotations of ~900 tokens rewritten (each within the per-value budget; the Model's
    go onto its Workflow, the Endpoint's onto its four objects): the plan compares the first ones
    token by token and shows the rest whole, both in `specChanges` and in `changes`."""
    rng = random.Random(4)

    def annotated(seed_values: list[str]) -> str:
        model = ", ".join(f"m{i}: '{v}'" for i, v in enumerate(seed_values[:15]))
        endpoint = ", ".join(f"e{i}: '{v}'" for i, v in enumerate(seed_values[15:]))
        return (BASE.replace("metadata: {name: base-model}", f"metadata: {{name: base-model, annotations: {{{model}}}}}")
                    .replace("metadata: {name: web}", f"metadata: {{name: web, annotations: {{{endpoint}}}}}"))

    project = Project.create(tmp_path)
    project.write("base.yaml", annotated([_tokens(rng, 1300) for _ in range(30)]))
    project.git_init()
    project.write("base.yaml", annotated([_tokens(rng, 1300) for _ in range(30)]))
    run = project.run("plan", "specs", "--base", "HEAD", "-o", "json", timeout=180)
    assert run.returncode == 0, run.output
    plan = json.loads(run.stdout)
    for shown in ([c.get("valueDiff") for c in plan["specChanges"]],
                  [d.get("valueDiff") for c in plan["changes"] for d in c["diff"] if "annotations" in d["path"]]):
        notes = [v.get("note", "") for v in shown if v]
        assert len(notes) >= 30, len(notes)
        assert any(not note for note in notes), "nothing compared"
        assert any("this plan's budget for comparing long values" in note for note in notes), notes


def test_a_long_multi_line_value_rewritten_is_shown_whole() -> None:
    rng = random.Random(3)
    old = "\n".join(rng.choice(["x", "y", "z"]) * 3 for _ in range(5000))
    new = "\n".join(rng.choice(["x", "y", "z"]) * 3 for _ in range(5000))
    shown = value_diff(old, new)
    assert shown is not None and "too long to compare line by line" in shown["note"]
    assert shown["lines"][0][0] == "@@" and len(shown["lines"]) == budgets_lines() and shown["more"] > 9000


def test_one_edit_in_a_long_multi_line_value_is_still_a_small_diff() -> None:
    lines = [f"line {i}" for i in range(20_000)]
    edited = list(lines)
    edited[7_000] = "changed"
    shown = value_diff("\n".join(lines), "\n".join(edited))
    assert shown == {"kind": "lines", "more": 0, "lines": [["@@", "-6999,5 +6999,5"], [" ", "line 6998"], [" ", "line 6999"],
                                                         ["-", "line 7000"], ["+", "changed"], [" ", "line 7001"],
                                                         [" ", "line 7002"]]}


def test_yaml_documents_parse_as_before_under_the_budgets() -> None:
    """The budgets change no honest document: anchors and aliases still read as before."""
    from reconciler.load.yamlsource import parse_documents

    text = "a: &a {x: 1, y: [1, 2]}\nb: *a\nc: [*a, *a]\n"
    [raw], problems = parse_documents(text, "f.yaml")
    assert problems == []
    assert raw.data == yaml.safe_load(text)
