"""Plan lines for what a Model's workflow promises about trust (issue 18): the differential
privacy budget its training spends, the attacks its evaluation measures, the explanations it
records. Read from the rendered step configs, so the plan shows what the Workflow will do."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def trust_reasons(steps: Mapping[str, Mapping[str, Any]]) -> list[str]:
    lines: list[str] = []
    train = next((s.get("config") or {} for n, s in steps.items() if n in ("train", "train-trial-0")), {})
    privacy = (train.get("spec") or {}).get("privacy")
    if privacy:
        trials = sum(1 for n in steps if n.startswith("train-trial-"))
        line = (f"train with DP-SGD (Opacus): privacy budget ε ≤ {privacy.get('epsilon'):g} at δ {privacy.get('delta'):g}, "
                f"per-sample gradients clipped to {privacy.get('maxGradNorm'):g}")
        if trials > 1:
            line += f" — per trial; picking the best of {trials} trials on validation data is not covered by the budget"
        lines.append(line)
    evaluate = (steps.get("evaluate") or {}).get("config") or {}
    robust = evaluate.get("robustness")
    if robust:
        lines.append(f"evaluate under attack: {', '.join(a.upper() for a in robust.get('attacks', []))} at "
                     f"L∞ ε {robust.get('epsilon'):g} ({robust.get('samples')} test rows)")
    gates = [t for t in evaluate.get("thresholds") or [] if t.get("metric") in ("epsilon", "fgsmAccuracy", "pgdAccuracy")]
    for t in gates:
        bound = " and ".join(f"{op} {v:g}" for op, v in (("≥", t.get("min")), ("≤", t.get("max"))) if v is not None)
        lines.append(f"gate: {t['metric']} {bound}")
    explain = (steps.get("explain") or {}).get("config") or {}
    if explain:
        settings = explain.get("settings") or {}
        lines.append(f"explain: {', '.join(settings.get('methods', []))} on {settings.get('samples')} test rows, "
                     "with a randomised-weights sanity check")
    return lines
