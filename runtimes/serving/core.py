"""The one model-loading core both servers use: load any bundle, turn raw inputs into outputs.

Inputs are what a client sends: for feature models the raw feature values (the prepare step's
clip/standardize transform is applied here, as in training), for token models integer token ids
(bytes of the text). Outputs: ``probabilities`` (FP32 [N, classes]) and ``label`` (INT64 [N]) for
classifiers, ``prediction`` for regression, ``next_token`` for language models.

Device: ``$FORGE_SERVE_DEVICE`` — ``auto`` (the default: the first CUDA device when the server
sees one and the bundle holds float weights, else the CPU), ``cpu``, ``cuda`` or ``cuda:N``. In a
cluster a server sees a GPU only when its Endpoint's resources ask for one. INT8 and exported
(PT2E) bundles always run on the CPU, where their kernels are.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import numpy as np


class ServingCore:
    def __init__(self, model_dir: Path):
        import torch

        from runtimes.models import load_bundle

        self._torch = torch
        self.model, self.info = load_bundle(model_dir)
        self.device = serving_device(self.info.get("kind", "state_dict"))
        if self.device.type != "cpu":
            self.model.to(self.device)
        self.task = self.info["task"]
        self.input_kind = self.info.get("inputKind", "features")
        self.classes = list(self.info.get("classes") or [])
        transform = self.info.get("transform") or {}
        self._clips = transform.get("clip") or []
        std = transform.get("standardize")
        self._mean = np.asarray(std["mean"], dtype=np.float32) if std else None
        self._std = np.asarray(std["std"], dtype=np.float32) if std else None
        self._lock = threading.Lock()  # one forward pass at a time: batching, not interleaving

    def _features(self, inputs: np.ndarray) -> np.ndarray:
        x = np.asarray(inputs, dtype=np.float32)
        x = x.reshape(len(x), -1) if x.ndim != 1 else x.reshape(1, -1)
        expected = self.info.get("numFeatures")
        if expected and x.shape[1] != expected:
            raise ValueError(f"expected {expected} feature values per row, got {x.shape[1]}")
        for clip in self._clips:
            cols = clip.get("columns")
            if cols:
                x[:, cols] = np.clip(x[:, cols], clip["min"], clip["max"])
            else:
                x = np.clip(x, clip["min"], clip["max"])
        if self._mean is not None:
            x = (x - self._mean) / self._std
        return x

    def predict(self, inputs: np.ndarray) -> dict[str, np.ndarray]:
        torch = self._torch
        if self.input_kind == "tokens":
            arr = np.asarray(inputs)
            if arr.ndim == 1:
                arr = arr.reshape(1, -1)
            t = torch.from_numpy(arr.astype(np.int64))
        else:
            t = torch.from_numpy(self._features(inputs))
        with self._lock, torch.inference_mode():
            out = self.model(t.to(self.device)).float()
            if self.task == "regression":
                return {"prediction": out.reshape(len(out), -1)[:, 0].cpu().numpy()}
            if self.task == "lm":
                return {"next_token": out[:, -1, :].argmax(-1).cpu().numpy().astype(np.int64)}
            probs = torch.softmax(out, dim=-1).cpu()
        return {"probabilities": probs.numpy().astype(np.float32), "label": probs.argmax(-1).numpy().astype(np.int64)}

    def describe(self) -> dict[str, Any]:
        described = {k: self.info.get(k) for k in ("model", "version", "variant", "kind", "task", "inputKind", "classes", "numFeatures")}
        return {**described, "device": str(self.device)}


def serving_device(kind: str) -> Any:
    """The device a bundle of ``kind`` is served on (``$FORGE_SERVE_DEVICE``, see the module doc)."""
    import torch

    wanted = os.environ.get("FORGE_SERVE_DEVICE", "auto").strip() or "auto"
    if kind != "state_dict" or wanted == "cpu":
        return torch.device("cpu")
    if wanted == "auto":
        return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(wanted)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"FORGE_SERVE_DEVICE={wanted}: this machine has no CUDA device")
    return device
