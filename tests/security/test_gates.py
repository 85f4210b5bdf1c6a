"""Promise 4 — gates that cannot lie: thresholds are finite numbers; every PromQL query and built-in
template is parsed when the specs are validated (promql-parser), reported with its file:line; the
placeholders are filled in without `str.format`, so label matchers `{…}` work and stray braces are
PromQL's business, not a crash; the write-back branch takes no format placeholder but `{endpoint}`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specs.rollout import BUILTIN_TEMPLATES, check_promql, fill_placeholders
from tests.security.helpers import BASE, Project, assert_diagnostic, doc, snapshot

MODEL = "datasetRef: digits\narchitecture: {type: mlp}\n"
POLICY = "strategy: canary\ncanary: {steps: [{weight: 100, analysis: [m]}]}\nmetrics:\n"


def metric(fields: str) -> str:
    """A RolloutPolicy whose one metric `m` (on line 9) has ``fields``."""
    return doc("RolloutPolicy", POLICY + f"  - {{name: m, {fields}}}\n", name="p")


CASES = [
    # --- thresholds: finite only -----------------------------------------------------------
    ("model-threshold-nan", doc("Model", MODEL + "evaluation:\n  thresholds:\n    - {metric: accuracy, min: .nan}\n"),
     10, "expected a finite number, got nan"),
    ("model-threshold-inf", doc("Model", MODEL + "evaluation:\n  thresholds:\n    - {metric: loss, max: .inf}\n"),
     10, "expected a finite number, got inf"),
    ("model-threshold-overflow", doc("Model", MODEL + "evaluation:\n  thresholds:\n    - {metric: loss, max: 1e400}\n"),
     10, "expected a finite number, got inf"),
    ("metric-min-nan", metric("template: success-rate, min: .NaN"), 9, "expected a finite number"),
    ("metric-max-neg-inf", metric("template: error-rate, max: -.inf"), 9, "expected a finite number"),
    ("compare-to-stable-nan", metric("template: latency-p99, compareToStable: {maxIncrease: .nan}"), 9, "expected a finite number"),
    ("clip-bound-inf", doc("Dataset", 'source: {uri: "sklearn://digits", format: sklearn}\nversion: "1"\n'
                           f"digest: sha256:{'1' * 64}\ncleaning: [{{op: clip, min: -.inf, max: 1}}]\n"),
     9, "expected a finite number"),
    ("learning-rate-nan", doc("Model", MODEL + "hyperparameters: {learningRate: .nan}\n"), 8, "expected a finite number"),
    ("search-range-inf", doc("Model", MODEL + "search:\n  space:\n    learningRate: {type: uniform, min: 0, max: .inf}\n"),
     10, "expected a finite number"),
    # --- PromQL parsed at validate time ----------------------------------------------------
    ("unclosed-paren", metric("max: 1, query: 'sum(rate(x[5m])'"), 9, "query is not valid PromQL: unclosed left parenthesis"),
    ("unclosed-matcher", metric("max: 1, query: 'up{job=\"a\"'"), 9, "query is not valid PromQL"),
    ("not-promql", metric("max: 1, query: 'SELECT * FROM metrics'"), 9, "query is not valid PromQL"),
    ("range-vector", metric("max: 1, query: 'up[5m]'"), 9, "query yields a range vector"),
    ("string-result", metric("max: 1, query: '\"ok\"'"), 9, "query yields a string"),
    ("format-positional", metric("max: 1, query: 'up{0}'"), 9, "query is not valid PromQL"),
    ("format-attribute", metric("max: 1, query: 'up{endpoint.__class__}'"), 9, "query is not valid PromQL"),
    ("unknown-placeholder", metric("max: 1, query: 'rate(x[{interval}])'"), 9, "query is not valid PromQL"),
    ("bad-window-for-template", metric("template: success-rate, min: 0.9, window: 1.5m"), 9,
     "query is not valid PromQL: not a valid duration string: 1.5m"),
    ("too-long", metric("max: 1, query: '" + "+".join(["up"] * 400) + "'"), 9, "at most 1024 characters"),
    ("too-deep", metric("max: 1, query: '" + "(" * 40 + "up" + ")" * 40 + "'"), 9, "nests brackets deeper than 32 levels"),
    # --- write-back branch ---------------------------------------------------------------------
    ("branch-positional", doc("RolloutPolicy", "strategy: canary\ncanary: {steps: [{weight: 100}]}\n"
                              "gitWriteback: {enabled: true, branch: 'forge/{0}'}\n"), 8,
     "branch 'forge/{0}': only the placeholder `{endpoint}` is filled in"),
    ("branch-attribute", doc("RolloutPolicy", "strategy: canary\ncanary: {steps: [{weight: 100}]}\n"
                             "gitWriteback: {branch: 'rb/{endpoint.__init__}'}\n"), 8, "only the placeholder `{endpoint}`"),
    ("branch-dotdot", doc("RolloutPolicy", "strategy: canary\ncanary: {steps: [{weight: 100}]}\n"
                          "gitWriteback: {branch: 'forge/../main'}\n"), 8, "is not a valid git branch name"),
    ("branch-lock", doc("RolloutPolicy", "strategy: canary\ncanary: {steps: [{weight: 100}]}\n"
                        "gitWriteback: {branch: 'forge/x.lock'}\n"), 8, "is not a valid git branch name"),
    ("branch-option", doc("RolloutPolicy", "strategy: canary\ncanary: {steps: [{weight: 100}]}\n"
                          "gitWriteback: {branch: '-f'}\n"), 8, "is not a valid git branch name"),
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


def test_query_with_label_matchers_works_end_to_end(tmp_path: Path) -> None:
    """The base policy's query has `{endpoint="{endpoint}",code=~"5.."}`: validate, render, plan and
    plan --base all succeed, and the PrometheusRule holds the query with only the placeholders
    filled in."""
    project = Project.create(tmp_path)
    assert project.run("validate", "specs").returncode == 0
    for env, namespace in (("local", "forge-local"), ("cluster", "team-a")):
        run = project.run("render", "specs", "--env", env)
        assert run.returncode == 0, run.output
        assert ('expr: (sum(rate(forge_requests_total{endpoint="web",role="canary",code=~"5.."}[2m]))) > 1'
                in run.stdout), run.stdout
        assert namespace in run.stdout
    project.git_init()
    project.write("base.yaml", BASE.replace("max: 1\n", "max: 2\n"))
    run = project.run("plan", "specs", "--base", "HEAD", "-o", "json")
    assert run.returncode == 0, run.output
    changes = json.loads(run.stdout)["specChanges"]
    assert {"kind": "RolloutPolicy", "name": "canary", "op": "change", "path": "metrics[errors].max", "old": 1.0,
            "new": 2.0, "file": "specs/base.yaml", "line": 41} in changes, changes


def test_yaml_1_2_floats_are_numbers(tmp_path: Path) -> None:
    """`1e-3` is a number in Kubernetes' YAML; strict validation must not turn it into a string error."""
    project = Project.create(tmp_path)
    project.write("case.yaml", doc("Model", MODEL + "hyperparameters: {learningRate: 1e-3, weightDecay: 5E-4}\n", name="m2"))
    run = project.run("validate", "specs")
    assert run.returncode == 0, run.output


def test_fill_placeholders_is_not_str_format() -> None:
    query = 'sum(x{a="{endpoint}",b=~"{role}|{x}"}[{window}]) + {0} + {endpoint.__class__}'
    filled = fill_placeholders(query, {"endpoint": "web", "role": "canary", "window": "2m"})
    assert filled == 'sum(x{a="web",b=~"canary|{x}"}[2m]) + {0} + {endpoint.__class__}'
    with pytest.raises(ValueError, match="holds characters"):
        fill_placeholders(query, {"endpoint": 'x"} or vector(1) #'})


@pytest.mark.parametrize("name", sorted(BUILTIN_TEMPLATES))
def test_builtin_templates_parse(name: str) -> None:
    for window in ("10s", "2m", "500ms", "1h"):
        check_promql(BUILTIN_TEMPLATES[name], window)
    assert "{{" not in BUILTIN_TEMPLATES[name]
