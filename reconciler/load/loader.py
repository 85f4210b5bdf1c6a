"""Load specs: files → YAML documents → typed Forge documents → a checked :class:`SpecSet`.

Every problem becomes a :class:`Diagnostic` with file, line, column and field path, and loading goes
on past the first one so a user sees them all at once.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic.alias_generators import to_camel

from reconciler.budgets import MAX_DOCUMENTS, Spent, spec_budgets
from reconciler.diagnostics import Diagnostic, SpecError, clip
from reconciler.heap import gc_paused
from reconciler.load.parsecache import ParseCache
from reconciler.load.sources import SourceFile, files_from_git, files_from_paths
from reconciler.load.yamlsource import RawDocument, _dotted, decode, parse_documents
from specs import API_VERSION, KINDS, Dataset, Document, Environment, SpecSet, check_references
from specs.safety import OutsideRoot, evaluated_text, resolve_inside

__all__ = ["MAX_DOCUMENTS", "LoadResult", "Origin", "check_local_paths", "load", "load_files", "load_or_raise"]


@dataclass(frozen=True)
class Origin:
    """Where a document was defined."""

    file: str
    line: int


@dataclass
class LoadResult:
    """What loading produced: the documents that validated, where each came from, and problems."""

    specs: SpecSet
    diagnostics: list[Diagnostic]
    origins: dict[tuple[str, str], Origin] = field(default_factory=dict)
    files: int = 0
    raws: dict[tuple[str, str], RawDocument] = field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        """True when there is no error."""
        return not any(d.severity.value == "error" for d in self.diagnostics)


def load(paths: list[str], rev: str | None = None, cache: ParseCache | None = None) -> LoadResult:
    """Load the specs under ``paths`` from the working tree, or at git revision ``rev``, skipping
    the parse of the files an earlier run parsed cleanly (:mod:`reconciler.load.parsecache`: a
    file's entry is found by its name and bytes, so a revision's unchanged files are the working
    tree's); from the working tree, also check that the data files the specs name stay inside
    their root. ``cache``: one the caller shares between loads and saves (a pull request's base
    and head); by default this load reads and saves its own."""
    own = cache is None
    parses = ParseCache(paths) if cache is None else cache
    result = load_files(files_from_git(paths, rev) if rev else files_from_paths(paths), parses)
    if own:
        parses.save()
    if rev:
        return result
    extra = check_local_paths(result, Path.cwd())
    if extra:
        result.diagnostics = sorted(set(result.diagnostics) | set(extra))
    return result


def check_local_paths(result: LoadResult, base: Path) -> list[Diagnostic]:
    """Every `file://`/`text://` source that exists must resolve inside each Environment's `root`
    (relative to ``base``, the folder forgectl runs in) and be a regular file; so must the roots
    and `stateDir`s themselves. Nothing is opened: only names are resolved and file types read."""
    problems: list[Diagnostic] = []
    envs = result.specs.of(Environment)
    roots: list[tuple[str, Path]] = []
    for env in envs:
        raw = result.raws.get(("Environment", env.name))
        field_path: tuple[str, ...] = ("spec", "root")
        try:
            root = resolve_inside(base, env.spec.root, what="root")
            if env.spec.target == "local":
                field_path = ("spec", "local", "stateDir")
                resolve_inside(root, f"{env.spec.local.state_dir}/{env.name}", what="stateDir")
        except OutsideRoot as exc:
            if raw is not None:
                line, col = raw.position(field_path)
                problems.append(Diagnostic(raw.file, line, col, clip(str(exc)), ".".join(field_path)))
            if field_path[-1] == "root":
                continue
        roots.append((env.name, root))
    if not envs:
        roots.append(("", base.resolve()))
    for dataset in result.specs.of(Dataset):
        source = dataset.spec.source
        if not source.uri.startswith(("file://", "text://")) or source.local_path is None:
            continue
        raw = result.raws.get(("Dataset", dataset.name))
        for env_name, root in roots:
            try:
                target = resolve_inside(root, source.local_path, what="source")
                if target.is_dir():
                    raise OutsideRoot(f"source {source.local_path!r} is a folder, not a file")
            except OutsideRoot as exc:
                if raw is not None:
                    line, col = raw.position(("spec", "source", "uri"))
                    where = f" (Environment {env_name!r})" if env_name else ""
                    problems.append(Diagnostic(raw.file, line, col, clip(str(exc)) + where, "spec.source.uri"))
                break
    return problems


def load_or_raise(paths: list[str], rev: str | None = None, cache: ParseCache | None = None) -> LoadResult:
    """Like :func:`load`, raising :class:`SpecError` when there is any error."""
    result = load(paths, rev, cache)
    if not result.ok:
        raise SpecError(result.diagnostics)
    return result


def load_files(files: Iterable[SourceFile], cache: ParseCache | None = None) -> LoadResult:
    """Load already-read spec files (pure apart from CPU: no I/O happens here), with the cyclic
    garbage collector paused (:func:`reconciler.heap.gc_paused`: thousands of documents). With a
    ``cache`` (read already), a file parsed cleanly before is not parsed again; its documents are
    validated all the same."""
    with gc_paused():
        return _load_files(files, cache)


def _load_files(files: Iterable[SourceFile], cache: ParseCache | None) -> LoadResult:
    diagnostics: list[Diagnostic] = []
    documents: list[Document] = []
    raws: dict[tuple[str, str], RawDocument] = {}
    invalid: set[tuple[str, str]] = set()  # documents that exist but did not validate
    spent = Spent()  # the run's budgets (reconciler/budgets.py), across every file
    count = 0
    for source in files:
        if spent.exhausted:
            break  # a budget of the whole run is spent and was reported where: read no further
        count += 1
        if source.problem is not None:
            diagnostics.append(Diagnostic(source.path, 1, 1, source.problem, hint=source.hint))
            continue
        recalled = cache.recall(source, spent) if cache is not None else None
        if recalled is not None:
            parsed = recalled
        else:
            text, problems = decode(source.data, source.path)
            diagnostics += problems
            if text is None:
                continue
            before = (spent.values, spent.alias_values, spent.documents)
            parsed, parse_problems = parse_documents(text, source.path, spent)
            diagnostics += parse_problems
            if cache is not None and not problems and not parse_problems:
                cache.keep(source, parsed, (spent.values - before[0], spent.alias_values - before[1],
                                            spent.documents - before[2]))
        for raw in parsed:
            doc = _validate(raw, diagnostics)
            if doc is None:
                if isinstance(raw.data, dict) and isinstance(raw.data.get("metadata"), dict):
                    invalid.add((str(raw.data.get("kind")), str(raw.data["metadata"].get("name"))))
                continue
            key = (doc.kind, doc.name)
            if key in raws:
                first = raws[key]
                line, col = raw.position(("metadata", "name"))
                diagnostics.append(
                    Diagnostic(raw.file, line, col, f"duplicate {key[0]} {key[1]!r}: already defined at {first.file}:{first.line}",
                               "metadata.name", "names are unique per kind; rename one of them")
                )
                continue
            raws[key] = raw
            documents.append(doc)
    specs = SpecSet(tuple(documents))
    for kind, name, field_path, message in spec_budgets(specs):
        raw = raws[(kind, name)]
        line, col = raw.position(field_path)
        diagnostics.append(Diagnostic(raw.file, line, col, message, _dotted(field_path)))
    for problem in check_references(specs):
        if problem.target in invalid:
            continue  # already reported where that document is; don't cascade
        raw = raws[(problem.kind, problem.name)]
        line, col = raw.position(problem.path)
        diagnostics.append(Diagnostic(raw.file, line, col, problem.message, _dotted(problem.path)))
    origins = {key: Origin(raw.file, raw.line) for key, raw in raws.items()}
    return LoadResult(specs, sorted(set(diagnostics)), origins, count, raws)


def _validate(raw: RawDocument, diagnostics: list[Diagnostic]) -> Document | None:
    """Check the envelope (mapping, apiVersion, kind), then validate against the kind's model."""
    data = raw.data

    def report(path: tuple[str | int, ...], message: str, hint: str = "", *, key: bool = False) -> None:
        line, col = raw.position(path, key=key)
        diagnostics.append(Diagnostic(raw.file, line, col, clip(message), clip(_dotted(path)), clip(hint)))

    if data is None:
        return None  # already reported (too large / unreadable)
    if not isinstance(data, dict):
        what = "a list" if isinstance(data, list) else f"a {type(data).__name__} value"
        report((), f"a document must be a mapping with apiVersion, kind, metadata and spec, not {what}")
        return None
    api_version = data.get("apiVersion")
    kind = data.get("kind")
    ok = True
    if api_version is None:
        report((), "missing `apiVersion`", f"add `apiVersion: {API_VERSION}`")
        ok = False
    elif api_version != API_VERSION:
        report(("apiVersion",), f"unknown apiVersion {api_version!r}; expected {API_VERSION!r}")
        ok = False
    if kind is None:
        report((), "missing `kind`", f"one of {', '.join(KINDS)}")
        ok = False
    elif not isinstance(kind, str) or kind not in KINDS:
        report(("kind",), f"unknown kind {kind!r}; expected one of {', '.join(KINDS)}", _did_you_mean(str(kind), KINDS))
        ok = False
    if not ok:
        return None
    for path, is_key, message, hint in evaluated_text(data):
        report(path, message, hint, key=is_key)
    cls = KINDS[str(kind)]
    try:
        return cls.model_validate(data, by_alias=True, by_name=False)
    except ValidationError as exc:
        for err in exc.errors(include_url=False):
            path, message, hint, at_key = _explain(cls, data, err)
            report(path, message, hint, key=at_key)
        return None


def _explain(cls: type[BaseModel], data: Any, err: Mapping[str, Any]) -> tuple[tuple[str | int, ...], str, str, bool]:
    """Turn one pydantic error into (path in the data, message, hint, whether to point at the key)."""
    loc = tuple(err["loc"])
    path = _data_path(data, loc)
    kind = err["type"]
    msg = str(err["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
    given = err.get("input")
    ctx = err.get("ctx") or {}
    if kind == "extra_forbidden":
        name = str(loc[-1])
        allowed = _fields_at(cls, loc)
        return path, f"unknown field `{name}`", _did_you_mean(name, allowed, allowed_note=True), True
    if kind == "missing":
        field_name = str(loc[-1])
        return path[:-1], f"missing required field `{field_name}`", "", False
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        disc = ctx.get("discriminator", "type").strip("'")
        tags = re.findall(r"'([^']*)'", str(ctx.get("expected_tags", "")))
        if kind == "union_tag_not_found":
            return path, f"missing `{disc}`; expected one of {', '.join(tags)}", "", False
        tag = str(ctx.get("tag"))
        return path + (disc,), f"unknown {disc} {tag!r}; expected one of {', '.join(tags)}", _did_you_mean(tag, tags), False
    if kind in ("literal_error", "enum"):
        options = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        return path, f"{given!r} is not allowed; expected one of {', '.join(options)}", _did_you_mean(str(given), options), False
    hint = ""
    if kind == "string_type" and given is not None and not isinstance(given, (dict, list)):
        hint = f"YAML read this as {type(given).__name__}; quote it: '{given}'"
    elif kind == "string_pattern_mismatch" and "pattern" in ctx:
        msg = f"{given!r} does not match the expected format"
        hint = _pattern_hint(str(ctx["pattern"]))
    elif kind in ("int_type", "int_parsing", "float_type", "float_parsing", "bool_type", "bool_parsing"):
        expected = {"int": "an integer", "float": "a number", "bool": "true or false"}[kind.split("_")[0]]
        msg = f"expected {expected}, got {_short_repr(given)}"
        if isinstance(given, str):
            hint = "a quoted value is a string, as in Kubernetes; write the value without quotes"
        elif isinstance(given, float) and kind.startswith("int"):
            hint = "write a whole number without a decimal point"
    elif kind == "finite_number":
        msg = f"expected a finite number, got {_short_repr(given)}"
        hint = "NaN and infinity are not allowed: a NaN bound would let every value pass"
    return path, msg, hint, False


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:79] + "…"


def _pattern_hint(pattern: str) -> str:
    hints = {
        "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$": "names are DNS-1123 labels: lower-case letters, digits and '-', "
        "starting and ending with a letter or digit, at most 63 characters",
        "^sha256:[0-9a-f]{64}$": "a digest is `sha256:` followed by 64 lower-case hex digits",
    }
    if pattern in hints:
        return hints[pattern]
    if "ms|s|m|h" in pattern:
        return "a duration is a number and a unit: 500ms, 30s, 5m or 1h"
    return f"expected to match {pattern}"


def _data_path(data: Any, loc: tuple[Any, ...]) -> tuple[str | int, ...]:
    """Follow ``loc`` through ``data``, dropping pydantic's union-member tags that are not keys."""
    path: list[str | int] = []
    cur = data
    for part in loc:
        if isinstance(cur, dict) and part in cur:
            path.append(part)
            cur = cur[part]
        elif isinstance(cur, list) and isinstance(part, int) and 0 <= part < len(cur):
            path.append(part)
            cur = cur[part]
        elif isinstance(cur, dict) and part == loc[-1]:
            path.append(part)  # a missing or unknown key: point at it by name
            cur = None
    return tuple(path)


def _members(tp: Any) -> list[Any]:
    """Flatten Annotated / Optional / Union annotations into their member types."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _members(typing.get_args(tp)[0])
    if origin in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(tp) for m in _members(arg)]
    return [tp]


def _fields_at(root: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The field names (aliases) allowed in the mapping that holds ``loc[-1]``."""
    current: list[Any] = [root]
    for part in loc[:-1]:
        following: list[Any] = []
        tagged: list[Any] = []
        for tp in (m for t in current for m in _members(t)):
            origin = typing.get_origin(tp)
            if isinstance(tp, type) and issubclass(tp, BaseModel):
                for info in tp.model_fields.values():
                    if info.alias == part:
                        following.append(info.annotation)
                    elif typing.get_origin(info.annotation) is typing.Literal and part in typing.get_args(info.annotation):
                        tagged.append(tp)
            elif origin is list and isinstance(part, int):
                following.append(typing.get_args(tp)[0])
            elif origin is dict:
                following.append(typing.get_args(tp)[1])
        current = following or tagged
    names: list[str] = []
    for tp in (m for t in current for m in _members(t)):
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            names += [info.alias or n for n, info in tp.model_fields.items()]
    return sorted(set(names))


def _did_you_mean(given: str, options: Iterable[str], *, allowed_note: bool = False) -> str:
    options = list(options)
    camel = to_camel(given)
    if camel != given and camel in options:
        return f"did you mean `{camel}`? (keys are camelCase)"
    close = difflib.get_close_matches(given, options, n=1, cutoff=0.6)
    if not close:
        lowered = {o.lower(): o for o in options}
        close = [lowered[given.lower()]] if given.lower() in lowered else []
    if close:
        return f"did you mean `{close[0]}`?"
    if allowed_note and options:
        return "allowed here: " + ", ".join(options)
    return ""
