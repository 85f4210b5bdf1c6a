"""The traffic of the rollout tests and benches (tests/rollout/test_rollout_controller.py,
bench/rollback_latency.py, bench/rollout_faults.py): requests split between the stable and canary
model servers by the live weight (what the mesh does in a cluster), each one logged with its time,
role and outcome. Sends to the URLs it is given (127.0.0.1 in all of them).

Every request has a denominator (issue 35): each one sent is logged with its outcome — answered,
or failed with a reason (:func:`failure_reason`: connection refused, reset, incomplete read,
timeout, a non-2xx status, or the exception's type) — whatever it raised, so no request vanishes
with a traffic thread; a tick the paced traffic skips (too far behind its schedule) is counted as
skipped. :meth:`Traffic.tally` adds them up per role."""

from __future__ import annotations

import http.client
import json
import random
import socket
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from typing import NamedTuple

ZERO = [0.0] * 64
BODY = json.dumps({"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": ZERO}]}).encode()


class Sent(NamedTuple):
    """One request: when its role was chosen (``time.monotonic()``), the role, whether it was
    answered with a 2xx, and why not (``""`` when it was)."""

    at: float
    role: str
    ok: bool
    reason: str = ""


def failure_reason(exc: BaseException) -> str:
    """What a failed request met, in a few words a table can count by."""
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code}"
    cause = exc.reason if isinstance(exc, urllib.error.URLError) and isinstance(exc.reason, BaseException) else exc
    if isinstance(cause, ConnectionRefusedError):
        return "connection refused"
    if isinstance(cause, (ConnectionResetError, http.client.RemoteDisconnected, BrokenPipeError)):
        return "connection reset"
    if isinstance(cause, http.client.IncompleteRead):
        return "incomplete read"
    if isinstance(cause, (TimeoutError, socket.timeout)):
        return "timeout"
    return type(cause).__name__


@dataclass(frozen=True)
class Tally:
    """The requests of one role over a span: sent = answered + failed, and the failures by reason."""

    sent: int
    answered: int
    failed: int
    reasons: dict[str, int]

    def to_json(self) -> dict[str, object]:
        return {"sent": self.sent, "answered": self.answered, "failed": self.failed, "reasons": dict(self.reasons)}


@dataclass
class Traffic:
    """Requests split between stable and canary by the live weights, each one logged with its time
    and outcome, so counts can be compared per role over windows of time."""

    stable_url: str
    canary_url: str
    weight: int = 0
    #: Every request sent (:class:`Sent`: when the role was chosen, role, answered, why not).
    log: list[Sent] = field(default_factory=list)
    #: Ticks of the schedule skipped without sending (:class:`PacedTraffic` far behind), by time.
    skipped: list[float] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def send(self, rng: random.Random) -> None:
        """One request to the role drawn with the current weight, logged."""
        # The time is taken before the weight is read: a request logged at or after a moment
        # the weight was set chose its role with that weight.
        at = time.monotonic()
        role = "canary" if rng.random() * 100 < self.weight else "stable"
        url = (self.canary_url if role == "canary" else self.stable_url) + "/v2/models/digits-mlp/infer"
        req = urllib.request.Request(url, data=BODY, headers={"content-type": "application/json"}, method="POST")
        reason = ""
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                resp.read()
                if not 200 <= resp.status < 300:
                    reason = f"HTTP {resp.status}"
        except Exception as exc:  # noqa: BLE001 — every request is counted, whatever it raised
            reason = failure_reason(exc)
        self.log.append(Sent(at, role, not reason, reason))  # list.append is atomic: readers read while workers write

    def run(self, rate: float = 40.0) -> None:
        rng = random.Random(1)
        while not self.stop.is_set():
            self.send(rng)
            time.sleep(1.0 / rate)

    def tally(self, role: str, since: float = 0.0, until: float = float("inf")) -> Tally:
        """The requests to ``role`` chosen in [since, until), answered and failed, with the reasons."""
        sent = [r for r in list(self.log) if r.role == role and since <= r.at < until]
        reasons = Counter(r.reason for r in sent if not r.ok)
        return Tally(len(sent), sum(1 for r in sent if r.ok), sum(reasons.values()), dict(sorted(reasons.items())))

    def skipped_between(self, since: float = 0.0, until: float = float("inf")) -> int:
        """Ticks of the schedule skipped in [since, until) (no role chosen: nothing was sent)."""
        return sum(1 for t in list(self.skipped) if since <= t < until)

    def count(self, role: str, ok: bool | None = None, since: float = 0.0, until: float = float("inf")) -> int:
        """Requests to ``role`` chosen in [since, until): all of them, or only the answered (``ok``) or failed ones."""
        return sum(1 for s in list(self.log) if s.role == role and since <= s.at < until and (ok is None or s.ok is ok))

    def silent_windows(self, role: str, since: float, until: float, width: float) -> list[float]:
        """Starts (seconds after ``since``) of the consecutive ``width``-second windows in which ``role``
        answered nothing: an outage of ``role`` longer than 2 × ``width`` leaves at least one."""
        starts, t = [], since
        while t + width <= until:
            if self.count(role, ok=True, since=t, until=t + width) == 0:
                starts.append(round(t - since, 1))
            t += width
        return starts


class PacedTraffic(Traffic):
    """:class:`Traffic` paced on a schedule by a few workers, so that the rate holds although each
    request takes milliseconds (the benches)."""

    def run(self, rate: float = 40.0, workers: int = 4) -> None:
        lock = threading.Lock()
        start, ticket = time.monotonic(), [0]

        def worker(seed: int) -> None:
            rng = random.Random(seed)
            while not self.stop.is_set():
                with lock:
                    due = start + ticket[0] / rate
                    ticket[0] += 1
                if self.stop.wait(max(0.0, due - time.monotonic())):
                    return
                if time.monotonic() - due > 1.0:
                    self.skipped.append(due)  # far behind: skip the tick rather than burst, and say so
                    continue
                self.send(rng)

        threads = [threading.Thread(target=worker, args=(i + 1,), daemon=True) for i in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
