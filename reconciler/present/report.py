"""`forgectl models report --html FILE`: the leaderboard as one self-contained HTML file (pure).

The plots are SVG written here, inline in the page: no JavaScript, no fonts, stylesheets or images
from anywhere, so the file opens offline, in a mail attachment or a CI artifact viewer, and its
Content-Security-Policy (`default-src 'none'`) makes the browser refuse any request it might try.
Drawing two scatter plots does not justify a plotting library in the control plane, which installs
light (matplotlib would bring numpy and a font stack; plotly ~4 MB of JavaScript per file), and
writing the SVG keeps the output byte-for-byte reproducible.

Per leaderboard: accuracy (the ranking metric) against p50 latency and against size, both on log
axes; colour = version, shape = runtime (● PyTorch, ◆ ONNX Runtime), a black ring = on the Pareto
front; each point's tooltip gives its figures. Then the ranked table; then, for each version a
hyperparameter search trained, its trials (searchplot.py); then every version's lineage.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from reconciler.present.searchplot import search_section
from reconciler.present.svg import esc as _esc
from reconciler.present.svg import linear_ticks as _linear_ticks
from reconciler.registry.leaderboard import Board, Row
from reconciler.registry.records import JSONObject, Record
from specs.searchresult import SearchResult

#: Okabe–Ito: distinguishable with the common colour-vision deficiencies.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;max-width:1180px;color:#1b1f24;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 6px}h3{font-size:15px;margin:18px 0 6px}
.meta,.hint{color:#57606a;margin:2px 0}.plots{display:flex;flex-wrap:wrap;gap:16px;margin:10px 0}
figure{margin:0;border:1px solid #d0d7de;border-radius:6px;padding:6px;background:#fff}
figcaption{font-size:12px;color:#57606a;text-align:center}
table{border-collapse:collapse;width:100%;margin:8px 0 4px;font-variant-numeric:tabular-nums}
th,td{border-bottom:1px solid #d8dee4;padding:4px 8px;text-align:right;white-space:nowrap}
th{background:#f6f8fa;font-weight:600}td.l,th.l{text-align:left}tr.front td{background:#f1f8ff}
.star{color:#bf8700}.swatch{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:4px;vertical-align:-1px}
code{font:12px ui-monospace,SFMono-Regular,Menlo,monospace}.note{color:#9a6700}
"""


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "—"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}" if n / size < 100 else f"{n / size:.0f} {unit}"
    return f"{n:.0f} B"


def fmt_ms(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{v:.3f} ms" if v < 1 else f"{v:.2f} ms" if v < 100 else f"{v:.0f} ms"


def fmt_metric(metric: str, v: float | None) -> str:
    if v is None:
        return "—"
    return f"{100 * v:.2f} %" if metric == "accuracy" and 0 <= v <= 1 else f"{v:.4g}"


def _log_ticks(lo: float, hi: float, binary: bool = False) -> list[float]:
    """Ticks of a log axis: 1-2-5 per decade, or powers of two (sizes in bytes)."""
    if binary:
        ticks = [2.0**k for k in range(math.floor(math.log2(lo)), math.ceil(math.log2(hi)) + 1) if lo <= 2.0**k <= hi]
        return ticks[::2] if len(ticks) > 7 else ticks
    ticks = []
    for k in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1):
        for m in (1, 2, 5):
            v = m * 10.0**k
            if lo <= v <= hi:
                ticks.append(v)
    return ticks


def _overlaps(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def scatter(points: list[dict[str, Any]], *, x_label: str, y_label: str, x_fmt: Callable[[float], str],
            y_fmt: Callable[[float], str], title: str, width: int = 540, height: int = 340, binary_x: bool = False) -> str:
    """An SVG scatter plot, log x axis, linear y axis. A point: x, y, color, shape ('circle' |
    'diamond'), front (bool), label, tip."""
    left, right, top, bottom = 70, 18, 30, 48
    pw, ph = width - left - right, height - top - bottom
    usable = [p for p in points if p.get("x") and p["x"] > 0 and p.get("y") is not None]
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
             f'role="img" aria-label="{_esc(title)}" font-family="system-ui,sans-serif" font-size="11">',
             f'<text x="{width / 2:.1f}" y="18" text-anchor="middle" font-size="13" font-weight="600">{_esc(title)}</text>']
    if not usable:
        parts.append(f'<text x="{width / 2:.1f}" y="{height / 2:.1f}" text-anchor="middle" fill="#57606a">no measured variants</text></svg>')
        return "".join(parts)
    xs, ys = [p["x"] for p in usable], [p["y"] for p in usable]
    xlo, xhi = min(xs) / 1.6, max(xs) * 1.6
    ypad = max((max(ys) - min(ys)) * 0.18, abs(max(ys)) * 0.004, 1e-6)
    ylo, yhi = min(ys) - ypad, max(ys) + ypad

    def px(x: float) -> float:
        return left + pw * (math.log10(x) - math.log10(xlo)) / (math.log10(xhi) - math.log10(xlo))

    def py(y: float) -> float:
        return top + ph * (1 - (y - ylo) / (yhi - ylo))

    parts.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="#fbfcfd" stroke="#8c959f"/>')
    for t in _log_ticks(xlo, xhi, binary_x):
        x = px(t)
        parts.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + ph}" stroke="#e6e9ec"/>'
                     f'<text x="{x:.1f}" y="{top + ph + 15}" text-anchor="middle" fill="#444">{_esc(x_fmt(t))}</text>')
    for t in _linear_ticks(ylo, yhi):
        y = py(t)
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + pw}" y2="{y:.1f}" stroke="#e6e9ec"/>'
                     f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" fill="#444">{_esc(y_fmt(t))}</text>')
    parts.append(f'<text x="{left + pw / 2:.1f}" y="{height - 8}" text-anchor="middle" fill="#1b1f24">{_esc(x_label)}</text>'
                 f'<text transform="translate(16 {top + ph / 2:.1f}) rotate(-90)" text-anchor="middle" fill="#1b1f24">{_esc(y_label)}</text>')
    # labels: the first of a few places around its point that overlaps no other label or marker
    placed: list[tuple[float, float, float, float]] = [(px(p["x"]) - 7, py(p["y"]) - 7, px(p["x"]) + 7, py(p["y"]) + 7) for p in usable]
    where: dict[int, tuple[float, float, str]] = {}
    for i, p in sorted(enumerate(usable), key=lambda ip: (-ip[1]["y"], ip[1]["x"])):
        x, y = px(p["x"]), py(p["y"])
        w = 6.2 * len(str(p.get("label", ""))) + 2
        best = None
        for dx, dy in ((9, -8), (9, 15), (-9, -8), (-9, 15), (9, -20), (-9, -20), (9, 27), (-9, 27)):
            x0 = x + dx if dx > 0 else x + dx - w
            box = (x0, y + dy - 10, x0 + w, y + dy + 2)
            if box[0] < left or box[2] > left + pw or box[1] < top or box[3] > top + ph:
                continue
            if not any(_overlaps(box, other) for other in placed):
                best = (dx, dy, box)
                break
        if best is None:
            best = (9, -8, (x + 9, y - 18, x + 9 + w, y - 6))
        placed.append(best[2])
        where[i] = (x + best[0], y + best[1], "start" if best[0] > 0 else "end")
    # the front drawn last, so its rings stay on top
    for i, p in sorted(enumerate(usable), key=lambda ip: bool(ip[1].get("front"))):
        x, y = px(p["x"]), py(p["y"])
        stroke = ' stroke="#000" stroke-width="2.2"' if p.get("front") else ' stroke="#fff" stroke-width="1"'
        if p.get("shape") == "diamond":
            r = 7.5
            shape = f'<path d="M{x:.1f} {y - r:.1f}L{x + r:.1f} {y:.1f}L{x:.1f} {y + r:.1f}L{x - r:.1f} {y:.1f}Z" fill="{p["color"]}"{stroke}/>'
        else:
            shape = f'<circle cx="{x:.1f}" cy="{y:.1f}" r="6" fill="{p["color"]}"{stroke}/>'
        lx, ly, anchor = where[i]
        parts.append(f'<g class="point"><title>{_esc(p.get("tip", ""))}</title>{shape}'
                     f'<text x="{lx:.1f}" y="{ly:.1f}" text-anchor="{anchor}" fill="#24292f">{_esc(p.get("label", ""))}</text></g>')
    parts.append("</svg>")
    return "".join(parts)


def _short(version: str) -> str:
    return version[:8]


def _board_html(index: int, board: Board, colors: Mapping[str, str], hardware: JSONObject | None) -> str:
    metric, goal = board.metric, board.goal
    rows = board.rows

    def point(row: Row, x: float | None) -> dict[str, Any]:
        f = row.figures
        tip = (f"{row.model} {row.version} · {row.variant} ({f.runtime}, {f.kind})\n"
               f"{metric} {fmt_metric(metric, row.metric)} · size {fmt_bytes(f.size_bytes)} · "
               f"p50 {fmt_ms(f.p50_ms)} · p99 {fmt_ms(f.p99_ms)}" + ("\nPareto front" if row.pareto else ""))
        return {"x": x, "y": row.metric, "color": colors.get(row.version, "#777"),
                "shape": "diamond" if f.runtime == "onnxruntime" else "circle", "front": bool(row.pareto),
                "label": f"{row.variant}·{_short(row.version)[:4]}" if len(colors) > 1 else row.variant, "tip": tip}

    y_fmt = (lambda v: f"{100 * v:.1f} %") if metric == "accuracy" else (lambda v: f"{v:.3g}")
    better = "higher is better" if goal == "maximize" else "lower is better"
    where = ""
    if hardware:
        where = f" on {_esc(hardware.get('cpu') or hardware.get('machine'))} ({_esc(hardware.get('machine'))}, {_esc(hardware.get('threads'))} thread(s))"
    plots = (scatter([point(r, r.figures.p50_ms) for r in rows], x_label=f"latency p50 at batch {board.batch} (log scale)",
                     y_label=metric, x_fmt=fmt_ms, y_fmt=y_fmt, title=f"{metric} vs latency"),
             scatter([point(r, r.figures.size_bytes) for r in rows], x_label="size of the weights file (log scale)", y_label=metric,
                     x_fmt=fmt_bytes, y_fmt=y_fmt, title=f"{metric} vs size", binary_x=True))
    legend = " ".join(f'<span class="swatch" style="background:{c}"></span><code>{_esc(v)}</code>' for v, c in colors.items()
                      if any(r.version == v for r in rows))
    head = ("<tr><th>#</th><th>front</th><th class=l>model</th><th class=l>version</th><th class=l>variant</th>"
            f"<th class=l>runtime</th><th>{_esc(metric)}</th><th>size</th><th>parameters</th><th>p50</th><th>p99</th>"
            "<th>throughput</th><th>memory</th></tr>")
    body = []
    for r in rows:
        f = r.figures
        star = '<span class="star" title="on the Pareto front">★</span>' if r.pareto else ""
        params = "—" if f.parameters is None else f"{f.parameters:,}"
        throughput = "—" if f.throughput is None else f"{f.throughput:,.0f}/s"
        body.append(
            f'<tr class="{"front" if r.pareto else ""}"><td>{r.rank}</td><td>{star}</td><td class=l>{_esc(r.model)}</td>'
            f'<td class=l><span class="swatch" style="background:{colors.get(r.version, "#777")}"></span><code>{_esc(_short(r.version))}</code></td>'
            f'<td class=l>{_esc(r.variant)}</td><td class=l>{_esc(f.runtime)} <small>{_esc(f.kind)}</small></td>'
            f'<td>{fmt_metric(metric, r.metric)}</td><td>{fmt_bytes(f.size_bytes)}</td>'
            f'<td>{params}</td><td>{fmt_ms(f.p50_ms)}</td><td>{fmt_ms(f.p99_ms)}</td>'
            f'<td>{throughput}</td><td>{fmt_bytes(f.memory_bytes)}</td></tr>')
    notes = "".join(f'<p class="note">{_esc(n)}</p>' for n in board.notes)
    return (f'<section class="board" id="board-{index}"><h2>{_esc(board.group)} — ranked on {_esc(metric)} ({better})</h2>'
            f'<p class="hint">Latency and throughput at batch {board.batch}, measured by the benchmark step{where}. '
            f'★ / black ring: the Pareto front of {_esc(metric)}, size and p50 latency. ● PyTorch ◆ ONNX Runtime. {legend}</p>{notes}'
            f'<div class="plots"><figure>{plots[0]}</figure><figure>{plots[1]}</figure></div>'
            f'<table class="leaderboard"><thead>{head}</thead><tbody>{"".join(body)}</tbody></table></section>')


def _lineage_html(records: Iterable[Record], colors: Mapping[str, str]) -> str:
    rows = []
    for r in records:
        line = r.lineage
        parents = ", ".join(f"{p.model}@{_short(p.version or '?')} ({p.relation})" for p in line.parents) or "—"
        served = ", ".join(f"{s.endpoint} {s.role}" + (f" {s.traffic} %" if s.live else f" ({s.rollout or 'not live'})")
                           for s in r.served_by or ()) or "—"
        rows.append(
            f'<tr><td class=l>{_esc(r.model)}</td><td class=l><span class="swatch" style="background:{colors.get(r.version, "#777")}"></span>'
            f'<code>{_esc(r.version)}</code></td><td class=l>{_esc(r.registered_at)}</td>'
            f'<td class=l><code>{_esc(line.git_revision or "—")}</code></td>'
            f'<td class=l>{_esc(line.dataset)} <code>{_esc((line.dataset_digest or "")[:19])}…</code></td>'
            f'<td class=l><code>{_esc((line.spec_digest or "")[:12])}</code></td><td class=l><code>{_esc(line.workflow)}</code></td>'
            f'<td class=l>{_esc(parents)}</td><td class=l>{_esc(served)}</td></tr>')
    head = ("<tr><th class=l>model</th><th class=l>version</th><th class=l>registered</th><th class=l>git revision</th>"
            "<th class=l>dataset (digest)</th><th class=l>spec digest</th><th class=l>workflow</th><th class=l>parents</th>"
            "<th class=l>served by</th></tr>")
    return f'<section id="lineage"><h2>Versions and lineage</h2><table class="lineage"><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table></section>'


def html_report(boards: Sequence[Board], records: Sequence[Record], *, environment: str, generated: str) -> str:
    """The whole page."""
    colors = {r.version: PALETTE[i % len(PALETTE)] for i, r in enumerate(records)}
    hardware = next((r.hardware for r in reversed(records) if r.hardware), None)
    sections = "".join(_board_html(i, b, colors, hardware) for i, b in enumerate(boards)) or "<p>No registered model versions yet.</p>"
    searches = [search_section(r.model, r.version, SearchResult.from_json(r.search)) for r in records if r.search]
    if searches:
        sections += f'<section id="searches"><h2>Hyperparameter searches</h2>{"".join(searches)}</section>'
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>Forge model leaderboard — {_esc(environment)}</title><style>{STYLE}</style></head><body>"
            f"<header><h1>Model leaderboard</h1><p class=\"meta\">environment <code>{_esc(environment)}</code> · "
            f"{len(records)} version(s) · generated {_esc(generated)} by <code>forgectl models report</code></p></header>"
            f"{sections}{_lineage_html(records, colors) if records else ''}</body></html>\n")
