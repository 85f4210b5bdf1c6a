"""``python -m runtimes register``: record a model version and its variants in the registry.

Copies each variant's bundle into ``output/<variant>/`` (``base`` included) and writes
``output/registry.json``: model, version, and per variant its folder, weights sha256, size,
parameters and the metrics/report it came with. ``metrics.json`` repeats the summary. A version
trained by a search also records it (``search``: the pick-best step's ``trials.json`` — the study's
trials, best trial, pruned count and the epochs pruning saved). A variant its step rejected
(:mod:`runtimes.verdicts`: beyond its accuracy bound, an export that computes something else) is
not registered: ``rejected`` names it with the step's reason, in both files.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import sys
from pathlib import Path
from typing import Any

from runtimes._step import in_workspace, parse_config, read_json, run_step, write_json
from runtimes.errors import StepFailed
from runtimes.verdicts import split
from specs.searchresult import summarised
from specs.stepconfig import RegisterConfig

log = logging.getLogger("forge.register")


def main(argv: list[str] | None = None) -> int:
    config, _ = parse_config(RegisterConfig, argv, "python -m runtimes register")
    out = in_workspace(config.output)
    built, rejected = split({name: in_workspace(folder) for name, folder in sorted(config.variants.items())})
    entries = {name: _register_variant(name, folder, out / name, f"{config.output.rstrip('/')}/{name}")
               for name, folder in built.items()}
    registry: dict = {"model": config.model, "version": config.version, "variants": entries,
                      "rejected": {name: why.to_json() for name, why in rejected.items()}}
    if config.benchmark:
        bench = read_json(in_workspace(config.benchmark) / "benchmark.json")
        registry["hardware"] = bench.get("hardware")
        for name, figures in (bench.get("variants") or {}).items():
            if name in entries:
                entries[name]["benchmark"] = figures
    if config.artifacts:
        # Built artifacts that are not servable bundles (TensorRT engines): recorded, built or not.
        registry["artifacts"] = {name: read_json(in_workspace(folder) / "report.json")
                                 for name, folder in sorted(config.artifacts.items())}
    search = _search(config)
    if search is not None:
        registry["search"] = search
    write_json(out / "registry.json", registry)
    # The Workflow's `metrics` output parameter (what a cluster's registry view reads): a summary
    # small enough for Argo's parameter limits.
    summary = {name: {"sizeBytes": e["sizeBytes"], "kind": e["kind"], "parameters": e.get("parameters"),
                      "accuracy": (e.get("benchmark") or {}).get("accuracy", (e.get("metrics") or {}).get("accuracy")),
                      "latency": {b: {k: f[k] for k in ("p50Ms", "p99Ms", "throughput")}
                                  for b, f in ((e.get("benchmark") or {}).get("batches") or {}).items()}}
               for name, e in entries.items()}
    write_json(out / "metrics.json", {"model": config.model, "version": config.version, "variants": sorted(entries),
                                      "registry": summary, "hardware": registry.get("hardware"),
                                      "artifacts": {n: {"built": a.get("built"), "reason": a.get("reason")}
                                                    for n, a in (registry.get("artifacts") or {}).items()},
                                      "rejected": {name: why.reason for name, why in rejected.items()},
                                      **({"search": summarised(search, SUMMARY_TRIALS)} if search is not None else {})})
    log.info("registered %s %s with variants %s", config.model, config.version, ", ".join(sorted(entries)))
    for name, why in rejected.items():
        log.warning("not registered: variant %s was rejected: %s", name, why.reason)
    return 0


#: Trials a search's summary in ``metrics.json`` lists (the best first): the Workflow's output
#: parameter it becomes must stay small (Argo keeps it in the Workflow's status).
SUMMARY_TRIALS = 50


def _search(config: RegisterConfig) -> dict[str, Any] | None:
    """The search that trained the base variant: the pick-best step's ``trials.json`` beside its bundle."""
    base = config.variants.get("base")
    trials = in_workspace(base) / "trials.json" if base else None
    return read_json(trials) if trials is not None and trials.is_file() else None


def _register_variant(name: str, src: Path, dst: Path, path: str) -> dict[str, Any]:
    """Copy one variant's bundle (its top-level JSON and weights files) from ``src`` into ``dst``
    and return its registry entry: where it is (``path``), its weights' digest and size, and the
    report and metrics it came with."""
    info = read_json(src / "model.json")
    weights = src / info.get("file", "model.pt")
    if not weights.exists():
        raise StepFailed(f"variant {name}: no weights at {weights}")
    dst.mkdir(parents=True, exist_ok=True)
    for item in src.iterdir():
        if item.is_file() and item.suffix in (".json", ".pt", ".pt2", ".onnx"):
            shutil.copy2(item, dst / item.name)
    extra = {}
    for report in ("report.json", "metrics.json"):
        if (src / report).exists():
            extra[report.removesuffix(".json")] = read_json(src / report)
    return {
        "path": path,
        "sha256": hashlib.sha256(weights.read_bytes()).hexdigest(),
        "sizeBytes": weights.stat().st_size,
        "kind": info["kind"],
        "parameters": info.get("parameters"),
        **({"source": info["source"]} if info.get("source") else {}),
        **extra,
    }


def run(argv: list[str] | None = None) -> int:
    return run_step(main, argv)


if __name__ == "__main__":
    sys.exit(run())
