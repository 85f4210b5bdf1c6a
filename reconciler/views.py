"""Human views of a Plan — terminal text (coloured with rich) and Markdown for pull requests —
both rendered from the plan's JSON, the one source of truth (as Terraform does)."""

from __future__ import annotations

import html
import json
import re
from collections import defaultdict
from typing import Any, Mapping

from rich.markup import escape as _rich_escape

from reconciler.diagnostics import printable

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
    """Rich markup of the plan for a terminal or a CI log, grouped by spec. Every value from the
    plan is escaped: it can neither add markup nor control characters."""
    lines = [f"[bold]Environment[/bold] {_escape(plan['environment'])} ([italic]{_escape(plan['target'])}[/italic])"
             + (f" at {_escape(plan['revision'])}" if plan.get("revision") else "")]
    for group, changes in _grouped(plan, verbose).items():
        lines.append("")
        lines.append(f"[bold]{_escape(group)}[/bold]")
        for change in changes:
            action = change["action"]
            lines.append(f"  [{STYLE[action]}]{SYMBOL[action]} {action:<7} {_escape(_ref(change))}[/{STYLE[action]}]")
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


def _escape(text: Any) -> str:
    """A value for rich markup: control characters shown as escapes, `[` escaped."""
    return _rich_escape(printable(str(text)))


_MD_SPECIAL = re.compile(r"([\\`*_\[\]|~#])")
_BACKTICKS = re.compile(r"`+")


def _md_plain(text: str) -> str:
    """Text outside code spans: Markdown's inline syntax (emphasis, links, images, tables,
    strike-through, issue references) escaped, HTML escaped, `@` as an entity (no mentions)."""
    text = html.escape(_MD_SPECIAL.sub(r"\\\1", text), quote=False)
    return text.replace("@", "&#64;")


def md_text(text: Any) -> str:
    """A value for Markdown prose or a table cell, on one line (control characters shown as
    escapes). Code spans that pair up (`` `name` ``, as Forge writes field names in reasons) stay
    code spans — their content is literal to Markdown and cannot add syntax — with only `|` escaped
    (tables); everything else is escaped by :func:`_md_plain`. An unpaired backtick is text."""
    text = printable(str(text))
    out: list[str] = []
    pos = 0
    while True:
        opening = _BACKTICKS.search(text, pos)
        if opening is None:
            out.append(_md_plain(text[pos:]))
            break
        closing = next((m for m in _BACKTICKS.finditer(text, opening.end()) if len(m[0]) == len(opening[0])), None)
        if closing is None:
            out.append(_md_plain(text[pos:]))
            break
        out.append(_md_plain(text[pos:opening.start()]))
        out.append(opening[0] + text[opening.end():closing.start()].replace("|", "\\|") + closing[0])
        pos = closing.end()
    return "".join(out)


def _md_code(text: Any) -> str:
    """A value as inline code that no value can break out of: a code span when the text holds no
    backtick, pipe or control character (the usual names), else an escaped `<code>` element."""
    text = str(text)
    if text and text.isprintable() and not re.search(r"[`|]", text) and text.strip() == text:
        return f"`{text}`"
    return f"<code>{md_text(text)}</code>"


def _fence(lines: list[str]) -> str:
    """A code fence longer than any run of backticks in ``lines`` (so none can close it)."""
    longest = max((len(run) for line in lines for run in re.findall(r"`+", line)), default=0)
    return "`" * max(3, longest + 1)


def markdown(plan: Mapping[str, Any], *, title: str = "Forge plan") -> str:
    """A pull-request comment body: summary, then per spec a table of changes and their reasons.
    Every value from the plan is escaped (see :func:`md_text`); diffs sit in a fence that no value
    can close, one line per field."""
    out = [f"### {md_text(title)} — {_md_code(plan['environment'])}", "", f"**{summary_line(plan)}**", ""]
    groups = _grouped(plan, False)
    if not groups:
        return "\n".join(out)
    for group, changes in groups.items():
        out += [f"#### {md_text(group)}", "", "| | object | why |", "|---|---|---|"]
        for change in changes:
            why = "<br>".join(md_text(r) for r in change["reasons"]) or "—"
            out.append(f"| {SYMBOL[change['action']].strip() or '·'} {change['action']} | {_md_code(_ref(change))} | {why} |")
        diffs = [c for c in changes if c["action"] == "update" and c["diff"]]
        for change in diffs:
            body = []
            for d in change["diff"][:50]:
                old = printable(_short(_redact(change, d["old"], d["path"])))
                new = printable(_short(_redact(change, d["new"], d["path"])))
                if d["op"] != "add":
                    body.append(f"- {printable(d['path'])}: {old}")
                if d["op"] != "remove":
                    body.append(f"+ {printable(d['path'])}: {new}")
            fence = _fence(body)
            out += ["", f"<details><summary>{md_text(_ref(change))}: {len(change['diff'])} field(s)</summary>", "",
                    fence + "diff", *body, fence, "", "</details>"]
        out.append("")
    for note in plan.get("notes", []):
        out.append(f"> {md_text(note)}")
    return "\n".join(out)


def rollout_text(status: Mapping[str, Any]) -> str:
    """`forgectl rollout status` for a terminal: phase, step, weights, last analysis, last reason."""
    lines = [f"[bold]Endpoint[/bold] {_escape(status['endpoint'])} (model `{_escape(status['model'])}`, "
             f"specs want {_escape(status['desiredVersion'])})"]
    serving = status.get("serving")
    if serving is None:
        lines.append("  not applied yet")
        return "\n".join(lines)
    w = serving["weights"]
    lines.append(f"  stable  {_escape(serving['stable'])}  [green]{'█' * (w['stable'] // 5)}[/green] {w['stable']} %")
    if serving.get("canary"):
        lines.append(f"  canary  {_escape(serving['canary'])}  [yellow]{'█' * (w['canary'] // 5)}[/yellow] {w['canary']} %")
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
        lines.append(f"  [{style}]{_escape(v):<12}[/{style}] {_escape(m['metric'])} = {value}  "
                     f"(want {_escape(m['threshold'])}): {_escape(m['detail'])}")
    lines.append(f"  why     {_escape(rollout['reason'])}")
    if rollout.get("writeback"):
        lines.append(f"  git     {_escape(rollout['writeback'])}")
    for entry in rollout.get("history", [])[-5:]:
        lines.append(f"  [dim]{entry['from']} → {entry['to']}: {_escape(entry['reason'])}[/dim]")
    return "\n".join(lines)
