"""The shipped examples validate, the committed schema is current and accepts them."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml
from typer.testing import CliRunner

from forgectl.cli import app

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p for p in (ROOT / "examples").iterdir() if p.is_dir())
EXAMPLE_FILES = sorted(f for e in EXAMPLES for f in e.rglob("*.yaml"))


def test_three_examples_exist() -> None:
    assert {e.name for e in EXAMPLES} >= {"quickstart", "llm-finetune", "edge-vision"}


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.name for e in EXAMPLES])
def test_example_validates(example: Path) -> None:
    result = CliRunner().invoke(app, ["validate", str(example), "--output", "json"])
    report = json.loads(result.stdout)
    assert result.exit_code == 0, report
    assert report == {"valid": True, "errors": 0, "diagnostics": []}


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.name for e in EXAMPLES])
def test_example_has_two_environments(example: Path) -> None:
    from reconciler.load.loader import load
    from specs import Environment

    specs = load([str(example)]).specs
    envs = {e.name: e for e in specs.of(Environment)}
    assert envs["local"].spec.target == "local" and envs["local"].spec.default
    assert envs["cluster"].spec.target == "kubernetes"
    assert envs["cluster"].spec.kubernetes is not None and envs["cluster"].spec.kubernetes.context is None


def test_schema_is_current() -> None:
    result = CliRunner().invoke(app, ["schema", "--check"])
    assert result.exit_code == 0, result.output


def test_schema_check_fails_when_stale(tmp_path: Path) -> None:
    CliRunner().invoke(app, ["schema", "--write", "--dir", str(tmp_path)])
    model = tmp_path / "model.schema.json"
    model.write_text(model.read_text().replace("learningRate", "learning_rate"))
    result = CliRunner().invoke(app, ["schema", "--check", "--dir", str(tmp_path)])
    assert result.exit_code == 1
    assert "stale" in result.output and "model.schema.json" in result.output


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=[str(f.relative_to(ROOT)) for f in EXAMPLE_FILES])
def test_committed_schema_accepts_example(path: Path) -> None:
    schema = json.loads((ROOT / "schema" / "forge.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    first_line = path.read_text().splitlines()[0]
    assert first_line == "# yaml-language-server: $schema=../../schema/forge.schema.json"
    for doc in yaml.safe_load_all(path.read_text()):
        errors = sorted(validator.iter_errors(doc), key=lambda e: e.path)
        assert not errors, [f"{list(e.path)}: {e.message}" for e in errors]


def test_committed_schema_rejects_unknown_field() -> None:
    schema = json.loads((ROOT / "schema" / "model.schema.json").read_text())
    doc = yaml.safe_load((ROOT / "examples/quickstart/model.yaml").read_text())
    doc["spec"]["hyperparameters"]["learning_rate"] = 0.1
    assert list(jsonschema.Draft202012Validator(schema).iter_errors(doc))


def test_schema_fields_are_documented() -> None:
    """Every property of every kind has a description: it is the editor's hover help."""
    schema = json.loads((ROOT / "schema" / "forge.schema.json").read_text())
    missing = []
    for name, definition in schema.get("$defs", {}).items():
        for prop, body in definition.get("properties", {}).items():
            if "description" not in body:
                missing.append(f"{name}.{prop}")
    assert not missing, missing
