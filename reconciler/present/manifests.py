"""Manifests as text: stable YAML for `forgectl render` and golden files."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import yaml

from reconciler.diagnostics import printable


class _Dumper(yaml.SafeDumper):
    """Block style, no aliases, long lines kept whole (configs are single JSON strings). A string
    holding a character a terminal or CI log would act on — control, bidirectional or zero-width
    characters — is written double-quoted with that character as an escape (`\u202e`), exactly as
    :func:`reconciler.diagnostics.printable` shows it in every other output: the YAML stays valid
    and reads back to the same string, and nothing in it can reorder or hide what is printed."""

    def ignore_aliases(self, data: Any) -> bool:
        return True

    def write_double_quoted(self, text: str, split: bool = True) -> None:
        if _printable(text):
            super().write_double_quoted(text, split)
            return
        data = '"' + printable(text.replace("\\", "\\\\").replace('"', '\\"')) + '"'
        self.write_indicator(data, True)  # the whole quoted scalar as one token, as PyYAML writes its opening quote


def _printable(text: str) -> bool:
    """True when every character of ``text`` but line breaks prints as itself."""
    return text.replace("\n", "").isprintable()


#: Strings YAML 1.2 readers (kubectl, Go) would take for numbers, booleans or null: PyYAML's
#: YAML 1.1 resolver leaves e.g. `064436155966` plain, and the API server then sees a number.
_AMBIGUOUS = re.compile(r"^([-+]?[0-9][0-9_.eE+-]*|0[xXoObB][0-9a-fA-F_]+|[-+]?\.?(inf|Inf|INF|nan|NaN|NAN)|"
                        r"true|True|TRUE|false|False|FALSE|yes|Yes|YES|no|No|NO|on|On|ON|off|Off|OFF|y|Y|n|N|null|Null|NULL|~|)$")


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    if not _printable(value):
        style: str | None = '"'  # escapes are only possible in double quotes (see _Dumper)
    else:
        style = "|" if "\n" in value else ("'" if _AMBIGUOUS.match(value) else None)
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def to_yaml(obj: Any) -> str:
    """One object as YAML, keys in the order the renderer built them."""
    return yaml.dump(obj, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=1 << 20, allow_unicode=True)


def to_yaml_stream(objects: Iterable[Any]) -> str:
    """Several objects as one multi-document YAML stream."""
    return "".join("---\n" + to_yaml(o) for o in objects)


def file_name(obj: dict[str, Any]) -> str:
    """`<kind>-<namespace>-<name>.yaml`, lower-case, for `render -o DIR`."""
    meta = obj.get("metadata", {})
    parts = [obj.get("kind", "object").lower(), meta.get("namespace", ""), meta.get("name", "")]
    return "-".join(p for p in parts if p) + ".yaml"
