"""The digits dataset and MLP that the tests and benches prepare, train and serve (scikit-learn's
digits through ``python -m runtimes prepare|train``, see :mod:`devkit.runtime_steps`)."""

from __future__ import annotations

from typing import Any

#: sha256 of scikit-learn's digits in Forge's canonical array encoding (runtimes.data).
DIGITS_DIGEST = "sha256:4eca0a80f7990df18560bf7c80f03e0893a8868820f1ee4405e0402527902353"

DIGITS_DATASET = {
    "source": {"uri": "sklearn://digits", "format": "sklearn"},
    "version": "1.0",
    "digest": DIGITS_DIGEST,
    "splits": {"train": 0.7, "validation": 0.1, "test": 0.2, "seed": 7},
    "cleaning": [{"op": "deduplicate"}, {"op": "clip", "min": 0, "max": 16}],
    "labeling": {"classes": [str(i) for i in range(10)]},
}

DIGITS_MODEL = {
    "datasetRef": "digits",
    "architecture": {"type": "mlp", "hiddenSizes": [256, 128]},
    "hyperparameters": {"learningRate": 0.002, "batchSize": 64, "epochs": 30, "optimizer": "adamw", "weightDecay": 0.0001, "seed": 7},
    "evaluation": {"thresholds": [{"metric": "accuracy", "min": 0.95}]},
}


def train_config(output: str, model: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """The train step's ``--config-json`` for the digits MLP (``model`` instead of DIGITS_MODEL when given)."""
    return {"step": "train", "model": "digits-mlp", "version": "v1", "spec": model or DIGITS_MODEL, "data": "data/digits", "output": output, **extra}
