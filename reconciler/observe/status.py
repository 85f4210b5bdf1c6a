"""`forgectl status`: workflows and their steps, model versions with their metrics, endpoints with
their traffic split, rollout state and last analysis — collected as plain data through the Target
protocol alone, then drawn."""

from __future__ import annotations

from typing import Any

from reconciler.observe.syncs import read_syncs, sync_lines
from reconciler.targets.base import Target
from reconciler.traffic.serving import serving_states
from renderers.labels import ENDPOINT, MODEL_VERSION, NAME
from specs import Environment, SpecSet


def collect(specs: SpecSet, env: Environment, target: Target) -> dict[str, Any]:
    """Everything `status` shows, as plain data: the live objects, and what the target records
    beyond them (:meth:`Target.run_details`: steps, runs in progress, models, addresses)."""
    live = target.read_live()
    details = target.run_details(live)
    data: dict[str, Any] = {"environment": env.name, "target": target.name, "workflows": [], "models": [], "endpoints": []}
    for wf in (o for o in live if o["kind"] == "Workflow"):
        labels = wf["metadata"].get("labels") or {}
        steps = [{"step": r.step, "status": r.status, "attempts": r.attempts,
                  "seconds": round(r.finished - r.started, 1) if r.started and r.finished else None,
                  "exit": r.exit_code, "message": r.message}
                 for r in details.steps.get(wf["metadata"]["name"], [])]
        data["workflows"].append({"name": wf["metadata"]["name"], "model": labels.get(NAME), "version": labels.get(MODEL_VERSION),
                                  "phase": (wf.get("status") or {}).get("phase", "Pending"), "steps": steps})
    for run in details.running:
        if not any(w["name"] == run.name for w in data["workflows"]):
            data["workflows"].append({"name": run.name, "phase": run.phase, "steps": [], "message": run.message})
    data["models"] = list(details.models)
    api = target.cluster_api()
    if api is not None:  # a cluster: what its controller (if one applies this environment) says
        data["controller"] = read_syncs(api, env.name, target.namespace).to_json()
    states = serving_states(live)
    backend = target.rollout_backend(specs, env, None)
    for sd in (o for o in live if o["kind"] == "SeldonDeployment"):
        endpoint = (sd["metadata"].get("labels") or {}).get(ENDPOINT, sd["metadata"]["name"])
        serving = states.get(endpoint)
        rollout = backend.load_state(endpoint)
        entry = {"endpoint": endpoint,
                 "stable": serving.stable if serving else None,
                 "canary": serving.canary if serving else None,
                 "weights": {"stable": 100 - serving.canary_weight, "canary": serving.canary_weight} if serving else None,
                 "rollout": rollout.to_json() if rollout else None}
        if endpoint in details.endpoint_urls:
            entry["url"] = details.endpoint_urls[endpoint]
            entry["serving"] = served_backend(entry["url"])
        data["endpoints"].append(entry)
    return data


def served_backend(url: str | None) -> dict[str, Any] | None:
    """What a model server behind ``url`` runs, as it says at ``GET /forge/serving`` (the variant,
    its backend and threads, the batcher, why that variant); None when it does not answer."""
    if not url:
        return None
    import json
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/forge/serving", timeout=2) as resp:
            body = json.loads(resp.read())
    except (OSError, ValueError):
        return None
    return {k: body.get(k) for k in ("role", "version", "variant", "endpointVariant", "backend", "threads", "batcher", "reason")} \
        if isinstance(body, dict) else None


def render_text(data: dict[str, Any]) -> str:
    """Rich markup of the status."""
    style = {"succeeded": "green", "cached": "cyan", "failed": "red", "running": "yellow", "Succeeded": "green", "Failed": "red", "Running": "yellow"}
    lines = [f"[bold]Environment[/bold] {data['environment']} ({data['target']})"]
    if "controller" in data:
        lines += ["", "[bold]Controller[/bold]", *sync_lines(data["controller"])]
    lines += ["", "[bold]Workflows[/bold]"]
    for wf in data["workflows"] or [{"name": "none", "phase": "", "steps": []}]:
        phase = wf.get("phase", "")
        lines.append(f"  {wf['name']}  [{style.get(phase, 'white')}]{phase}[/{style.get(phase, 'white')}]")
        for step in wf.get("steps", []):
            s = step["status"]
            secs = f"{step['seconds']:.1f}s" if step.get("seconds") is not None else ""
            lines.append(f"    [{style.get(s, 'white')}]{s:<10}[/{style.get(s, 'white')}] {step['step']:<24} {secs}")
    if data["models"]:
        lines += ["", "[bold]Model versions[/bold]"]
        for m in data["models"]:
            acc = m["evaluation"].get("accuracy")
            privacy = m.get("privacy") or {}
            robust = "".join(f"  {k} {m['evaluation'][k]:.4f}" for k in ("fgsmAccuracy", "pgdAccuracy")
                             if isinstance(m["evaluation"].get(k), float))
            lines.append(f"  {m['model']} {m['version']}" + (f"  test accuracy {acc:.4f}" if isinstance(acc, float) else "")
                         + (f"  privacy ε {privacy.get('epsilonSpent', 0):.3g} spent of {privacy.get('epsilonTarget', 0):g} "
                            f"(δ {privacy.get('delta', 0):g})" if privacy else "") + robust)
            for name, v in m["variants"].items():
                size = f"{v['sizeBytes'] / 1024:.0f} KiB" if v.get("sizeBytes") else ""
                accuracy = f"accuracy {v['accuracy']:.4f}" if isinstance(v.get("accuracy"), float) else ""
                lines.append(f"    {name:<12} {size:>10}  {accuracy}")
    lines += ["", "[bold]Endpoints[/bold]"]
    if not data["endpoints"]:
        lines.append("  none served")
    for ep in data["endpoints"]:
        w = ep.get("weights") or {"stable": 100, "canary": 0}
        lines.append(f"  {ep['endpoint']}  {ep.get('url') or ''}")
        served = ep.get("serving")
        if served:
            lines.append(f"    serves {served.get('variant')} on {served.get('backend')} (threads {served.get('threads')}, batcher "
                         f"{served.get('batcher')}; {served.get('role')} {served.get('version')}): {served.get('reason')}".replace("[", "\\["))
        lines.append(f"    stable {ep['stable']}  [green]{'█' * (w['stable'] // 5)}[/green] {w['stable']} %")
        if ep.get("canary"):
            lines.append(f"    canary {ep['canary']}  [yellow]{'█' * (w['canary'] // 5)}[/yellow] {w['canary']} %")
        rollout = ep.get("rollout")
        if rollout:
            lines.append(f"    rollout {rollout['phase']} (step {rollout['step'] + 1}): {rollout['reason']}".replace("[", "\\["))
            for m in rollout.get("last_analysis", []):
                value = "—" if m.get("value") is None else f"{m['value']:.4g}"
                lines.append(f"      {m['verdict']:<12} {m['metric']} = {value} (want {m['threshold']})")
    return "\n".join(lines)
