"""What the HTML report's hand-written SVG plots share (pure): escaping text for HTML/SVG and the
ticks of a linear axis. report.py draws the leaderboard's scatter plots with them, searchplot.py a
search's trials."""

from __future__ import annotations

import html
import math
from typing import Any


def esc(value: Any) -> str:
    """``value`` as text safe inside an HTML/SVG element or a quoted attribute (None: empty)."""
    return html.escape("" if value is None else str(value), quote=True)


def linear_ticks(lo: float, hi: float, target: int = 5) -> list[float]:
    """About ``target`` round ticks (steps of 1, 2, 2.5 or 5 × 10ᵏ) between ``lo`` and ``hi``."""
    span = hi - lo
    raw = span / target
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    out = []
    v = first
    while v <= hi + step * 1e-9:
        out.append(round(v, 12))
        v += step
    return out
