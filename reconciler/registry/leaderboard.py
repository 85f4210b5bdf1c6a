"""The leaderboard: versions × variants ranked on the metric the spec names, with size and
latency, and the Pareto front of (metric, size, latency) marked (pure).

- **Groups**: per dataset (default: every model trained on the same data competes) or per model
  family (`by="model"`).
- **Metric**: what the Model spec names — its search metric, else its first evaluation threshold
  on a quality metric (a `min` threshold means higher is better, a `max` lower), else accuracy.
  When the models of a group name different metrics, the group uses the one named most often
  (ties: alphabetical) and says so.
- **Figures**: the benchmark step's, so every row was measured by one code path on one node:
  accuracy on the held-out split, weights size, latency p50/p99 and throughput at `batch` rows
  (default 1), memory. A variant without a benchmark shows its compress/export report's accuracy
  and no latency.
- **Pareto front**: a row is on it when no other row of the group is at least as good on all three
  of metric, size and p50 latency and strictly better on one. Rows lacking a figure are not
  ranked on the front.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from reconciler.registry.records import Figures, Record, Variant, variant_figures

LATENCY_METRICS = ("latencyP99Ms", "latencyMs", "latency")


def spec_metric(spec: Mapping[str, Any]) -> tuple[str, str]:
    """(metric, goal) a Model spec (its JSON, as trained) names for ranking."""
    search = spec.get("search") or {}
    if search.get("metric"):
        return search["metric"], search.get("goal", "maximize")
    for threshold in (spec.get("evaluation") or {}).get("thresholds") or []:
        metric = threshold.get("metric")
        if metric and metric not in LATENCY_METRICS:
            return metric, "minimize" if threshold.get("max") is not None and threshold.get("min") is None else "maximize"
    return "accuracy", "maximize"


@dataclass(frozen=True)
class Row:
    """One (version, variant) of a leaderboard: the metric it is ranked on and its figures;
    ``pareto`` None when it lacks a figure the front needs, ``rank`` 0 until ranked."""

    model: str
    version: str
    variant: str
    registered_at: str
    metric: float | None
    figures: Figures
    pareto: bool | None = None
    rank: int = 0

    def to_json(self) -> dict[str, Any]:
        f = self.figures
        return {"model": self.model, "version": self.version, "variant": self.variant, "registeredAt": self.registered_at,
                "metric": self.metric, "kind": f.kind, "runtime": f.runtime, "accuracy": f.accuracy, "accuracyFrom": f.accuracy_from,
                "sizeBytes": f.size_bytes, "parameters": f.parameters, "p50Ms": f.p50_ms, "p99Ms": f.p99_ms,
                "throughput": f.throughput, "memoryBytes": f.memory_bytes, "pareto": self.pareto, "rank": self.rank}


@dataclass(frozen=True)
class Board:
    """The leaderboard of one group: its metric and goal, the batch size of its latencies, the
    ranked rows, notes, and the (model, version) pairs it covers."""

    group: str
    metric: str
    goal: str
    batch: int
    rows: tuple[Row, ...]
    notes: tuple[str, ...]
    versions: tuple[tuple[str, str], ...]

    def to_json(self) -> dict[str, Any]:
        return {"group": self.group, "metric": self.metric, "goal": self.goal, "batch": self.batch,
                "rows": [r.to_json() for r in self.rows], "notes": list(self.notes), "versions": [list(v) for v in self.versions]}


def _value(variant: Variant, figures: Figures, metric: str) -> float | None:
    return figures.accuracy if metric == "accuracy" else variant.measured(metric)


def rows(records: Iterable[Record], metric: str, batch: int = 1) -> list[Row]:
    """One row per (version, variant) with the figures the board shows."""
    out = []
    for record in records:
        for name, variant in record.variants.items():
            figures = variant_figures(name, variant.registration, record.evaluation, batch)
            value = _value(variant, figures, metric)
            if value is None and name == "base":
                # A metric only the evaluate step measures (fgsmAccuracy, pgdAccuracy, epsilon):
                # it was measured on the trained model, which is `base`.
                found = record.evaluation.get(metric)
                value = float(found) if isinstance(found, (int, float)) and not isinstance(found, bool) else None
            out.append(Row(record.model, record.version, name, record.registered_at, value, figures))
    return out


def _front_key(row: Row, sign: float) -> tuple[float, float, float]:
    f = row.figures
    assert row.metric is not None and f.size_bytes is not None and f.p50_ms is not None
    return (sign * row.metric, -f.size_bytes, -f.p50_ms)


def _dominates(a: Row, b: Row, sign: float) -> bool:
    ka, kb = _front_key(a, sign), _front_key(b, sign)
    return all(x >= y for x, y in zip(ka, kb)) and any(x > y for x, y in zip(ka, kb))


def pareto(items: Sequence[Row], goal: str) -> list[Row]:
    """Each row marked `pareto` True/False (None when it lacks a figure)."""
    sign = 1.0 if goal == "maximize" else -1.0
    complete = [r for r in items if r.metric is not None and r.figures.size_bytes is not None and r.figures.p50_ms is not None]
    ids = {id(r) for r in complete}
    return [replace(row, pareto=None if id(row) not in ids else not any(_dominates(o, row, sign) for o in complete if o is not row))
            for row in items]


def board(name: str, records: Sequence[Record], batch: int = 1) -> Board:
    """The leaderboard of one group of records."""
    named = Counter(spec_metric(r.lineage.spec) for r in records)
    ranked = sorted(named.items(), key=lambda kv: (-kv[1], kv[0]))
    (metric, goal), _ = ranked[0] if ranked else (("accuracy", "maximize"), 0)
    items = pareto(rows(records, metric, batch), goal)
    sign = -1.0 if goal == "maximize" else 1.0

    def order(row: Row) -> tuple[Any, ...]:
        missing = row.metric is None
        return (missing, sign * (row.metric or 0.0), row.figures.p50_ms if row.figures.p50_ms is not None else float("inf"),
                row.figures.size_bytes or 0, row.model, row.version, row.variant)

    items.sort(key=order)
    notes = []
    if len(ranked) > 1:
        notes.append("models of this group name different metrics (" + ", ".join(f"{m} ({g})" for (m, g), _ in ranked)
                     + f"); ranked on {metric}")
    return Board(name, metric, goal, batch, tuple(replace(row, rank=rank) for rank, row in enumerate(items, 1)), tuple(notes),
                 tuple(sorted({(r.model, r.version) for r in records})))


def leaderboards(records: Sequence[Record], by: str = "dataset", batch: int = 1) -> list[Board]:
    """Leaderboards per dataset (`by="dataset"`) or per model family (`by="model"`)."""
    groups: dict[str, list[Record]] = {}
    for record in records:
        key = f"dataset {record.lineage.dataset or '?'}" if by == "dataset" else f"model {record.model}"
        groups.setdefault(key, []).append(record)
    return [board(name, group, batch) for name, group in sorted(groups.items())]
