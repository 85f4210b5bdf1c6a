"""The target flags every forgectl command that talks to a target shares (`forgectl/options.py`):
they arrive as one value, take the place of the group parameter, are refused where they would
clash, and are the same four with the same help on every such command (issue 13, a thin CLI)."""

from __future__ import annotations

from typing import Annotated, Any

import pytest
import typer
from typer.main import get_command
from typer.testing import CliRunner

from forgectl.cli import app as forgectl_app
from forgectl.options import NO_OVERRIDES, PathsArg, TargetFlags, with_target_flags

FLAG_HELP = {
    "--kubeconfig": "Kubeconfig file (default $KUBECONFIG, then ~/.kube/config).",
    "--context": "Kubeconfig context (default: the current one).",
    "--namespace": "Namespace (default: the environment's).",
    "--prometheus-url": "Prometheus the rollout gates query (default: the environment's `prometheus.url`), e.g. "
                        "http://127.0.0.1:9090 through `kubectl port-forward` when forgectl runs outside the cluster.",
}


def _tiny_app() -> tuple[typer.Typer, list[tuple[Any, ...]]]:
    seen: list[tuple[Any, ...]] = []
    app = typer.Typer()

    @app.command()
    @with_target_flags
    def show(paths: PathsArg = None, flags: TargetFlags = NO_OVERRIDES,
             verbose: Annotated[bool, typer.Option("--verbose")] = False) -> None:
        seen.append((paths, flags, verbose))

    @app.command()
    def other() -> None:  # a second command, so `show` is a subcommand as in forgectl
        seen.append(("other",))

    return app, seen


def test_target_flags_arrive_as_one_value_and_positionals_stay() -> None:
    app, seen = _tiny_app()
    result = CliRunner().invoke(app, ["show", "a", "b", "-n", "ns", "--kubeconfig", "k", "--context", "c", "--verbose",
                                      "--prometheus-url", "http://127.0.0.1:9090"])
    assert result.exit_code == 0, result.output
    assert seen == [(["a", "b"], TargetFlags("k", "c", "ns", "http://127.0.0.1:9090"), True)]
    seen.clear()
    assert CliRunner().invoke(app, ["show"]).exit_code == 0
    assert seen == [(None, TargetFlags(), False)]


def test_target_flags_take_the_place_of_the_group_parameter() -> None:
    app, _ = _tiny_app()
    params = [p for p in get_command(app).commands["show"].params]
    assert [p.name for p in params] == ["paths", "kubeconfig", "context", "namespace", "prometheus_url", "verbose"]
    assert [p.opts for p in params[1:4]] == [["--kubeconfig"], ["--context"], ["--namespace", "-n"]]


def test_with_target_flags_refuses_a_command_without_the_group_or_with_a_clash() -> None:
    def without(paths: PathsArg = None) -> None: ...

    def clash(namespace: str = "", flags: TargetFlags = NO_OVERRIDES) -> None: ...

    with pytest.raises(TypeError, match="exactly one parameter annotated TargetFlags"):
        with_target_flags(without)
    with pytest.raises(TypeError, match="clash with the target flags"):
        with_target_flags(clash)


def _commands(group: Any, prefix: str = "") -> dict[str, Any]:
    found = {}
    for name, command in group.commands.items():
        if hasattr(command, "commands"):
            found.update(_commands(command, f"{prefix}{name} "))
        else:
            found[f"{prefix}{name}"] = command
    return found


def test_every_command_with_target_flags_has_the_same_four() -> None:
    commands = _commands(get_command(forgectl_app))
    # install and uninstall name the cluster by --kubeconfig and --context alone (no Environment):
    # the same two options, and their -n is the controller's namespace
    for name in ("install", "uninstall"):
        params = {p.name: p for p in commands[name].params}
        for flag in ("--kubeconfig", "--context"):
            option = params[flag.removeprefix("--")]
            assert option.opts[0] == flag and option.help == FLAG_HELP[flag] and option.default is None, (name, flag)
        assert params["namespace"].default == "forge-system" and "prometheus_url" not in params
    with_flags = sorted(name for name, c in commands.items() if any(p.name == "kubeconfig" for p in c.params)
                        and name not in ("install", "uninstall"))
    assert with_flags == ["apply", "diff", "doctor", "down", "experiment status", "experiment stop", "labels merge",
                          "labels pull", "models diff", "models list",
                          "models report", "models show", "plan", "reconcile", "rollout abort", "rollout promote",
                          "rollout retry", "rollout status", "status"]
    for name in with_flags:
        params = {p.name: p for p in commands[name].params}
        for flag, help_text in FLAG_HELP.items():
            option = params[flag.removeprefix("--").replace("-", "_")]
            assert option.opts[0] == flag and option.help == help_text and option.default is None, (name, flag)
        assert params["namespace"].opts == ["--namespace", "-n"]


def test_json_output_is_the_standard_librarys_json(capsys: pytest.CaptureFixture[str]) -> None:
    """`-o json` is written by orjson (a 10,000-endpoint plan is hundreds of MB): the same values as
    the standard library's encoder reads back, non-ASCII text as UTF-8, and what orjson refuses (an
    integer past 64 bits) written by the standard library instead."""
    import json

    from forgectl.shell import json_bytes, print_json

    value = {"name": "modèle", "n": [1, 2.5, None, True], "nested": {"empty": {}, "list": []}}
    assert json.loads(json_bytes(value)) == value
    assert json_bytes(value).decode() == json.dumps(value, indent=2, ensure_ascii=False)
    huge = {"n": 2**70}
    assert json.loads(json_bytes(huge)) == huge
    print_json(value)
    assert json.loads(capsys.readouterr().out) == value


def _groups(command: Any, path: str = "forgectl") -> list[tuple[str, Any]]:
    """Every command group under ``command`` (itself first), with its command line."""
    found = [(path, command)]
    for name, sub in getattr(command, "commands", {}).items():
        if getattr(sub, "commands", None) is not None:
            found += _groups(sub, f"{path} {name}")
    return found


def test_every_command_list_shows_one_summary_per_command_without_a_broken_line() -> None:
    """`forgectl --help` and each group's list give each command one summary, joined to one line:
    no docstring line break wraps a sentence mid-way in the terminal (typer's rich list keeps them)."""
    runner = CliRunner()
    for path, group in _groups(get_command(forgectl_app)):
        summaries = {name: sub.short_help or sub.help or "" for name, sub in group.commands.items()}  # as typer lists them
        for name, summary in summaries.items():
            assert summary, f"{path} {name}: no summary"
            assert "\n" not in summary, f"{path} {name}: {summary!r}"
            assert len(summary) <= 160, f"{path} {name}: a summary of {len(summary)} characters"
        shown = " ".join(runner.invoke(forgectl_app, [*path.split()[1:], "--help"], env={"COLUMNS": "200"}).output.split())
        for name, summary in summaries.items():
            assert f"{name} {summary}" in shown, (path, name)
