"""The environment Lease as its holder sees it while writing: a fence (:class:`~reconciler.targets.base.Fence`).

A holder may write only while the Lease is surely its own: until its **fencing deadline** — the
Lease's `renewTime` + `leaseDurationSeconds` as the API server last confirmed them (the response to
the create or renewal that stored them), measured on this process's monotonic clock from the moment
that request was sent (so a jump of the wall clock cannot stretch it), less a safety margin for clock
skew between holders and a request's time in flight. Another holder takes the Lease over only once
`renewTime` + duration has passed on its own clock; the margin keeps this holder's last write before
that. A process paused past the deadline (SIGSTOP, a VM frozen, a long GC) finds it passed when it
resumes and sends nothing more: every write checks :meth:`LeaseFence.check` right before it goes
out. What remains — a write checked just before the pause and sent just after — is refused by the
API server through the write's preconditions (`resourceVersion` as read, create-only), so a stale
write cannot land on an object another holder changed.

Lost is final: a deadline passed, the Lease deleted or found with another holder, and this fence
never holds again (a renewal that would still succeed is not made: the holder has been deposed in
principle, and whoever took over may be writing).

A holder's tenure is named by its :class:`FenceToken` — the Lease's uid, its `leaseTransitions`
(one more at each take-over, as client-go counts them) and the holder — which the rollout backend
stamps on the objects it writes (:mod:`reconciler.targets.kubernetes.rollout`), so that a new
holder's first write bumps every rollout's `resourceVersion` before it acts.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from reconciler.errors import LeaseLost


@dataclass(frozen=True)
class FenceToken:
    """One tenure of the environment's Lease: the Lease object (``lease``: its uid), how many times
    it changed hands before this tenure began (``transitions``: its `spec.leaseTransitions`) and who
    holds it. Tenures of one Lease object are ordered by ``transitions``; those of different Lease
    objects (deleted and created again) are not comparable."""

    lease: str
    transitions: int
    holder: str

    @classmethod
    def of(cls, stored: Mapping[str, Any]) -> FenceToken | None:
        """The tenure a stored Lease records (None without a uid or holder)."""
        uid = (stored.get("metadata") or {}).get("uid")
        spec = stored.get("spec") or {}
        holder = spec.get("holderIdentity")
        if not uid or not holder:
            return None
        return cls(str(uid), int(spec.get("leaseTransitions") or 0), str(holder))

    def to_text(self) -> str:
        """The token as an annotation's value (compact JSON)."""
        return json.dumps({"lease": self.lease, "transitions": self.transitions, "holder": self.holder},
                          separators=(",", ":"))

    @classmethod
    def from_text(cls, text: str | None) -> FenceToken | None:
        """The token :meth:`to_text` wrote (None when absent or unreadable)."""
        if not text:
            return None
        try:
            raw = json.loads(text)
            return cls(str(raw["lease"]), int(raw["transitions"]), str(raw["holder"]))
        except (ValueError, TypeError, KeyError):
            return None

    def supersedes(self, other: FenceToken) -> bool:
        """Whether this tenure of the same Lease began after ``other``'s."""
        return self.lease == other.lease and self.transitions > other.transitions


class LeaseFence:
    """The fence of one held Lease (``ref``, held by ``holder``); ``margin`` seconds of safety.
    Thread-safe: the renewer updates it while the apply's writers check it."""

    def __init__(self, ref: str, holder: str, margin: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.ref, self.holder, self.margin, self.clock = ref, holder, margin, clock
        self._guard = threading.Lock()
        self._deadline = -math.inf
        self._lost: str | None = None
        #: The Lease as last stored (its resourceVersion is the renewal's precondition).
        self.stored: dict[str, Any] = {}

    # -- what the renewer tells it -------------------------------------------------------------
    def confirmed(self, stored: Mapping[str, Any], sent_at: float) -> None:
        """The server stored ``stored`` (our create or renewal), sent at ``sent_at`` (monotonic)."""
        duration = float((stored.get("spec") or {}).get("leaseDurationSeconds") or 0)
        with self._guard:
            self.stored = dict(stored)
            if self._lost is None:
                self._deadline = max(self._deadline, sent_at + duration - self.margin)

    def seen(self, stored: Mapping[str, Any]) -> None:
        """The Lease read back still names this holder (its resourceVersion moved for another
        reason): renew from that version; the deadline does not move."""
        with self._guard:
            self.stored = dict(stored)

    def lose(self, why: str) -> None:
        """The Lease is not ours any more (the first reason is kept)."""
        with self._guard:
            if self._lost is None:
                self._lost = why

    # -- what the writers ask -------------------------------------------------------------------
    @property
    def token(self) -> FenceToken | None:
        """This holder's tenure, as the Lease was last stored (None before it was)."""
        with self._guard:
            return FenceToken.of(self.stored)

    @property
    def deadline(self) -> float:
        """The monotonic time after which nothing may be sent."""
        with self._guard:
            return self._deadline

    @property
    def lost(self) -> str | None:
        """Why the Lease is not held (lost, or not taken yet), or None while it is."""
        self._expire()
        with self._guard:
            if self._lost is None and self._deadline == -math.inf:
                return "not taken yet"
            return self._lost

    @property
    def held(self) -> bool:
        """Whether the Lease is surely ours now."""
        return self.lost is None

    def check(self, what: str) -> None:
        """Raise :class:`LeaseLost` (``what`` was not sent) unless the Lease is held now."""
        why = self.lost
        if why is not None:
            raise LeaseLost(f"{what}: not sent: the environment's {self.ref} is no longer held by {self.holder} ({why}); "
                            "the apply stops here — another apply may hold the environment now. Plan again and apply.")

    def _expire(self) -> None:
        now = self.clock()
        with self._guard:
            if self._lost is None and self._deadline > -math.inf and now >= self._deadline:
                late = now - self._deadline
                self._lost = (f"not renewed in time: its fencing deadline (renewTime + leaseDurationSeconds as the API "
                              f"server last confirmed them, less {self.margin:g} s) passed {late:.1f} s ago")
