"""``python -m runtimes await``: wait until another run's files exist.

Argo orders the tasks of one Workflow, not Workflows between themselves, and Seldon starts a
model server as soon as its SeldonDeployment exists. A distillation that reads its teacher's
registered model, and a server of a version still training, therefore wait here (an init
container, or the first task of the DAG) for the `registry.json` that `register` writes last. A
server waits for its variant too: a registration that rejected it fails the wait with the step's
reason, so the pod stops in its init container saying why instead of a server finding no bundle.
"""

from __future__ import annotations

import json
import logging
import time

from runtimes._step import in_workspace, parse_config, run_step
from runtimes.errors import StepFailed, UpstreamFailed
from specs.stepconfig import AwaitConfig

log = logging.getLogger("forge.await")


def _failed_outcome(config: AwaitConfig) -> str | None:
    for outcome in config.outcomes:
        path = in_workspace(outcome)
        try:
            status = json.loads(path.read_text()).get("status")
        except (OSError, ValueError):
            continue  # not written yet (the run is still going), or being written
        if status not in (None, "Succeeded"):
            return f"{outcome}: {status}"
    return None


def _rejected(config: AwaitConfig) -> str | None:
    """Why the awaited registration has nothing to serve as the config's variant (its step rejected it)."""
    for path in config.registrations():
        try:
            registration = json.loads(in_workspace(path).read_text())
        except (OSError, ValueError) as exc:
            raise StepFailed(f"{config.what}: {path} cannot be read: {exc}") from exc
        rejected = config.rejected(registration)
        if rejected is not None:
            return rejected
    return None


def main(argv: list[str] | None = None) -> int:
    config, _ = parse_config(AwaitConfig, argv, "python -m runtimes await")
    deadline = time.monotonic() + config.timeout_seconds
    while True:
        missing = [p for p in config.paths if not in_workspace(p).exists()]
        if not missing:
            # Registered, but perhaps without the variant this server needs: it will never come.
            rejected = _rejected(config)
            if rejected is not None:
                raise UpstreamFailed(f"{config.what}: {rejected}")
            log.info("%s: ready", config.what)
            return 0
        failed = _failed_outcome(config)
        if failed:
            raise UpstreamFailed(f"{config.what}: the awaited run failed ({failed})")
        if time.monotonic() >= deadline:
            raise StepFailed(f"{config.what}: still missing after {config.timeout_seconds} s: {', '.join(missing)}")
        log.info("%s: waiting for %s", config.what, ", ".join(missing))
        time.sleep(min(config.poll_seconds, max(0.0, deadline - time.monotonic())))


def run(argv: list[str] | None = None) -> int:
    return run_step(main, argv)
