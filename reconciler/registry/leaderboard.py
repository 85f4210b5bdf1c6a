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
from typing import Any

from reconciler.registry.records import variant_figures

LATENCY_METRICS = ("latencyP99Ms", "latencyMs", "latency")


def spec_metric(spec: Mapping[str, Any]) -> tuple[str, str]:
    """(metric, goal) a Model spec names for ranking."""
    search = spec.get("search") or {}
    if search.get("metric"):
        return search["metric"], search.get("goal", "maximize")
    for threshold in (spec.get("evaluation") or {}).get("thresholds") or []:
        metric = threshold.get("metric")
        if metric and metric not in LATENCY_METRICS:
            return metric, "minimize" if threshold.get("max") is not None and threshold.get("min") is None else "maximize"
    return "accuracy", "maximize"


def _value(entry: Mapping[str, Any], figures: Mapping[str, Any], metric: str) -> float | None:
    if metric == "accuracy":
        return figures.get("accuracy")
    for source in (entry.get("benchmark") or {}, entry.get("metrics") or {}, (entry.get("report") or {}).get("after") or {}):
        if isinstance(source.get(metric), (int, float)):
            return float(source[metric])
    return None


def rows(records: Iterable[Mapping[str, Any]], metric: str, batch: int = 1) -> list[dict[str, Any]]:
    """One row per (version, variant) with the figures the board shows."""
    out = []
    for record in records:
        for name, entry in record.get("variants", {}).items():
            figures = variant_figures(name, entry, record.get("evaluation"), batch)
            value = _value(entry, figures, metric)
            if value is None and name == "base":
                # A metric only the evaluate step measures (fgsmAccuracy, pgdAccuracy, epsilon):
                # it was measured on the trained model, which is `base`.
                found = (record.get("evaluation") or {}).get(metric)
                value = float(found) if isinstance(found, (int, float)) and not isinstance(found, bool) else None
            out.append({"model": record["model"], "version": record["version"], "variant": name,
                        "registeredAt": record.get("registeredAt"), "metric": value,
                        **{k: figures.get(k) for k in ("kind", "runtime", "accuracy", "accuracyFrom", "sizeBytes",
                                                        "parameters", "p50Ms", "p99Ms", "throughput", "memoryBytes")}})
    return out


def _dominates(a: Mapping[str, Any], b: Mapping[str, Any], sign: float) -> bool:
    ka = (sign * a["metric"], -a["sizeBytes"], -a["p50Ms"])
    kb = (sign * b["metric"], -b["sizeBytes"], -b["p50Ms"])
    return all(x >= y for x, y in zip(ka, kb)) and any(x > y for x, y in zip(ka, kb))


def pareto(items: list[dict[str, Any]], goal: str) -> None:
    """Mark each row `pareto: True/False` (None when it lacks a figure)."""
    sign = 1.0 if goal == "maximize" else -1.0
    complete = [r for r in items if all(r.get(k) is not None for k in ("metric", "sizeBytes", "p50Ms"))]
    ids = {id(r) for r in complete}
    for row in items:
        row["pareto"] = None if id(row) not in ids else not any(_dominates(o, row, sign) for o in complete if o is not row)


def board(name: str, records: list[Mapping[str, Any]], batch: int = 1) -> dict[str, Any]:
    """The leaderboard of one group of records."""
    named = Counter(spec_metric((r.get("lineage") or {}).get("spec") or {}) for r in records)
    ranked = sorted(named.items(), key=lambda kv: (-kv[1], kv[0]))
    (metric, goal), _ = ranked[0] if ranked else (("accuracy", "maximize"), 0)
    items = rows(records, metric, batch)
    pareto(items, goal)
    sign = -1.0 if goal == "maximize" else 1.0

    def order(row: dict[str, Any]) -> tuple[Any, ...]:
        missing = row["metric"] is None
        return (missing, sign * (row["metric"] or 0.0), row["p50Ms"] if row["p50Ms"] is not None else float("inf"),
                row["sizeBytes"] or 0, row["model"], row["version"], row["variant"])

    items.sort(key=order)
    for rank, row in enumerate(items, 1):
        row["rank"] = rank
    notes = []
    if len(ranked) > 1:
        notes.append("models of this group name different metrics (" + ", ".join(f"{m} ({g})" for (m, g), _ in ranked)
                     + f"); ranked on {metric}")
    return {"group": name, "metric": metric, "goal": goal, "batch": batch, "rows": items, "notes": notes,
            "versions": sorted({(r["model"], r["version"]) for r in records})}


def leaderboards(records: Sequence[Mapping[str, Any]], by: str = "dataset", batch: int = 1) -> list[dict[str, Any]]:
    """Leaderboards per dataset (`by="dataset"`) or per model family (`by="model"`)."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for record in records:
        line = record.get("lineage") or {}
        key = f"dataset {line.get('dataset') or '?'}" if by == "dataset" else f"model {record['model']}"
        groups.setdefault(key, []).append(record)
    return [board(name, group, batch) for name, group in sorted(groups.items())]
