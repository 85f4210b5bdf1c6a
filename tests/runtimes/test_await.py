"""`python -m runtimes await`, the init container of every model server and the wait of a
distillation for its teacher: it holds until the version is registered, fails at once when the
version's run failed, and — for a server of one variant — when the registration says a step
rejected that variant (no bundle of it will ever come)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from renderers.workflow import await_registration, registry_dir, version_dir
from runtimes import await_files
from specs.stepconfig import EXIT_UPSTREAM_FAILED, WORKSPACE_ENV

MODEL, VERSION = "digits-mlp", "0123456789ab"
REASON = "accuracy dropped 61.3 points, more than the allowed 0.5"


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(WORKSPACE_ENV, str(tmp_path))
    return tmp_path


def _register(workspace: Path, rejected: dict[str, object]) -> None:
    """What `register` writes last: the version's ``registry.json``."""
    path = workspace / registry_dir(MODEL, VERSION) / "registry.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"model": MODEL, "version": VERSION, "variants": {"base": {}, "int8": {}},
                                "rejected": rejected}))


def _wait(variant: str | None, timeout: int = 0) -> int:
    config = await_registration(MODEL, VERSION, f"model {MODEL} {VERSION}", variant).model_copy(
        update={"timeout_seconds": timeout, "poll_seconds": 0.05})
    return await_files.run(["--config-json", config.model_dump_json(by_alias=True)])


def test_a_registered_variant_is_ready(workspace: Path) -> None:
    _register(workspace, {"gutted": {"reason": REASON, "report": {}}})
    assert _wait("int8") == 0
    assert _wait(None) == 0  # a server that picks among the registered variants (`select: fastest`)


def test_a_rejected_variant_fails_the_wait_at_once_with_the_steps_reason(workspace: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    _register(workspace, {"gutted": {"reason": REASON, "report": {}}})
    assert _wait("gutted", timeout=3600) == EXIT_UPSTREAM_FAILED
    error = capsys.readouterr().err
    assert f"variant gutted of version {VERSION} was rejected: {REASON}" in error, error


def test_a_version_not_registered_yet_is_waited_for_and_a_failed_run_ends_the_wait(workspace: Path,
                                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert _wait("int8", timeout=0) != 0  # nothing registered within the time given
    assert "still missing" in capsys.readouterr().err
    outcome = workspace / version_dir(MODEL, VERSION) / "outcome.json"
    outcome.parent.mkdir(parents=True)
    outcome.write_text(json.dumps({"status": "Failed"}))
    assert _wait("int8", timeout=3600) == EXIT_UPSTREAM_FAILED
    assert "the awaited run failed" in capsys.readouterr().err
