"""The new parts of the plan keep docs/security.md's promise 5: a hostile multi-line value *changed*
by a pull request (so it reaches the unified diffs, the token diffs and the spec changes) cannot
close a fence, add HTML, mention people or start a workflow command, in Markdown or text."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.security.helpers import BASE, Project
from tests.security.test_output import HOSTILE


def _project(tmp_path: Path) -> Project:
    old = json.dumps("first line\nsecond line\n" + "z" * 150)
    new = json.dumps("first line\n" + HOSTILE + "\n" + "z" * 150 + " " + HOSTILE.replace("\n", " "))
    project = Project.create(tmp_path, BASE.replace("metadata: {name: web}", f"metadata: {{name: web, annotations: {{note: {old}}}}}"))
    project.git_init()
    project.write("base.yaml", BASE.replace("metadata: {name: web}", f"metadata: {{name: web, annotations: {{note: {new}}}}}"))
    return project


def test_changed_hostile_values_stay_inert_in_markdown(tmp_path: Path) -> None:
    project = _project(tmp_path)
    run = project.run("plan", "specs", "--base", "HEAD", "-o", "markdown")
    assert run.returncode == 0, run.output
    body = run.stdout
    assert "\x1b" not in body
    assert "@@ metadata.annotations.note @@" in body  # the unified diff of the spec change is there
    fences = [line for line in body.splitlines() if line.startswith("```")]
    assert fences and len(fences) % 2 == 0
    for opening, closing in zip(fences[::2], fences[1::2]):
        assert closing == opening.removesuffix("diff") and len(opening.removesuffix("diff")) > 3
    inside = False
    prose = []
    for line in body.splitlines():
        if line.startswith("```"):
            inside = not inside
            continue
        if inside:
            assert line.startswith(("- ", "+ ", "  ", "@@ ")), line
        else:
            prose.append(line)
            assert not line.startswith(("# ", "::", "##[")), line
            if line.startswith("|"):
                assert re.match(r"^\| [+~\-·] (create|update|delete|no-op) \| |^\| \| object \| why \||^\|---", line), line
    text = "\n".join(prose)
    assert "<img" not in text and "@security-team" not in text and "[click](https" not in text


def test_changed_hostile_values_stay_inert_in_text_and_json(tmp_path: Path) -> None:
    project = _project(tmp_path)
    run = project.run("plan", "specs", "--base", "HEAD")
    assert run.returncode == 0, run.output
    assert "\x1b" not in run.output and "\r" not in run.output
    assert not any(line.startswith(("::", "##")) for line in run.output.splitlines())
    assert "[bold red]RED[/]" in run.stdout  # rich markup in a value is printed, not interpreted
    data = json.loads(project.run("plan", "specs", "--base", "HEAD", "-o", "json").stdout)
    [change] = [c for c in data["specChanges"] if c["path"] == "metadata.annotations.note"]
    assert change["valueDiff"]["kind"] == "lines" and change["new"].startswith("first line\nx\n```")
