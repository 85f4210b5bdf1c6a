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


def main(argv: list[str] | None = None) -> int:
    config, _ = parse_config(EvaluateConfig, argv, "python -m runtimes evaluate")
    from runtimes.data import load_prepared
    from runtimes.learn import latency_ms, measure, split_tensors
    from runtimes.models import load_bundle

    model, info = load_bundle(in_workspace(config.model_dir))
    data = load_prepared(in_workspace(config.data), ("test",))
    x, y = split_tensors(data.split("test"), data.meta, info["architecture"].get("contextLength"))
    metrics = measure(model, x, y, info["task"])
    if len(x):
        metrics["latencyP99Ms"] = latency_ms(model, x, runs=100)["p99"]
    extra: dict[str, Any] = {}
    trained = in_workspace(config.model_dir) / "metrics.json"
    privacy = (json.loads(trained.read_text()).get("privacy") if trained.exists() else None) or None
    if privacy:
        metrics["epsilon"] = float(privacy["epsilonSpent"])
        extra["privacy"] = privacy
    if config.robustness is not None:
        from runtimes.robustness import adversarial_metrics

        robust = adversarial_metrics(model, x, y, info["task"], config.robustness)
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
    write_json(out / "metrics.json", {"model": config.model, **metrics, "metrics": metrics, "testRows": int(len(x)),
                                      **extra, "thresholds": results, "passed": not failed})
    log.info("test metrics of %s: %s", config.model, ", ".join(f"{k} {v:.4g}" for k, v in metrics.items()))
    if failed:
        raise ThresholdsFailed(f"model {config.model} fails its offline thresholds: {'; '.join(failed)}")
    return 0


def run(argv: list[str] | None = None) -> int:
    return run_step(main, argv)


if __name__ == "__main__":
    sys.exit(run())
