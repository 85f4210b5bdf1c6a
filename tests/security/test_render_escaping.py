"""Promise 5, for YAML: `forgectl render` (stdout, and `-o DIR`) never writes a control,
bidirectional or zero-width character raw into a CI log. Such a string is written double-quoted
with the character as the escape every other output shows (`printable`), and the YAML stays valid:
it reads back to exactly the string the spec holds."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import pytest
import yaml

from reconciler.diagnostics import printable
from reconciler.present.manifests import to_yaml_stream
from tests.security.helpers import BASE, Project

#: Characters a log viewer or terminal acts on instead of showing: bidirectional overrides and
#: isolates (Trojan Source), zero-width ones, the BOM, line and paragraph separators, C0/C1 controls.
INVISIBLE = ["\u202e", "\u202d", "\u2066", "\u2067", "\u2068", "\u2069", "\u200b", "\u200c", "\u200d", "\u2060",
             "\ufeff", "\u2028", "\u2029", "\x1b", "\x07", "\x08", "\x85", "\x9b", "\r", "\x7f"]
#: An annotation value using each of them, written with YAML escapes in the spec itself.
VALUES = {
    "trojan": "approve\u202e\u2066 // reviewed \u2069\u2066",
    "hidden": "admin\u200bpassword\u200d\u2060",
    "terminal": "\x1b[2J\x1b[31mFAILED\x1b[0m\x07\r::error::forged",
    "separators": "a\u2028b\u2029c\x85d",
    "bom": "\ufeffstart",
    "multi-line": "first line\n\u202esecond line\n",
}


def _project(tmp_path: Path) -> Project:
    annotations = ", ".join(f"{k}: {json.dumps(v)}" for k, v in VALUES.items())  # JSON strings are YAML
    text = (BASE.replace("metadata: {name: base-model}", f"metadata: {{name: base-model, annotations: {{{annotations}}}}}")
                .replace("metadata: {name: web}", f"metadata: {{name: web, annotations: {{{annotations}}}}}"))
    assert text.count("annotations") == 2
    return Project.create(tmp_path, text)


def _no_raw_invisibles(text: str) -> None:
    for ch in INVISIBLE:
        assert ch not in text, f"raw {unicodedata.name(ch, hex(ord(ch)))} in the output"
    for line in text.splitlines():
        assert line.isprintable(), repr(line)


def _annotated(objects: list[dict]) -> list[dict]:
    return [o for o in objects if "trojan" in (o.get("metadata") or {}).get("annotations", {})]


def test_render_escapes_invisible_characters_and_round_trips(tmp_path: Path) -> None:
    project = _project(tmp_path)
    run = project.run("render", "specs", timeout=60)
    assert run.returncode == 0, run.output
    _no_raw_invisibles(run.stdout)
    objects = [o for o in yaml.safe_load_all(run.stdout) if o]
    annotated = _annotated(objects)
    kinds = {o["kind"] for o in annotated}
    assert {"Workflow", "SeldonDeployment", "PodMonitor"} <= kinds, kinds
    for obj in annotated:
        for key, value in VALUES.items():
            assert obj["metadata"]["annotations"][key] == value  # read back exactly
    # The escape is the one `printable` shows everywhere else.
    assert '"approve\\u202e\\u2066 // reviewed \\u2069\\u2066"' in run.stdout
    assert printable(VALUES["trojan"]) == "approve\\u202e\\u2066 // reviewed \\u2069\\u2066"


def test_render_to_a_folder_escapes_too(tmp_path: Path) -> None:
    project = _project(tmp_path)
    out = tmp_path / "rendered"
    run = project.run("render", "specs", "-o", str(out), timeout=60)
    assert run.returncode == 0, run.output
    files = sorted(out.glob("*.yaml"))
    assert files
    seen = 0
    for path in files:
        text = path.read_text()
        _no_raw_invisibles(text)
        obj = yaml.safe_load(text)
        if "trojan" in obj["metadata"].get("annotations", {}):
            assert obj["metadata"]["annotations"] == {**obj["metadata"]["annotations"], **VALUES}
            seen += 1
    assert seen >= 3


@pytest.mark.parametrize("ch", INVISIBLE, ids=[f"U+{ord(c):04X}" for c in INVISIBLE])
def test_each_character_in_keys_values_and_lists(ch: str) -> None:
    """Every character alone, in a mapping key, a value and a list item, at the start, middle and
    end of a string, with quotes and backslashes around it: valid YAML that reads back the same."""
    strings = [ch, f"a{ch}b", f"{ch}start", f"end{ch}", f'q"u\\o{ch}te', f"line\n{ch}\n"]
    obj = {"metadata": {"annotations": {s: s for s in strings}}, "items": strings}
    text = to_yaml_stream([obj])
    _no_raw_invisibles(text)
    assert list(yaml.safe_load_all(text)) == [obj]


def test_printable_text_is_written_as_before() -> None:
    """Nothing changes for text that prints as itself: plain, quoted-when-ambiguous, block."""
    obj = {"a": "plain", "b": "0123", "c": "yes", "d": "line one\nline two\n", "e": "é ü 中文 — emoji 😀"}
    assert to_yaml_stream([obj]) == ("---\na: plain\nb: '0123'\nc: 'yes'\nd: |\n  line one\n  line two\n"
                                     "e: é ü 中文 — emoji 😀\n")
