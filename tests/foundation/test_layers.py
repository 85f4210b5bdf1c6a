"""The layer rules of ../shared/DESIGN.md (and issue 13), each checked on the real tree and each
shown to bite on a violation planted in a temporary tree.

The checks read the source with `ast` — they import nothing — and count every import, including
lazy ones inside functions and under `if TYPE_CHECKING:`: a lazy import still couples the layers,
it only defers the failure to the day the code path runs. A rule is a scope (the files it governs),
what they must not import (module prefixes), what they must not call, and exceptions named with
their reason. `test_rule_holds` runs each on the repository; `test_rule_bites` plants one breaking
and one conforming file per rule in a tmp tree and checks that exactly the breaking one is named.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata as metadata
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Top-level packages of this repository (code, tooling, tests): "ours".
OURS = ("specs", "renderers", "reconciler", "forgectl", "runtimes", "devkit", "tests", "bench", "scripts", "schema")
CONTROL_PLANE = ("specs", "renderers", "reconciler", "forgectl")

#: Modules that reach outside the process (files, network, processes, clocks, databases, clusters).
IO_MODULES = ("os", "io", "pathlib", "shutil", "tempfile", "glob", "subprocess", "socket", "ssl", "select", "selectors",
              "http", "urllib", "urllib3", "requests", "ftplib", "smtplib", "sqlite3", "dbm", "shelve", "signal", "fcntl",
              "mmap", "threading", "multiprocessing", "concurrent", "asyncio", "time", "datetime", "uuid", "secrets",
              "kubernetes", "git", "prometheus_api_client", "logging")
#: Builtins that do I/O or run code named by data.
IO_CALLS = ("open", "print", "input", "eval", "exec", "compile", "__import__", "breakpoint")

#: What the CLI must not touch itself: transports, storage, processes. It parses, calls
#: `reconciler`, and prints (writing a file the user named with `-o` is printing elsewhere).
CLI_FORBIDDEN = ("subprocess", "socket", "sqlite3", "http", "urllib", "urllib3", "requests", "kubernetes", "git",
                 "prometheus_api_client", "shutil", "tempfile", "fcntl", "multiprocessing", "concurrent",
                 # a target only through reconciler.plan.session and the Target protocol
                 "reconciler.targets")


#: Of reconciler, what the targets may import (everything else of it drives the targets, or is
#: above them): each with its reason. The folder check (test_import_cycles.py) keeps these rooms
#: from importing a target back.
TARGETS_MAY_IMPORT = (
    "reconciler.targets",            # themselves: the protocol (base.py) and each target's own modules
    "reconciler.errors", "reconciler.diagnostics", "reconciler.resources", "reconciler.heap",  # the ground floor
    "reconciler.applied",            # the ground floor: the digest an apply records on each object
    "reconciler.runtimeenv",         # the ground floor: the checkout's root and the runtime environments
    "reconciler.load",               # specs and sources (a Workflow's dataset paths, the git revision)
    "reconciler.metrics",            # the Prometheus client and the analysis of a measurement
    "reconciler.rollout",            # the rollout state and the controller's Backend protocol they implement
    "reconciler.traffic",            # what an endpoint serves, and its one writer (the rollout backends move traffic through it)
    "reconciler.registry.records",   # the pure record builders (each target keeps or reads its records itself)
)

#: Inside what CLI_FORBIDDEN names, what the CLI may import, each with its reason.
CLI_ALLOWED = (
    "reconciler.targets.base",        # the Target protocol itself: the seam the CLI talks through
    "reconciler.targets.local.load",  # `forgectl load`: an HTTP client for a loopback endpoint (a demo's
                                      # traffic), not a target operation; it reaches the address via the seam
)


# -- what a file does, read from its source -------------------------------------------------------

@dataclass(frozen=True)
class Facts:
    path: str                      # relative to the root, with `/`
    imports: frozenset[str]        # absolute dotted names: `from a.b import c` gives `a.b` and `a.b.c`
    calls: frozenset[str]          # builtins called by name (`open(...)`)
    attribute_calls: frozenset[str]  # `x.execute(...)` gives `execute`
    random_calls: frozenset[str]   # `random.<name>(...)`: the module's shared, unseeded generator
    attributes: frozenset[str]     # every attribute name read or called (`target.db` gives `db`)
    #: Comparisons (and `match` subjects) that tell the targets apart: `….spec.target` compared,
    #: or a target's name (`"local"`, `"kubernetes"`) compared with anything; with their line.
    target_branches: frozenset[str] = frozenset()


def _module_name(rel: Path) -> str:
    parts = list(rel.with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def read_facts(root: Path, path: Path) -> Facts:
    rel = path.relative_to(root)
    module = _module_name(rel)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    imports: set[str] = set()
    calls: set[str] = set()
    attribute_calls: set[str] = set()
    random_calls: set[str] = set()
    attributes: set[str] = set()
    target_branches: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            attributes.add(node.attr)
        if isinstance(node, (ast.Compare, ast.Match)):
            target_branches |= {f"{what} (line {node.lineno})" for what in _tells_targets_apart(node)}
        if isinstance(node, ast.Import):
            imports |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package
                for _ in range(node.level - 1):
                    anchor = anchor.rpartition(".")[0]
                base = f"{anchor}.{base}" if base else anchor
            imports.add(base)
            imports |= {f"{base}.{alias.name}" for alias in node.names if alias.name != "*"}
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name):
                calls.add(func.id)
            elif isinstance(func, ast.Attribute):
                attribute_calls.add(func.attr)
                if isinstance(func.value, ast.Name) and func.value.id == "random":
                    random_calls.add(func.attr)
    return Facts(rel.as_posix(), frozenset(imports), frozenset(calls), frozenset(attribute_calls), frozenset(random_calls),
                 frozenset(attributes), frozenset(target_branches))


#: The targets' names (`Environment.spec.target`, `Target.name`).
TARGET_NAMES = ("local", "kubernetes")


def _tells_targets_apart(node: ast.Compare | ast.Match) -> list[str]:
    """What in a comparison or `match` branches on which target it is (see Facts.target_branches)."""
    operands = [node.left, *node.comparators] if isinstance(node, ast.Compare) else [node.subject]
    found = []
    for operand in operands:
        if isinstance(operand, ast.Attribute) and operand.attr == "target" and \
                isinstance(operand.value, ast.Attribute) and operand.value.attr == "spec":
            found.append(f"compares {ast.unparse(operand)}")
        elif isinstance(operand, ast.Constant) and operand.value in TARGET_NAMES:
            found.append(f"compares with {operand.value!r}")
    return found


def _under(name: str, prefixes: Iterable[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _outermost(names: Iterable[str]) -> list[str]:
    """``names`` without those inside another one (`a.b.c` goes when `a.b` is there)."""
    names = set(names)
    return sorted(n for n in names if not any(n.startswith(other + ".") for other in names))


# -- the rules ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Rule:
    name: str
    says: str                                   # the rule, as DESIGN.md / issue 13 states it
    scope: tuple[str, ...]                      # globs relative to the root
    check: Callable[[Facts], list[str]]
    exempt: dict[str, str] = field(default_factory=dict)  # path → why the rule does not apply there
    outside: tuple[str, ...] = ()               # folders inside the scope that the rule does not govern

    def files(self, root: Path) -> list[Path]:
        found = {p for pattern in self.scope for p in root.glob(pattern) if p.is_file()}
        rel = {p: p.relative_to(root).as_posix() for p in found}
        return sorted(p for p in found if rel[p] not in self.exempt and not rel[p].startswith(self.outside))


def forbid_imports(prefixes: Iterable[str], *, allow: Iterable[str] = ()) -> Callable[[Facts], list[str]]:
    prefixes, allow = tuple(prefixes), tuple(allow)

    def check(facts: Facts) -> list[str]:
        return [f"imports {name}" for name in _outermost(n for n in facts.imports if _under(n, prefixes) and not _under(n, allow))]
    return check


def pure(*, ours_allowed: Iterable[str], ours_forbidden: Iterable[str] = ()) -> Callable[[Facts], list[str]]:
    """No I/O module, no I/O builtin, no unseeded randomness, and of ours only ``ours_allowed``
    (minus ``ours_forbidden``)."""
    ours_allowed, ours_forbidden = tuple(ours_allowed), tuple(ours_forbidden)

    def check(facts: Facts) -> list[str]:
        problems = [f"imports {name} (I/O)" for name in _outermost(n for n in facts.imports if _under(n, IO_MODULES))]
        problems += [f"imports {name} (not a pure layer)" for name in _outermost(
            n for n in facts.imports if _under(n, OURS) and (not _under(n, ours_allowed) or _under(n, ours_forbidden)))]
        problems += [f"calls {name}()" for name in sorted(facts.calls & set(IO_CALLS))]
        problems += [f"calls random.{name}() (unseeded)" for name in sorted(facts.random_calls - {"Random"})]
        return problems
    return check


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@functools.cache
def base_distributions() -> frozenset[str]:
    """The distributions `pip install forgectl` (no extras) installs: the base dependencies and
    theirs, read from the installed metadata."""
    from packaging.requirements import Requirement

    seen: set[str] = set()
    todo = ["forgectl"]
    while todo:
        name = todo.pop()
        try:
            requires = metadata.distribution(name).requires or []
        except metadata.PackageNotFoundError:
            continue
        for text in requires:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue  # an extra (train, serve, dev …) or another platform's
            if _normalise(req.name) not in seen:
                seen.add(_normalise(req.name))
                todo.append(req.name)
    return frozenset(seen)


@functools.cache
def _owners() -> dict[str, list[str]]:
    """Top-level module → the installed distributions that provide it."""
    return dict(metadata.packages_distributions())


def installs_light(facts: Facts) -> list[str]:
    """Of third-party code, only what the base install brings; of ours, only the control plane."""
    light = base_distributions()
    owners = _owners()
    problems = []
    for name in _outermost(facts.imports):
        top = name.split(".")[0]
        if top in sys.stdlib_module_names or top == "__future__" or not top:
            continue
        if top in OURS:
            if top not in CONTROL_PLANE:
                problems.append(f"imports {name} (not control plane: it runs in its own image or is tooling)")
            continue
        dists = {_normalise(d) for d in owners.get(top, [])}
        if not dists & light:
            problems.append(f"imports {name} (not installed by the base dependencies)")
    return problems


def sql_outside_statedb(facts: Facts) -> list[str]:
    problems = [f"imports {name}" for name in _outermost(n for n in facts.imports if _under(n, ("sqlite3",)))]
    problems += [f"calls .{name}() (SQL)" for name in sorted(facts.attribute_calls & {"execute", "executemany", "executescript"})]
    return problems


def no_target_internals(facts: Facts) -> list[str]:
    """A target's own handles (the local target's StateDB `.db`, its `.workspace`) are read only
    inside reconciler/targets: callers ask the protocol (run_details, model_records, log_files …)."""
    return [f"reads .{name} (a target's internals)" for name in sorted(facts.attributes & TARGET_INTERNALS)]


def no_target_branch(facts: Facts) -> list[str]:
    """What differs by target is the target's own answer (a capability on the Target protocol),
    never a branch on which target the Environment names."""
    return [f"{what}: ask the Target (a capability in reconciler/targets/base.py)" for what in sorted(facts.target_branches)]


#: Attribute names that are a target's internals, not its protocol.
TARGET_INTERNALS = frozenset({"db", "workspace"})
STATE_DB = "reconciler/targets/local/state.py"
#: The development tooling: benchmarks, scripts and the dev harness (tests/ use them, never the reverse).
DEV_TOOLING = ("bench/**/*.py", "scripts/**/*.py", "devkit/**/*.py")

RULES = [
    Rule("specs-import-nothing-of-ours", "`specs` imports nothing of ours",
         ("specs/**/*.py",), forbid_imports(set(OURS) - {"specs"})),
    Rule("renderers-are-pure", "`render` is a pure function; `renderers` never do I/O and depend only on `specs`",
         ("renderers/**/*.py",), pure(ours_allowed=("specs", "renderers"))),
    Rule("diff-and-plan-are-pure", "`diff` is a pure function; a Plan is a plain data value",
         ("reconciler/plan/diff.py", "reconciler/plan/plan.py", "reconciler/plan/reasons.py", "reconciler/resources.py",
          "reconciler/specdiff.py"),
         pure(ours_allowed=("specs", "renderers", "reconciler"),
              ours_forbidden=("reconciler.targets", "reconciler.plan.session", "reconciler.plan.apply", "reconciler.metrics.prometheus",
                              "reconciler.load.sources", "reconciler.load.loader", "reconciler.rollout.writeback", "reconciler.rollout.controller",
                              "reconciler.registry.records", "reconciler.observe.status"))),
    Rule("rollout-core-is-pure",
         "the rollout core (state machine, analysis of a measurement) is pure: it decides, the controller carries out",
         ("reconciler/rollout/machine.py", "reconciler/metrics/analysis.py"),
         pure(ours_allowed=("specs", "renderers", "reconciler.metrics.analysis", "reconciler.rollout.machine", "reconciler.rollout.regression"))),
    Rule("runtimes-never-import-reconciler", "`runtimes` never import `reconciler` (nor the CLI above it)",
         ("runtimes/**/*.py",), forbid_imports(("reconciler", "forgectl"))),
    Rule("control-plane-installs-light",
         "the control plane (specs, renderers, reconciler, CLI) installs light: runtimes and their extras stay out",
         tuple(f"{p}/**/*.py" for p in CONTROL_PLANE), installs_light),
    Rule("cli-parses-and-prints", "the CLI parses arguments, calls `reconciler`, prints; targets only through the Target seam",
         ("forgectl/**/*.py",), forbid_imports(CLI_FORBIDDEN, allow=CLI_ALLOWED)),
    Rule("cli-never-branches-on-the-target",
         "what differs by target is a target capability (reconciler/targets/base.py), not a CLI branch on `spec.target`",
         ("forgectl/**/*.py",), no_target_branch),
    Rule("targets-are-the-bottom-adapters",
         "a target imports only the value rooms below it (rollout, traffic, registry.records, load, metrics, the ground floor), "
         "never a room that drives it (plan, observe, controller, present, experiment) nor the CLI",
         ("reconciler/targets/**/*.py",), forbid_imports(("reconciler", "forgectl"), allow=TARGETS_MAY_IMPORT)),
    Rule("planner-sees-only-the-target-protocol",
         "the planner, applier and status see only the Target interface (reconciler/targets/base.py)",
         ("reconciler/**/*.py",), forbid_imports(("reconciler.targets",), allow=("reconciler.targets.base",)),
         exempt={"reconciler/plan/session.py": "the factory: it opens the target the Environment names"},
         outside=("reconciler/targets/",)),
    Rule("callers-use-only-the-target-protocol",
         "status, the registry, the controllers and the CLI use nothing of a target but the protocol",
         ("reconciler/**/*.py", "forgectl/**/*.py"), no_target_internals, outside=("reconciler/targets/",)),
    Rule("product-never-imports-dev-tooling",
         "the product (control plane and runtimes) never imports the dev harness, tests, benchmarks or scripts",
         tuple(f"{p}/**/*.py" for p in (*CONTROL_PLANE, "runtimes")), forbid_imports(("devkit", "tests", "bench", "scripts"))),
    Rule("dev-tooling-never-imports-tests",
         "bench/, scripts/ and devkit/ never import tests/: what they share with the tests (runners, servers, the rollout "
         "harness, the cluster's clean-up) lives in devkit/",
         DEV_TOOLING, forbid_imports(("tests",))),
    Rule("all-sql-inside-statedb", "all SQL lives inside StateDB (reconciler/targets/local/state.py)",
         tuple(f"{p}/**/*.py" for p in (*CONTROL_PLANE, "runtimes", "devkit")), sql_outside_statedb,
         exempt={STATE_DB: "the one owner of the schema"}),
]


def violations(rule: Rule, root: Path) -> list[str]:
    """Every breach of ``rule`` in the tree at ``root``, as `path: what`."""
    return [f"{facts.path}: {problem}" for path in rule.files(root)
            for facts in [read_facts(root, path)] for problem in rule.check(facts)]


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_rule_holds(rule: Rule) -> None:
    files = rule.files(ROOT)
    assert files, f"{rule.name}: no file in scope {rule.scope} (a wrong root would pass vacuously)"
    for path in rule.exempt:
        assert (ROOT / path).is_file(), f"{rule.name}: the exemption {path} names no file any more"
    found = violations(rule, ROOT)
    assert not found, f"{rule.says}:\n" + "\n".join(found)


# -- each rule bites: a planted violation is named, a conforming neighbour is not ------------------

PLANTED: dict[str, tuple[dict[str, str], dict[str, str], list[str]]] = {
    # rule: ({breaking file: source}, {conforming file: source}, what the check must report)
    "specs-import-nothing-of-ours": (
        {"specs/bad.py": "def f():\n    from renderers.labels import NAME  # lazy still counts\n    return NAME\n"},
        {"specs/good.py": "from specs.base import Thing\nimport pydantic\n"},
        ["specs/bad.py: imports renderers.labels"]),
    "renderers-are-pure": (
        {"renderers/bad.py": "from .labels import NAME\n\ndef render():\n    return open('/etc/hosts').read()\n"},
        {"renderers/good.py": "import json\nimport random\nfrom specs import Model\nRNG = random.Random(7)\n"},
        ["renderers/bad.py: calls open()"]),
    "diff-and-plan-are-pure": (
        {"reconciler/plan/diff.py": "import time\nfrom reconciler.targets.base import Target\n"},
        {"reconciler/plan/plan.py": "import hashlib\nfrom reconciler.plan.diff import field_diff\nfrom renderers.labels import KIND\n"},
        ["reconciler/plan/diff.py: imports time (I/O)", "reconciler/plan/diff.py: imports reconciler.targets.base (not a pure layer)"]),
    "rollout-core-is-pure": (
        {"reconciler/rollout/machine.py": "from reconciler.metrics.prometheus import Prometheus\nimport time\nNOW = time.time()\n"},
        {"reconciler/metrics/analysis.py": "import math\nfrom dataclasses import dataclass\nfrom specs.rollout import Metric\n"},
        ["reconciler/rollout/machine.py: imports time (I/O)",
         "reconciler/rollout/machine.py: imports reconciler.metrics.prometheus (not a pure layer)"]),
    "runtimes-never-import-reconciler": (
        {"runtimes/bad.py": "from reconciler.registry.records import build_record\n"},
        {"runtimes/good.py": "import torch\nfrom specs.stepconfig import TrainConfig\nfrom runtimes import _step\n"},
        ["runtimes/bad.py: imports reconciler.registry.records"]),
    "control-plane-installs-light": (
        {"reconciler/bad.py": "def f():\n    import torch\n    from runtimes.serve import main\n"},
        {"reconciler/good.py": "import json\nimport yaml\nimport kubernetes\nfrom git import Repo\nfrom specs import Model\n"},
        ["reconciler/bad.py: imports runtimes.serve (not control plane: it runs in its own image or is tooling)",
         "reconciler/bad.py: imports torch (not installed by the base dependencies)"]),
    "cli-parses-and-prints": (
        {"forgectl/bad.py": "def down():\n    from reconciler.targets.local.target import LocalTarget\n    import subprocess\n"},
        {"forgectl/good.py": "import json\nimport typer\nfrom reconciler.plan.session import open_target\nfrom reconciler.targets.base import Target\n",
         "forgectl/load.py": "def load():\n    from reconciler.targets.local.load import generate\n"},
        ["forgectl/bad.py: imports reconciler.targets.local.target", "forgectl/bad.py: imports subprocess"]),
    "cli-never-branches-on-the-target": (
        {"forgectl/bad.py": "def apply(environment, target):\n    if environment.spec.target == 'local':\n        pass\n"
                            "    bars = None if target.name != \"kubernetes\" else 1\n"
                            "    match environment.spec.target:\n        case _:\n            pass\n"},
        {"forgectl/good.py": "def down(target, env):\n    stopped = target.down()\n    if stopped is not None:\n        return stopped\n"
                             "    name = env or 'local'\n    return target.name, name, env.spec.target\n"},
        ["forgectl/bad.py: compares environment.spec.target (line 2): ask the Target (a capability in reconciler/targets/base.py)",
         "forgectl/bad.py: compares environment.spec.target (line 5): ask the Target (a capability in reconciler/targets/base.py)",
         "forgectl/bad.py: compares with 'kubernetes' (line 4): ask the Target (a capability in reconciler/targets/base.py)",
         "forgectl/bad.py: compares with 'local' (line 2): ask the Target (a capability in reconciler/targets/base.py)"]),
    "targets-are-the-bottom-adapters": (
        {"reconciler/targets/local/bad.py": "from reconciler.registry.leaderboard import rows\n\ndef f():\n"
                                            "    from reconciler.plan.session import open_target  # lazy still counts\n",
         "reconciler/targets/kubernetes/bad.py": "from reconciler.observe import status\nfrom forgectl.shell import out\n"},
        {"reconciler/targets/kubernetes/good.py": "from reconciler.errors import TargetError\nfrom reconciler.registry.records import build_record\n"
                                                  "from reconciler.rollout.controller import RolloutState\nfrom reconciler.traffic.serving import apply_serving\n"
                                                  "from reconciler.targets.base import Target\nfrom renderers.labels import NAME\n",
         "reconciler/plan/session.py": "from reconciler.targets.local.target import LocalTarget\n"},
        ["reconciler/targets/kubernetes/bad.py: imports forgectl.shell", "reconciler/targets/kubernetes/bad.py: imports reconciler.observe",
         "reconciler/targets/local/bad.py: imports reconciler.plan.session",
         "reconciler/targets/local/bad.py: imports reconciler.registry.leaderboard"]),
    "planner-sees-only-the-target-protocol": (
        {"reconciler/bad.py": "from reconciler.targets import local\n"},
        {"reconciler/good.py": "from reconciler.targets.base import Target\n",
         "reconciler/plan/session.py": "from reconciler.targets.local.target import LocalTarget\n",
         "reconciler/targets/local/thing.py": "from reconciler.targets.local.state import StateDB\n"},
        ["reconciler/bad.py: imports reconciler.targets"]),
    "callers-use-only-the-target-protocol": (
        {"reconciler/observe/models.py": "def collect(target):\n    return target.db.model_versions()\n",
         "forgectl/cli.py": "def status(target):\n    print(target.workspace / 'registry')\n"},
        {"reconciler/observe/status.py": "def collect(target, live):\n    return target.run_details(live), target.model_records(live)\n",
         "reconciler/targets/local/target.py": "class LocalTarget:\n    def model_records(self):\n        return self.db.model_versions()\n"},
        ["forgectl/cli.py: reads .workspace (a target's internals)", "reconciler/observe/models.py: reads .db (a target's internals)"]),
    "product-never-imports-dev-tooling": (
        {"reconciler/targets/local/bad.py": "from devkit.cluster import Cluster\n",
         "runtimes/bad.py": "def f():\n    from tests.polling import wait_until\n"},
        {"reconciler/targets/local/good.py": "from reconciler.targets.local.processes import free_port\n",
         "devkit/cluster.py": "from reconciler.targets.local import processes\n"},
        ["reconciler/targets/local/bad.py: imports devkit.cluster", "runtimes/bad.py: imports tests.polling"]),
    "dev-tooling-never-imports-tests": (
        {"bench/bad.py": "from tests.rollout.test_rollout_controller import Rollout\n",
         "devkit/bad.py": "def f():\n    import tests.cluster_fixtures  # lazy still counts\n",
         "scripts/cluster/bad.py": "from tests import polling\n"},
        {"bench/good.py": "from bench.rollback_latency import drain\nfrom devkit.rollout_harness import Rollout\n",
         "devkit/good.py": "import testinfra\nfrom devkit.runtime_steps import Runner\n",
         "scripts/cluster/good.py": "from devkit.cluster import Cluster\n",
         "tests/conftest.py": "from devkit.runtime_steps import Runner\nfrom tests.runtimes.helpers import events\n"},
        ["bench/bad.py: imports tests.rollout.test_rollout_controller", "devkit/bad.py: imports tests.cluster_fixtures",
         "scripts/cluster/bad.py: imports tests"]),
    "all-sql-inside-statedb": (
        {"reconciler/observe/status.py": "def f(target):\n    return target.db.db.execute('SELECT * FROM steps')\n"},
        {STATE_DB: "import sqlite3\nDB = sqlite3.connect(':memory:')\nDB.execute('SELECT 1')\n",
         "reconciler/other.py": "from reconciler.targets.local.state import StateDB\n"},
        ["reconciler/observe/status.py: calls .execute() (SQL)"]),
}


def test_every_rule_has_a_planted_violation() -> None:
    assert set(PLANTED) == {r.name for r in RULES}


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_rule_bites(rule: Rule, tmp_path: Path) -> None:
    bad, good, expected = PLANTED[rule.name]
    for rel, source in {**bad, **good}.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    assert violations(rule, tmp_path) == expected
