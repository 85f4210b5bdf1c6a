"""The plan's render cache (reconciler/plan/rendercache.py) and the spec files' parse cache
(reconciler/load/parsecache.py): what their keys hold, shown by changing each input.

Every render through the cache is compared with a render without it: the cache may only ever save
work, never change a manifest."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from reconciler.applied import desired_digest
from reconciler.load.loader import load, load_files, load_or_raise
from reconciler.load.parsecache import ParseCache
from reconciler.load.sources import files_from_paths
from reconciler.packcache import Pack
from reconciler.plan import rendercache
from reconciler.plan.rendercache import RenderCache
from reconciler.resources import ObjectRef
from renderers import RenderContext, render
from renderers.bundle import recalled_versions
from renderers.versions import model_version
from specs import Compression, Compute, Dataset, Document, Endpoint, Environment, Model, RolloutPolicy, SpecSet

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart"


def _changed(doc: Any, **spec: Any) -> Any:
    return doc.model_copy(update={"spec": doc.spec.model_copy(update=spec)})


def _with(specs: SpecSet, *docs: Document) -> SpecSet:
    new = {(d.kind, d.name): d for d in docs}
    kept = tuple(new.pop((d.kind, d.name), d) for d in specs.documents)
    return SpecSet(kept + tuple(new.values()))


@pytest.fixture
def specs() -> SpecSet:
    """The quick-start, plus a second endpoint serving its model."""
    base = load_or_raise([str(QUICKSTART)]).specs
    endpoint = base.get(Endpoint, "digits")
    assert endpoint is not None
    second = endpoint.model_copy(update={"metadata": endpoint.metadata.model_copy(update={"name": "digits-two"})})
    return _with(base, second)


def _cluster(specs: SpecSet) -> Environment:
    env = specs.get(Environment, "cluster")
    assert env is not None
    return env


def _render(specs: SpecSet, folder: Path, env: Environment | None = None, revision: str | None = None
            ) -> tuple[list[dict[str, Any]], RenderCache]:
    env = env or _cluster(specs)
    cache = RenderCache(env, "forge", folder)
    # as a plan asks: each Model's version first (what its Endpoints serve), then the render
    versions = recalled_versions(specs, RenderContext(env, revision), cache)
    assert versions == {m: v for m, v in versions.items() if v == model_version(specs, specs.get(Model, m), env)}
    out = render(specs, RenderContext(env, revision), cache)
    assert versions == {m: v for m, v in out.versions.items() if m in versions}
    cache.save()
    plain = render(specs, RenderContext(env, revision))
    assert out.manifests == plain.manifests  # the cache never changes a manifest
    assert [list(o["metadata"].get("annotations") or {}) for o in out.manifests] == [
        list(o["metadata"].get("annotations") or {}) for o in plain.manifests]  # nor the order of its annotations
    assert {k: w.manifest for k, w in out.workflows.items()} == {k: w.manifest for k, w in plain.workflows.items()}
    for obj in out.manifests:
        ref = ObjectRef.of(obj)
        if ref in cache.digests:
            assert cache.digests[ref] == desired_digest(obj)
    return out.manifests, cache


def _units(specs: SpecSet) -> int:
    return len(specs.of(Model)) + len(specs.of(Endpoint))


def test_unchanged_specs_render_nothing(specs: SpecSet, tmp_path: Path) -> None:
    _, cold = _render(specs, tmp_path)
    assert (cold.recalled, cold.kept) == (0, _units(specs))
    manifests, warm = _render(specs, tmp_path)
    assert (warm.recalled, warm.kept) == (_units(specs), 0)
    owned = [o for o in manifests if o["kind"] in ("Workflow", "SeldonDeployment", "PodMonitor", "PrometheusRule", "ConfigMap")]
    assert {ObjectRef.of(o) for o in owned} <= set(warm.digests)


def test_a_new_commit_renders_nothing(specs: SpecSet, tmp_path: Path) -> None:
    _render(specs, tmp_path, revision="1111111")
    manifests, cache = _render(specs, tmp_path, revision="2222222")  # stamped on, not rendered again
    assert (cache.recalled, cache.kept) == (_units(specs), 0)
    assert all(o["metadata"]["annotations"]["forge.dev/git-revision"] == "2222222"
               for o in manifests if o["kind"] in ("Workflow", "SeldonDeployment", "ConfigMap"))
    _, cache = _render(specs, tmp_path)  # and without a revision, none
    assert (cache.recalled, cache.kept) == (_units(specs), 0)


def test_a_changed_endpoint_renders_only_its_objects(specs: SpecSet, tmp_path: Path) -> None:
    _render(specs, tmp_path)
    endpoint = specs.get(Endpoint, "digits-two")
    manifests, cache = _render(_with(specs, _changed(endpoint, replicas=3)), tmp_path)
    assert (cache.recalled, cache.kept) == (_units(specs) - 1, 1)
    sdep = next(o for o in manifests if o["kind"] == "SeldonDeployment" and o["metadata"]["name"] == "digits-two")
    assert sdep["spec"]["predictors"][0]["replicas"] == 3


# Each kind a Model or an Endpoint refers to, changed: the units that read it render again (the
# number of units that miss), the others are recalled; the manifests equal a render without cache.
REFERENCED = [
    pytest.param(lambda s: _changed(s.get(Dataset, "digits"), digest="sha256:" + "1" * 64), 3, id="Dataset"),
    pytest.param(lambda s: _changed(s.get(Compute, "cpu"), priority="high"), 1, id="Compute"),
    pytest.param(lambda s: s.get(RolloutPolicy, "three-step-canary").model_copy(update={"spec": s.get(
        RolloutPolicy, "three-step-canary").spec.model_copy(update={"on_prometheus_unreachable": "rollback"})}), 2,
        id="RolloutPolicy"),
    pytest.param(lambda s: _changed(s.get(Compression, "digits-compact"), variants=s.get(
        Compression, "digits-compact").spec.variants[:1]), 3, id="Compression"),
]


@pytest.mark.parametrize(("change", "rerendered"), REFERENCED)
def test_a_changed_reference_renders_what_reads_it(specs: SpecSet, tmp_path: Path, change: Any, rerendered: int) -> None:
    _render(specs, tmp_path)
    changed = _with(specs, change(specs))
    assert changed != specs
    _, cache = _render(changed, tmp_path)
    assert (cache.recalled, cache.kept) == (_units(specs) - rerendered, rerendered)


def test_a_new_renderer_or_environment_renders_everything(specs: SpecSet, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    _render(specs, tmp_path)
    env = _cluster(specs)
    other = env.model_copy(update={"spec": env.spec.model_copy(update={"image_tag": "9.9.9"})})
    _, cache = _render(_with(specs, other), tmp_path, other)
    assert (cache.recalled, cache.kept) == (0, _units(specs))
    monkeypatch.setattr(rendercache, "code_version", lambda: "another-renderer")
    _, cache = _render(specs, tmp_path)
    assert (cache.recalled, cache.kept) == (0, _units(specs))


def test_a_damaged_pack_is_ignored(specs: SpecSet, tmp_path: Path) -> None:
    _, cold = _render(specs, tmp_path)
    data = bytearray(cold.pack.path.read_bytes())
    at = data.index(b'"replicas":') + len(b'"replicas":')
    data[at:at + 1] = b"7"  # a value changed under a valid-looking pack
    cold.pack.path.write_bytes(bytes(data))
    _, cache = _render(specs, tmp_path)
    assert (cache.recalled, cache.kept) == (0, _units(specs))
    cold.pack.path.write_bytes(b"forge-pack-1 truncated")
    _, cache = _render(specs, tmp_path)
    assert cache.recalled == 0


def test_concurrent_writers_leave_a_whole_pack(tmp_path: Path) -> None:
    def write(i: int) -> None:
        pack = Pack(tmp_path, {"scope": 1}, "v")
        for k in range(200):
            pack.put(f"{i}-{k}", {"value": "x" * 500})
        pack.save()

    threads = [threading.Thread(target=write, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    pack = Pack(tmp_path, {"scope": 1}, "v")
    found = [pack.get(f"{i}-0") for i in range(6)]
    assert sum(v is not None for v in found) == 1  # one writer's whole pack, never a mix
    assert not list(tmp_path.glob(".pack-*"))


def test_a_pack_gives_back_what_was_put_in_it_exotic_values_too(tmp_path: Path) -> None:
    # a file name that is not UTF-8 (surrogateescape), a big integer, a non-ASCII and an empty key:
    # what orjson refuses the standard library writes, and either reads it back the same
    values = {"plain": {"a": [1, 2.5, None, True, "é"]}, "name": {"file": "specs/caf\udce9.yaml"},
              "big": {"n": 2**70}, "": {"empty": ""}}
    pack = Pack(tmp_path, {"scope": 2}, "v")
    for key, value in values.items():
        pack.put(key, value)
    pack.save()
    again = Pack(tmp_path, {"scope": 2}, "v")
    assert {key: again.get(key) for key in values} == values


def test_a_packs_entries_share_their_short_strings(tmp_path: Path) -> None:
    """Read back, two entries' equal short strings are one object (what a render would have
    shared), a long one is each entry's own, and every value is as it was put."""
    long = "x" * 100
    values = {f"unit-{i}": {"labels": {"forge.dev/managed-by": "forgectl"}, "image": ["forge/runtime:1.2"],
                            "config": "".join(["x"] * 100)} for i in range(2)}
    pack = Pack(tmp_path, {"scope": 3}, "v")
    for key, value in values.items():
        pack.put(key, value)
    pack.save()
    again = Pack(tmp_path, {"scope": 3}, "v")
    a, b = again.get("unit-0"), again.get("unit-1")
    assert {"unit-0": a, "unit-1": b} == values
    assert a["labels"]["forge.dev/managed-by"] is b["labels"]["forge.dev/managed-by"]
    assert a["image"][0] is b["image"][0]
    assert a["config"] == b["config"] == long and a["config"] is not b["config"]


# -- the parse cache --------------------------------------------------------------------------------


def test_unchanged_files_are_not_parsed_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORGE_CACHE", str(tmp_path / "cache"))
    first = load([str(QUICKSTART)])
    cache = ParseCache([str(QUICKSTART)])
    again = load_files(files_from_paths([str(QUICKSTART)]), cache)
    assert cache.pack.misses == 0 and cache.pack.hits == first.files
    assert again.specs == first.specs and again.diagnostics == first.diagnostics
    assert again.origins == first.origins
    # positions come back (parsed again on demand): the same line for a field as the first load's
    key = ("Model", "digits-mlp")
    assert again.raws[key].position(("spec", "hyperparameters")) == first.raws[key].position(("spec", "hyperparameters"))


def test_bad_input_keeps_its_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORGE_CACHE", str(tmp_path / "cache"))
    tree = tmp_path / "specs"
    tree.mkdir()
    for f in QUICKSTART.glob("*.yaml"):
        (tree / f.name).write_text(f.read_text())
    assert load([str(tree)]).ok
    model = tree / "model.yaml"
    text = model.read_text()
    model.write_text(text.replace("learningRate:", "learningRat:"))  # parses, fails validation
    for _ in range(2):  # the clean parse is cached; the schema error is reported every time, with its line
        bad = load([str(tree)])
        assert not bad.ok
        [diag] = [d for d in bad.diagnostics if d.severity.value == "error"]
        line = text.splitlines().index(next(x for x in text.splitlines() if "learningRate:" in x)) + 1
        assert (Path(diag.file).name, diag.line, "learningRat" in diag.message) == ("model.yaml", line, True)
    model.write_text(text.replace("learningRate:", "learningRate: [\n"))  # a syntax error is never cached
    for _ in range(2):
        broken = load([str(tree)])
        assert not broken.ok and any(Path(d.file).name == "model.yaml" and "YAML" in d.message for d in broken.diagnostics)


@pytest.mark.parametrize("example", sorted(p.name for p in (ROOT / "examples").iterdir() if p.is_dir()))
def test_every_example_renders_the_same_through_the_cache(example: str, tmp_path: Path) -> None:
    specs = load_or_raise([str(ROOT / "examples" / example)]).specs
    for env in specs.of(Environment):
        for revision in ("1111111", "2222222", None):  # cold, then recalled and stamped, then unstamped
            _render(specs, tmp_path / env.name, env, revision)


# -- a pull request's plan --------------------------------------------------------------------------


def test_a_pull_request_parses_and_renders_what_it_changes_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`forgectl plan --base`: the two revisions share one parse cache (a file the pull request
    leaves alone is parsed once between them) and one render pack (the head recalls what the base
    rendered a moment before); a second plan of the same pull request parses and renders nothing;
    and the plan is the very one made with no cache at all."""
    from reconciler.plan.pullrequest import pull_request_plan
    from tests.plan.repos import NO_KUBECONFIG, PlanRepo

    repo = PlanRepo.of(tmp_path, "quickstart")
    repo.edit("model.yaml", "learningRate: 0.002", "learningRate: 0.003")
    monkeypatch.chdir(repo.root)
    monkeypatch.setenv("KUBECONFIG", NO_KUBECONFIG)
    kept: list[tuple[str, str]] = []
    parses: list[tuple[int, int]] = []
    real_keep, real_save = RenderCache.keep, ParseCache.save

    def keep(self: RenderCache, unit: Document, *args: Any) -> None:
        kept.append((unit.kind, unit.name))
        real_keep(self, unit, *args)

    def save(self: ParseCache) -> None:
        parses.append((self.pack.hits, self.pack.misses))
        real_save(self)

    monkeypatch.setattr(RenderCache, "keep", keep)
    monkeypatch.setattr(ParseCache, "save", save)
    (tmp_path / "not-a-folder").write_text("")  # no pack can be read or written under a file
    monkeypatch.setenv("FORGE_CACHE", str(tmp_path / "not-a-folder"))
    plain = pull_request_plan(None, "HEAD", None, None)
    files = len(list(repo.root.glob("*.yaml")))
    units = {(d.kind, d.name) for d in load_or_raise(["."]).specs.documents if d.kind in ("Model", "Endpoint")}

    monkeypatch.setenv("FORGE_CACHE", str(tmp_path / "cache"))
    kept.clear(), parses.clear()
    cold = pull_request_plan(None, "HEAD", None, None)
    # the base parsed every file; the head only the one it changed
    assert parses == [(files - 1, files + 1)]
    # the base rendered every unit; the head the changed Model's Workflow and the Endpoint serving it
    assert sorted(kept) == sorted([*units, ("Model", "digits-mlp"), ("Endpoint", "digits")])

    kept.clear(), parses.clear()
    warm = pull_request_plan(None, "HEAD", None, None)
    assert kept == [] and parses == [(2 * files, 0)]
    assert plain == cold == warm
