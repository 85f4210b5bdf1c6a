"""The regression gate (pure): a candidate version against the live one on the same held-out data,
from the registry records of both (the evaluate and benchmark steps' measurements of the served
variant). See `RolloutPolicy.spec.regressionGate`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from specs.rollout import RegressionGate


@dataclass(frozen=True)
class GateResult:
    """``passed`` None: the gate could not compare and was skipped (``detail`` says why)."""

    passed: bool | None
    detail: str
    candidate: float | None = None
    live: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "detail": self.detail, "candidate": self.candidate, "live": self.live}


def _metric(record: Mapping[str, Any], variant: str, metric: str) -> float | None:
    figures = ((record.get("variants") or {}).get(variant) or {}).get("figures") or {}
    value = figures.get(metric)
    if value is None and variant == "base":
        value = (record.get("evaluation") or {}).get(metric)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def regression_gate(gate: RegressionGate, candidate: Mapping[str, Any] | None, live: Mapping[str, Any] | None,
                    variant: str, *, live_variant: str | None = None) -> GateResult:
    """Whether ``candidate`` may take traffic from ``live`` (registry records) for ``variant``."""
    if candidate is None or live is None:
        missing = "candidate" if candidate is None else "live version"
        return GateResult(None, f"regression gate skipped: no registry record of the {missing}")
    cv, lv = candidate.get("version"), live.get("version")
    dc = (candidate.get("lineage") or {}).get("datasetDigest")
    dl = (live.get("lineage") or {}).get("datasetDigest")
    c = _metric(candidate, variant, gate.metric)
    v = _metric(live, live_variant or variant, gate.metric)
    if c is None or v is None:
        return GateResult(None, f"regression gate skipped: no {gate.metric} of variant {variant} for "
                                f"{'candidate ' + str(cv) if c is None else 'live ' + str(lv)}", c, v)
    if dc != dl:
        text = (f"candidate {cv} and live {lv} were evaluated on different data ({dc or '?'} vs {dl or '?'}): "
                f"{gate.metric} {c:.4f} vs {v:.4f} are not comparable")
        if gate.on_different_data == "refuse":
            return GateResult(False, f"regression gate refused: {text} (onDifferentData: refuse)", c, v)
        return GateResult(None, f"regression gate skipped: {text}", c, v)
    drop = v - c
    numbers = (f"{gate.metric} on the held-out split: candidate {cv} {c:.4f}, live {lv} {v:.4f} "
               f"({-drop:+.4f}; largest drop allowed {gate.max_drop:g})")
    if drop > gate.max_drop + 1e-12:
        return GateResult(False, f"regression gate refused: {numbers}", c, v)
    return GateResult(True, f"regression gate passed: {numbers}", c, v)
