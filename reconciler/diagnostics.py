"""Diagnostics: problems a user can cause, each with a source position, collected rather than
raised so that one run reports all of them (as Terraform's `tfdiags` does).

Exceptions of Forge::

    ForgeError                 a user-facing failure: one message, exit code 1
    ├── SpecError              specs did not load; carries the diagnostics
    └── (see reconciler.errors for target, plan and lock errors)
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from enum import Enum

#: Longest message, path or hint a diagnostic shows (a spec value quoted in one is cut, not echoed
#: whole: a 4 MiB string stays in the file).
MAX_MESSAGE = 500


def clip(text: str, limit: int = MAX_MESSAGE) -> str:
    """``text`` cut to ``limit`` characters, with `…` where it was cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def printable(text: str) -> str:
    """``text`` safe for a terminal or a CI log: control characters (ESC, CR, NUL, …) and invisible
    format characters (bidirectional overrides, zero-width joiners) shown as escapes, so user text
    can neither move the cursor, recolour, hide nor reorder what is printed around it."""
    if text.isprintable():
        return text
    out = []
    for ch in text:
        if ch.isprintable() or ch == " ":
            out.append(ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x100:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(f"\\u{ord(ch):04x}" if ord(ch) < 0x10000 else f"\\U{ord(ch):08x}")
    return "".join(out)


def log_safe(text: str) -> str:
    """:func:`printable`, and a line that would start like a CI runner's command (`::`, `##[`,
    `##vso[`) is shifted, so a file name cannot issue one."""
    text = printable(text)
    return "./" + text if text.startswith(("::", "##")) else text


class Severity(str, Enum):
    """How bad a diagnostic is."""

    ERROR = "error"
    WARNING = "warning"


@dataclass(frozen=True, order=True)
class Diagnostic:
    """One problem in one place: file, 1-based line and column, field path, message and hint."""

    file: str
    line: int
    column: int
    message: str
    path: str = ""
    hint: str = ""
    severity: Severity = field(default=Severity.ERROR, compare=False)

    def text(self) -> str:
        """`file:line:col: error: spec.x: message (hint)` — the compiler convention editors link."""
        where = f"{log_safe(self.file)}:{self.line}:{self.column}"
        at = f"{printable(self.path)}: " if self.path else ""
        hint = f"\n    hint: {printable(self.hint)}" if self.hint else ""
        return f"{where}: {self.severity.value}: {at}{printable(self.message)}{hint}"

    def github(self) -> str:
        """A GitHub Actions workflow command that annotates the line in a pull request."""
        title = self.path or "forgectl"
        msg = self.message + (f" (hint: {self.hint})" if self.hint else "")
        return (
            f"::{self.severity.value} file={_gh_escape_prop(self.file)},line={self.line},col={self.column},"
            f"title={_gh_escape_prop(title)}::{_gh_escape_data(msg)}"
        )

    def to_json(self) -> dict[str, object]:
        """A plain dict for `--output json`."""
        data = asdict(self)
        data["severity"] = self.severity.value
        return data


def _gh_escape_data(text: str) -> str:
    """Escape a workflow command's message as the Actions toolkit does (`%`, CR, LF), after
    showing any other control character as an escape."""
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return printable(text)


def _gh_escape_prop(text: str) -> str:
    return _gh_escape_data(text).replace(":", "%3A").replace(",", "%2C")


class ForgeError(Exception):
    """A failure the user can act on; the CLI prints its message and exits 1, never a traceback."""

    exit_code: int = 1


class SpecError(ForgeError):
    """The specs did not load cleanly."""

    def __init__(self, diagnostics: Iterable[Diagnostic]) -> None:
        self.diagnostics = sorted(diagnostics)
        count = len(self.diagnostics)
        super().__init__(f"{count} problem{'s' if count != 1 else ''} in the specs")


def render_diagnostics(diagnostics: list[Diagnostic], output: str) -> str:
    """All diagnostics as `text`, `json` or `github` output."""
    ordered = sorted(diagnostics)
    if output == "json":
        errors = sum(d.severity is Severity.ERROR for d in ordered)
        return json.dumps(
            {"valid": errors == 0, "errors": errors, "diagnostics": [d.to_json() for d in ordered]}, indent=2
        )
    if output == "github":
        return "\n".join(d.github() for d in ordered)
    return "\n".join(d.text() for d in ordered)
