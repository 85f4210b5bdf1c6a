"""Why `{{` is refused in spec text, asked of Argo Workflows itself (forge-judge: v4.0.5's
`ValidateWorkflow`, as its controller, `argo submit` and `argo lint` call it).

A spec string reaches a Workflow inside a step's config, in the container's `args`. Argo treats
`{{…}}` there as its own template tags: an unknown one makes the controller refuse the whole
Workflow, a known one (`{{workflow.name}}`) passes validation — Argo will substitute it, silently
changing the config. Text without `{{` (single braces, `$`) is left alone. So Forge refuses `{{` at
validate time, where it can name the file and line.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from reconciler.load.loader import load_or_raise
from reconciler.targets.local import upstream
from renderers import RenderContext, render
from tests.judges.conftest import judge  # noqa: F401 - the session fixture that builds forge-judge
from tests.security.helpers import BASE, DIGEST, Project, assert_diagnostic, doc

pytestmark = pytest.mark.judges

ODD = doc("Dataset", 'source: {uri: "file://data/x.csv", format: csv}\nversion: "1"\n'
                     f"digest: {DIGEST}\nlabeling: {{column: '{{y}}', classes: ['{{a}}', '}}{{', '$HOME']}}\n"
                     "cleaning:\n  - {op: filter, query: 'a == \"{ b }\" and c > 0'}\n", name="odd") \
    + "---\n" + doc("Model", "datasetRef: odd\narchitecture: {type: mlp}\n", name="odd-model")


def _workflow(project: Project, model: str = "odd-model") -> dict[str, Any]:
    specs = load_or_raise([str(project.root / "specs")]).specs
    env = specs.environment("cluster")
    return next(m for m in render(specs, RenderContext(env)).manifests
                if m["kind"] == "Workflow" and m["metadata"]["name"].startswith(model))


def _with_filter(workflow: dict[str, Any], query: str) -> dict[str, Any]:
    """The Workflow as it would be had a spec's filter query been ``query`` (bypassing validate)."""
    changed = copy.deepcopy(workflow)
    for template in changed["spec"]["templates"]:
        if template.get("name") == "prepare-data":
            args = template["container"]["args"]
            config = json.loads(args[args.index("--config-json") + 1])
            config["spec"]["cleaning"] = [{"op": "filter", "query": query}]
            args[args.index("--config-json") + 1] = json.dumps(config)
    return changed


@pytest.fixture
def odd_project(tmp_path: Path) -> Project:
    project = Project.create(tmp_path, BASE)
    project.write("odd.yaml", ODD)
    return project


def test_spec_text_without_double_braces_is_left_alone_by_argo(odd_project: Project, judge: Path) -> None:  # noqa: F811
    assert upstream.argo_validate(_workflow(odd_project)) == []


def test_argo_resolves_double_braces_in_step_args(odd_project: Project, judge: Path) -> None:  # noqa: F811
    workflow = _workflow(odd_project)
    unknown = upstream.argo_validate(_with_filter(workflow, "x > {{inputs.parameters.secret}}"))
    assert unknown and all("failed to resolve {{inputs.parameters.secret}}" in e for e in unknown), unknown
    # A tag Argo knows passes its validation: it would be substituted at run time.
    assert upstream.argo_validate(_with_filter(workflow, "x > {{workflow.name}}")) == []


@pytest.mark.parametrize("query", ["x > {{inputs.parameters.secret}}", "x > {{workflow.name}}", "x > {{=sprig.env('HOME')}}"])
def test_forge_refuses_that_text_with_its_line(tmp_path: Path, query: str) -> None:
    project = Project.create(tmp_path)
    project.write("case.yaml", doc("Dataset", 'source: {uri: "sklearn://digits", format: sklearn}\nversion: "1"\n'
                                              f"digest: {DIGEST}\ncleaning:\n  - {{op: filter, query: {json.dumps(query)}}}\n"))
    assert_diagnostic(project.run("validate", "specs"), "case.yaml", 10, "`{{` is not allowed in spec text")
