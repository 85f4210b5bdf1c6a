"""Human views of a Plan — terminal text (coloured with rich) and Markdown for pull requests —
both rendered from the plan's JSON, the one source of truth (as Terraform does)."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any, Mapping

SYMBOL = {"create": "+", "update": "~", "delete": "-", "no-op": " "}
STYLE = {"create": "green", "update": "yellow", "delete": "red", "no-op": "dim"}
SENSITIVE_KINDS = frozenset({"Secret"})
REDACTED = "(sensitive value)"
MAX_VALUE = 120


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else value
    if len(text) > MAX_VALUE:
        text = text[: MAX_VALUE - 1] + "…"
    return text


def _redact(change: Mapping[str, Any], value: Any, path: str) -> Any:
    if change["ref"]["kind"] in SENSITIVE_KINDS and (path.startswith("data") or path.startswith("stringData")):
        return REDACTED
    return value


def _grouped(plan: Mapping[str, Any], include_noop: bool) -> dict[str, list[Mapping[str, Any]]]:
    groups: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for change in plan["changes"]:
        if change["action"] == "no-op" and not include_noop:
            continue
        spec = change["spec"]
        key = f"{spec['kind']} {spec['name']}" if spec["kind"] else "shared"
        groups[key].append(change)
    return dict(groups)


def summary_line(plan: Mapping[str, Any]) -> str:
    """`Plan: 2 to create, 1 to update, 1 to delete, 3 unchanged.`"""
    s = plan["summary"]
    if not any(s[a] for a in ("create", "update", "delete")):
        return f"No changes. {s['no-op']} object(s) match the specs."
    return f"Plan: {s['create']} to create, {s['update']} to update, {s['delete']} to delete, {s['no-op']} unchanged."


def _ref(change: Mapping[str, Any]) -> str:
    ref = change["ref"]
    return f"{ref['kind']} {ref['namespace']}/{ref['name']}" if ref["namespace"] else f"{ref['kind']} {ref['name']}"


def text(plan: Mapping[str, Any], *, verbose: bool = False) -> str:
    """Rich markup of the plan for a terminal or a CI log, grouped by spec."""
    lines = [f"[bold]Environment[/bold] {plan['environment']} ([italic]{plan['target']}[/italic])"
             + (f" at {plan['revision']}" if plan.get("revision") else "")]
    for group, changes in _grouped(plan, verbose).items():
        lines.append("")
        lines.append(f"[bold]{group}[/bold]")
        for change in changes:
            action = change["action"]
            lines.append(f"  [{STYLE[action]}]{SYMBOL[action]} {action:<7} {_ref(change)}[/{STYLE[action]}]")
            for reason in change["reasons"]:
                lines.append(f"      [cyan]why:[/cyan] {_escape(reason)}")
            if action == "update":
                for d in change["diff"][:20]:
                    old = _short(_redact(change, d["old"], d["path"]))
                    new = _short(_redact(change, d["new"], d["path"]))
                    if d["op"] == "add":
                        lines.append(f"      [green]+ {_escape(d['path'])}: {_escape(new)}[/green]")
                    elif d["op"] == "remove":
                        lines.append(f"      [red]- {_escape(d['path'])}: {_escape(old)}[/red]")
                    else:
                        lines.append(f"      [yellow]~ {_escape(d['path'])}: {_escape(old)} → {_escape(new)}[/yellow]")
                if len(change["diff"]) > 20:
                    lines.append(f"      … {len(change['diff']) - 20} more field(s)")
    for note in plan.get("notes", []):
        lines.append(f"\n[dim]{_escape(note)}[/dim]")
    lines.append("")
    lines.append(f"[bold]{summary_line(plan)}[/bold]")
    return "\n".join(lines)


def _escape(text: str) -> str:
    return text.replace("[", "\\[")


def markdown(plan: Mapping[str, Any], *, title: str = "Forge plan") -> str:
    """A pull-request comment body: summary, then per spec a table of changes and their reasons."""
    out = [f"### {title} — `{plan['environment']}`", "", f"**{summary_line(plan)}**", ""]
    groups = _grouped(plan, False)
    if not groups:
        return "\n".join(out)
    for group, changes in groups.items():
        out += [f"#### {group}", "", "| | object | why |", "|---|---|---|"]
        for change in changes:
            why = "<br>".join(r.replace("|", "\\|") for r in change["reasons"]) or "—"
            out.append(f"| {SYMBOL[change['action']].strip() or '·'} {change['action']} | `{_ref(change)}` | {why} |")
        diffs = [c for c in changes if c["action"] == "update" and c["diff"]]
        for change in diffs:
            out += ["", f"<details><summary>{_ref(change)}: {len(change['diff'])} field(s)</summary>", "", "```diff"]
            for d in change["diff"][:50]:
                old = _short(_redact(change, d["old"], d["path"]))
                new = _short(_redact(change, d["new"], d["path"]))
                if d["op"] != "add":
                    out.append(f"- {d['path']}: {old}")
                if d["op"] != "remove":
                    out.append(f"+ {d['path']}: {new}")
            out += ["```", "", "</details>"]
        out.append("")
    for note in plan.get("notes", []):
        out.append(f"> {note}")
    return "\n".join(out)


def rollout_text(status: Mapping[str, Any]) -> str:
    """`forgectl rollout status` for a terminal: phase, step, weights, last analysis, last reason."""
    lines = [f"[bold]Endpoint[/bold] {status['endpoint']} (model `{status['model']}`, specs want {status['desiredVersion']})"]
    serving = status.get("serving")
    if serving is None:
        lines.append("  not applied yet")
        return "\n".join(lines)
    w = serving["weights"]
    lines.append(f"  stable  {serving['stable']}  [green]{'█' * (w['stable'] // 5)}[/green] {w['stable']} %")
    if serving.get("canary"):
        lines.append(f"  canary  {serving['canary']}  [yellow]{'█' * (w['canary'] // 5)}[/yellow] {w['canary']} %")
    rollout = status.get("rollout")
    if not rollout:
        lines.append("  no rollout recorded")
        return "\n".join(lines)
    colour = {"Promoted": "green", "RolledBack": "red", "Aborted": "red", "Holding": "yellow"}.get(rollout["phase"], "cyan")
    lines.append(f"  phase   [{colour}]{rollout['phase']}[/{colour}]  step {rollout['step'] + 1}  canary weight {rollout['weight']} %")
    for m in rollout.get("last_analysis", []):
        value = "—" if m.get("value") is None else f"{m['value']:.4g}"
        v = m["verdict"]
        style = {"pass": "green", "fail": "red"}.get(v, "yellow")
        lines.append(f"  [{style}]{v:<12}[/{style}] {m['metric']} = {value}  (want {m['threshold']}): {_escape(m['detail'])}")
    lines.append(f"  why     {_escape(rollout['reason'])}")
    if rollout.get("writeback"):
        lines.append(f"  git     {_escape(rollout['writeback'])}")
    for entry in rollout.get("history", [])[-5:]:
        lines.append(f"  [dim]{entry['from']} → {entry['to']}: {_escape(entry['reason'])}[/dim]")
    return "\n".join(lines)
