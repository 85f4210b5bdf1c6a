"""The traffic of the rollout tests and benches (tests/rollout/test_rollout_controller.py,
bench/rollback_latency.py, bench/rollout_faults.py): requests split between the stable and canary
model servers by the live weight (what the mesh does in a cluster), each one logged with its time,
role and outcome. Sends to the URLs it is given (127.0.0.1 in all of them)."""

from __future__ import annotations

import json
import random
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

ZERO = [0.0] * 64
BODY = json.dumps({"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": ZERO}]}).encode()


@dataclass
class Traffic:
    """Requests split between stable and canary by the live weights, each one logged with its time
    and outcome, so counts can be compared per role over windows of time."""

    stable_url: str
    canary_url: str
    weight: int = 0
    #: (time.monotonic() when the role was chosen, role, answered without error) of every request.
    log: list[tuple[float, str, bool]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def send(self, rng: random.Random) -> None:
        """One request to the role drawn with the current weight, logged."""
        # The time is taken before the weight is read: a request logged at or after a moment
        # the weight was set chose its role with that weight.
        at = time.monotonic()
        role = "canary" if rng.random() * 100 < self.weight else "stable"
        url = (self.canary_url if role == "canary" else self.stable_url) + "/v2/models/digits-mlp/infer"
        req = urllib.request.Request(url, data=BODY, headers={"content-type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                resp.read()
            ok = True
        except (urllib.error.URLError, OSError):
            ok = False
        self.log.append((at, role, ok))  # list.append is atomic: readers read while workers write

    def run(self, rate: float = 40.0) -> None:
        rng = random.Random(1)
        while not self.stop.is_set():
            self.send(rng)
            time.sleep(1.0 / rate)

    def count(self, role: str, ok: bool | None = None, since: float = 0.0, until: float = float("inf")) -> int:
        """Requests to ``role`` chosen in [since, until): all of them, or only the answered (``ok``) or failed ones."""
        return sum(1 for at, r, good in list(self.log) if r == role and since <= at < until and (ok is None or good is ok))

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
                    continue  # far behind: skip the tick rather than burst
                self.send(rng)

        threads = [threading.Thread(target=worker, args=(i + 1,), daemon=True) for i in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
