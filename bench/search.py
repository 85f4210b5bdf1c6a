"""bench/search: a search that learns and stops early against random search, on the same budget.

    python bench/search.py [--seeds 3] [--trials 6] [--epochs 4]

The quickstart's digits MLP, searched over learning rate (log-uniform 1e-4 … 0.3), batch size and
weight decay, with the product's own steps run in-process: the renderer draws the random trials
and names the study (``renderers.workflow.search_trials`` / ``search_study``), ``runtimes.train``
trains each trial (reporting to the Optuna study and stopping when pruned), ``runtimes.pick_best``
picks the best. For each seed (the spec's ``hyperparameters.seed``: the random draws, the TPE
sampler's seed and the weights' initialisation all follow it):

- **random**: ``--trials`` trials drawn at render time, each trained ``--epochs`` epochs — a budget
  of trials × epochs trial-epochs;
- **tpe + asha**: trials asked of the study one after another (TPE, ASHA rungs at 1, 3, 9, …
  epochs) until the trial-epochs they trained reach the same budget (the last one may finish its
  rung past it: the epochs each used are reported).

Trials run one at a time (``parallelism: 1``: the bench compares the algorithms, not the fan-out).
Prints one line per seed, then as its last line the JSON of the run — per seed the best validation
accuracy each reached, the trials and trial-epochs each used, and the ratios: ``best_ratio``
(TPE + ASHA's best over random's, mean over seeds), ``trials_ratio`` (trials TPE + ASHA ran on the
budget over random's) and ``epochs_saved_fraction`` (of the epochs its trials would have trained
without pruning, the share ASHA saved) — and writes it to ``bench/results/search-<date>.json``
(``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.compress import DIGITS  # noqa: E402
from bench.runtime_env import ROOT, ensure_runtime_env, step  # noqa: E402

SPACE = {
    "learningRate": {"type": "logUniform", "min": 0.0001, "max": 0.3},
    "batchSize": {"type": "choice", "values": [32, 64, 128, 256]},
    "weightDecay": {"type": "uniform", "min": 0.0, "max": 0.001},
}


def _model(seed: int, epochs: int, search: dict[str, Any]) -> Any:
    from specs import Model

    return Model.model_validate({
        "apiVersion": "forge.dev/v1alpha1", "kind": "Model", "metadata": {"name": "digits-mlp"},
        "spec": {"datasetRef": "digits", "computeRef": "cpu",
                 "architecture": {"type": "mlp", "hiddenSizes": [256, 128]},
                 "hyperparameters": {"learningRate": 0.002, "batchSize": 64, "epochs": epochs, "weightDecay": 0.0001,
                                     "seed": seed},
                 "search": {"parallelism": 1, "metric": "accuracy", "goal": "maximize", "space": SPACE, **search}},
    })


def _train(model: Any, version: str, index: int, overrides: dict[str, Any], trial: dict[str, Any] | None) -> dict[str, Any]:
    output = f"{version}/trials/{index}"
    config = {"step": "train", "model": model.name, "version": version, "spec": model.spec.model_dump(mode="json", by_alias=True),
              "overrides": overrides, "data": "digits", "output": output, **({"trial": trial} if trial else {})}
    assert step("runtimes.train", config) == 0, f"trial {index} of {version} failed"
    return json.loads((Path(os.environ["FORGE_WORKSPACE"]) / output / "metrics.json").read_text())


def _pick(version: str, trials: int, study: dict[str, Any] | None) -> dict[str, Any]:
    config = {"step": "pick-best", "model": "digits-mlp", "trials": [f"{version}/trials/{i}" for i in range(trials)],
              "metric": "accuracy", "goal": "maximize", "output": f"{version}/train", **({"study": study} if study else {})}
    assert step("runtimes.pick_best", config) == 0, f"pick-best of {version} failed"
    return json.loads((Path(os.environ["FORGE_WORKSPACE"]) / version / "train" / "trials.json").read_text())


def random_search(seed: int, trials: int, epochs: int) -> dict[str, Any]:
    """``trials`` trials of values the renderer drew, each trained to the end."""
    from renderers.workflow import search_trials

    model = _model(seed, epochs, {"algorithm": "random", "trials": trials})
    version = f"random-{seed}"
    for i, overrides in enumerate(search_trials(model)):
        _train(model, version, i, overrides, None)
    chosen = _pick(version, trials, None)
    return {"best": chosen["values"][chosen["best"]], "trials": trials, "epochs": trials * epochs}


def tpe_asha(seed: int, budget: int, epochs: int) -> dict[str, Any]:
    """Trials asked of the study (TPE) and stopped by ASHA, until they trained ``budget`` epochs."""
    from renderers.workflow import search_study

    model = _model(seed, epochs, {"algorithm": "tpe", "earlyStopping": "asha", "trials": 1000})
    version = f"tpe-{seed}"
    study = search_study(model, version)
    assert study is not None
    used = index = 0
    while used < budget:
        metrics = _train(model, version, index, {}, {"study": study.model_dump(mode="json", by_alias=True), "index": index})
        used += metrics["trial"]["epochsTrained"]
        index += 1
    chosen = _pick(version, index, study.model_dump(mode="json", by_alias=True))
    s = chosen["study"]
    return {"best": s["bestValue"], "trials": index, "epochs": used, "states": s["states"],
            "epochsSaved": s["epochsSaved"], "epochsBudget": s["epochsBudget"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--trials", type=int, default=6, help="random search's trials; the budget is trials × epochs")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / f"search-{time.strftime('%Y-%m-%d')}.json"))
    args = parser.parse_args()
    ensure_runtime_env()
    import logging

    ws = tempfile.mkdtemp(prefix="forge-bench-search-")
    os.environ["FORGE_WORKSPACE"] = ws
    os.environ["FORGE_SOURCE_ROOT"] = ws
    assert step("runtimes.prepare", {"step": "prepare", "dataset": "digits", "spec": DIGITS, "output": "digits"}) == 0
    logging.getLogger().setLevel(logging.WARNING)  # the trials' per-epoch lines would drown the summary
    budget = args.trials * args.epochs
    runs = []
    start = time.monotonic()
    for seed in range(1, args.seeds + 1):
        rnd = random_search(seed, args.trials, args.epochs)
        tpe = tpe_asha(seed, budget, args.epochs)
        runs.append({"seed": seed, "random": rnd, "tpeAsha": tpe})
        print(f"seed {seed}: random best {rnd['best']:.4f} ({rnd['trials']} trials, {rnd['epochs']} epochs); "
              f"tpe+asha best {tpe['best']:.4f} ({tpe['trials']} trials, {tpe['epochs']} epochs, {tpe['states']})",
              file=sys.stderr, flush=True)
    result = {
        "model": "digits-mlp", "space": SPACE, "seeds": args.seeds, "epochsPerTrial": args.epochs, "budgetTrialEpochs": budget,
        "runs": runs,
        "random_best_mean": round(statistics.mean(r["random"]["best"] for r in runs), 4),
        "tpe_asha_best_mean": round(statistics.mean(r["tpeAsha"]["best"] for r in runs), 4),
        "best_ratio": round(statistics.mean(r["tpeAsha"]["best"] / r["random"]["best"] for r in runs), 4),
        "tpe_wins": sum(r["tpeAsha"]["best"] > r["random"]["best"] for r in runs),
        "trials_ratio": round(statistics.mean(r["tpeAsha"]["trials"] / r["random"]["trials"] for r in runs), 3),
        "epochs_saved_fraction": round(sum(r["tpeAsha"]["epochsSaved"] for r in runs)
                                       / sum(r["tpeAsha"]["epochsBudget"] for r in runs), 3),
        "seconds": round(time.monotonic() - start, 1),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
