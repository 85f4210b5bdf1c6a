"""The dashboard text's fast paths give exactly what `json.dumps(dashboard(...), indent=1,
sort_keys=True)` gives: the indenting encoder on any JSON value, and the per-policy template with
the endpoint's name substituted (issue 19: with thousands of endpoints the dashboards were most of
a render)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from reconciler.load.loader import load_or_raise
from renderers.dashboards import _TEMPLATES, dashboard, dashboard_json, dashboard_text
from specs import Endpoint, RolloutPolicy

ROOT = Path(__file__).resolve().parents[2]


def _value(rng: random.Random, depth: int = 0) -> object:
    r = rng.random()
    if depth > 4 or r < 0.4:
        return rng.choice([None, True, False, 0, -3, 10**20, 1.5, 0.1, 1e-7, 2.0, float("inf"), "", "plain",
                           'q"b\\\n\té€\U0001f600', "${datasource}"])
    if r < 0.7:
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {rng.choice(["a", "B", "é", '"k', "1", "c d"]) + str(rng.randint(0, 3)): _value(rng, depth + 1)
            for _ in range(rng.randint(0, 4))}


def test_indenting_encoder_matches_json_dumps() -> None:
    rng = random.Random(19)
    for _ in range(3000):
        value = _value(rng)
        assert dashboard_json(value) == json.dumps(value, indent=1, sort_keys=True)


@pytest.mark.parametrize("example", ["quickstart", "llm-finetune", "edge-vision"])
def test_template_matches_a_full_render(example: str) -> None:
    specs = load_or_raise([str(ROOT / "examples" / example)]).specs
    policies = [None, *specs.of(RolloutPolicy)]
    names = [e.name for e in specs.of(Endpoint)] + ["a", "e-0001", "x" * 63, "dashboard", "forge", "0-9"]
    _TEMPLATES.clear()
    for policy in policies:
        for namespace in ("forge-a", "ns"):
            for name in names:
                expected = json.dumps(dashboard(Endpoint.model_validate(
                    {"apiVersion": "forge.dev/v1alpha1", "kind": "Endpoint", "metadata": {"name": name},
                     "spec": {"modelRef": "m"}}), policy, namespace), indent=1, sort_keys=True)
                assert dashboard_text(name, policy, namespace) == expected
    assert _TEMPLATES and all(template is not None for _, template in _TEMPLATES.values())
