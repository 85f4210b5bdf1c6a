"""Which variants an Endpoint may serve: `base`, a Compression's variants, and their ONNX exports
(`<v>-onnx`, `<v>-onnx-int8` on a CPU/ARM target) — the same names the Workflow's register step
records, so whatever validates is there to be served."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from reconciler.load.loader import load, load_or_raise
from renderers import RenderContext, render
from renderers.stepargs import decode_step_config
from specs import Compression, Model

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart"


def _quickstart(tmp_path: Path, *changes: tuple[str, str, str]) -> Path:
    """A copy of the quick-start with (file, old, new) replacements."""
    shutil.copytree(QUICKSTART, tmp_path / "specs")
    for name, old, new in changes:
        path = tmp_path / "specs" / name
        text = path.read_text()
        assert old in text, (name, old)
        path.write_text(text.replace(old, new, 1))
    return tmp_path / "specs"


def test_an_endpoint_serves_an_onnx_export_from_its_registered_folder(tmp_path: Path) -> None:
    folder = _quickstart(tmp_path, ("endpoint.yaml", "variant: int8", "variant: base-onnx-int8"))
    specs = load_or_raise([str(folder)]).specs
    env = specs.environment("local")
    assert env is not None
    rendered = render(specs, RenderContext(env))
    sd = next(m for m in rendered.manifests if m["kind"] == "SeldonDeployment")
    [predictor] = sd["spec"]["predictors"]
    assert predictor["labels"]["forge.dev/variant"] == "base-onnx-int8"
    config = decode_step_config(predictor["componentSpecs"][0]["spec"]["containers"][0])
    version = predictor["labels"]["forge.dev/model-version"]
    assert config["modelDir"] == f"registry/digits-mlp/{version}/base-onnx-int8"
    # the folder the register step fills under that name is the export step's ONNX Runtime INT8 graph
    workflow = rendered.workflows["digits-mlp"].manifest
    steps = {t["name"]: decode_step_config(t["container"]) for t in workflow["spec"]["templates"] if t.get("container")}
    register = next(c for c in steps.values() if c.get("step") == "register")
    export = next(c for c in steps.values() if c.get("step") == "export")
    assert register["variants"]["base-onnx-int8"] == f"{export['output']}/onnx-int8"
    assert register["output"] == f"registry/digits-mlp/{version}"


@pytest.mark.parametrize("example", ["quickstart", "experiments", "edge-vision"])
def test_the_variants_an_endpoint_may_name_are_those_the_workflow_registers(example: str) -> None:
    specs = load_or_raise([str(ROOT / "examples" / example)]).specs
    env = specs.environment("cluster") or specs.environment("local")
    assert env is not None
    rendered = render(specs, RenderContext(env))
    checked = 0
    for model in specs.of(Model):
        compression = specs.get(Compression, model.spec.compression_ref) if model.spec.compression_ref else None
        if compression is None or model.name not in rendered.workflows:
            continue
        templates = rendered.workflows[model.name].manifest["spec"]["templates"]
        [register] = [c for c in (decode_step_config(t["container"]) for t in templates if t.get("container"))
                      if c.get("step") == "register"]
        assert sorted(register["variants"]) == sorted(compression.spec.servable_variants()), model.name
        checked += 1
    assert checked


@pytest.mark.parametrize("changes, wanted, expected", [
    # not exported: only `base` is
    ((), "pruned-onnx", "'base', 'pruned', 'int8', 'base-onnx', 'base-onnx-int8'"),
    # a TensorRT target builds an engine, not an ONNX Runtime INT8 graph
    ((("compression.yaml", "hardwareTarget: x86-avx2", "hardwareTarget: nvidia-gpu"),), "base-onnx-int8",
     "'base', 'pruned', 'int8', 'base-onnx')"),
    # ONNX Runtime INT8 turned off
    ((("compression.yaml", "variants: [base]", "variants: [base]\n    int8: {enabled: false}"),), "base-onnx-int8",
     "'base', 'pruned', 'int8', 'base-onnx')"),
])
def test_a_variant_no_step_registers_is_refused_with_its_line(tmp_path: Path, changes: tuple[tuple[str, str, str], ...],
                                                              wanted: str, expected: str) -> None:
    folder = _quickstart(tmp_path, ("endpoint.yaml", "variant: int8", f"variant: {wanted}"), *changes)
    errors = [d.text() for d in load([str(folder)]).diagnostics]
    assert len(errors) == 1, errors
    assert f"model 'digits-mlp' builds no variant {wanted!r} (expected {expected}" in errors[0], errors[0]
    assert re.match(r".*endpoint\.yaml:8:\d+: error:", errors[0]), errors[0]


def test_the_base_onnx_export_of_a_tensorrt_target_is_servable(tmp_path: Path) -> None:
    folder = _quickstart(tmp_path, ("compression.yaml", "hardwareTarget: x86-avx2", "hardwareTarget: nvidia-gpu"),
                         ("endpoint.yaml", "variant: int8", "variant: base-onnx"))
    assert load_or_raise([str(folder)]).ok


def test_the_seldon_wrapper_is_not_asked_to_serve_an_onnx_graph(tmp_path: Path) -> None:
    folder = _quickstart(tmp_path, ("endpoint.yaml", "variant: int8", "variant: base-onnx"),
                         ("endpoint.yaml", "  backend:\n    select: fastest\n    maxAccuracyDrop: 1.0\n", ""),
                         ("endpoint.yaml", "    p99TargetMs: 150\n", ""),
                         ("endpoint.yaml", "protocol: v2", "protocol: seldon"))
    errors = [d.text() for d in load([str(folder)]).diagnostics]
    assert len(errors) == 1, errors
    assert "'base-onnx' is an ONNX graph, which the seldon wrapper does not serve: use protocol: v2" in errors[0]
    assert re.match(r".*endpoint\.yaml:8:\d+: error:", errors[0]), errors[0]
