"""The endpoints of an environment, each with what the specs want it to serve: the model, the
model version the specs build (in that environment), and the rollout policy."""

from __future__ import annotations

from typing import NamedTuple

from reconciler.diagnostics import ForgeError
from renderers.versions import model_version
from specs import Endpoint, Environment, RolloutPolicy, SpecSet


class DesiredEndpoint(NamedTuple):
    """An Endpoint and what the specs want it to serve (unpacks as a 4-tuple)."""

    endpoint: Endpoint
    #: The name of the Model the endpoint serves.
    model: str
    #: The version of that model the specs build in the environment.
    version: str
    #: The endpoint's own policy, else the environment's default; None when neither names one.
    policy: RolloutPolicy | None


def desired_endpoints(specs: SpecSet, environment: Environment, only: str | None = None) -> list[DesiredEndpoint]:
    """Every Endpoint of ``specs`` (sorted by name), or only the one named ``only``."""
    found = []
    for endpoint in specs.of(Endpoint):
        if only is not None and endpoint.name != only:
            continue
        model = specs.model_of(endpoint)
        found.append(DesiredEndpoint(endpoint, model.name, model_version(specs, model, environment),
                                     specs.policy_of(endpoint, environment)))
    return found


def find_endpoint(specs: SpecSet, environment: Environment, name: str) -> DesiredEndpoint:
    """The Endpoint named ``name``; :class:`ForgeError` when the specs have none."""
    found = desired_endpoints(specs, environment, name)
    if not found:
        raise ForgeError(f"no Endpoint {name!r} in the specs")
    return found[0]
