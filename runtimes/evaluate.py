"""``python -m runtimes evaluate``: the Model's metrics on the held-out test split, against its
offline thresholds.

Writes ``output/metrics.json``: the metrics (``accuracy``, ``precision``, ``recall``, ``f1``,
``loss``; ``perplexity`` for language models; ``latencyP99Ms`` on CPU at batch size 1;
``epsilon``, the privacy budget the train step's accountant spent, for a model trained with
``privacy``; ``fgsmAccuracy``/``pgdAccuracy`` with ``robustness``, see runtimes/robustness.py), each
threshold with its value and verdict, and ``passed``. Exits 0 when every threshold holds, 3 when
one does not (the message names them).
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from runtimes._step import in_workspace, parse_config, run_step, write_json
from runtimes.errors import ThresholdsFailed
from specs.stepconfig import EvaluateConfig

log = logging.getLogger("forge.evaluate")
#: Test rows the latency is timed on (latency_ms goes through its first `runs` rows).
LATENCY_ROWS = 1024


def main(argv: list[str] | None = None) -> int:
    config, _ = parse_config(EvaluateConfig, argv, "python -m runtimes evaluate")
    from runtimes.data import load_prepared
    from runtimes.learn import latency_ms, measure_rows, split_rows
    from runtimes.models import load_bundle

    model, info = load_bundle(in_workspace(config.model_dir))
    data = load_prepared(in_workspace(config.data), ("test",))
    # Measured over the whole split (a sharded one streamed a batch at a time); timed and attacked
    # on a bounded sample of its first rows.
    test = split_rows(data, "test", info["architecture"].get("contextLength"))
    metrics = measure_rows(model, test, info["task"])
    if len(test):
        metrics["latencyP99Ms"] = latency_ms(model, test.head(LATENCY_ROWS)[0], runs=100)["p99"]
    extra: dict[str, Any] = {}
    trained = in_workspace(config.model_dir) / "metrics.json"
    privacy = (json.loads(trained.read_text()).get("privacy") if trained.exists() else None) or None
    if privacy:
        metrics["epsilon"] = float(privacy["epsilonSpent"])
        extra["privacy"] = privacy
    if config.robustness is not None:
        from runtimes.robustness import adversarial_metrics

        robust = adversarial_metrics(model, *test.head(config.robustness.samples), info["task"], config.robustness)
        extra["robustness"] = robust.pop("robustness")
        metrics.update(robust)
    results, failed = [], []
    for t in config.thresholds:
        value = metrics.get(t.metric, float("nan"))
        ok = t.check(value)
        results.append({"metric": t.metric, "min": t.min, "max": t.max, "value": value, "passed": ok})
        if not ok:
            got = "not trained with differential privacy" if t.metric == "epsilon" and not privacy else f"got {value:.4g}"
            failed.append(f"{t.describe()} ({got})")
    out = in_workspace(config.output)
    write_json(out / "metrics.json", {"model": config.model, **metrics, "metrics": metrics, "testRows": len(test),
                                      **extra, "thresholds": results, "passed": not failed})
    log.info("test metrics of %s: %s", config.model, ", ".join(f"{k} {v:.4g}" for k, v in metrics.items()))
    if failed:
        raise ThresholdsFailed(f"model {config.model} fails its offline thresholds: {'; '.join(failed)}")
    return 0


def run(argv: list[str] | None = None) -> int:
    return run_step(main, argv)


if __name__ == "__main__":
    sys.exit(run())
