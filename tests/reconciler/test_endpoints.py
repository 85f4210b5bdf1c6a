"""The endpoints and versions the specs want (`reconciler/load/endpoints.py`), which the rollout
commands look up by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.diagnostics import ForgeError
from reconciler.load.endpoints import desired_endpoints, find_endpoint
from renderers.versions import model_version
from tests.reconciler.quickstart_repo import copied_example


def test_desired_endpoints_name_the_model_version_and_policy(tmp_path: Path) -> None:
    result = copied_example(tmp_path)
    env = result.specs.environment(None)
    [digits] = desired_endpoints(result.specs, env)
    endpoint, model, version, policy = digits  # unpacks as the 4-tuple the commands use
    assert (endpoint.name, model) == ("digits", "digits-mlp")
    assert version == model_version(result.specs, result.specs.model_of(endpoint), env)
    assert policy is not None and policy.name == "three-step-canary"  # the environment's default
    assert find_endpoint(result.specs, env, "digits") == digits
    assert desired_endpoints(result.specs, env, "nope") == []
    with pytest.raises(ForgeError, match="no Endpoint 'nope' in the specs"):
        find_endpoint(result.specs, env, "nope")
    with pytest.raises(ForgeError, match="no Endpoint '' in the specs"):  # an empty name is no wildcard
        find_endpoint(result.specs, env, "")
