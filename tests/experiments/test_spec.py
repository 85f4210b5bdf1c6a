"""The Endpoint's `experiment` and `shadow`: cross-field rules with file:line errors, the example,
and what the renderer makes of them."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from reconciler.load.loader import load, load_or_raise
from renderers import RenderContext, render
from renderers.stepargs import decode_step_config
from specs import Endpoint
from specs.experiment import LATENCY_BUCKETS

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "experiments"


def _with_endpoint(tmp_path: Path, body: str) -> list[str]:
    for f in EXAMPLE.glob("*.yaml"):
        if f.name != "endpoint.yaml":
            shutil.copy(f, tmp_path / f.name)
    (tmp_path / "endpoint.yaml").write_text(
        "apiVersion: forge.dev/v1alpha1\nkind: Endpoint\nmetadata:\n  name: ab\nspec:\n  modelRef: digits-mlp\n" + body)
    result = load([str(tmp_path)])
    return [d.text() for d in result.diagnostics]


ARMS = """  experiment:
    arms:
      - name: a
        share: 50
      - name: b
        variant: int8
        share: 50
    primary:
      kind: success-rate
"""


def test_the_example_validates() -> None:
    assert load_or_raise([str(EXAMPLE)]).ok


def test_a_valid_experiment(tmp_path: Path) -> None:
    assert _with_endpoint(tmp_path, ARMS) == []


@pytest.mark.parametrize("change, message, line", [
    (("share: 50\n      - name: b", "share: 40\n      - name: b"), "the arms' shares sum to 90, not 100 (a=40, b=50)", 8),
    (("name: b", "name: a"), "arm names must be unique; repeated: a", 8),
    (("name: b", "name: canary"), "arm name 'canary' is reserved", 11),
    (("kind: success-rate", "kind: latency-under\n      latencyUnderSeconds: 0.3"), "not a bucket bound", 15),
    (("kind: success-rate", "kind: ratio\n      numerator: 'sum(rate(x[{window}])'\n      denominator: 'sum(y)'"),
     "numerator: query is not valid PromQL", 15),
    (("kind: success-rate", "kind: ratio"), "`kind: ratio` needs `numerator` and `denominator`", 15),
    (("variant: int8", "variant: int9"), "model 'digits-mlp' builds no variant 'int9'", 12),
])
def test_errors_name_file_and_line(tmp_path: Path, change: tuple[str, str], message: str, line: int) -> None:
    errors = _with_endpoint(tmp_path, ARMS.replace(*change, 1))
    assert len(errors) == 1, errors
    assert message in errors[0]
    assert re.match(rf".*endpoint\.yaml:{line}:\d+: error:", errors[0]), errors[0]


def test_control_must_name_an_arm_and_sticky_needs_one_key(tmp_path: Path) -> None:
    errors = _with_endpoint(tmp_path, ARMS + "    control: c\n    sticky: {header: x-user, cookie: u}\n")
    text = "\n".join(errors)
    assert "control names arm 'c'" in text or "sticky needs exactly one" in text


def test_buckets_match_the_serving_runtime() -> None:
    text = (ROOT / "runtimes" / "serving" / "telemetry.py").read_text()
    found = re.search(r"^LATENCY_BUCKETS = \(([^)]*)\)", text, re.M)
    assert found is not None
    assert tuple(float(x) for x in found[1].split(",")) == LATENCY_BUCKETS


def test_render_arms_shadow_and_faults() -> None:
    specs = load_or_raise([str(EXAMPLE)]).specs
    env = specs.environment("local")
    assert env is not None
    sds = {m["metadata"]["name"]: m for m in render(specs, RenderContext(env, "0123456789ab")).manifests
           if m["kind"] == "SeldonDeployment"}
    ab = sds["digits-ab"]["spec"]["predictors"]
    assert [(p["name"], p["labels"]["forge.dev/role"], p["labels"]["forge.dev/variant"], p["traffic"], p.get("shadow"))
            for p in ab] == [("base", "base", "base", 50, None), ("int8", "int8", "int8", 50, None),
                             ("shadow", "shadow", "pruned", 100, True)]
    # every arm serves the version the specs build; the role label reaches the runtime's series
    assert len({p["labels"]["forge.dev/model-version"] for p in ab}) == 1
    assert all(f'"role":"{p["name"]}"' in p["componentSpecs"][0]["spec"]["containers"][0]["args"][-1].replace(" ", "")
               for p in ab)
    # each server's init container waits for the variant it serves: one a step rejected fails the
    # wait with its reason (tests/runtimes/test_await.py) instead of a server finding no bundle
    waits = {p["name"]: decode_step_config(p["componentSpecs"][0]["spec"]["initContainers"][0])["variant"] for p in ab}
    assert waits == {"base": "base", "int8": "int8", "shadow": "pruned"}


def test_a_server_that_picks_its_variant_waits_for_the_registration_alone(tmp_path: Path) -> None:
    """Under `backend.select: fastest` a server serves the fastest variant registered, whatever
    its spec names: its wait, and the offline gates, ask for no variant."""
    assert _with_endpoint(tmp_path, "  variant: int8\n  backend:\n    select: fastest\n  shadow:\n    variant: pruned\n") == []
    specs = load_or_raise([str(tmp_path)]).specs
    endpoint = next(e for e in specs.of(Endpoint) if e.name == "ab")
    assert endpoint.spec.required_variant() is None and endpoint.spec.required_variant("pruned") is None
    env = specs.environment("local")
    assert env is not None
    [sd] = [m for m in render(specs, RenderContext(env, "0123456789ab")).manifests
            if m["kind"] == "SeldonDeployment" and m["metadata"]["name"] == "ab"]
    assert [decode_step_config(p["componentSpecs"][0]["spec"]["initContainers"][0]).get("variant")
            for p in sd["spec"]["predictors"]] == [None, None]
    pinned = endpoint.spec.model_copy(update={"backend": None})
    assert (pinned.required_variant(), pinned.required_variant("pruned")) == ("int8", "pruned")


def test_an_endpoint_without_experiment_keeps_its_digest() -> None:
    """`experiment`/`shadow` unset stay out of the dump, so existing Endpoints do not change."""
    specs = load_or_raise([str(ROOT / "examples" / "quickstart")]).specs
    dumped = specs.of(Endpoint)[0].model_dump(mode="json", by_alias=True)
    assert "experiment" not in dumped["spec"] and "shadow" not in dumped["spec"]
