"""What the local target shows beyond its live objects: the registered model versions as the
workspace holds them, and the log files of steps and servers (read only; `forgectl status` and
`forgectl logs` draw them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def model_summaries(workspace: Path) -> list[dict[str, Any]]:
    """Every registered model version in the workspace: `{model, version, variants, evaluation}`
    (and `privacy` when its evaluation measured it), ordered by registry path."""
    models = []
    for reg in sorted((workspace / "registry").glob("*/*/registry.json")):
        info = _read(reg) or {}
        variants = {}
        for variant, meta in (info.get("variants") or {}).items():
            metrics = meta.get("metrics") or {}
            report = meta.get("report") or {}
            variants[variant] = {"sizeBytes": meta.get("sizeBytes"), "parameters": meta.get("parameters"),
                                 "accuracy": metrics.get("accuracy", (report.get("after") or {}).get("accuracy"))}
        evaluate = _read(workspace / "models" / info.get("model", "") / info.get("version", "") / "evaluate" / "metrics.json") or {}
        models.append({"model": info.get("model"), "version": info.get("version"), "variants": variants,
                       "evaluation": {k: v for k, v in evaluate.items() if isinstance(v, (int, float, bool))},
                       **({"privacy": evaluate["privacy"]} if isinstance(evaluate.get("privacy"), dict) else {})})
    return models


def log_files(state_dir: Path, name: str) -> list[Path]:
    """Log files of a local step (`WORKFLOW/STEP` or `STEP`: its latest run), a workflow (all its
    steps), or an endpoint's servers (any log whose name holds ``name``)."""
    logs = state_dir / "logs"
    found: list[Path] = []
    if "/" in name:
        found = [logs / "workflows" / f"{name}.log"]
    else:
        found = sorted((logs / "workflows").glob(f"*/{name}.log"), key=lambda p: p.stat().st_mtime)[-1:]
        found += sorted((logs / "workflows" / name).glob("*.log")) if (logs / "workflows" / name).is_dir() else []
        found += sorted(p for p in logs.glob(f"*{name}*.log"))
    return [p for p in found if p.is_file()]
