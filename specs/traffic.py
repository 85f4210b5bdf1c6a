"""`traffic`: what splits an Endpoint's requests between its predictors — Seldon's own `traffic`
(through Istio or Ambassador) or an `HTTPRoute` of the Gateway API, attached to a Gateway the
cluster already runs. Set per Environment, overridden per Endpoint (the Endpoint's `traffic`
replaces the Environment's as a whole)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints, model_validator

from specs.base import Name, SpecModel

#: Gateway API's `SectionName` and `PreciseHostname`/`Hostname` patterns (gateway.networking.k8s.io/v1).
SECTION_NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
HOSTNAME = r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
MAX_HOSTNAMES = 16

Router = Literal["seldon", "gatewayAPI"]

SectionName = Annotated[
    str, StringConstraints(min_length=1, max_length=253, pattern=SECTION_NAME),
    Field(description="A listener of the Gateway (its `name`), e.g. `http`."),
]
Hostname = Annotated[
    str, StringConstraints(min_length=1, max_length=253, pattern=HOSTNAME),
    Field(description="A host name the route answers for, e.g. `digits.example.com` or `*.example.com`."),
]


class GatewayParentRef(SpecModel):
    """The Gateway the Endpoint's HTTPRoute attaches to (its `parentRefs` entry)."""

    name: Name = Field(description="Name of the Gateway.")
    namespace: Name | None = Field(
        default=None, description="Namespace of the Gateway; default the Environment's namespace. A Gateway in "
        "another namespace must allow routes from it (`listeners[].allowedRoutes`).",
    )
    section_name: SectionName | None = Field(
        default=None, description="The Gateway's listener to attach to; default every listener that allows the route.",
    )


class TrafficRouting(SpecModel):
    """What splits an Endpoint's traffic between its stable, canary and experiment predictors."""

    router: Router = Field(
        default="seldon",
        description="`seldon`: the SeldonDeployment's own `traffic` weights, which Seldon Core applies only through "
        "Istio or Ambassador. `gatewayAPI`: an `HTTPRoute` (gateway.networking.k8s.io/v1) per Endpoint, attached to "
        "`parentRef`, whose weighted `backendRefs` are the Services Seldon creates per predictor; the rollout moves "
        "its weights and counts a step once the Gateway reports the route `Accepted` with `ResolvedRefs`.",
    )
    parent_ref: GatewayParentRef | None = Field(
        default=None, description="The Gateway to attach to (required with `router: gatewayAPI`).",
    )
    hostnames: list[Hostname] = Field(
        default_factory=list, max_length=MAX_HOSTNAMES,
        description="Host names the route answers for (its `hostnames`); none: every host of the listener.",
    )

    @model_validator(mode="after")
    def _parent(self) -> TrafficRouting:
        if self.router == "gatewayAPI" and self.parent_ref is None:
            raise ValueError("`router: gatewayAPI` needs a `parentRef` naming the Gateway the route attaches to")
        if self.router == "seldon" and (self.parent_ref is not None or self.hostnames):
            used = " and ".join(k for k, on in (("parentRef", self.parent_ref is not None), ("hostnames", bool(self.hostnames))) if on)
            raise ValueError(f"{used} apply to `router: gatewayAPI` only; with `router: seldon` Seldon's own `traffic` splits")
        return self
