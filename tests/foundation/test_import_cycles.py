"""No import cycles among Forge's own packages (issue 13).

The graph is built from the source with `ast`, not by importing: every `import` statement counts,
including those inside functions and `if TYPE_CHECKING:` blocks, because a lazy import is exactly
how a cycle hides (it still couples the two modules both ways). A package's implicit import of its
parent `__init__` is not an edge: that is how Python packages work, not a dependency we chose.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("specs", "renderers", "reconciler", "forgectl", "runtimes")


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def modules(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """Module name → source file of every module under ``packages`` in ``root``."""
    found: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            found[_module_name(path, root)] = path
    return found


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The longest known module that ``name`` is or lies inside (`a.b.func` → `a.b`)."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The known modules ``module`` imports anywhere in its source."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _resolve(alias.name, known)
                if target:
                    found.add(target)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package, one level up per extra dot
                package = module if is_package else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}" if base else package
            for alias in node.names:
                # `from pkg import sub` imports the submodule `pkg.sub` when there is one
                target = _resolve(f"{base}.{alias.name}", known) if f"{base}.{alias.name}" in known else _resolve(base, known)
                if target:
                    found.add(target)
    found.discard(module)
    return found


def import_graph(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """Module → the modules of ours it imports."""
    known = modules(root, packages)
    return {name: imports_of(name, path, known) for name, path in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(start: str) -> None:
        # iterative, so a deep graph cannot hit the recursion limit
        nonlocal counter
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            advanced = False
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return sorted(found)


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    found = import_graph(ROOT)
    assert len(found) > 100  # the walk found the packages (a wrong root would pass vacuously)
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycles(graph: dict[str, set[str]], package: str) -> None:
    """No cycle touches ``package`` (one test per package, so a failure names where to look)."""
    found = [c for c in cycles(graph) if any(m == package or m.startswith(f"{package}.") for m in c)]
    assert not found, "import cycles:\n" + "\n".join(" ↔ ".join(c) for c in found)


def test_cycle_check_bites(tmp_path: Path) -> None:
    """The same check finds a cycle hidden behind a lazy import, and a relative one."""
    pkg = tmp_path / "specs"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from specs.b import thing\n")
    (pkg / "b.py").write_text("def thing():\n    from specs import a\n    return a\n")
    (pkg / "c.py").write_text("from .d import x\n")
    (pkg / "d.py").write_text("from . import c\nx = 1\n")
    (pkg / "e.py").write_text("import specs.a\n")
    graph = import_graph(tmp_path, ("specs",))
    assert cycles(graph) == [["specs.a", "specs.b"], ["specs.c", "specs.d"]]
