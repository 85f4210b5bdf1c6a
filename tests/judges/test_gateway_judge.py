"""The HTTPRoute's backends are Services the real Seldon Core v1.17.1 operator creates: each
`backendRefs` entry Forge renders (name and port) is checked against the Services of one pass of
the operator's own `Reconcile` (seldon-judge render) on the SeldonDeployment rendered beside it,
including the hashed name Seldon gives a predictor whose name passes 63 characters."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.targets.local import upstream
from renderers import RenderContext, render
from specs import SpecSet
from tests.renderers.test_gateway import ROUTING, STATES, quickstart

pytestmark = pytest.mark.judges



def _rendered(name: str, case: str) -> tuple[dict, dict]:
    specs, env, endpoint = quickstart(ROUTING)
    if name != endpoint.name:
        endpoint = endpoint.model_copy(update={"metadata": endpoint.metadata.model_copy(update={"name": name})})
        specs = SpecSet(tuple(endpoint if d.kind == "Endpoint" else d for d in specs.documents))
    manifests = render(specs, RenderContext(env, revision="0123456789ab", serving={name: STATES[case]})).manifests
    sd = next(m for m in manifests if m["kind"] == "SeldonDeployment")
    route = next(m for m in manifests if m["kind"] == "HTTPRoute")
    return sd, route


@pytest.mark.parametrize("name", ["digits", "d" * 60], ids=["short", "hashed"])
@pytest.mark.parametrize("case", ["canary-10", "arms"])
def test_every_backend_is_a_service_the_operator_creates(seldon_judge: Path, name: str, case: str) -> None:
    sd, route = _rendered(name, case)
    services = {o["metadata"]["name"]: o for o in upstream.seldon_render(sd) if o["kind"] == "Service"}
    refs = {(b["name"], b["port"]) for rule in route["spec"]["rules"] for b in rule["backendRefs"]}
    assert len(refs) == len(sd["spec"]["predictors"])  # one Service per predictor, each routed to
    for svc_name, port in refs:
        assert svc_name in services, (svc_name, sorted(services))
        ports = {p["name"]: p["port"] for p in services[svc_name]["spec"]["ports"]}
        assert ports.get("http") == port, ports
    if name != "digits":
        assert all(n.startswith("seldon-") for n, _ in refs)
