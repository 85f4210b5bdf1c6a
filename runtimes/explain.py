"""``python -m runtimes explain``: attributions of an evaluated classifier (Captum).

On the first ``samples`` rows of the held-out split, each method of ``settings.methods`` explains
the model's logit of the row's **true** class:

- ``integratedGradients`` (Sundararajan et al., 2017): the path integral of the gradient from an
  all-zero baseline (the prepared features' zero: the training mean when standardised), ``steps``
  points (Gauss–Legendre). Its completeness error — |Σ attributions − (f(x) − f(baseline))| —
  is reported (``completenessError``, mean over rows).
- ``saliency`` (|∇ₓ logit|) and ``inputXGradient`` (x · ∇ₓ logit): cheaper methods, compared
  with the first one by the Spearman rank correlation of the absolute attributions per row
  (``agreement``).

Written under ``output``:

- ``explanations.json``: per method and class the mean absolute attribution of every feature and
  the top features; the methods' agreement; the sanity check; the maps written;
- ``maps/<method>-class-<c>.png`` for image data (``imageShape`` in the prepared data's meta, the
  digits' 8×8): the class's mean attribution next to an example row of it, and
  ``maps/<method>-example-<i>.png`` for single rows (``mapsPerClass`` of them per class);
- ``metrics.json``: a small summary (the Workflow's output parameter; the registry reads it).

**Sanity check** (the model-randomisation test of Adebayo et al., 2018): the same attributions
are computed for the model with every layer's weights re-initialised (``reset_parameters``,
seeded); ``sanityRankCorrelation`` is the mean Spearman rank correlation between the trained and
the randomised model's absolute attributions, over the features where the input differs from the
baseline (elsewhere Integrated Gradients and input × gradient attribute 0 for *every* model, and
on the digits — mostly blank pixels — those ties alone correlate at ≈ 0.9; measured: IG 0.91
over all features, 0.36 over the informative ones). Attributions that explain the model must
change when the model does: the check passes (``sanityPassed``) below ``SANITY_BOUND``, and
``sanityByMethod`` gives every method's figure. A method that only echoes the input (edge
detection) fails it. The step reports, it does not gate. ``agreement`` uses the same features.
"""

from __future__ import annotations

import logging
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtimes._step import in_workspace, parse_config, run_step, write_json
from runtimes.errors import StepFailed
from specs.model import Explanations
from specs.stepconfig import ExplainConfig

log = logging.getLogger("forge.explain")

SANITY_BOUND = 0.5
TOP_FEATURES = 8


def _attribute(method: str, model: Any, x: Any, target: Any, steps: int) -> tuple[Any, Any]:
    """(attributions, IG completeness error per row or None)."""
    from captum.attr import InputXGradient, IntegratedGradients, Saliency

    if method == "integratedGradients":
        attr, delta = IntegratedGradients(model).attribute(x, baselines=x * 0, target=target, n_steps=steps,
                                                           return_convergence_delta=True)
        return attr.detach(), delta.detach().abs()
    if method == "saliency":
        return Saliency(model).attribute(x, target=target, abs=True).detach(), None
    return InputXGradient(model).attribute(x, target=target).detach(), None


def _rank_correlation(a: Any, b: Any, mask: Any) -> float:
    """Mean over rows of the Spearman rank correlation of |a| and |b|, over the features where
    ``mask`` holds (the input differs from the baseline)."""
    import torch

    a, b, mask = a.reshape(len(a), -1).abs(), b.reshape(len(b), -1).abs(), mask.reshape(len(mask), -1)
    values = []
    for i in range(len(a)):
        u, v = a[i][mask[i]], b[i][mask[i]]
        if len(u) < 2:
            continue
        ru, rv = u.argsort().argsort().double(), v.argsort().argsort().double()
        ru, rv = ru - ru.mean(), rv - rv.mean()
        values.append(float((ru * rv).sum() / (ru.norm() * rv.norm()).clamp_min(1e-12)))
    return float(torch.tensor(values).mean()) if values else float("nan")


def _randomised(model: Any, seed: int) -> Any:
    import copy

    import torch

    torch.manual_seed(seed)
    clone = copy.deepcopy(model)
    for module in clone.modules():
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()
    return clone.eval()


def _png(path: Any, panels: list[tuple[str, Any, str]], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(2.4 * len(panels), 2.6))
    for ax, (name, image, cmap) in zip(axes if len(panels) > 1 else [axes], panels):
        bound = float(abs(image).max()) or 1.0
        ax.imshow(image, cmap=cmap, **({"vmin": -bound, "vmax": bound} if cmap == "bwr" else {}))
        ax.set_title(name, fontsize=8)
        ax.axis("off")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80, metadata={"Software": None})
    plt.close(fig)


@dataclass
class _Rows:
    """The rows explained and what names them: their classes' and features' names and, for image
    data, the image shape (the prepared data's ``imageShape``)."""

    x: Any
    y: Any
    classes: list[str]
    feature_names: list[str]
    shape: list[int] | None


def main(argv: list[str] | None = None) -> int:
    config, _ = parse_config(ExplainConfig, argv, "python -m runtimes explain")
    settings = config.settings
    model, info, meta, (x, y) = _load(config)
    classes = [str(c) for c in (info.get("classes") or meta.get("classes") or range(int(y.max()) + 1))]
    attributions, completeness = _attributions(model, x, y, settings)
    primary = settings.methods[0]
    sanity_by_method, agreement = _sanity_and_agreement(model, attributions, x, y, settings)
    sanity = sanity_by_method[primary]
    feature_names = meta.get("featureNames") or [f"f{i}" for i in range(x.shape[1] if x.dim() == 2 else x[0].numel())]
    rows = _Rows(x, y, classes, feature_names, meta.get("imageShape"))
    per_class = {method: _per_class(attr, rows) for method, attr in attributions.items()}
    out_dir = in_workspace(config.output)
    maps = _maps(out_dir, attributions, rows, settings.maps_per_class) if rows.shape and settings.maps_per_class else []

    summary = {
        "model": config.model,
        "methods": list(settings.methods),
        "primary": primary,
        "rows": int(len(x)),
        "target": "true class",
        "baseline": "zeros",
        "sanityRankCorrelation": round(sanity, 4),
        "sanityBound": SANITY_BOUND,
        "sanityPassed": sanity < SANITY_BOUND,
        "sanityByMethod": sanity_by_method,
        "agreement": agreement,
        "completenessError": None if completeness is None else round(completeness, 6),
        "maps": len(maps),
        "folder": config.output,
    }
    write_json(out_dir / "explanations.json", {**summary, "perClass": per_class, "mapFiles": maps,
                                               "featureNames": feature_names})
    write_json(out_dir / "metrics.json", summary)
    log.info("explanations of %s: %s on %d rows; sanity rank correlation %.3f (%s, bound %.2f); agreement %s; %d maps",
             config.model, ", ".join(settings.methods), len(x), sanity, "passed" if sanity < SANITY_BOUND else "FAILED",
             SANITY_BOUND, agreement, len(maps))
    return 0


def _load(config: ExplainConfig) -> tuple[Any, dict[str, Any], dict[str, Any], tuple[Any, Any]]:
    """The model (float, eval mode), its ``model.json``, the prepared data's meta and the first
    ``samples`` rows of the test split; refused, with the reason, for what attributions of the
    true class's logit cannot explain (no float weights to differentiate, not a classifier of
    features or images, no rows)."""
    from runtimes.data import load_prepared
    from runtimes.learn import split_rows
    from runtimes.models import load_bundle

    model, info = load_bundle(in_workspace(config.model_dir))
    if info.get("kind", "state_dict") != "state_dict" and not any(True for _ in model.parameters()):
        raise StepFailed("explain: the bundle has no float weights to differentiate")
    data = load_prepared(in_workspace(config.data), ("test",))
    if info["task"] != "classification" or data.meta.get("inputKind") != "features":
        raise StepFailed(f"explain: attributions are computed for classifiers of features or images "
                         f"(this model: task {info['task']}, input {data.meta.get('inputKind')})")
    model = model.float().eval()
    warnings.filterwarnings("ignore", message="Input Tensor .* did not already require gradients")
    x, y = split_rows(data, "test").head(config.settings.samples)  # a sample: a sharded split's first rows only are read
    if not len(x):
        raise StepFailed("explain: the test split is empty")
    return model, info, data.meta, (x, y)


def _attributions(model: Any, x: Any, y: Any, settings: Explanations) -> tuple[dict[str, Any], float | None]:
    """Each method's attributions of the true class's logit, and Integrated Gradients' mean
    completeness error (None without it). Seeded: the methods themselves are deterministic, the
    seed keeps whatever a Captum version samples the same from run to run."""
    import torch

    torch.manual_seed(0)
    attributions: dict[str, Any] = {}
    completeness = None
    for method in settings.methods:
        attr, delta = _attribute(method, model, x, y, settings.steps)
        attributions[method] = attr
        if delta is not None:
            completeness = float(delta.mean())
    return attributions, completeness


def _sanity_and_agreement(model: Any, attributions: dict[str, Any], x: Any, y: Any,
                          settings: Explanations) -> tuple[dict[str, float], dict[str, float]]:
    """(each method's rank correlation with its attributions of the randomised model — the
    sanity check —, each other method's agreement with the first one), both over the features
    where the input differs from the (zero) baseline."""
    methods, informative = settings.methods, x != 0
    random_model = _randomised(model, seed=1)
    sanity_by_method: dict[str, float] = {
        m: round(_rank_correlation(attributions[m], _attribute(m, random_model, x, y, settings.steps)[0], informative), 4)
        for m in methods}
    agreement: dict[str, float] = {m: round(_rank_correlation(attributions[methods[0]], attributions[m], informative), 4)
                                   for m in methods[1:]}
    return sanity_by_method, agreement


def _per_class(attr: Any, explained: _Rows) -> dict[str, Any]:
    """One method's attributions by class: every feature's mean absolute attribution and the top
    ``TOP_FEATURES`` features (with their signed means)."""
    y, classes, feature_names = explained.y, explained.classes, explained.feature_names
    flat = attr.reshape(len(attr), -1)
    out = {}
    for c in sorted(set(y.tolist())):
        rows = flat[y == c]
        mean_abs = rows.abs().mean(0)
        top = mean_abs.argsort(descending=True)[:TOP_FEATURES].tolist()
        out[classes[c] if c < len(classes) else str(c)] = {
            "rows": int(len(rows)),
            "meanAbsAttribution": [round(float(v), 6) for v in mean_abs],
            "top": [{"feature": feature_names[i] if i < len(feature_names) else f"f{i}", "index": i,
                     "meanAbs": round(float(mean_abs[i]), 6), "mean": round(float(rows[:, i].mean()), 6)} for i in top],
        }
    return out


def _maps(out_dir: Path, attributions: dict[str, Any], rows: _Rows, per_class: int) -> list[str]:
    """PNG maps of image data: per method and class the mean attribution beside the class's
    first row, then single rows, up to ``per_class`` rows of each class in all. Returns the files
    written, relative to ``out_dir``."""
    x, y, classes, shape = rows.x, rows.y, rows.classes, rows.shape
    assert shape is not None
    h, w = int(shape[-2]), int(shape[-1])
    maps: list[str] = []
    for method, attr in attributions.items():
        for c in sorted(set(y.tolist())):
            idx = (y == c).nonzero().flatten().tolist()
            name = classes[c] if c < len(classes) else str(c)
            mean = attr[y == c].reshape(-1, *shape).mean(0).reshape(-1, h, w).sum(0)
            path = out_dir / "maps" / f"{method}-class-{name}.png"
            _png(path, [("input", x[idx[0]].reshape(-1, h, w).sum(0), "gray"), ("mean attribution", mean, "bwr")],
                 f"{method}, class {name} ({len(idx)} rows)")
            maps.append(str(path.relative_to(out_dir)))
            for i in idx[1:per_class]:
                path = out_dir / "maps" / f"{method}-example-{i}.png"
                _png(path, [("input", x[i].reshape(-1, h, w).sum(0), "gray"),
                            ("attribution", attr[i].reshape(-1, h, w).sum(0), "bwr")], f"{method}, row {i}, class {name}")
                maps.append(str(path.relative_to(out_dir)))
    return maps


def run(argv: list[str] | None = None) -> int:
    return run_step(main, argv)


if __name__ == "__main__":
    sys.exit(run())
