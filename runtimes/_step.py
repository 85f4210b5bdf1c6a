"""What every step shares: reading its config, resolving workspace paths, logging, JSON output."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from runtimes.errors import StepFailed
from specs.stepconfig import DEFAULT_WORKSPACE, WORKSPACE_ENV

C = TypeVar("C", bound=BaseModel)
log = logging.getLogger("forge.runtimes")


def workspace() -> Path:
    """The workspace root: ``$FORGE_WORKSPACE`` (default ``/forge/workspace``)."""
    return Path(os.environ.get(WORKSPACE_ENV, DEFAULT_WORKSPACE))


def source_root() -> Path:
    """Root that ``file://`` and ``text://`` URIs are relative to: ``$FORGE_SOURCE_ROOT`` or the cwd."""
    return Path(os.environ.get("FORGE_SOURCE_ROOT", os.getcwd()))


def in_workspace(relative: str) -> Path:
    """Resolve a config path (relative to the workspace; absolute paths are kept as given)."""
    path = Path(relative)
    return path if path.is_absolute() else workspace() / path


def forge_cache() -> Path:
    return Path(os.environ.get("FORGE_CACHE", Path.home() / ".cache" / "forge"))


def setup_logging() -> None:
    logging.basicConfig(
        level=os.environ.get("FORGE_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def parse_config(cls: type[C], argv: list[str] | None, prog: str, extra: Callable[[argparse.ArgumentParser], None] | None = None) -> tuple[C, argparse.Namespace]:
    parser = argparse.ArgumentParser(prog=prog, description=(cls.__doc__ or "").strip().splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", help="path of the step's JSON config")
    source.add_argument("--config-json", help="the step's JSON config, inline")
    if extra is not None:
        extra(parser)
    args = parser.parse_args(argv)
    if args.config is not None:
        try:
            text = Path(args.config).read_text()
        except OSError as exc:
            raise StepFailed(f"cannot read config {args.config}: {exc.strerror}") from None
    else:
        text = args.config_json
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise StepFailed(f"config is not JSON: {exc}") from None
    try:
        return cls.model_validate(data), args
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(root)'}: {err['msg']}" for err in exc.errors()
        )
        raise StepFailed(f"invalid {cls.__name__}: {problems}") from None


def write_json(path: Path, value: Any) -> None:
    """Write JSON atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as fh:
        json.dump(value, fh, indent=2, sort_keys=True)
        fh.write("\n")
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise StepFailed(f"missing {path}") from None
    except json.JSONDecodeError as exc:
        raise StepFailed(f"{path} is not JSON: {exc}") from None


def emit(event: str, **fields: Any) -> None:
    """One machine-readable JSON line on stdout (progress bars in the CLI read these)."""
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


def first_attempt(marker: Path, what: str) -> bool:
    """Whether this is the first attempt of a step to get here: it creates ``marker`` (exclusively:
    of processes that get here together, one is first), with ``what`` in it. Any later attempt
    finds the marker — it lives in the step's output folder, which the attempts share (the
    workspace volume) — and is not the first."""
    marker.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(marker, "x") as fh:
            fh.write(f"{what} at {time.time():.3f}\n")
    except FileExistsError:
        log.info("fault injection: %s exists (an earlier attempt was the first)", marker)
        return False
    return True


def hold_first_attempt(marker: Path, seconds: int) -> bool:
    """Fault injection for retry drills (a Model's ``faultInjection.holdFirstAttemptSeconds``):
    the first attempt of a step to get here (:func:`first_attempt`) says so — a
    ``{"event": "hold"}`` line on stdout and a warning — and waits ``seconds`` before it carries on.

    Why: a drill that kills a running step (deletes its pod) must hit a step that is still
    running. A sleep before the fault is a coin toss against a step that takes seconds; a step
    that holds until it is killed is not. Later attempts do not wait, so the retry runs as usual.
    Returns whether this one held."""
    if not first_attempt(marker, f"held for {seconds} s"):
        return False
    log.warning("fault injection: the first attempt holds for %d s before it runs (a drill: kill it now)", seconds)
    emit("hold", seconds=seconds, marker=str(marker))
    time.sleep(seconds)
    log.warning("fault injection: held %d s and not killed; carrying on", seconds)
    return True


def kill_first_attempt(marker: Path) -> None:
    """Fault injection for retry drills (a Model's ``faultInjection.killFirstAttempt``): the first
    attempt of a step to get here (:func:`first_attempt`) says so — a ``{"event": "kill"}`` line
    and a warning — and kills itself with SIGKILL, as the kernel's OOM killer would: its container
    exits 137 and Argo decides, by the step's `retryStrategy`, to retry it. Later attempts return
    at once. Deterministic where deleting a running pod is not (Argo may re-create a pod deleted
    under it instead of recording an attempt)."""
    if not first_attempt(marker, "killed"):
        return
    log.warning("fault injection: the first attempt kills itself (SIGKILL; a drill of the retry path)")
    emit("kill", signal="SIGKILL", marker=str(marker))
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


#: Where the kubelet reads a container's termination message (the default
#: `terminationMessagePath`, a file it mounts writable for any user); absent off a cluster.
TERMINATION_LOG = Path("/dev/termination-log")


def leave_termination_message(text: str) -> None:
    """Leave ``text`` as the container's termination message: the pod's status then says why
    the step failed (`kubectl describe`; Forge reads a shadow's held server from it). Nothing
    where no kubelet mounted the file."""
    if TERMINATION_LOG.is_file():
        try:
            TERMINATION_LOG.write_text(text[:4096])  # the kubelet keeps at most 4 KiB
        except OSError:
            pass  # the message is a courtesy; the log says it too


def run_step(main: Callable[[list[str] | None], int | None], argv: list[str] | None = None) -> int:
    """Run a step's main; turn a :class:`StepFailed` into its message (on stderr, and as the
    container's termination message) and exit code."""
    setup_logging()
    try:
        return int(main(argv) or 0)
    except StepFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        leave_termination_message(str(exc))
        return exc.exit_code
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
