"""A hyperparameter search's trials as an inline SVG, for `forgectl models report --html` (pure).

One point per trial that reported a value, in the order the study numbered them (the order they
were asked for): x = trial number, y = the searched metric. A completed trial is a filled point
at its final value; a pruned trial is hollow, at the last value it reported — after fewer epochs,
so not comparable with the completed ones (which is why pick-best never chooses it). The trial
the search picked has a black ring. A trial with no value (failed before its first epoch) has no
point; the caption counts it. Drawn like report.py's plots: SVG written here, no script, each
point's tooltip giving its state, value, epochs and hyperparameters.
"""

from __future__ import annotations

import json
import math

from reconciler.present.svg import esc, linear_ticks
from specs.searchresult import COMPLETE, SearchResult, TrialRow

COMPLETE_FILL = "#0072B2"
PRUNED_STROKE = "#D55E00"
OTHER_STROKE = "#8c959f"


def _value_text(metric: str | None, value: float) -> str:
    return f"{100 * value:.2f} %" if metric == "accuracy" and 0 <= value <= 1 else f"{value:.4g}"


def _tip(search: SearchResult, row: TrialRow) -> str:
    params = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in sorted(row.params.items()))
    epochs = "" if row.epochs_trained is None else f" · {row.epochs_trained} epoch(s)"
    pruned = "" if row.pruned_at is None else f", pruned after epoch {row.pruned_at}"
    best = " · picked" if search.is_best(row) else ""
    assert row.value is not None
    return (f"trial {row.number} · {row.state}{pruned} · {search.metric or 'value'} {_value_text(search.metric, row.value)}"
            f"{epochs}{best}" + (f"\n{params}" if params else ""))


def trials_plot(search: SearchResult, *, title: str, width: int = 540, height: int = 300) -> str:
    """The SVG of ``search``'s trials (see the module docstring); a note instead of points when
    no trial reported a value."""
    left, right, top, bottom = 70, 18, 30, 48
    pw, ph = width - left - right, height - top - bottom
    rows = sorted((r for r in search.rows() if r.value is not None and math.isfinite(r.value)), key=lambda r: r.number)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
             f'role="img" aria-label="{esc(title)}" font-family="system-ui,sans-serif" font-size="11">',
             f'<text x="{width / 2:.1f}" y="18" text-anchor="middle" font-size="13" font-weight="600">{esc(title)}</text>']
    if not rows:
        parts.append(f'<text x="{width / 2:.1f}" y="{height / 2:.1f}" text-anchor="middle" fill="#57606a">'
                     'no trial reported a value</text></svg>')
        return "".join(parts)
    values = [r.value for r in rows if r.value is not None]
    xlo, xhi = rows[0].number - 0.5, rows[-1].number + 0.5
    pad = max((max(values) - min(values)) * 0.12, abs(max(values)) * 0.004, 1e-6)
    ylo, yhi = min(values) - pad, max(values) + pad

    def px(x: float) -> float:
        return left + pw * (x - xlo) / (xhi - xlo)

    def py(y: float) -> float:
        return top + ph * (1 - (y - ylo) / (yhi - ylo))

    parts.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="#fbfcfd" stroke="#8c959f"/>')
    every = max(1, math.ceil(len(rows) / 12))  # at most a dozen trial numbers under the axis
    for n in range(rows[0].number, rows[-1].number + 1, every):
        parts.append(f'<text x="{px(n):.1f}" y="{top + ph + 15}" text-anchor="middle" fill="#444">{n}</text>')
    for t in linear_ticks(ylo, yhi):
        y = py(t)
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + pw}" y2="{y:.1f}" stroke="#e6e9ec"/>'
                     f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" fill="#444">{esc(_value_text(search.metric, t))}</text>')
    parts.append(f'<text x="{left + pw / 2:.1f}" y="{height - 8}" text-anchor="middle" fill="#1b1f24">trial (in the order asked)</text>'
                 f'<text transform="translate(16 {top + ph / 2:.1f}) rotate(-90)" text-anchor="middle" fill="#1b1f24">'
                 f'{esc(search.metric or "value")}</text>')
    for row in rows:
        assert row.value is not None
        x, y = px(row.number), py(row.value)
        if row.state == COMPLETE:
            paint = f'fill="{COMPLETE_FILL}" stroke="#fff" stroke-width="1"'
        else:
            paint = f'fill="none" stroke="{PRUNED_STROKE if row.state == "pruned" else OTHER_STROKE}" stroke-width="2"'
        ring = f'<circle cx="{x:.1f}" cy="{y:.1f}" r="9.5" fill="none" stroke="#000" stroke-width="2"/>' if search.is_best(row) else ""
        parts.append(f'<g class="trial" data-trial="{row.number}" data-state="{esc(row.state)}"><title>{esc(_tip(search, row))}</title>'
                     f'<circle cx="{x:.1f}" cy="{y:.1f}" r="6" {paint}/>{ring}</g>')
    parts.append("</svg>")
    return "".join(parts)


def search_section(model: str, version: str, search: SearchResult) -> str:
    """The report's section for the search that trained ``model@version``: a caption (algorithm,
    each state's count, the pick, the trial-epochs pruning saved) and the plot."""
    study = search.study
    rows = search.rows()
    plotted = sum(r.value is not None for r in rows)
    if study is None:
        caption = f"{len(rows)} trials"
    else:
        states = ", ".join(f"{n} {s}" for s, n in sorted(study.states.items()))
        caption = (f"{esc(study.algorithm)}, early stopping {esc(study.early_stopping)}: {sum(study.states.values())} trials "
                   f"({esc(states)}); picked trial {esc(study.best_trial)} with {esc(json.dumps(dict(study.best_params), sort_keys=True))}")
        if study.epochs_budget:
            caption += f"; {esc(study.epochs_trained)} of {esc(study.epochs_budget)} trial-epochs trained, {esc(study.epochs_saved)} saved by pruning"
        if study.trials_total > len(rows):
            caption += f"; the registry keeps the best {len(rows)} of {study.trials_total}"
    if plotted < len(rows):
        caption += f"; {len(rows) - plotted} without a value not drawn"
    title = f"{model}@{version[:8]} search: {search.metric or 'value'} per trial"
    return (f'<section class="search"><h3>Search of <code>{esc(model)}@{esc(version)}</code></h3>'
            f'<p class="hint">{caption}. ● completed (final value) ○ pruned (last value reported) — black ring: picked.</p>'
            f'<div class="plots"><figure>{trials_plot(search, title=title)}</figure></div></section>')
