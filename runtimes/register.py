"""``python -m runtimes register``: record a model version and its variants in the registry.

Copies each variant's bundle into ``output/<variant>/`` (``base`` included) and writes
``output/registry.json``: model, version, and per variant its folder, weights sha256, size,
parameters and the metrics/report it came with. ``metrics.json`` repeats the summary.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import sys

from runtimes._step import in_workspace, parse_config, read_json, run_step, write_json
from runtimes.errors import StepFailed
from specs.stepconfig import RegisterConfig

log = logging.getLogger("forge.register")


def main(argv: list[str] | None = None) -> int:
    config, _ = parse_config(RegisterConfig, argv, "python -m runtimes register")
    out = in_workspace(config.output)
    entries = {}
    for name, folder in sorted(config.variants.items()):
        src = in_workspace(folder)
        info = read_json(src / "model.json")
        weights = src / info.get("file", "model.pt")
        if not weights.exists():
            raise StepFailed(f"variant {name}: no weights at {weights}")
        dst = out / name
        dst.mkdir(parents=True, exist_ok=True)
        for item in src.iterdir():
            if item.is_file() and item.suffix in (".json", ".pt", ".pt2"):
                shutil.copy2(item, dst / item.name)
        extra = {}
        for report in ("report.json", "metrics.json"):
            if (src / report).exists():
                extra[report.removesuffix(".json")] = read_json(src / report)
        entries[name] = {
            "path": f"{config.output.rstrip('/')}/{name}",
            "sha256": hashlib.sha256(weights.read_bytes()).hexdigest(),
            "sizeBytes": weights.stat().st_size,
            "kind": info["kind"],
            "parameters": info.get("parameters"),
            **extra,
        }
    registry = {"model": config.model, "version": config.version, "variants": entries}
    write_json(out / "registry.json", registry)
    write_json(out / "metrics.json", {"model": config.model, "version": config.version, "variants": sorted(entries)})
    log.info("registered %s %s with variants %s", config.model, config.version, ", ".join(sorted(entries)))
    return 0


def run(argv: list[str] | None = None) -> int:
    return run_step(main, argv)


if __name__ == "__main__":
    sys.exit(run())
