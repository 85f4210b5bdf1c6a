"""`forgectl status`: workflows and their steps, model versions with their metrics, endpoints with
their traffic split, rollout state and last analysis — collected as plain data, then drawn."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from renderers.labels import ENDPOINT, MODEL_VERSION, NAME
from specs import Environment, SpecSet


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def collect(specs: SpecSet, env: Environment, target: Any) -> dict[str, Any]:
    """Everything `status` shows, as plain data."""
    from reconciler.session import serving_states

    live = target.read_live()
    data: dict[str, Any] = {"environment": env.name, "target": target.name, "workflows": [], "models": [], "endpoints": []}
    local = target.name == "local"
    for wf in (o for o in live if o["kind"] == "Workflow"):
        labels = wf["metadata"].get("labels") or {}
        entry = {"name": wf["metadata"]["name"], "model": labels.get(NAME), "version": labels.get(MODEL_VERSION),
                 "phase": (wf.get("status") or {}).get("phase", "Pending"), "steps": []}
        if local:
            rows = target.db.db.execute(
                "SELECT step, status, attempts, started, finished, exit_code, message FROM steps WHERE workflow = ? ORDER BY started",
                (wf["metadata"]["name"],)).fetchall()
            entry["steps"] = [{"step": r[0], "status": r[1], "attempts": r[2],
                               "seconds": round(r[4] - r[3], 1) if r[3] and r[4] else None, "exit": r[5], "message": r[6]} for r in rows]
        data["workflows"].append(entry)
    if local:
        running = target.db.db.execute("SELECT name, phase, message FROM workflows WHERE phase = 'Running'").fetchall()
        for name, phase, message in running:
            if not any(w["name"] == name for w in data["workflows"]):
                data["workflows"].append({"name": name, "phase": phase, "steps": [], "message": message})
        registry = target.workspace / "registry"
        for reg in sorted(registry.glob("*/*/registry.json")):
            info = _read(reg) or {}
            variants = {}
            for variant, meta in (info.get("variants") or {}).items():
                metrics = meta.get("metrics") or {}
                report = meta.get("report") or {}
                variants[variant] = {"sizeBytes": meta.get("sizeBytes"), "parameters": meta.get("parameters"),
                                     "accuracy": metrics.get("accuracy", (report.get("after") or {}).get("accuracy"))}
            evaluate = _read(target.workspace / "models" / info.get("model", "") / info.get("version", "") / "evaluate" / "metrics.json") or {}
            data["models"].append({"model": info.get("model"), "version": info.get("version"), "variants": variants,
                                   "evaluation": {k: v for k, v in evaluate.items() if isinstance(v, (int, float, bool))},
                                   **({"privacy": evaluate["privacy"]} if isinstance(evaluate.get("privacy"), dict) else {})})
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
        if local:
            entry["url"] = target.serving.endpoint_url(endpoint)
        data["endpoints"].append(entry)
    return data


def render_text(data: dict[str, Any]) -> str:
    """Rich markup of the status."""
    style = {"succeeded": "green", "cached": "cyan", "failed": "red", "running": "yellow", "Succeeded": "green", "Failed": "red", "Running": "yellow"}
    lines = [f"[bold]Environment[/bold] {data['environment']} ({data['target']})", "", "[bold]Workflows[/bold]"]
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


def log_files(target: Any, name: str) -> list[Path]:
    """Log files of a local step (`WORKFLOW/STEP` or `STEP`), a workflow, or an endpoint's servers."""
    logs = target.state_dir / "logs"
    found: list[Path] = []
    if "/" in name:
        found = [logs / "workflows" / f"{name}.log"]
    else:
        found = sorted((logs / "workflows").glob(f"*/{name}.log"), key=lambda p: p.stat().st_mtime)[-1:]
        found += sorted((logs / "workflows" / name).glob("*.log")) if (logs / "workflows" / name).is_dir() else []
        found += sorted(p for p in logs.glob(f"*{name}*.log"))
    return [p for p in found if p.is_file()]
