"""No import cycles among Forge's own packages (issues 13 and 27), at three levels:

- **modules**: no two modules import each other, directly or around a loop;
- **folders**: inside every folder, its subfolders (each with everything under it) and the
  folder's own modules (as one more node) import each other in one direction only — so
  `reconciler/`'s rooms form layers (targets below the rooms that drive them, the value rooms
  below the targets), `reconciler/targets/`'s base below its two targets, and so on down;
- **package `__init__` files** re-export nothing: every module of a package runs its package's
  `__init__` first, so an `__init__` that imports one of its own modules is a cycle with it.

The graph is built from the source with `ast`, not by importing: every `import` statement counts,
including those inside functions and `if TYPE_CHECKING:` blocks, because a lazy import is exactly
how a cycle hides (it still couples the two modules both ways). In the module graph a package's
implicit import of its parent `__init__` is not an edge (that is how Python packages work); the
`__init__` rule is what keeps that implicit edge from closing a loop.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("specs", "renderers", "reconciler", "forgectl", "runtimes", "devkit")
#: Where no folder may import its sibling folders both ways (runtimes/ is not held to it yet: its
#: step modules and runtimes/serving/ import each other).
FOLDER_CHECKED = ("reconciler", "devkit", "forgectl")
#: Package `__init__` files that are a public face, re-exporting their package's names
#: (`from specs import Model`); none of the modules they import imports them back (the module check
#: holds that). Every other `__init__` is a docstring only.
FACES = {"specs": "the spec language's public names", "renderers": "render() and its context, the renderers' public names"}


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


def packages(known: dict[str, Path]) -> set[str]:
    """The module names that are packages (an `__init__.py`)."""
    return {name for name, path in known.items() if path.name == "__init__.py"}


def folder_graph(graph: dict[str, set[str]], known: dict[str, Path], folder: str) -> dict[str, dict[str, tuple[str, str]]]:
    """Inside ``folder`` (a package; "" for the top level): each subfolder with everything under
    it is one node, named after it, and the folder's own modules together are one more, named
    ``folder``. Node → node it imports → the first (importer, imported) pair that makes the edge."""
    subpackages = packages(known)

    def node(module: str) -> str | None:
        if folder and module != folder and not module.startswith(folder + "."):
            return None
        if module == folder:
            return folder
        rest = module[len(folder) + 1:] if folder else module
        child = f"{folder}.{rest.split('.')[0]}" if folder else rest.split(".")[0]
        return child if child in subpackages else folder

    edges: dict[str, dict[str, tuple[str, str]]] = {}
    for importer in sorted(graph):
        source = node(importer)
        if source is None:
            continue
        edges.setdefault(source, {})
        for imported in sorted(graph[importer]):
            target = node(imported)
            if target is not None and target != source:
                edges[source].setdefault(target, (importer, imported))
    return edges


def cycles_in(graph: dict[str, set[str]], known: dict[str, Path], folder: str) -> list[str]:
    """The cycles among the nodes of ``folder`` (see :func:`folder_graph`), one line each, every
    edge with the import that makes it (`a → b (a.x imports b.y)`)."""
    edges = folder_graph(graph, known, folder)
    found = []
    for cycle in cycles({n: set(e) for n, e in edges.items()}):
        members = set(cycle)
        shown = [f"{a} → {b} ({edges[a][b][0]} imports {edges[a][b][1]})"
                 for a in cycle for b in sorted(edges.get(a, {})) if b in members]
        found.append(f"in {folder or '(top level)'}: " + "; ".join(shown))
    return found


def folder_cycles(graph: dict[str, set[str]], known: dict[str, Path], under: str) -> list[str]:
    """Every folder cycle in the package ``under`` and in each folder inside it."""
    return [line for folder in sorted(p for p in packages(known) if p == under or p.startswith(under + "."))
            for line in cycles_in(graph, known, folder)]


def init_imports(root: Path, packages_: tuple[str, ...] = PACKAGES, faces: dict[str, str] = FACES) -> list[str]:
    """Package `__init__` files (other than ``faces``) that import a module of their own package."""
    known = modules(root, packages_)
    graph = import_graph(root, packages_)
    return [f"{known[p].relative_to(root).as_posix()} imports {m}"
            for p in sorted(packages(known)) if p not in faces
            for m in sorted(graph[p]) if m.startswith(p + ".")]


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


@pytest.mark.parametrize("package", FOLDER_CHECKED)
def test_no_folder_cycles(graph: dict[str, set[str]], package: str) -> None:
    """No folder cycle in ``package`` or any folder inside it (reconciler's rooms among them)."""
    known = modules(ROOT)
    assert package in packages(known)
    found = folder_cycles(graph, known, package)
    assert not found, "folder cycles:\n" + "\n".join(found)


def test_no_cycle_between_top_level_packages(graph: dict[str, set[str]]) -> None:
    """specs, renderers, reconciler, forgectl, runtimes and devkit import each other one way only."""
    found = cycles_in(graph, modules(ROOT), "")
    assert not found, "folder cycles:\n" + "\n".join(found)


def test_folder_check_bites(tmp_path: Path) -> None:
    """A folder cycle with no module cycle in it is found, at the top of a package and deeper
    down, and named by the imports that make it; folders whose arrows point one way pass."""
    files = {
        "reconciler/__init__.py": "",
        "reconciler/errors.py": "",
        # rooms: traffic → targets.base and targets.kubernetes → traffic — a cycle of the rooms
        "reconciler/traffic/__init__.py": "",
        "reconciler/traffic/serving.py": "def apply(target):\n    from reconciler.targets.base import Target  # lazy\n",
        "reconciler/targets/__init__.py": "",
        "reconciler/targets/base.py": "from reconciler.errors import x\n",
        "reconciler/targets/kubernetes/__init__.py": "",
        "reconciler/targets/kubernetes/rollout.py": "from reconciler.traffic.serving import apply\n",
        # inside targets: base.py (targets' own module) → local, local → base
        "reconciler/targets/local/__init__.py": "",
        "reconciler/targets/local/target.py": "from ..base import Target\n",
        "reconciler/targets/factory.py": "from reconciler.targets.local.target import LocalTarget\n",
        # one way only: plan → targets, plan → traffic
        "reconciler/plan/__init__.py": "",
        "reconciler/plan/session.py": "from reconciler.targets.base import Target\nfrom reconciler.traffic import serving\n",
    }
    for rel, source in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(source)
    known = modules(tmp_path, ("reconciler",))
    graph = import_graph(tmp_path, ("reconciler",))
    assert cycles(graph) == []  # no module imports itself back: only the folders do
    assert folder_cycles(graph, known, "reconciler") == [
        "in reconciler: reconciler.targets → reconciler.traffic (reconciler.targets.kubernetes.rollout imports "
        "reconciler.traffic.serving); reconciler.traffic → reconciler.targets (reconciler.traffic.serving imports "
        "reconciler.targets.base)",
        "in reconciler.targets: reconciler.targets → reconciler.targets.local (reconciler.targets.factory imports "
        "reconciler.targets.local.target); reconciler.targets.local → reconciler.targets (reconciler.targets.local.target "
        "imports reconciler.targets.base)",
    ]
    (tmp_path / "reconciler/traffic/serving.py").write_text("def apply(target):\n    return target.apply({})\n")
    (tmp_path / "reconciler/targets/factory.py").unlink()
    graph = import_graph(tmp_path, ("reconciler",))
    assert folder_cycles(graph, modules(tmp_path, ("reconciler",)), "reconciler") == []


def test_package_inits_import_none_of_their_modules() -> None:
    for face in FACES:
        assert (ROOT / face / "__init__.py").is_file(), f"FACES names {face}, which is no package any more"
    found = init_imports(ROOT)
    assert not found, "a package __init__ is a docstring only (its modules import it first):\n" + "\n".join(found)


def test_init_check_bites(tmp_path: Path) -> None:
    """An `__init__` re-exporting its own module is named, lazily or relatively; one importing
    another package, or a face's, is not."""
    files = {
        "devkit/__init__.py": '"""The harness."""\nfrom devkit.cluster import Cluster\n',
        "devkit/cluster.py": "from devkit.node import paths\n",
        "devkit/node/__init__.py": "def node():\n    from .node import Node\n    return Node\n",
        "devkit/node/node.py": "from devkit.node import paths\n",
        "devkit/node/paths.py": "",
        "devkit/other/__init__.py": "from specs import Model\n",
        "specs/__init__.py": "from specs.base import Model\n",
        "specs/base.py": "",
    }
    for rel, source in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(source)
    assert init_imports(tmp_path, ("devkit", "specs"), {"specs": "a face"}) == [
        "devkit/__init__.py imports devkit.cluster", "devkit/node/__init__.py imports devkit.node.node"]
