"""Who of several `forgectl reconcile --watch` acts: the one holding the environment's lock.

The lock is the one an apply takes (`Target.lock`: the Lease `forgectl-<environment>` on the
kubernetes target, the `flock` on `.forge/<env>/lock` on the local one). A watch holds it across
its passes, as a leader holds its election Lease: only the holder walks rollouts, and every write
it makes — a traffic move, a rollout state, an Event — is checked against the lock's fence just
before it is sent (:mod:`reconciler.targets.kubernetes.lease`). Another watch waits, taking the
lock over once its holder is gone (killed: its Lease expires; the local flock is freed with the
process) or deposed (paused past its Lease). A deposed holder that resumes finds its fence lost:
its next write raises :class:`~reconciler.errors.LeaseLost` unsent, and it follows from then on.
A write checked just before a pause and sent after it is the API server's to refuse: traffic
moves and rollout states carry the `resourceVersion` read and a new holder stamps its tenure
first (:mod:`reconciler.targets.kubernetes.rollout`); the 409 deposes the paused one.
"""

from __future__ import annotations

import getpass
import os
import socket
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field

from reconciler.errors import LockHeldError
from reconciler.targets.base import Fence, LeaseTiming

#: How long a watch's Lease lasts by default: client-go's leader election (15 s, renew deadline 10 s,
#: retry 2 s), as the in-cluster controller holds it.
WATCH_LEASE_SECONDS = 15.0


def watch_lease(duration: float = WATCH_LEASE_SECONDS) -> LeaseTiming:
    """The Lease of a watch lasting ``duration`` seconds, in client-go's proportions (15/10/2):
    renewed every 2/15 of it, nothing written in its last third."""
    return LeaseTiming(duration=duration, renew=duration * 2 / 15, margin=duration / 3)


def default_holder() -> str:
    """The name a watch's lock records: who, where, which process."""
    return f"{getpass.getuser()}@{socket.gethostname()}:{os.getpid()} (reconcile --watch)"


@dataclass
class Leadership:
    """The environment's lock held across a controller's passes. ``lock`` is the target's
    (`Target.lock`), ``holder`` the name the lock records."""

    lock: Callable[[str | None], AbstractContextManager[Fence]]
    holder: str
    fence: Fence | None = None
    #: Why this watch does not lead now (who holds the lock, or why it was lost); None while it leads.
    waiting: str | None = None
    _stack: ExitStack = field(default_factory=ExitStack, repr=False)

    def leading(self) -> bool:
        """Whether this watch holds the lock now, taking it when it is free. A fence found lost is
        let go (its Lease is not released: it may be another's now), and this pass follows: the
        lock is asked for again at the next one."""
        if self.fence is not None and not self.fence.held:
            self.deposed("its fencing deadline passed or the Lease was taken over (paused past it?)")
            return False
        if self.fence is None:
            try:
                self.fence = self._stack.enter_context(self.lock(self.holder))
            except LockHeldError as exc:
                self.waiting = str(exc)
                return False
            self.waiting = None
        return True

    def deposed(self, why: str) -> None:
        """The lock is not ours any more (a write found it lost, ``why``): follow from now on."""
        self.waiting = f"lost the environment's lock: {why}"
        self.release()

    def release(self) -> None:
        """Let the lock go (released only while it is surely still ours: see `Target.lock`)."""
        self._stack.close()
        self.fence = None
