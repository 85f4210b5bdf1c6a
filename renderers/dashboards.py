"""A Grafana dashboard per Endpoint, as a ConfigMap for Grafana's dashboard sidecar (pure).

The sidecar (kube-prometheus-stack's `grafana.sidecar.dashboards`, or k8s-sidecar on its own)
watches ConfigMaps labelled `grafana_dashboard: "1"` and loads each JSON file of their `data` into
Grafana; `grafana_folder` (an annotation, with the sidecar's `folderAnnotation` set to it) files
the dashboard under "Forge". The ConfigMap lives in the Endpoint's namespace: the sidecar must
search it (`searchNamespace: ALL` or that namespace).

Panels, per arm (the serving runtime's `role`, `version` and `variant` labels):

- traffic: requests per second;
- success rate (non-5xx share), with the policy's bound as a threshold line;
- latency quantiles p50/p90/p99 from `forge_request_duration_seconds`, with the policy's p99 bound;
- the rollout step as Prometheus sees it: the canary's share of requests, next to a table of the
  policy's steps (the controller's own state is in `forgectl rollout status`);
- rows per model call (dynamic batching).

Every query selects the series with the same label names as the rollout gates' built-in templates
(`specs.rollout.BUILTIN_TEMPLATES`), read from them (`label`), so the dashboard and the gates
cannot drift apart. The datasource is a dashboard variable (any Prometheus datasource).
"""

from __future__ import annotations

import json
import re
from json.encoder import encode_basestring_ascii
from typing import Any

from renderers.labels import ENDPOINT, digest, owner_metadata
from specs import Endpoint, Environment, RolloutPolicy
from specs.rollout import BUILTIN_TEMPLATES

SIDECAR_LABEL = "grafana_dashboard"
FOLDER_ANNOTATION = "grafana_folder"
FOLDER = "Forge"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def _label_of(placeholder: str) -> str:
    """The label name the built-in gate templates match ``{placeholder}`` with."""
    match = re.search(r'(\w+)="\{' + placeholder + r'\}"', BUILTIN_TEMPLATES["success-rate"])
    assert match, placeholder
    return match.group(1)


def label(what: str) -> str:
    """Name of the serving runtime's series label holding ``what`` (endpoint, namespace, version,
    variant, role): as the gates' built-in templates name it (the role's prefix for the others)."""
    if what in ("endpoint", "namespace", "role"):
        return _label_of(what)
    return _label_of("role")[: -len("role")] + what


def selector(endpoint: str, namespace: str, extra: str = "") -> str:
    """The label matchers of one endpoint's series."""
    base = f'{label("endpoint")}="{endpoint}",{label("namespace")}="{namespace}"'
    return "{" + base + (f",{extra}" if extra else "") + "}"


def _panel(pid: int, title: str, kind: str, grid: tuple[int, int, int, int], targets: list[tuple[str, str]],
           unit: str = "short", thresholds: list[tuple[float, str]] | None = None, description: str = "") -> dict[str, Any]:
    x, y, w, h = grid
    steps: list[dict[str, Any]] = [{"color": "green", "value": None}]
    steps += [{"color": color, "value": value} for value, color in (thresholds or [])]
    return {
        "id": pid, "type": kind, "title": title, "description": description, "datasource": DATASOURCE,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "fieldConfig": {"defaults": {"unit": unit, "thresholds": {"mode": "absolute", "steps": steps},
                                     "custom": {"thresholdsStyle": {"mode": "line" if thresholds else "off"}}},
                        "overrides": []},
        "options": {"legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull", "max"]},
                    "tooltip": {"mode": "multi"}},
        "targets": [{"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend, "datasource": DATASOURCE}
                    for i, (expr, legend) in enumerate(targets)],
    }


def _policy_bounds(policy: RolloutPolicy | None) -> tuple[list[tuple[float, str]], list[tuple[float, str]]]:
    """(success-rate thresholds, latency thresholds) from the policy's built-in metrics."""
    success: list[tuple[float, str]] = []
    latency: list[tuple[float, str]] = []
    for metric in (policy.spec.metrics if policy else []):
        if metric.template == "success-rate" and metric.min is not None:
            success = [(0.0, "red"), (metric.min, "green")]
        elif metric.template == "latency-p99" and metric.max is not None:
            latency = [(metric.max, "red")]
    return success, latency


def _steps_markdown(policy: RolloutPolicy | None) -> str:
    if policy is None:
        return "No rollout policy: a new version replaces the stable one directly."
    if policy.spec.strategy == "canary" and policy.spec.canary is not None:
        lines = ["| step | canary weight | pause | analysis |", "| --- | --- | --- | --- |"]
        for i, step in enumerate(policy.spec.canary.steps, 1):
            lines.append(f"| {i} | {step.weight} % | {step.pause} | {', '.join(step.analysis) or '—'} |")
        return f"Rollout policy `{policy.name}` (canary):\n\n" + "\n".join(lines) + \
            "\n\nThe controller's state: `forgectl rollout status <endpoint>`."
    return f"Rollout policy `{policy.name}` ({policy.spec.strategy}). The controller's state: `forgectl rollout status <endpoint>`."


def dashboard(endpoint: Endpoint, policy: RolloutPolicy | None, namespace: str) -> dict[str, Any]:
    """The Grafana dashboard model of one endpoint."""
    return _dashboard(endpoint.name, policy, namespace)


def _dashboard(name: str, policy: RolloutPolicy | None, namespace: str) -> dict[str, Any]:
    sel = selector(name, namespace)
    rate = "$__rate_interval"
    role, version, variant = label("role"), label("version"), label("variant")
    arms = f"{role}, {version}, {variant}"
    by_arm = "{{" + role + "}} {{" + version + "}}"
    success_bounds, latency_bounds = _policy_bounds(policy)
    requests = f"forge_requests_total{sel}"
    ok = "forge_requests_total" + selector(name, namespace, 'code!~"5.."')
    buckets = f"forge_request_duration_seconds_bucket{sel}"
    canary = "forge_requests_total" + selector(name, namespace, f'{role}="canary"')
    panels = [
        _panel(1, "Traffic per arm", "timeseries", (0, 0, 12, 8),
               [(f"sum by ({arms}) (rate({requests}[{rate}]))", by_arm + " {{" + variant + "}}")], unit="reqps",
               description="Inference requests per second answered by each predictor."),
        _panel(2, "Success rate per arm", "timeseries", (12, 0, 12, 8),
               [(f"sum by ({arms}) (rate({ok}[{rate}])) / sum by ({arms}) (rate({requests}[{rate}]))", by_arm)],
               unit="percentunit", thresholds=success_bounds,
               description="Share of requests not answered with HTTP 5xx; the line is the policy's bound."),
        _panel(3, "Latency quantiles per arm", "timeseries", (0, 8, 12, 9),
               [(f"histogram_quantile({q}, sum by (le, {role}, {version}) (rate({buckets}[{rate}])))", f"p{pct} {by_arm}")
                for q, pct in (("0.5", "50"), ("0.9", "90"), ("0.99", "99"))], unit="s", thresholds=latency_bounds,
               description="End-to-end request latency at the model server; the line is the policy's p99 bound."),
        _panel(4, "Rollout step: canary share of requests", "timeseries", (12, 8, 12, 9),
               [(f"sum(rate({canary}[{rate}])) / sum(rate({requests}[{rate}]))", "canary share")], unit="percentunit",
               thresholds=[(float(s.weight) / 100, "blue") for s in (policy.spec.canary.steps if policy and policy.spec.canary else [])],
               description="The canary's share of answered requests: it follows the rollout's steps (the lines)."),
        {"id": 5, "type": "text", "title": "Rollout policy", "gridPos": {"x": 0, "y": 17, "w": 12, "h": 7},
         "options": {"mode": "markdown", "content": _steps_markdown(policy)}},
        _panel(6, "Rows per model call (dynamic batching)", "timeseries", (12, 17, 12, 7),
               [(f"sum by ({role}, {version}) (rate(forge_batch_size_sum{sel}[{rate}])) / "
                 f"sum by ({role}, {version}) (rate(forge_batch_size_count{sel}[{rate}]))", by_arm)],
               description="Average rows per model call after batching."),
    ]
    return {
        "uid": f"forge-{digest([namespace, name])[:24]}",
        "title": f"Forge endpoint {name} ({namespace})",
        "tags": ["forge", f"endpoint:{name}"],
        "editable": False,
        "schemaVersion": 39,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "templating": {"list": [{"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
                                 "current": {}, "hide": 0}]},
        "panels": panels,
    }


def _indented(value: Any, out: list[str], pad: str) -> None:
    """Append ``value`` as ``json.dumps(value, indent=1, sort_keys=True)`` writes it, at nesting
    ``pad``. The same bytes, about 4× faster: json's indenting encoder is pure Python (its C
    encoder cannot indent), and with thousands of endpoints the dashboards were most of a render."""
    if isinstance(value, str):
        out.append(encode_basestring_ascii(value))
    elif value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, dict):
        if not value:
            out.append("{}")
            return
        inner = pad + " "
        first = True
        for key, item in sorted(value.items()):
            if not isinstance(key, str):
                raise TypeError(f"dashboard keys are strings, not {type(key).__name__}")
            out.append(("{\n" if first else ",\n") + inner + encode_basestring_ascii(key) + ": ")
            first = False
            _indented(item, out, inner)
        out.append("\n" + pad + "}")
    elif isinstance(value, (list, tuple)):
        if not value:
            out.append("[]")
            return
        inner = pad + " "
        first = True
        for item in value:
            out.append(("[\n" if first else ",\n") + inner)
            first = False
            _indented(item, out, inner)
        out.append("\n" + pad + "]")
    elif isinstance(value, (int, float)):
        out.append(json.dumps(value))  # int and float reprs, NaN/Infinity exactly as json writes them
    else:
        raise TypeError(f"not JSON serializable: {type(value).__name__}")


def dashboard_json(model: dict[str, Any]) -> str:
    """``json.dumps(model, indent=1, sort_keys=True)``, faster (see :func:`_indented`)."""
    out: list[str] = []
    _indented(model, out, "")
    return "".join(out)


#: A DNS-1123 label (what an Endpoint's name is): it reads the same inside a JSON string.
_PLAIN_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
#: The name a template is rendered with (a DNS-1123 label no Endpoint can have: 63 characters max).
_PLACEHOLDER = "forge-dashboard-endpoint-name-placeholder-" + "x" * 30
#: (policy identity, namespace) → (the policy, the dashboard's text for the placeholder name, or
#: None where substituting the name was found not to give the same text). Policies are frozen.
_TEMPLATES: dict[tuple[int, str], tuple[RolloutPolicy | None, str | None]] = {}
_TEMPLATES_MAX = 64


def _uid(namespace: str, name: str) -> str:
    return f"forge-{digest([namespace, name])[:24]}"


def dashboard_text(name: str, policy: RolloutPolicy | None, namespace: str) -> str:
    """The JSON text of endpoint ``name``'s dashboard: ``dashboard_json(dashboard(...))``.

    A dashboard differs from one endpoint to the next only by the name (in the title, tags and the
    queries' matchers) and the uid derived from it, so the text is rendered once per policy and
    namespace with a placeholder name and the name substituted — checked against a full render of
    the first endpoint that uses the template (if they differ, every endpoint is rendered in full).
    With thousands of endpoints, building and encoding each dashboard was most of a render."""
    if not _PLAIN_NAME.match(name) or _PLACEHOLDER in namespace:
        return dashboard_json(_dashboard(name, policy, namespace))
    key = (id(policy), namespace)
    cached = _TEMPLATES.get(key)
    if cached is None or cached[0] is not policy:
        if len(_TEMPLATES) >= _TEMPLATES_MAX:
            _TEMPLATES.clear()
        full = dashboard_json(_dashboard(name, policy, namespace))
        template = dashboard_json(_dashboard(_PLACEHOLDER, policy, namespace))
        _TEMPLATES[key] = (policy, template if _substitute(template, name, namespace) == full else None)
        return full
    if cached[1] is None:
        return dashboard_json(_dashboard(name, policy, namespace))
    return _substitute(cached[1], name, namespace)


def _substitute(template: str, name: str, namespace: str) -> str:
    return template.replace(_uid(namespace, _PLACEHOLDER), _uid(namespace, name)).replace(_PLACEHOLDER, name)


def render_dashboard(endpoint: Endpoint, policy: RolloutPolicy | None, env: Environment, namespace: str,
                     revision: str | None) -> dict[str, Any]:
    """The ConfigMap carrying an endpoint's dashboard, labelled for Grafana's sidecar."""
    meta = owner_metadata(endpoint, name=f"{endpoint.name[:53]}-dashboard", namespace=namespace, environment=env.name,
                          revision=revision, labels={ENDPOINT: endpoint.name, SIDECAR_LABEL: "1"},
                          annotations={FOLDER_ANNOTATION: FOLDER})
    text = dashboard_text(endpoint.name, policy, namespace)
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {f"forge-{endpoint.name}.json": text}}
