"""A validated set of specs with their references resolved — the input of every renderer.

Resolution is pure: :func:`check_references` returns the problems (dangling references, missing
defaults, cycles) as :class:`ReferenceProblem` values; the loader turns them into diagnostics with
file positions.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TypeVar

from specs.compression import Distill
from specs.compute import queue_problems
from specs.documents import (
    KINDS,
    Compression,
    Compute,
    Dataset,
    Document,
    Endpoint,
    Environment,
    Model,
    RolloutPolicy,
)

D = TypeVar("D", bound=Document)


@dataclass(frozen=True)
class ReferenceProblem:
    """A reference that cannot be resolved, or a cycle, found in one document. ``target`` is the
    (kind, name) referred to, for a dangling reference."""

    kind: str
    name: str
    path: tuple[str | int, ...]
    message: str
    target: tuple[str, str] | None = None


@dataclass(frozen=True)
class SpecSet:
    """Every document of a repository, by kind and name."""

    documents: tuple[Document, ...] = ()
    _index: dict[tuple[str, str], Document] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        for doc in self.documents:
            self._index.setdefault((doc.kind, doc.name), doc)

    def get(self, kind: type[D], name: str | None) -> D | None:
        """The document of ``kind`` named ``name``, or None."""
        if name is None:
            return None
        found = self._index.get((kind.__name__, name))
        return found if isinstance(found, kind) else None

    def of(self, kind: type[D]) -> list[D]:
        """Every document of ``kind``, sorted by name (so output never depends on file order)."""
        return sorted((d for d in self.documents if isinstance(d, kind)), key=lambda d: d.name)

    def __iter__(self) -> Iterator[Document]:
        return iter(self.documents)

    # -- environment selection -------------------------------------------------------------
    def environment(self, name: str | None = None) -> Environment | None:
        """The Environment named ``name``; else the one marked default; else one named `local`;
        else the only one."""
        envs = self.of(Environment)
        if name is not None:
            return self.get(Environment, name)
        for env in envs:
            if env.spec.default:
                return env
        return self.get(Environment, "local") or (envs[0] if len(envs) == 1 else None)

    # -- resolved references -----------------------------------------------------------------
    def dataset_of(self, model: Model) -> Dataset:
        """The Dataset a Model trains on (references are checked before renderers run)."""
        return _must(self.get(Dataset, model.spec.dataset_ref), "Dataset", model.spec.dataset_ref)

    def compute_of(self, model: Model, env: Environment | None) -> Compute:
        """The Compute pool of a Model: its own `computeRef` or the Environment's default."""
        ref = model.spec.compute_ref or (env.spec.defaults.compute_ref if env else None)
        return _must(self.get(Compute, ref), "Compute", ref)

    def compression_of(self, model: Model) -> Compression | None:
        """The Compression of a Model, if it has one."""
        return self.get(Compression, model.spec.compression_ref)

    def serving_compute_of(self, endpoint: Endpoint) -> Compute | None:
        """The Compute pool an Endpoint's model servers run in (its `computeRef`), if any; without
        one they run on the cluster's ordinary CPU nodes."""
        return self.get(Compute, endpoint.spec.compute_ref)

    def model_of(self, endpoint: Endpoint) -> Model:
        """The Model an Endpoint serves."""
        return _must(self.get(Model, endpoint.spec.model_ref), "Model", endpoint.spec.model_ref)

    def policy_of(self, endpoint: Endpoint, env: Environment | None) -> RolloutPolicy | None:
        """The RolloutPolicy of an Endpoint: its own or the Environment's default."""
        ref = endpoint.spec.rollout_policy_ref or (env.spec.defaults.rollout_policy_ref if env else None)
        return self.get(RolloutPolicy, ref)

    def labeller_of(self, model: Model) -> str | None:
        """The Model that auto-labels the data set ``model`` trains on (`labeling.auto.modelRef`),
        when it is another Model: its registration is awaited by ``model``'s Workflow."""
        dataset = self.get(Dataset, model.spec.dataset_ref)
        auto = dataset.spec.labeling.auto if dataset is not None else None
        return auto.model_ref if auto is not None and auto.model_ref != model.name else None

    def teachers_of(self, compression: Compression) -> list[str]:
        """Names of the Models that teach a Compression's distillation stages."""
        return sorted(
            {s.teacher_ref for v in compression.spec.variants for s in v.stages if isinstance(s, Distill) and s.teacher_ref}
        )


def _must(doc: D | None, kind: str, name: str | None) -> D:
    if doc is None:
        raise LookupError(f"{kind} {name!r} is not defined (references are checked by the loader)")
    return doc


def check_references(specs: SpecSet) -> list[ReferenceProblem]:
    """Every reference problem in ``specs``: dangling references, missing defaults, an Endpoint
    variant its model does not build, several default Environments, and cycles of
    Model → Compression → teacher Model."""
    problems: list[ReferenceProblem] = []

    def ref(doc: Document, path: tuple[str | int, ...], kind: type[Document], name: str | None) -> None:
        if name is not None and specs.get(kind, name) is None:
            known = ", ".join(d.name for d in specs.of(kind)) or "none defined"
            problems.append(
                ReferenceProblem(doc.kind, doc.name, path, f"{kind.__name__} {name!r} is not defined (known: {known})",
                                 target=(kind.__name__, name))
            )

    envs = specs.of(Environment)
    defaults = [e for e in envs if e.spec.default]
    for extra in defaults[1:]:
        problems.append(
            ReferenceProblem("Environment", extra.name, ("spec", "default"),
                             f"only one Environment may be the default; {defaults[0].name!r} already is")
        )
    for env in envs:
        ref(env, ("spec", "defaults", "computeRef"), Compute, env.spec.defaults.compute_ref)
        ref(env, ("spec", "defaults", "rolloutPolicyRef"), RolloutPolicy, env.spec.defaults.rollout_policy_ref)

    for model in specs.of(Model):
        ref(model, ("spec", "datasetRef"), Dataset, model.spec.dataset_ref)
        ref(model, ("spec", "compressionRef"), Compression, model.spec.compression_ref)
        if model.spec.compute_ref is not None:
            ref(model, ("spec", "computeRef"), Compute, model.spec.compute_ref)
        elif not envs or any(e.spec.defaults.compute_ref is None for e in envs):
            problems.append(
                ReferenceProblem("Model", model.name, ("spec",),
                                 "no `computeRef`, and not every Environment sets `defaults.computeRef`")
            )

    for compute in specs.of(Compute):
        problems.extend(ReferenceProblem("Compute", compute.name, path, message) for path, message in queue_problems(compute.spec))

    for comp in specs.of(Compression):
        for vi, variant in enumerate(comp.spec.variants):
            for si, stage in enumerate(variant.stages):
                if isinstance(stage, Distill):
                    ref(comp, ("spec", "variants", vi, "stages", si, "teacherRef"), Model, stage.teacher_ref)

    for ds in specs.of(Dataset):
        if ds.spec.labeling.auto is not None:
            ref(ds, ("spec", "labeling", "auto", "modelRef"), Model, ds.spec.labeling.auto.model_ref)

    for ep in specs.of(Endpoint):
        ref(ep, ("spec", "modelRef"), Model, ep.spec.model_ref)
        ref(ep, ("spec", "rolloutPolicyRef"), RolloutPolicy, ep.spec.rollout_policy_ref)
        ref(ep, ("spec", "computeRef"), Compute, ep.spec.compute_ref)
        gpus = max(ep.spec.resources.requests.gpus, ep.spec.resources.limits.gpus)
        pool = specs.get(Compute, ep.spec.compute_ref)
        if gpus and (pool is None or pool.spec.accelerator.effective_resource_name is None):
            problems.append(
                ReferenceProblem("Endpoint", ep.name, ("spec", "resources"),
                                 f"servers request {gpus} accelerator(s) but "
                                 + (f"Compute {pool.name!r} is a CPU pool" if pool else "the Endpoint has no `computeRef`")
                                 + ": name an accelerator pool in `computeRef`")
            )
        served = specs.get(Model, ep.spec.model_ref)
        if served is not None:
            pipeline = specs.get(Compression, served.spec.compression_ref)
            variants = pipeline.spec.servable_variants() if pipeline else ["base"]
            wanted: list[tuple[tuple[str | int, ...], str]] = [(("spec", "variant"), ep.spec.variant)]
            if ep.spec.experiment is not None:
                wanted += [(("spec", "experiment", "arms", i, "variant"), arm.variant)
                           for i, arm in enumerate(ep.spec.experiment.arms) if arm.variant is not None]
            if ep.spec.shadow is not None and ep.spec.shadow.variant is not None:
                wanted.append((("spec", "shadow", "variant"), ep.spec.shadow.variant))
            for path, wanted_variant in wanted:
                if wanted_variant not in variants:
                    problems.append(
                        ReferenceProblem("Endpoint", ep.name, path,
                                         f"model {served.name!r} builds no variant {wanted_variant!r} "
                                         f"(expected {', '.join(repr(v) for v in variants)})")
                    )
                elif ep.spec.protocol == "seldon" and pipeline is not None and wanted_variant in pipeline.spec.exported_variants():
                    # the seldon wrapper's environment (numpy 1, old Flask) has no ONNX Runtime
                    problems.append(
                        ReferenceProblem("Endpoint", ep.name, path,
                                         f"{wanted_variant!r} is an ONNX graph, which the seldon wrapper does not serve: "
                                         "use protocol: v2 (MLServer runs it on ONNX Runtime) or a PyTorch variant")
                    )

    problems.extend(_teacher_cycles(specs))
    return problems


def _teacher_cycles(specs: SpecSet) -> list[ReferenceProblem]:
    """A Model needs its teachers' and its data's labelling model's workflows finished first; a
    cycle among them never finishes. A model teaching its own compression (self-distillation from
    its uncompressed weights) or labelling its own data (after its own evaluation) is fine."""
    edges: dict[str, list[str]] = {}
    via: dict[tuple[str, str], tuple[str | int, ...]] = {}
    for model in specs.of(Model):
        comp = specs.compression_of(model)
        teachers = specs.teachers_of(comp) if comp else []
        edges[model.name] = [t for t in teachers if t != model.name and specs.get(Model, t) is not None]
        labeller = specs.labeller_of(model)
        if labeller is not None and specs.get(Model, labeller) is not None and labeller not in edges[model.name]:
            edges[model.name].append(labeller)
            via[(model.name, labeller)] = ("spec", "datasetRef")

    problems: list[ReferenceProblem] = []
    state: dict[str, int] = {}
    reported: set[frozenset[str]] = set()

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in edges.get(node, []):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt]
                key = frozenset(cycle)
                if key not in reported:
                    reported.add(key)
                    problems.append(
                        ReferenceProblem("Model", nxt, via.get((nxt, cycle[1]), ("spec", "compressionRef")),
                                         "reference cycle: " + " → ".join(cycle)
                                         + " (each model waits for its teacher or its data's labelling model)")
                    )
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for name in sorted(edges):
        if name not in state:
            visit(name, [])
    return problems


__all__ = ["KINDS", "ReferenceProblem", "SpecSet", "check_references"]
