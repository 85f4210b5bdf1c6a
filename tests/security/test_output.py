"""Promise 5 — output that cannot be forged: the Markdown plan (a PR comment), GitHub workflow
annotations and terminal output escape every user string. A spec value cannot close a code fence,
add HTML, mention people, start a workflow command or recolour the terminal."""

from __future__ import annotations

import json
import re
from pathlib import Path

from reconciler.present.views import markdown
from tests.security.helpers import BASE, DIGEST, Project, doc

#: A value that tries everything at once: close the fence and write a heading, HTML, a mention, a
#: link, a table row, a workflow command, an ANSI escape and rich markup.
HOSTILE = ("x\n```\n# Approved by @security-team ✅\n<img src=https://evil.example/p.png>"
           " [click](https://evil.example) | forged | row |\n::error::forged\x1b[31m[bold red]RED[/]")


def hostile_project(tmp_path: Path) -> Project:
    """Base specs committed; the working tree gives the endpoint an annotation and the dataset a
    filter query holding :data:`HOSTILE` (valid specs: the plan shows them)."""
    project = Project.create(tmp_path)
    project.git_init()
    value = json.dumps(HOSTILE)
    head = BASE.replace(
        f"  digest: {DIGEST}\n",
        f"  digest: {DIGEST}\n  cleaning:\n    - {{op: filter, query: {value}}}\n",
    ).replace("metadata: {name: web}", f"metadata: {{name: web, annotations: {{note: {value}}}}}")
    project.write("base.yaml", head)
    return project


def test_markdown_plan_escapes_spec_values(tmp_path: Path) -> None:
    project = hostile_project(tmp_path)
    run = project.run("plan", "specs", "--base", "HEAD", "-o", "markdown")
    assert run.returncode == 0, run.output
    body = run.stdout
    assert "\x1b" not in body
    # Outside code fences (where Markdown and HTML are live), nothing of the value is live.
    prose = "\n".join(re.split(r"(?ms)^(`{3,})diff$.*?^\1$", body)[::2])
    assert "<img" not in prose and "&lt;img" in prose
    assert "@security-team" not in prose and "&#64;security-team" in prose
    assert "[click](https" not in prose and "\\[click\\]" in prose
    assert not any(line.startswith(("::", "##[")) for line in body.splitlines())
    # No line starts a heading, a quote or a table row that Forge did not write.
    for line in body.splitlines():
        assert not line.startswith("# "), line
        if line.startswith("|"):
            assert re.match(r"^\| [+~\-·] (create|update|delete|no-op) \| |^\| \| object \| why \||^\|---", line), line
    # Every fence Forge opens is closed by the same fence, and nothing inside looks like one.
    fences = [line for line in body.splitlines() if line.startswith("```")]
    assert len(fences) % 2 == 0
    for opening, closing in zip(fences[::2], fences[1::2]):
        assert closing == opening.removesuffix("diff")
    inside = False
    for line in body.splitlines():
        if line.startswith("```"):
            inside = not inside
            continue
        if inside:  # Forge's diff lines: removed, added, a unified diff's context and hunk headers
            assert line.startswith(("- ", "+ ", "  ", "@@ ")), line


def test_markdown_of_a_plan_json_with_hostile_names() -> None:
    """Views render from the plan's JSON (a saved plan is a file): names are escaped as well."""
    plan = {
        "environment": "e`` <b>x</b>", "target": "t", "summary": {"create": 1, "update": 0, "delete": 0, "no-op": 0},
        "changes": [{"action": "create", "ref": {"kind": "Workflow", "namespace": "n|x", "name": "a`b<script>"},
                     "spec": {"kind": "Model", "name": "# Heading\n| x |"}, "reasons": ["`ok` and `broken | x"], "diff": []}],
        "notes": ["> quoted\n# head @here"],
    }
    body = markdown(plan)
    assert "<script>" not in body and "<b>" not in body
    assert "\n# " not in body and "\n| x |" not in body
    assert "@here" not in body
    assert "`ok`" in body  # Forge's own code spans survive


def test_github_annotations_escape_file_names_and_values(tmp_path: Path) -> None:
    project = Project.create(tmp_path)
    name = "a,b:c%0A::warning::forged.yaml"
    project.write(name, doc("Model", "datasetRef: digits\narchitecture: {type: mlp}\nprecision: \"fp8\\n::error::x\"\n"))
    run = project.run("validate", "specs", "-o", "github")
    assert run.returncode == 1
    lines = run.stdout.splitlines()
    assert len(lines) == 1, lines
    line = lines[0]
    assert line.startswith("::error file=")
    assert "a%2Cb%3Ac%250A%3A%3Awarning%3A%3Aforged.yaml,line=8,col=" in line
    assert "fp8\\n::error::x" in line  # the value's newline is shown escaped: no second command
    assert "\n" not in line


def test_text_output_shows_control_characters_as_escapes(tmp_path: Path) -> None:
    project = Project.create(tmp_path)
    project.write("case.yaml", doc("Model", "datasetRef: digits\narchitecture: {type: mlp}\n"
                                   "precision: \"fp8\\e[2J\\e]0;pwned\\a\\r::error::forged\"\n"))
    run = project.run("validate", "specs")
    assert run.returncode == 1
    assert "\x1b" not in run.output and "\r" not in run.output and "\x07" not in run.output
    assert "\\x1b[2J" in run.stderr
    assert not any(line.startswith("::") for line in run.output.splitlines())


def test_file_names_cannot_start_a_workflow_command(tmp_path: Path) -> None:
    project = Project.create(tmp_path)
    (project.root / "::error file=x::forged.yaml").write_text("a: [\n")
    run = project.run("validate", ".")
    assert run.returncode == 1
    assert not any(line.startswith(("::", "##")) for line in run.output.splitlines()), run.output
    assert "./::error file=x::forged.yaml:2:1: error:" in run.stderr


def test_terminal_messages_do_not_interpret_rich_markup(tmp_path: Path) -> None:
    project = Project.create(tmp_path)
    run = project.run("validate", "[bold red]specs[/]")
    assert run.returncode == 1
    assert "error: [bold red]specs[/]: no such file or folder" in run.stderr


def test_text_plan_escapes_markup_and_control_characters(tmp_path: Path) -> None:
    project = hostile_project(tmp_path)
    run = project.run("plan", "specs", "--base", "HEAD")
    assert run.returncode == 0, run.output
    assert "\x1b" not in run.output
    assert "[bold red]RED[/]" in run.stdout  # shown as text, not applied
    assert not any(line.startswith(("::", "##")) for line in run.output.splitlines())


def test_undecodable_file_name_with_an_escape_in_every_output(tmp_path: Path) -> None:
    project = Project.create(tmp_path)
    (project.root / "specs").joinpath(bytes.fromhex("6261 64ff 1b5b 3331 6d").decode("utf-8", "surrogateescape") + ".yaml"
                                     ).write_text("a: [\n")
    for output in ("text", "github", "json"):
        run = project.run("validate", "specs", "-o", output)
        assert run.returncode == 1
        assert "\x1b" not in run.output
        assert "\\udcff" in run.output, run.output
