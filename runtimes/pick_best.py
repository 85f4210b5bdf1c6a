"""``python -m runtimes pick-best``: choose the best trial of a search and copy its model.

Reads each trial folder's ``metrics.json`` (the validation metric at its top level), copies the
best trial's bundle (``model.json``, weights, ``metrics.json``) into ``output`` and writes
``output/trials.json`` (every trial's value and the choice). A search with a study (`tpe`, or
early stopping) picks from the study instead: the best *completed* trial — a pruned trial stopped
early and never wins — and ``trials.json`` records the study too (runtimes/study.py).
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
    if config.study is not None:
        return _from_study(config)
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
    _copy_bundle(pick, config.output)
    write_json(in_workspace(config.output) / "trials.json", {"metric": config.metric, "goal": config.goal, "values": values, "best": pick})
    log.info("best trial %s: %s %.4g", pick, config.metric, values[pick])
    return 0


def _from_study(config: PickBestConfig) -> int:
    """The best completed trial of the search's study (a pruned trial never wins), its bundle
    copied to ``output``; ``trials.json`` adds the study: best trial and values, the count of each
    state, the epochs trained against the budget of every trial trained to the end."""
    from runtimes.study import study_name, study_summary

    assert config.study is not None
    summary = study_summary(config.study)
    if summary.best_output is None or summary.best_output not in config.trials:
        raise StepFailed(f"the study {config.study.name} has no completed trial of this search "
                         f"(states: {summary.states or 'no trials'})")
    _copy_bundle(summary.best_output, config.output)
    epochs = _epochs_budget(config.trials)
    write_json(in_workspace(config.output) / "trials.json", {
        "metric": config.metric, "goal": config.goal, "values": summary.values, "best": summary.best_output,
        "study": {"storage": config.study.where, "name": study_name(config.study), "algorithm": config.study.search.algorithm,
                  "earlyStopping": config.study.search.early_stopping, **summary.to_json(),
                  "epochsBudget": epochs, "epochsSaved": max(0, epochs - summary.epochs_trained) if epochs else None},
    })
    log.info("best trial %d (%s): %s %.4g; trials %s, %d epochs trained of %d", summary.best_number, summary.best_output,
             config.metric, summary.best_value, summary.states, summary.epochs_trained, epochs)
    return 0


def _epochs_budget(trials: list[str]) -> int:
    """The epochs every trial would have trained without pruning: each trial's own ``epochs``
    (searched or the spec's), from its ``metrics.json``."""
    total = 0
    for trial in trials:
        try:
            metrics = read_json(in_workspace(trial) / "metrics.json")
        except Exception:  # noqa: BLE001 - a trial that wrote nothing adds nothing to the figure
            continue
        total += int((metrics.get("hyperparameters") or {}).get("epochs") or 0)
    return total


def _copy_bundle(trial: str, output: str) -> None:
    src, out = in_workspace(trial), in_workspace(output)
    out.mkdir(parents=True, exist_ok=True)
    for item in src.iterdir():
        if item.is_file() and item.name != "progress.json":
            shutil.copy2(item, out / item.name)


def run(argv: list[str] | None = None) -> int:
    return run_step(main, argv)


if __name__ == "__main__":
    sys.exit(run())
