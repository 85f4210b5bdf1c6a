"""A variant's verdict in its folder: a bundle (``model.json``), or ``rejected.json`` saying why not.

A compression variant that loses more accuracy than its bound, an ONNX graph that computes
something else than its PyTorch source, an INT8 graph beyond its bound — each is a *verdict* of
the step that built it, not a failure of the run: the step writes ``rejected.json`` where the
bundle would have been and ends 0, so the version's other variants are still benchmarked and
registered (TFX's "blessing" rather than a failed pipeline). What the later steps may not do is
guess: a folder with neither a bundle nor a verdict means the step that should have filled it did
not run to its end, and they fail on it (:func:`verdict`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtimes._step import read_json, write_json
from runtimes.errors import StepFailed

#: The verdict file a rejecting step leaves in the variant's folder.
REJECTED = "rejected.json"
#: The file that makes a folder a bundle (see :mod:`runtimes.models`), and its weights' suffixes.
BUNDLE = "model.json"
WEIGHTS = (".pt", ".pt2", ".onnx")


@dataclass(frozen=True)
class Rejection:
    """Why a variant was not built: the step's reason, and where its full report is (workspace path)."""

    variant: str
    reason: str
    report: str | None

    def to_json(self) -> dict[str, Any]:
        return {"reason": self.reason, **({"report": self.report} if self.report else {})}


def reject(folder: Path, variant: str, reason: str, report: str | None = None) -> Rejection:
    """Record that ``variant`` is rejected: its folder holds ``rejected.json`` and no bundle (one
    written before the verdict is removed, so no later step can serve it); its reports stay."""
    folder.mkdir(parents=True, exist_ok=True)
    for item in folder.iterdir():
        if item.is_file() and (item.name == BUNDLE or item.suffix in WEIGHTS):
            item.unlink()
    rejection = Rejection(variant, reason, report)
    write_json(folder / REJECTED, {"variant": variant, **rejection.to_json()})
    return rejection


def verdict(name: str, folder: Path) -> Rejection | None:
    """None when ``folder`` holds ``name``'s bundle; its :class:`Rejection` when a step rejected it.
    :class:`StepFailed` when it holds neither: the step that builds it did not finish."""
    if (folder / BUNDLE).exists():
        return None
    if (folder / REJECTED).exists():
        data = read_json(folder / REJECTED)
        return Rejection(name, str(data.get("reason") or "rejected"), data.get("report"))
    raise StepFailed(f"variant {name}: neither a bundle nor a verdict in {folder} (the step that builds it did not finish)")


def split(folders: dict[str, Path]) -> tuple[dict[str, Path], dict[str, Rejection]]:
    """The variants with a bundle, and the rejected ones with why (``StepFailed`` for neither)."""
    built: dict[str, Path] = {}
    rejected: dict[str, Rejection] = {}
    for name, folder in folders.items():
        found = verdict(name, folder)
        if found is None:
            built[name] = folder
        else:
            rejected[name] = found
    return built, rejected
