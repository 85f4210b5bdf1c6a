"""A source's `semver` range, read as Flux reads a GitRepository's `ref.semver`: with the
constraints of Masterminds/semver v3 (`^1.2`, `~1.2.3`, `1.x`, `>= 1.2, < 2`, `1.2 - 1.4.5`,
`||`), over tags that are strict semantic versions with an optional leading `v`
(fluxcd/pkg/version.ParseVersion).

No Python library reads Masterminds' ranges (npm's and PEP 440's differ from them on hyphen
ranges, `>1.2`, `<=1.2` and pre-releases), so this is a port of v3.4.0's `constraints.go` and
`version.go`, function for function and with their regular expressions; `tests/judges` holds it
to the library itself (`forge-judge semver`) over a grid of ranges and tags. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

#: The largest segment Go's strconv.ParseUint(…, 10, 64) reads.
_UINT64_MAX = 2**64 - 1

_NUM = "0123456789"
_ALLOWED = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-" + _NUM

_LOOSE = re.compile(r"^v?([0-9]+)(\.[0-9]+)?(\.[0-9]+)?"
                    r"(-([0-9A-Za-z\-]+(\.[0-9A-Za-z\-]+)*))?"
                    r"(\+([0-9A-Za-z\-]+(\.[0-9A-Za-z\-]+)*))?\Z")

# constraints.go: cvRegex and the operators, in upstream's order (Go's regexp and Python's re both
# take the first alternative that lets the whole pattern match, so the order decides alike). Go's
# `\s` is ASCII's [\t\n\f\r ] and its `$` the very end: Python's are wider, so both are spelled out.
_S = r"[\t\n\f\r ]"
_CV = (r"v?([0-9|x|X|\*]+)(\.[0-9|x|X|\*]+)?(\.[0-9|x|X|\*]+)?"
       r"(-([0-9A-Za-z\-]+(\.[0-9A-Za-z\-]+)*))?"
       r"(\+([0-9A-Za-z\-]+(\.[0-9A-Za-z\-]+)*))?")
_OPS = r"=||!=|>|<|>=|=>|<=|=<|~|~>|\^"
_CONSTRAINT = re.compile(rf"^{_S}*({_OPS}){_S}*({_CV}){_S}*\Z")
_RANGE = re.compile(rf"{_S}*({_CV}){_S}+-{_S}+({_CV}){_S}*")
_FIND = re.compile(rf"({_OPS}){_S}*({_CV})")
_VALID = re.compile(rf"^({_S}*({_OPS}){_S}*({_CV}){_S}*)((?:{_S}+|,{_S}*)({_OPS}){_S}*({_CV}){_S}*)*\Z")


class SemverError(ValueError):
    """A range (or a version inside it) that Masterminds/semver refuses; the message is its own."""


def _only(text: str, allowed: str) -> bool:
    return all(c in allowed for c in text)


def _uint(text: str) -> int:
    """strconv.ParseUint(text, 10, 64): digits only, at most 2⁶⁴ − 1."""
    if not text or not _only(text, _NUM) or int(text) > _UINT64_MAX:
        raise SemverError(f"error parsing version segment: {text!r}")
    return int(text)


def _check_prerelease(pre: str) -> None:
    for part in pre.split("."):
        if part == "":
            raise SemverError("invalid prerelease string")
        if _only(part, _NUM):
            if len(part) > 1 and part[0] == "0":
                raise SemverError("version segment starts with 0")
        elif not _only(part, _ALLOWED):
            raise SemverError("invalid prerelease string")


def _check_metadata(metadata: str) -> None:
    if any(part == "" or not _only(part, _ALLOWED) for part in metadata.split(".")):
        raise SemverError("invalid metadata string")


@dataclass(frozen=True)
class Version:
    """A semantic version; build metadata is kept but never compared."""

    major: int
    minor: int
    patch: int
    pre: str = ""
    metadata: str = ""

    @classmethod
    def parse(cls, text: str) -> Version:
        """NewVersion (v3's default, coercing): `v1`, `1.2`, `1.2.3-rc.1+build`."""
        m = _LOOSE.match(text)
        if m is None:
            raise SemverError("invalid semantic version")
        version = cls(_uint(m[1]), _uint(m[2][1:]) if m[2] else 0, _uint(m[3][1:]) if m[3] else 0,
                      m[5] or "", m[8] or "")
        if version.pre:
            _check_prerelease(version.pre)
        if version.metadata:
            _check_metadata(version.metadata)
        return version

    @classmethod
    def strict(cls, text: str) -> Version:
        """StrictNewVersion: exactly MAJOR.MINOR.PATCH, then an optional pre-release and metadata."""
        if not text:
            raise SemverError("version string empty")
        parts = text.split(".", 2)
        if len(parts) != 3:
            raise SemverError("invalid semantic version")
        metadata = pre = ""
        if "+" in parts[2]:
            parts[2], metadata = parts[2].split("+", 1)
            _check_metadata(metadata)
        if "-" in parts[2]:
            parts[2], pre = parts[2].split("-", 1)
            _check_prerelease(pre)
        for part in parts:
            if not _only(part, _NUM):
                raise SemverError("invalid characters in version")
            if len(part) > 1 and part[0] == "0":
                raise SemverError("version segment starts with 0")
        return cls(_uint(parts[0]), _uint(parts[1]), _uint(parts[2]), pre, metadata)

    def compare(self, other: Version) -> int:
        """-1, 0 or 1: by MAJOR.MINOR.PATCH, then a release above its pre-releases."""
        for a, b in ((self.major, other.major), (self.minor, other.minor), (self.patch, other.patch)):
            if a != b:
                return 1 if a > b else -1
        if self.pre == other.pre == "":
            return 0
        if not self.pre:
            return 1
        if not other.pre:
            return -1
        return _compare_prerelease(self.pre, other.pre)


def _compare_prerelease(v: str, o: str) -> int:
    sparts, oparts = v.split("."), o.split(".")
    for i in range(max(len(sparts), len(oparts))):
        d = _compare_pre_part(sparts[i] if i < len(sparts) else "", oparts[i] if i < len(oparts) else "")
        if d:
            return d
    return 0


def _numeric(text: str) -> int | None:
    try:
        return _uint(text)
    except SemverError:
        return None


def _compare_pre_part(s: str, o: str) -> int:
    if s == o:
        return 0
    if s == "":
        return -1
    if o == "":
        return 1
    si, oi = _numeric(s), _numeric(o)
    if si is None and oi is None:
        return 1 if s > o else -1
    if oi is None:  # o is a string, s a number
        return -1
    if si is None:
        return 1
    return 1 if si > oi else -1


def tag_version(tag: str) -> Version | None:
    """The version a tag names, as Flux reads it (fluxcd/pkg/version.ParseVersion: a strict
    semantic version after one optional leading `v`), or None."""
    try:
        Version.strict(tag.removeprefix("v"))
        return Version.parse(tag)
    except SemverError:
        return None


def _is_x(text: str) -> bool:
    return text in ("x", "*", "X")


@dataclass(frozen=True)
class _Constraint:
    con: Version
    orig: str
    op: str
    minor_dirty: bool
    dirty: bool
    patch_dirty: bool

    def check(self, v: Version, include_pre: bool) -> bool:
        return _OPERATORS[self.op](v, self, include_pre)


def _parse_constraint(text: str) -> _Constraint:
    m = _CONSTRAINT.match(text)
    if m is None:
        raise SemverError(f"improper constraint: {text}")
    ver, minor_dirty, patch_dirty, dirty = m[2], False, False, False
    pre = m[6] or ""
    if _is_x(m[3]) or not m[3]:
        ver, dirty = f"0.0.0{pre}", True
    elif _is_x((m[4] or "").removeprefix(".")) or not m[4]:
        minor_dirty = dirty = True
        ver = f"{m[3]}.0.0{pre}"
    elif _is_x((m[5] or "").removeprefix(".")) or not m[5]:
        dirty = patch_dirty = True
        ver = f"{m[3]}{m[4]}.0{pre}"
    try:
        con = Version.parse(ver)
    except SemverError:
        raise SemverError("constraint parser error") from None
    return _Constraint(con, m[2], m[1], minor_dirty, dirty, patch_dirty)


def _skips(v: Version, include_pre: bool) -> bool:
    """A pre-release where the range's group names none: no operator admits it."""
    return bool(v.pre) and not include_pre


def _not_equal(v: Version, c: _Constraint, include_pre: bool) -> bool:
    if _skips(v, include_pre):
        return False
    if c.dirty:
        if c.con.major != v.major:
            return True
        if c.con.minor != v.minor and not c.minor_dirty:
            return True
        if c.minor_dirty:
            return False
        if c.con.patch != v.patch and not c.patch_dirty:
            return True
        if c.patch_dirty:
            if v.pre or c.con.pre:
                return _compare_prerelease(v.pre, c.con.pre) != 0
            return False
    return v.compare(c.con) != 0


def _greater(v: Version, c: _Constraint, include_pre: bool) -> bool:
    if _skips(v, include_pre):
        return False
    if not c.dirty:
        return v.compare(c.con) == 1
    if v.major > c.con.major:
        return True
    if v.major < c.con.major or c.minor_dirty:
        return False
    if c.patch_dirty:
        return v.minor > c.con.minor
    return v.compare(c.con) == 1


def _less(v: Version, c: _Constraint, include_pre: bool) -> bool:
    return not _skips(v, include_pre) and v.compare(c.con) < 0


def _greater_equal(v: Version, c: _Constraint, include_pre: bool) -> bool:
    return not _skips(v, include_pre) and v.compare(c.con) >= 0


def _less_equal(v: Version, c: _Constraint, include_pre: bool) -> bool:
    if _skips(v, include_pre):
        return False
    if not c.dirty:
        return v.compare(c.con) <= 0
    if v.major > c.con.major:
        return False
    return not (v.major == c.con.major and v.minor > c.con.minor and not c.minor_dirty)


def _tilde(v: Version, c: _Constraint, include_pre: bool) -> bool:
    if _skips(v, include_pre) or v.compare(c.con) < 0:
        return False
    if c.con.major == c.con.minor == c.con.patch == 0 and not c.minor_dirty and not c.patch_dirty:
        return True  # ~0.0.0: anything
    if v.major != c.con.major:
        return False
    return not (v.minor != c.con.minor and not c.minor_dirty)


def _tilde_or_equal(v: Version, c: _Constraint, include_pre: bool) -> bool:
    if _skips(v, include_pre):
        return False
    if c.dirty:
        return _tilde(v, c, include_pre)
    return v.compare(c.con) == 0


def _caret(v: Version, c: _Constraint, include_pre: bool) -> bool:
    if _skips(v, include_pre) or v.compare(c.con) < 0:
        return False
    if c.con.major > 0 or c.minor_dirty:
        return v.major == c.con.major
    if v.major > 0:
        return False
    if c.con.minor > 0 or c.patch_dirty:
        return v.minor == c.con.minor
    if v.minor > 0:
        return False
    return c.con.patch == v.patch


_OPERATORS: dict[str, Callable[[Version, _Constraint, bool], bool]] = {
    "": _tilde_or_equal, "=": _tilde_or_equal, "!=": _not_equal, ">": _greater, "<": _less,
    ">=": _greater_equal, "=>": _greater_equal, "<=": _less_equal, "=<": _less_equal,
    "~": _tilde, "~>": _tilde, "^": _caret,
}


def _rewrite_range(text: str) -> str:
    """`A - B` → `>= A, <= B ` (upstream's rewriteRange, first occurrence of each match)."""
    for m in list(_RANGE.finditer(text)):
        text = text.replace(m[0], f">= {m[1]}, <= {m[11]} ", 1)
    return text


@dataclass(frozen=True)
class SemverRange:
    """A parsed range: OR groups of AND-ed constraints, each group admitting pre-releases only
    when one of its constraints names one."""

    text: str
    groups: tuple[tuple[_Constraint, ...], ...]
    pre_groups: tuple[bool, ...]

    @classmethod
    def parse(cls, text: str) -> SemverRange:
        """NewConstraint; :class:`SemverError` with upstream's message when it refuses ``text``."""
        groups: list[tuple[_Constraint, ...]] = []
        pre: list[bool] = []
        for part in _rewrite_range(text).split("||"):
            if not _VALID.match(part):
                raise SemverError(f"improper constraint: {part}")
            found = [m[0] for m in _FIND.finditer(part)] or [part]
            constraints = tuple(_parse_constraint(s) for s in found)
            groups.append(constraints)
            pre.append(any(c.con.pre for c in constraints))
        return cls(text, tuple(groups), tuple(pre))

    def admits(self, version: Version) -> bool:
        """Check: some group's every constraint holds."""
        return any(all(c.check(version, with_pre) for c in group) for group, with_pre in zip(self.groups, self.pre_groups))


def highest_admitted(tags: Iterable[str], semver: str) -> list[str]:
    """The tags of the highest version ``semver`` admits among ``tags`` (tags that are no version
    skipped), sorted by name: more than one when tags differ only in build metadata or a `v`,
    which Flux tells apart by their commits' dates (the caller's to read); empty when none is in
    the range."""
    spec = SemverRange.parse(semver)
    best: Version | None = None
    tied: list[str] = []
    for tag in tags:
        version = tag_version(tag)
        if version is None or not spec.admits(version):
            continue
        d = 1 if best is None else version.compare(best)
        if d > 0:
            best, tied = version, [tag]
        elif d == 0:
            tied.append(tag)
    return sorted(tied)
