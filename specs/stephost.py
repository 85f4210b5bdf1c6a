"""The step host's contract, shared by its two sides: the local target's executor
(``reconciler.targets.local.stephost``) and the host in the runtime environment
(``runtimes.stephost``), which forks each workflow step from an interpreter that imported torch
once. Pure: what a forked step inherits instead of reading, and the packets the two exchange.

Packets, one JSON object each over a ``SOCK_SEQPACKET`` socket pair:

* host → :class:`Ready` once its libraries are imported;
* executor → :class:`StepRequest`, with the step's output (a pipe's write end) as an
  ``SCM_RIGHTS`` descriptor — or two, stdout's and stderr's, for a caller that reads them
  apart; host → :class:`Spawned`;
* host → :class:`Exited` when that process ends.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

#: Variables an interpreter reads at start-up, or the host's preloaded libraries when imported
#: (threads, allocators, accelerators): a forked step would inherit the host's values instead of
#: reading its own, so a step runs in the host only when its values of these equal the host's.
STARTUP_VARIABLES = re.compile(
    r"PYTHON.*|LD_.*|LANG|LANGUAGE|LC_.*|MALLOC_.*|"
    r"(OMP|GOMP|KMP|MKL|OPENBLAS|GOTO|VECLIB|NUMEXPR|BLIS)_.*|"
    r"(TORCH|TORCHINDUCTOR|PYTORCH|CUDA|NVIDIA|NCCL|CUBLAS|CUDNN|TRITON|XLA|HIP|ROCM|HSA)_.*")

#: The largest packet either side reads.
PACKET_BYTES = 1 << 20


def startup_settings(env: Mapping[str, str]) -> dict[str, str]:
    """The part of ``env`` a step forked by the host would inherit from it instead of reading."""
    return {k: v for k, v in env.items() if STARTUP_VARIABLES.fullmatch(k)}


@dataclass(frozen=True)
class StepRequest:
    """Run ``python -m argv[0] argv[1:]`` in ``cwd`` with exactly ``env``."""

    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: str


@dataclass(frozen=True)
class Ready:
    """The host imported its libraries and takes requests."""

    pid: int


@dataclass(frozen=True)
class Spawned:
    """The process of the last request."""

    pid: int


@dataclass(frozen=True)
class Exited:
    """A step's process ended: ``code`` as ``Popen.returncode`` says (< 0: killed by signal -code)."""

    pid: int
    code: int


Packet = StepRequest | Ready | Spawned | Exited


def encode(packet: Packet) -> bytes:
    """One packet's bytes."""
    if isinstance(packet, StepRequest):
        body: dict[str, object] = {"argv": list(packet.argv), "env": packet.env, "cwd": packet.cwd}
    elif isinstance(packet, Exited):
        body = {"exited": packet.pid, "code": packet.code}
    else:
        body = {"ready" if isinstance(packet, Ready) else "spawned": packet.pid}
    return json.dumps(body).encode()


def decode(data: bytes) -> Packet:
    """The packet in ``data`` (ValueError when it is none)."""
    body = json.loads(data)
    if not isinstance(body, dict):
        raise ValueError(f"not a step host packet: {data[:80]!r}")
    if "argv" in body:
        return StepRequest(tuple(str(a) for a in body["argv"]), {str(k): str(v) for k, v in body["env"].items()},
                           str(body["cwd"]))
    if "exited" in body:
        return Exited(int(body["exited"]), int(body["code"]))
    if "ready" in body:
        return Ready(int(body["ready"]))
    if "spawned" in body:
        return Spawned(int(body["spawned"]))
    raise ValueError(f"not a step host packet: {data[:80]!r}")
