"""The budgets of one run: how much work any input may cost, in one table.

Each spec value has its limit where it is declared (`specs/`); these are the totals over a whole
run, and the limits of the reading machinery itself, so that no input costs more than its size: a
pull request cannot make `validate`, `render` or `plan` run longer than the largest honest
repository would. Each budget is checked before the work it pays for (a value is counted before it
is built, a search's trials before its Workflow is rendered, an object's bytes before it is written)
and spending it is one diagnostic naming the budget and the file, exit 1. docs/security.md lists
them all (the limits table and "Budgets").

Nothing here does I/O.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from reconciler.diagnostics import Diagnostic, SpecError
from renderers.labels import KIND, NAME
from specs import Endpoint, Model, SpecSet

# -- reading YAML (reconciler/load/yamlsource.py) --------------------------------------------------

#: Bytes of one spec file.
MAX_FILE_BYTES = 4 * 1024 * 1024
#: Values one document may expand to (aliases included), and how deep it may nest.
MAX_NODES = 100_000
MAX_DEPTH = 64
#: Values built by expanding an alias (`*name`), in one document and in the whole run: an alias
#: costs one reference to write and as many values as its anchor holds to read.
MAX_ALIAS_VALUES_PER_DOCUMENT = 10_000
MAX_ALIAS_VALUES = 100_000
#: Values built in the whole run (10,000 endpoints and their models take about 400,000).
MAX_VALUES = 1_000_000
#: YAML documents in one file (empty ones count: each costs a parse), and in the whole run.
MAX_DOCUMENTS_PER_FILE = 10_000
MAX_DOCUMENTS = 50_000
#: Decimal digits of an integer in any base (0x…, 0o…, 0b…, base 60): Python's own conversion
#: limit, fixed here so that `PYTHONINTMAXSTRDIGITS` cannot lift it.
MAX_INT_DIGITS = 4300
#: Parts of a YAML 1.1 base-60 number (`1:30:00`): PyYAML builds one with a multiplication per part
#: on an ever larger integer, quadratic in the parts.
MAX_BASE60_PARTS = 16

# -- what the specs ask to render (checked when they load, before anything is rendered) -----------

#: Search trials summed over every Model: each is a task of its Workflow.
MAX_SEARCH_TRIALS = 10_000
#: Objects the specs render (at most: 4 per Endpoint, 1 per Model and the Environment's own); 10,000
#: endpoints and their models render 50,005.
MAX_RENDERED_OBJECTS = 100_000
#: Bytes of the rendered objects (as compact JSON) `forgectl render` writes, counted before writing.
MAX_RENDERED_BYTES = 256 * 1024 * 1024

# -- the plan's token diff of long values (reconciler/plan/diff.py) --------------------------------

#: Strings longer than this are compared by their common prefix and suffix only (linear time).
MAX_COMPARED = 200_000
#: Token pairs one value's changed middle may cost to compare (difflib's matcher is quadratic in
#: the tokens), and all values of one plan together; past either, the value is shown whole, before
#: and after, with a note saying so.
MAX_TOKEN_PAIRS = 1_000_000
MAX_TOKEN_PAIRS_TOTAL = 20_000_000


@dataclass
class Spent:
    """What a run has spent so far of its totals (one per run; the loader and the plan's diff
    carry it, mutable on purpose)."""

    values: int = 0
    alias_values: int = 0
    documents: int = 0
    token_pairs: int = 0
    #: Why reading stopped, once a budget of the whole run is spent ("" until then).
    exhausted: str = ""


def exceeded(budget: str, limit: int, unit: str) -> str:
    """The message of a spent budget: which one and its size, and where the table is."""
    return f"budget spent: {budget} is at most {limit:,} {unit} (see docs/security.md, Budgets)"


#: Objects rendered per document of a kind, at most (renderers/bundle.py: a Workflow per Model; a
#: SeldonDeployment, PodMonitor, PrometheusRule and dashboard per Endpoint), and per environment.
OBJECTS_PER_KIND = {"Model": 1, "Endpoint": 4}
OBJECTS_PER_ENVIRONMENT = 6


def spec_budgets(specs: SpecSet) -> Iterator[tuple[str, str, tuple[str | int, ...], str]]:
    """The run's budgets on what the specs ask to render, checked before anything is rendered:
    (kind, name, field path, message) of the document at which a total is first exceeded."""
    trials = 0
    objects = OBJECTS_PER_ENVIRONMENT
    trials_spent = objects_spent = False
    for doc in specs.documents:
        if isinstance(doc, Model) and doc.spec.search is not None and not trials_spent:
            trials += doc.spec.search.trials
            if trials > MAX_SEARCH_TRIALS:
                trials_spent = True
                yield (doc.kind, doc.name, ("spec", "search", "trials"),
                       exceeded("search trials per run (summed over every Model)", MAX_SEARCH_TRIALS, "trials")
                       + f"; this Model brings the sum to {trials:,}")
        objects += OBJECTS_PER_KIND.get(doc.kind, 0) if isinstance(doc, (Model, Endpoint)) else 0
        if objects > MAX_RENDERED_OBJECTS and not objects_spent:
            objects_spent = True
            yield (doc.kind, doc.name, (), exceeded("rendered objects per run", MAX_RENDERED_OBJECTS, "objects")
                   + "; split the specs into several repositories")


def check_rendered_bytes(objects: Iterable[Mapping[str, Any]], origins: Mapping[tuple[str, str], Any]) -> None:
    """Raise :class:`SpecError` when the rendered objects take more than :data:`MAX_RENDERED_BYTES`
    as compact JSON (measured before any is written as YAML, which costs far more), naming the spec
    whose object went past it (``origins``: the loader's (kind, name) → file and line)."""
    total = 0
    for obj in objects:
        total += len(json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode())
        if total <= MAX_RENDERED_BYTES:
            continue
        meta = obj.get("metadata") or {}
        labels = meta.get("labels") or {}
        origin = origins.get((str(labels.get(KIND)), str(labels.get(NAME))))
        file, line = (origin.file, origin.line) if origin is not None else ("(rendered objects)", 1)
        what = f"{obj.get('kind')} {meta.get('name')!r}"
        raise SpecError([Diagnostic(file, line, 1, exceeded("rendered output per run", MAX_RENDERED_BYTES, "bytes")
                                    + f"; {what}, rendered from this spec, goes past it")])
