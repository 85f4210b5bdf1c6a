"""The one model-loading core both servers use: load any bundle, turn raw inputs into outputs.

Inputs are what a client sends: for feature models the raw feature values (the prepare step's
clip/standardize transform is applied here, as in training), for token models integer token ids
(bytes of the text). Outputs: ``probabilities`` (FP32 [N, classes]) and ``label`` (INT64 [N]) for
classifiers, ``prediction`` for regression, ``next_token`` for language models.

Device: ``$FORGE_SERVE_DEVICE`` — ``auto`` (the default: the first CUDA device when the server
sees one and the bundle holds float weights, else the CPU), ``cpu``, ``cuda`` or ``cuda:N``. In a
cluster a server sees a GPU only when its Endpoint's resources ask for one. INT8 and exported
(PT2E) bundles always run on the CPU, where their kernels are.

Backends: PyTorch bundles (``state_dict``, ``int8``, ``pickle``, ``pt2e``) run under
``torch.inference_mode``; ONNX bundles (``onnx``, ``onnx-int8``, the export step's) run in an ONNX
Runtime CPU session. Both use ``threads`` intra-op threads (:func:`cpu_budget` by default: the
CPUs the process may use), inter-op parallelism off: one batch computes at a time, and batching,
not interleaving, is how concurrent requests share the model.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

ONNX_KINDS = ("onnx", "onnx-int8")


def cpu_budget() -> int:
    """CPUs this process may use: its cgroup's CPU limit (v2 ``cpu.max``, v1 CFS quota) rounded
    up, else its CPU affinity, else ``os.cpu_count()``."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = None
    try:
        text = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if text and text[0] != "max":
            quota = int(text[0]) / int(text[1])
    except (OSError, ValueError, IndexError):
        try:
            q = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
            period = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
            quota = q / period if q > 0 and period > 0 else None
        except (OSError, ValueError):
            quota = None
    if quota is not None:
        cpus = min(cpus, max(1, int(-(-quota // 1))))
    return max(1, cpus)


class ServingCore:
    def __init__(self, model_dir: Path, threads: int | None = None):
        import torch

        from runtimes.models import read_info

        self._torch = torch
        self.threads = int(threads or cpu_budget())
        torch.set_num_threads(self.threads)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:  # already set, or inter-op work already started: keep what is there
            pass
        info = read_info(model_dir)
        # An onnxruntime InferenceSession (ONNX bundles) or a torch module: typed Any, as neither
        # library is importable where the control plane is type-checked.
        self.session: Any = None
        self.model: Any = None
        if info.get("kind") in ONNX_KINDS:
            self.session = serving_session(model_dir / info.get("file", "model.onnx"), self.threads)
            self._input_name = self.session.get_inputs()[0].name
            self.model, self.info = None, info
            self.device = torch.device("cpu")
            self.backend = "onnxruntime"
        else:
            from runtimes.models import load_bundle

            self.model, self.info = load_bundle(model_dir)
            self.device = serving_device(self.info.get("kind", "state_dict"))
            if self.device.type != "cpu":
                self.model.to(self.device)
            self.backend = "pytorch"
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

    def prepare(self, inputs: np.ndarray) -> np.ndarray:
        """Raw request inputs → the model's input rows (tokens as int64, features transformed);
        ``ValueError`` when they do not fit the model."""
        if self.input_kind == "tokens":
            arr = np.asarray(inputs)
            if arr.ndim == 1:
                arr = arr.reshape(1, -1)
            return np.ascontiguousarray(arr, dtype=np.int64)
        return self._features(inputs)

    def predict(self, inputs: np.ndarray) -> dict[str, np.ndarray]:
        return self.predict_rows(self.prepare(inputs))

    def predict_rows(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """Outputs of prepared rows (:meth:`prepare`), one forward pass."""
        if self.session is not None:
            return self._predict_onnx(rows)
        torch = self._torch
        t = torch.from_numpy(rows)
        with self._lock, torch.inference_mode():
            out = self.model(t.to(self.device)).float()
            if self.task == "regression":
                return {"prediction": out.reshape(len(out), -1)[:, 0].cpu().numpy()}
            if self.task == "lm":
                return {"next_token": out[:, -1, :].argmax(-1).cpu().numpy().astype(np.int64)}
            probs = torch.softmax(out, dim=-1).cpu()
        return {"probabilities": probs.numpy().astype(np.float32), "label": probs.argmax(-1).numpy().astype(np.int64)}

    def _predict_onnx(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        with self._lock:
            out = np.asarray(self.session.run(None, {self._input_name: rows})[0], dtype=np.float32)
        if self.task == "regression":
            return {"prediction": out.reshape(len(out), -1)[:, 0]}
        if self.task == "lm":
            return {"next_token": out[:, -1, :].argmax(-1).astype(np.int64)}
        shifted = np.exp(out - out.max(axis=-1, keepdims=True))
        probs = (shifted / shifted.sum(axis=-1, keepdims=True)).astype(np.float32)
        return {"probabilities": probs, "label": probs.argmax(-1).astype(np.int64)}

    def describe(self) -> dict[str, Any]:
        described = {k: self.info.get(k) for k in ("model", "version", "variant", "kind", "task", "inputKind", "classes", "numFeatures")}
        return {**described, "device": str(self.device), "backend": self.backend, "threads": self.threads}


def serving_session(path: Path, threads: int) -> Any:
    """An ONNX Runtime CPU session for a server: ``threads`` intra-op threads, sequential
    execution, and worker threads that sleep between runs instead of spinning (a spinning pool
    takes the CPU the server's event loop needs to decode the next requests)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])


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
