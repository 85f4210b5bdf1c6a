"""``python -m runtimes pick-best``: choose the best trial of a search and copy its model.

Reads each trial folder's ``metrics.json`` (the validation metric at its top level), copies the
best trial's bundle (``model.json``, weights, ``metrics.json``) into ``output`` and writes
``output/trials.json`` (every trial's value and the choice).
"""

from __future__ import annotations

import logging
import math
import shutil
import sys

from runtimes._step import in_workspace, parse_config, read_json, run_step, write_json
from runtimes.errors import StepFailed
from specs.stepconfig import PickBestConfig

log = logging.getLogger("forge.pick-best")


def main(argv: list[str] | None = None) -> int:
    config, _ = parse_config(PickBestConfig, argv, "python -m runtimes pick-best")
    values: dict[str, float] = {}
    for trial in config.trials:
        metrics = read_json(in_workspace(trial) / "metrics.json")
        value = metrics.get(config.metric, metrics.get("validation", {}).get(config.metric))
        if isinstance(value, (int, float)) and not math.isnan(value):
            values[trial] = float(value)
        else:
            log.warning("trial %s has no %s; skipped", trial, config.metric)
    if not values:
        raise StepFailed(f"no trial reports the metric {config.metric!r}")
    pick = (max if config.goal == "maximize" else min)(values, key=lambda t: values[t])
    src, out = in_workspace(pick), in_workspace(config.output)
    out.mkdir(parents=True, exist_ok=True)
    for item in src.iterdir():
        if item.is_file() and item.name != "progress.json":
            shutil.copy2(item, out / item.name)
    write_json(out / "trials.json", {"metric": config.metric, "goal": config.goal, "values": values, "best": pick})
    log.info("best trial %s: %s %.4g", pick, config.metric, values[pick])
    return 0


def run(argv: list[str] | None = None) -> int:
    return run_step(main, argv)


if __name__ == "__main__":
    sys.exit(run())
