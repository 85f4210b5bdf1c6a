"""Promise 2 — no template injection: no spec string reaches a rendered object where a controller
evaluates it. Argo Workflows substitutes `{{…}}` (and evaluates `{{=…}}`) anywhere in a Workflow's
templates, where step configs travel as JSON in the container's args; the kubelet expands `$(VAR)`
in command and args. Such text is refused at validate time with its file:line. Values that become
labels, selectors or names are validated as such."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specs import safety
from tests.security.helpers import DIGEST, Project, assert_diagnostic, doc, snapshot

MODEL = "datasetRef: digits\narchitecture: {type: mlp}\n"
DATASET = f'source: {{uri: "sklearn://digits", format: sklearn}}\nversion: "1"\ndigest: {DIGEST}\n'

CASES = [
    # (id, text, line, message)
    ("argo-tag-by-yaml-escape", doc("Model", MODEL, metadata='annotations: {note: "\\x7b\\x7bworkflow.uid}}"}\n'),
     5, "`{{` is not allowed in spec text"),  # `\x7b\x7b` is `{{` once YAML has loaded it
    ("argo-tag-in-annotation", doc("Model", MODEL, metadata="annotations: {note: '{{workflow.parameters.x}}'}\n"),
     5, "`{{` is not allowed in spec text: Argo Workflows substitutes"),
    ("argo-expression-in-filter", doc("Dataset", DATASET + "cleaning:\n  - {op: filter, query: \"{{=sprig.env('AWS_SECRET')}} > 0\"}\n"),
     10, "`{{` is not allowed in spec text"),
    ("argo-tag-in-label-column", doc("Dataset", 'source: {uri: "file://d.csv", format: csv}\nversion: "1"\n'
                                     f"digest: {DIGEST}\nlabeling: {{column: 'x{{{{inputs.parameters.p}}}}'}}\n"),
     9, "`{{` is not allowed in spec text"),
    ("argo-tag-in-class-name", doc("Dataset", DATASET + "labeling: {classes: ['{{steps.a.outputs.result}}']}\n"),
     9, "`{{` is not allowed"),
    ("argo-tag-in-option-key", doc("Model", "datasetRef: digits\narchitecture:\n  type: custom\n  entrypoint: 'm:f'\n"
                                   "  options: {'{{workflow.uid}}': 1}\nparameters: 10\n"),
     10, "`{{` is not allowed"),
    ("argo-tag-in-option-value", doc("Model", "datasetRef: digits\narchitecture:\n  type: custom\n  entrypoint: 'm:f'\n"
                                     "  options: {path: '{{=1+1}}'}\nparameters: 10\n"),
     10, "`{{` is not allowed"),
    ("argo-tag-in-search-choice", doc("Model", MODEL + "search:\n  space:\n    optimizer: {type: choice, values: ['{{item}}']}\n"),
     10, "`{{` is not allowed"),
    ("argo-tag-in-feature", doc("Dataset", DATASET + "features: [a, '{{workflow.name}}']\n"),
     9, "`{{` is not allowed"),
    ("kubelet-expansion-in-column", doc("Dataset", 'source: {uri: "file://d.csv", format: csv}\nversion: "1"\n'
                                        f"digest: {DIGEST}\nlabeling: {{column: '$(FORGE_WORKSPACE)'}}\n"),
     9, "`$(` is not allowed in spec text: the kubelet expands `$(VAR)`"),
    ("kubelet-expansion-in-filter", doc("Dataset", DATASET + "cleaning:\n  - {op: filter, query: 'x > $(HOME)'}\n"),
     10, "`$(` is not allowed"),
    ("argo-tag-in-source-path", doc("Dataset", 'source: {uri: "file://{{workflow.name}}.csv", format: csv}\nversion: "1"\n'
                                    f"digest: {DIGEST}\nlabeling: {{column: y}}\n"),
     6, "`{{` is not allowed"),
    # --- values that become labels, selectors or names ------------------------------------
    ("label-value-with-space", doc("Model", MODEL, metadata="labels: {team: 'a b'}\n"), 5, "label value of 'team' 'a b' must be"),
    ("label-value-too-long", doc("Model", MODEL, metadata=f"labels: {{team: {'a' * 64}}}\n"), 5, "must be at most 63 characters"),
    ("label-key-bad-prefix", doc("Model", MODEL, metadata="labels: {'Bad_Prefix/x': y}\n"), 5, "has an invalid prefix"),
    ("annotation-key-slash-only", doc("Model", MODEL, metadata="annotations: {'/x': y}\n"), 5, "has an invalid prefix"),
    ("node-selector-value", doc("Compute", "accelerator: {type: cpu}\nnodeSelector: {pool: 'gpu nodes'}\n"),
     7, "nodeSelector value of 'pool' 'gpu nodes' must be"),
    ("node-selector-key", doc("Compute", "accelerator: {type: cpu}\nnodeSelector: {'bad key': x}\n"),
     7, "nodeSelector key 'bad key' must be"),
    ("toleration-key", doc("Compute", "accelerator: {type: cpu}\ntolerations: [{key: 'a b', operator: Exists}]\n"),
     7, "toleration key 'a b' must be"),
    ("toleration-value", doc("Compute", "accelerator: {type: cpu}\ntolerations: [{key: k, value: '{x}'}]\n"),
     7, "toleration value '{x}' must be"),
    ("name-with-template", doc("Model", MODEL, name="'{{workflow.name}}'"), 4, "does not match"),
    ("variant-name", doc("Compression", "hardwareTarget: arm64\nvariants: [{name: 'A B', stages: [{type: quantize}]}]\n"),
     7, "does not match"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_refused_at_validate(tmp_path: Path, case: tuple[str, str, int, str]) -> None:
    _, text, line, message = case
    project = Project.create(tmp_path)
    project.write("case.yaml", text)
    before = snapshot(project.outside), snapshot(project.root)
    run = project.run("validate", "specs")
    assert_diagnostic(run, "case.yaml", line, message)
    project.assert_untouched(*before)


def test_promql_text_may_hold_braces(tmp_path: Path) -> None:
    """A metric's query goes to Prometheus only: `{…}` label matchers are its syntax, not a template.
    `{{` is still refused there — by the PromQL parser, with the line."""
    project = Project.create(tmp_path)
    project.write("case.yaml", doc("RolloutPolicy", "strategy: canary\ncanary: {steps: [{weight: 100, analysis: [m]}]}\n"
                                   "metrics:\n  - {name: m, max: 1, query: 'up{{job=\"x\"}}'}\n"))
    run = project.run("validate", "specs")
    assert_diagnostic(run, "case.yaml", 9, "query is not valid PromQL")
    assert "Argo" not in run.stderr


def test_rendered_objects_hold_only_forges_own_argo_tags(tmp_path: Path) -> None:
    """The other side of the promise: valid (if odd) spec text — single braces, `}}{` — adds no
    `{{…}}` to anything Forge renders, and in Workflows the only tags are the ones Forge puts there
    on purpose: the exit handler's workflow status, and each memoized task passing on the outputs of
    the one task inside it (named after a task of that Workflow)."""
    import re

    import yaml

    def tags(stream: str) -> tuple[set[str], set[str]]:
        everywhere, in_workflows = set(), set()
        for obj in yaml.safe_load_all(stream):
            found = set(re.findall(r"\{\{.*?\}\}", yaml.safe_dump(obj, width=10**9)))
            everywhere |= found
            if obj and obj.get("kind") == "Workflow":
                tasks = {t["name"] for t in obj["spec"]["templates"][0]["dag"]["tasks"]}
                passed_on = {f"{{{{tasks.{t}.outputs.parameters.metrics}}}}" for t in tasks}
                in_workflows |= found - passed_on
        return everywhere, in_workflows

    project = Project.create(tmp_path)
    plain = {env: project.run("render", "specs", "--env", env) for env in ("local", "cluster")}
    project.write("odd.yaml", doc("Dataset", 'source: {uri: "file://data/x.csv", format: csv}\nversion: "1"\n'
                                  f"digest: {DIGEST}\nlabeling: {{column: '{{y}}', classes: ['{{a}}', '}}}}{{']}}\n"
                                  "cleaning:\n  - {op: filter, query: 'a == \"{ b }\"'}\n", name="odd")
                  + "---\n" + doc("Model", "datasetRef: odd\narchitecture: {type: mlp}\n", name="odd-model"))
    for env in ("local", "cluster"):
        run = project.run("render", "specs", "--env", env)
        assert run.returncode == 0 and plain[env].returncode == 0, run.output
        everywhere, in_workflows = tags(run.stdout)
        assert everywhere == tags(plain[env].stdout)[0]
        assert in_workflows == {"{{workflow.failures}}", "{{workflow.status}}"}, in_workflows
        assert "$(" not in run.stdout


_TEXT = st.text(alphabet=st.sampled_from(list("{}$()ab\\\"\n\x00é=")), max_size=8)
_SCALARS = st.one_of(_TEXT, st.integers(), st.floats(allow_nan=False), st.booleans(), st.none(),
                     st.dates(), st.binary(max_size=4))
_DATA = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.one_of(_TEXT, st.integers()), inner, max_size=4)), max_leaves=20)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(_TEXT, _DATA, max_size=4), st.sampled_from(["Model", "RolloutPolicy", 3]))
def test_the_json_check_before_the_walk_misses_no_marker(data: dict, kind: object) -> None:
    """What YAML can load (strings with quotes, backslashes and control characters, keys that are
    numbers, dates, binary) gets the same answer from the JSON pre-check as from the walk alone."""
    doc_ = {**data, "kind": kind}
    assert safety.evaluated_text(doc_) == safety._walk_evaluated(doc_)

