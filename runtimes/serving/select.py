"""Which registered variant a server runs when its Endpoint says ``backend.select: fastest`` (pure).

The version's registry record (``registry/<model>/<version>/registry.json``, the register step's)
holds, per variant, the ``benchmark`` step's accuracy and its throughput at each batch size, all
measured on one node in alternating rounds. The choice is the variant with the highest
throughput at the batch size nearest the one the server will run (``batching.maxBatchSize``; 1
without batching), among the variants whose accuracy is within ``maxAccuracyDrop`` points of the
base's and whose kind this server can load. Without figures (no benchmark step, or the base's
accuracy unknown) the Endpoint's own variant is served, and the reason says why.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

#: Bundle kinds the serving core loads (runtimes.serving.core).
SERVABLE_KINDS = ("state_dict", "int8", "pickle", "pt2e", "onnx", "onnx-int8")


def nearest_batch(batches: Mapping[str, Any], wanted: int) -> str | None:
    """The measured batch size (a key of ``batches``) nearest ``wanted`` on a log scale."""
    sizes = [k for k in batches if str(k).isdigit() and int(k) > 0]
    if not sizes:
        return None
    return min(sizes, key=lambda k: (abs(math.log(int(k)) - math.log(max(1, wanted))), int(k)))


def choose_variant(record: Mapping[str, Any], preferred: str, max_accuracy_drop: float, batch: int) -> dict[str, Any]:
    """``{"variant", "reason", "candidates": [...]}``: the fastest variant within the accuracy bound
    (see the module docstring); ``preferred`` when there is nothing to choose by."""
    variants: Mapping[str, Any] = record.get("variants") or {}
    base_accuracy = ((variants.get("base") or {}).get("benchmark") or {}).get("accuracy")
    rows: list[dict[str, Any]] = []
    for name, entry in sorted(variants.items()):
        bench = entry.get("benchmark") or {}
        key = nearest_batch(bench.get("batches") or {}, batch)
        row = {"variant": name, "kind": entry.get("kind"), "runtime": bench.get("runtime"), "accuracy": bench.get("accuracy"),
               "batch": int(key) if key else None,
               "throughput": (bench.get("batches") or {}).get(key, {}).get("throughput") if key else None}
        if entry.get("kind") not in SERVABLE_KINDS:
            row["excluded"] = f"kind {entry.get('kind')!r} is not servable"
        elif row["throughput"] is None:
            row["excluded"] = "no benchmark figures"
        elif base_accuracy is None or row["accuracy"] is None:
            row["excluded"] = "no accuracy to compare with the base"
        else:
            drop = 100.0 * (float(base_accuracy) - float(row["accuracy"]))
            row["accuracyDropPt"] = round(drop, 3)
            if drop > max_accuracy_drop + 1e-9:
                row["excluded"] = f"loses {drop:.2f} pt of accuracy (bound {max_accuracy_drop:g} pt)"
        rows.append(row)
    eligible = [r for r in rows if "excluded" not in r]
    if not eligible:
        why = "no variant has benchmark figures within the bound" if rows else "the registry record lists no variants"
        return {"variant": preferred, "reason": f"{why}: serving the Endpoint's variant {preferred!r}", "candidates": rows}
    best = max(eligible, key=lambda r: (float(r["throughput"]), r["variant"] == preferred, r["variant"] == "base"))
    base_row = next((r for r in rows if r["variant"] == "base" and r.get("throughput")), None)
    speedup = f", {float(best['throughput']) / float(base_row['throughput']):.2f}× the base" if base_row and base_row is not best else ""
    reason = (f"fastest of {len(eligible)} variants within {max_accuracy_drop:g} pt of the base's accuracy: "
              f"{float(best['throughput']):,.0f} rows/s at batch {best['batch']} ({best['runtime'] or best['kind']}{speedup}), "
              f"accuracy drop {best['accuracyDropPt']:.2f} pt")
    return {"variant": best["variant"], "reason": reason, "candidates": rows}
