"""Property tests: random and mutated YAML never crash the loader — always diagnostics, never a
traceback — and every diagnostic points inside the file."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconciler.load.loader import load_files
from reconciler.load.sources import SourceFile

ROOT = Path(__file__).resolve().parents[2]
SEEDS = [p.read_bytes() for p in sorted((ROOT / "examples").rglob("*.yaml"))]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=20),
)
yaml_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=20,
)


def _check(data: bytes) -> None:
    result = load_files([SourceFile("fuzz.yaml", data)])
    lines = data.count(b"\n") + 1
    for diag in result.diagnostics:
        assert diag.file == "fuzz.yaml"
        assert 1 <= diag.line <= lines + 1, diag
        assert diag.column >= 1 and diag.message


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_random_bytes_never_crash(data: bytes) -> None:
    _check(data)


@settings(max_examples=200, deadline=None)
@given(yaml_values)
def test_random_yaml_values_never_crash(value: object) -> None:
    import yaml

    _check(yaml.safe_dump(value, allow_unicode=True).encode())


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(SEEDS), st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 10_000), st.binary(max_size=8)), min_size=1, max_size=4))
def test_mutated_examples_never_crash(seed: bytes, edits: list[tuple[int, int, bytes]]) -> None:
    data = bytearray(seed)
    for start, length, replacement in edits:
        start %= max(len(data), 1)
        data[start : start + length % 16] = replacement
    _check(bytes(data))


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(SEEDS), st.data())
def test_documents_with_changed_values_never_crash(seed: bytes, data: st.DataObject) -> None:
    import yaml

    docs = [d for d in yaml.safe_load_all(seed) if d]
    def mutate(node: object) -> object:
        if isinstance(node, dict) and node:
            key = data.draw(st.sampled_from(sorted(node, key=str)))
            return {**node, key: mutate(node[key]) if data.draw(st.booleans()) else data.draw(yaml_values)}
        if isinstance(node, list) and node:
            i = data.draw(st.integers(0, len(node) - 1))
            return node[:i] + [mutate(node[i])] + node[i + 1 :]
        return data.draw(yaml_values)
    _check(yaml.safe_dump_all([mutate(d) for d in docs]).encode())
