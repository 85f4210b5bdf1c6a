"""Human views of a Plan — terminal text (coloured with rich) and Markdown for pull requests —
both rendered from the plan's JSON, the one source of truth (as Terraform does)."""

from __future__ import annotations

import html
import json
import re
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

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


def _where(item: Mapping[str, Any]) -> str:
    file, line = item.get("file"), item.get("line")
    return f"{file}:{line}" if file and line else (file or "")


def _flag_line(item: Mapping[str, Any]) -> str:
    spec = item.get("spec") or {}
    who = f"{spec.get('kind')} {spec.get('name')}: " if spec.get("kind") else ""
    return who + str(item["message"])


def _spec_change_text(entry: Mapping[str, Any]) -> str:
    from reconciler.plan.review import change_line

    if not entry.get("path"):
        return "spec added" if entry["op"] == "add" else "spec removed"
    return change_line(entry)


def _cost_groups(plan: Mapping[str, Any]) -> list[tuple[str, list[str]]]:
    """(title, lines) per training step and endpoint of the plan's cost section."""
    cost = plan.get("cost") or {}
    groups = []
    for t in cost.get("training", []):
        groups.append((f"train Model {t['model']} — pool {t['pool']} ({t['accelerator']})", list(t.get("lines", []))))
    for e in cost.get("serving", []):
        groups.append((f"serve Endpoint {e['endpoint']}", [e["line"]]))
    return groups


def cost_summary(plan: Mapping[str, Any]) -> str:
    """`training: 8 GPUs, ≈ 0.0003 GPU-hours; serving: 2 GPUs`."""
    from renderers.cost import hours

    cost = plan.get("cost") or {}
    parts = []
    if any(t.get("error") for t in cost.get("training", [])):
        parts.append("training cannot be scheduled")
    elif cost.get("training"):
        known = cost.get("trainingGpuHours")
        parts.append(f"training {cost.get('trainingGpus', 0)} GPU{'s' if cost.get('trainingGpus', 0) != 1 else ''}"
                     + (f", ≈ {hours(known)} GPU-hours" if known is not None else ""))
    if cost.get("serving"):
        parts.append(f"serving {cost.get('servingGpus', 0)} GPU{'s' if cost.get('servingGpus', 0) != 1 else ''}")
    return "; ".join(parts)


def _value_diff_text(path: str, shown: Mapping[str, Any], indent: str) -> list[str]:
    """Rich markup lines of a token- or line-level value diff."""
    lines = []
    if shown["kind"] == "tokens":
        for h in shown["hunks"]:
            lines.append(f"{indent}[yellow]~ {_escape(path)}:[/yellow] {_escape(h['before'])}[red]\\[-{_escape(h['old'])}-][/red]"
                         f"[green]{{+{_escape(h['new'])}+}}[/green]{_escape(h['after'])}")
    else:
        lines.append(f"{indent}[yellow]~ {_escape(path)}:[/yellow]")
        for mark, line in shown["lines"]:
            style = {"-": "red", "+": "green", "@@": "cyan"}.get(mark, "dim")
            shown_mark = "@@" if mark == "@@" else mark
            lines.append(f"{indent}  [{style}]{_escape(shown_mark)} {_escape(line)}[/{style}]")
    if shown.get("more"):
        lines.append(f"{indent}  … {shown['more']} more")
    if shown.get("note"):
        lines.append(f"{indent}  [dim]({_escape(shown['note'])})[/dim]")
    return lines


def text(plan: Mapping[str, Any], *, verbose: bool = False) -> str:
    """Rich markup of the plan for a terminal or a CI log: blockers and risk flags first, then the
    spec changes, the GPU arithmetic and cost, and the changes grouped by spec. Every value from
    the plan is escaped: it can neither add markup nor control characters."""
    lines = [f"[bold]Environment[/bold] {_escape(plan['environment'])} ([italic]{_escape(plan['target'])}[/italic])"
             + (f" at {_escape(plan['revision'])}" if plan.get("revision") else "")
             + (f", compared with {_escape(plan['base'])}" if plan.get("base") else "")]
    blockers, risks = plan.get("blockers") or [], plan.get("risks") or []
    if blockers:
        lines += ["", f"[bold red]✗ The target cannot run this plan ({len(blockers)}):[/bold red]"]
        for b in blockers:
            where = _where(b) + (f"; capacity declared at {b['declaredAt']}" if b.get("declaredAt") else "")
            lines.append(f"  [red]✗[/red] {_escape(b['message'])}" + (f" [dim]({_escape(where)})[/dim]" if where else ""))
    if risks:
        lines += ["", f"[bold yellow]⚠ Risk flags ({len(risks)}):[/bold yellow]"]
        for r in risks:
            where = _where(r)
            lines.append(f"  [yellow]⚠ {_escape(r['flag'])}[/yellow]  {_escape(_flag_line(r))}"
                         + (f" [dim]({_escape(where)})[/dim]" if where else ""))
    changes = plan.get("specChanges") or []
    if changes:
        lines += ["", f"[bold]Spec changes ({len(changes)}):[/bold]"]
        last = None
        for entry in changes:
            head = (entry["kind"], entry["name"])
            if head != last:
                lines.append(f"  {_escape(entry['kind'])} {_escape(entry['name'])}" + (f" [dim]({_escape(entry['file'])})[/dim]" if entry.get("file") else ""))
                last = head
            at = f" [dim]:{entry['line']}[/dim]" if entry.get("line") else ""
            if entry.get("valueDiff"):
                lines += _value_diff_text(entry["path"], entry["valueDiff"], "    ")
                lines[-1] += at
            else:
                mark, style = {"add": ("+", "green"), "remove": ("-", "red")}.get(entry["op"], ("~", "yellow"))
                lines.append(f"    [{style}]{mark}[/{style}] {_escape(_spec_change_text(entry))}{at}")
    rollouts = plan.get("rollouts") or []
    if rollouts:
        lines += ["", f"[bold]Rollouts the controller will run ({len(rollouts)}):[/bold]"]
        for rollout in rollouts:
            first, *rest = rollout["lines"]
            lines.append(f"  Endpoint {_escape(rollout['endpoint'])}: {_escape(first)}")
            lines += [f"    {_escape(line)}" for line in rest]
    groups = _cost_groups(plan)
    if groups:
        lines += ["", f"[bold]GPU arithmetic and cost[/bold] ({_escape(cost_summary(plan))}):"]
        for title, body in groups:
            lines.append(f"  {_escape(title)}")
            lines += [f"    {_escape(line)}" for line in body]
    for group, group_changes in _grouped(plan, verbose).items():
        lines.append("")
        lines.append(f"[bold]{_escape(group)}[/bold]")
        for change in group_changes:
            action = change["action"]
            lines.append(f"  [{STYLE[action]}]{SYMBOL[action]} {action:<7} {_escape(_ref(change))}[/{STYLE[action]}]")
            for reason in change["reasons"]:
                lines.append(f"      [cyan]why:[/cyan] {_escape(reason)}")
            if action == "update":
                for d in change["diff"][:20]:
                    shown = d.get("valueDiff") if change["ref"]["kind"] not in SENSITIVE_KINDS else None
                    if shown:
                        lines += _value_diff_text(d["path"], shown, "      ")
                        continue
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


#: Most characters of a Markdown plan: a GitHub comment holds 65,536; the rest is headroom for
#: the note of what was left out.
MAX_MARKDOWN = 60_000
#: Most blockers or risk flags listed (the rest are counted).
MAX_FLAGS = 50
#: Most sections the note of what was left out names (the rest are counted).
MAX_LEFT_OUT = 5


def _md_where(item: Mapping[str, Any]) -> str:
    where = _where(item)
    return f" ({_md_code(where)})" if where else ""


def _diff_body(change: Mapping[str, Any]) -> list[str]:
    """Lines of a change's diff fence: `- path: old` / `+ path: new`, token-level hunks as one
    such pair each, unified diffs as `@@ path …`, `- `, `+ ` and `  ` (context) lines."""
    body: list[str] = []
    for d in change["diff"][:50]:
        shown = d.get("valueDiff") if change["ref"]["kind"] not in SENSITIVE_KINDS else None
        body += _value_diff_md(d["path"], shown) if shown else []
        if shown:
            continue
        old = printable(_short(_redact(change, d["old"], d["path"])))
        new = printable(_short(_redact(change, d["new"], d["path"])))
        if d["op"] != "add":
            body.append(f"- {printable(d['path'])}: {old}")
        if d["op"] != "remove":
            body.append(f"+ {printable(d['path'])}: {new}")
    if len(change["diff"]) > 50:
        body.append(f"+ … {len(change['diff']) - 50} more field(s)")
    return body


def _value_diff_md(path: str, shown: Mapping[str, Any]) -> list[str]:
    out = []
    if shown["kind"] == "tokens":
        for h in shown["hunks"]:
            out.append(f"- {printable(path)}: {printable(h['before'] + h['old'] + h['after'])}")
            out.append(f"+ {printable(path)}: {printable(h['before'] + h['new'] + h['after'])}")
    else:
        out.append(f"@@ {printable(path)} @@")
        for mark, line in shown["lines"]:
            if mark == "@@":
                out.append(f"@@ {printable(line)} @@")
            else:
                out.append(f"{mark if mark in '-+' else ' '} {printable(line)}")
    if shown.get("more"):
        out.append(f"@@ … {shown['more']} more @@")
    if shown.get("note"):
        out.append(f"@@ {printable(shown['note'])} @@")
    return out


def _details(summary: str, body: list[str], *, open_: bool = False) -> list[str]:
    return ["", f"<details{' open' if open_ else ''}><summary>{summary}</summary>", "", *body, "", "</details>"]


def _fenced(body: list[str]) -> list[str]:
    fence = _fence(body)
    return [fence + "diff", *body, fence]


def _flags_md(items: list[Mapping[str, Any]], risk: bool) -> list[str]:
    out = []
    for item in items[:MAX_FLAGS]:
        if risk:
            out.append(f"- **{md_text(item['flag'])}** — {md_text(_flag_line(item))}{_md_where(item)}")
        else:
            declared = f"; capacity declared at {_md_code(item['declaredAt'])}" if item.get("declaredAt") else ""
            out.append(f"- {md_text(item['message'])}{_md_where(item)}{declared}")
    if len(items) > MAX_FLAGS:
        out.append(f"- … and {len(items) - MAX_FLAGS} more (`-o json` lists them all)")
    return out


def _spec_changes_md(changes: list[Mapping[str, Any]]) -> list[str]:
    body: list[str] = []
    fenced: list[str] = []
    for entry in changes:
        at = _md_where(entry)
        who = f"{md_text(entry['kind'])} {_md_code(entry['name'])}"
        if entry.get("valueDiff"):
            body.append(f"- {who}: {_md_code(entry['path'])} changed (diff below){at}")
            fenced += _value_diff_md(f"{entry['kind']} {entry['name']}: {entry['path']}", entry["valueDiff"])
        else:
            body.append(f"- {who}: {md_text(_spec_change_text(entry))}{at}")
    if fenced:
        body += ["", *_fenced(fenced)]
    return body


def _cost_md(plan: Mapping[str, Any]) -> list[str]:
    body: list[str] = []
    for title, lines in _cost_groups(plan):
        body.append(f"- **{md_text(title)}**")
        for line in lines:
            depth = (len(line) - len(line.lstrip(" "))) // 2
            body.append("  " * (depth + 1) + f"- {md_text(line.strip())}")
    cost = plan.get("cost") or {}
    if cost.get("training"):
        body += ["", md_text(f"Memory: 90 % of a device is usable; GPU-hours assume {cost.get('utilisation', 0) * 100:g} % of "
                             "the accelerator's dense peak (renderers/cost.py has the formulas).")]
    return body


def markdown(plan: Mapping[str, Any], *, title: str = "Forge plan", limit: int = MAX_MARKDOWN) -> str:
    """A pull-request comment body: blockers and risk flags first, the summary, then collapsible
    sections — spec changes, the GPU arithmetic and cost — and per spec a table of changes, their
    reasons and diffs. Every value from the plan is escaped (see :func:`md_text`); diffs sit in a
    fence that no value can close. At most ``limit`` characters: sections that do not fit are left
    out, largest detail first, and a note at the end says what was."""
    head = [f"### {md_text(title)} — {_md_code(plan['environment'])}", ""]
    if plan.get("base"):
        head += [f"Comparing {_md_code(plan['base'])} → {_md_code(plan.get('head') or 'working tree')}.", ""]
    blockers, risks = plan.get("blockers") or [], plan.get("risks") or []
    if blockers:
        head += [f"**⛔ The target cannot run this plan ({len(blockers)}):**", "", *_flags_md(blockers, False), ""]
    if risks:
        head += [f"**⚠️ Risk flags ({len(risks)}):**", "", *_flags_md(risks, True), ""]
    head.append(f"**{summary_line(plan)}**")
    # Sections in order of importance, each (label for the left-out note, full lines, smaller lines).
    sections: list[tuple[str, list[str], list[str] | None]] = []
    spec_changes = plan.get("specChanges") or []
    if spec_changes:
        sections.append((f"spec changes ({len(spec_changes)})",
                         _details(f"Spec changes ({len(spec_changes)})", _spec_changes_md(spec_changes), open_=True), None))
    rollouts = plan.get("rollouts") or []
    if rollouts:
        body = []
        for rollout in rollouts:
            first, *rest = rollout["lines"]
            body.append(f"- Endpoint {_md_code(rollout['endpoint'])}: {md_text(first)}")
            body += [f"  - {md_text(line)}" for line in rest]
        sections.append((f"rollouts ({len(rollouts)})",
                         _details(f"Rollouts the controller will run ({len(rollouts)})", body, open_=True), None))
    if _cost_groups(plan):
        sections.append(("GPU arithmetic and cost",
                         _details(f"GPU arithmetic and cost — {md_text(cost_summary(plan))}", _cost_md(plan)), None))
    for group, changes in _grouped(plan, False).items():
        table = ["", f"#### {md_text(group)}", "", "| | object | why |", "|---|---|---|"]
        for change in changes:
            why = "<br>".join(md_text(r) for r in change["reasons"]) or "—"
            table.append(f"| {SYMBOL[change['action']].strip() or '·'} {change['action']} | {_md_code(_ref(change))} | {why} |")
        diffs: list[str] = []
        for change in changes:
            if change["action"] == "update" and change["diff"]:
                diffs += _details(f"{md_text(_ref(change))}: {len(change['diff'])} field(s)", _fenced(_diff_body(change)))
        sections.append((f"{group} ({len(changes)} object(s))", table + diffs, table if diffs else None))
    notes = [f"> {md_text(note)}" for note in plan.get("notes", [])]
    out = list(head)
    size = sum(len(line) + 1 for line in out) + sum(len(n) + 2 for n in notes) + 1000  # room for the note
    left_out: list[str] = []
    for label, full, smaller in sections:
        cost = sum(len(line) + 1 for line in full)
        if size + cost <= limit:
            out += full
            size += cost
            continue
        if smaller is not None and size + sum(len(line) + 1 for line in smaller) <= limit:
            out += smaller
            size += sum(len(line) + 1 for line in smaller)
            left_out.append(f"the diffs of {label}")
            continue
        left_out.append(label)
    if notes:
        out += ["", *notes]
    if left_out:
        shown = left_out[:MAX_LEFT_OUT] + ([f"and {len(left_out) - MAX_LEFT_OUT} more"] if len(left_out) > MAX_LEFT_OUT else [])
        out += ["", f"> **Left out to fit a comment ({limit:,} characters):** " + md_text("; ".join(shown))
                + " — `forgectl plan -o json` has everything."]
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
