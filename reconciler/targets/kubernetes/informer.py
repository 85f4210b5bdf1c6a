"""A watch-fed cache of one kind's objects: client-go's reflector and store, the part the
controller's rollout walk needs.

The walk read every SeldonDeployment of its environment with a LIST each pass: at 10,000
endpoints that was most of a 3.4 s walk, walks back to back, and the API server encoding 10,000
objects each time (bench/controller_scale.py). An :class:`Informer` LISTs once, then WATCHes from
that list's `resourceVersion` and applies each event to its store, so a pass reads memory and the
API server sends only what changed.

What a pass reads keeps the meaning the LIST gave it:

* The store trails the API server by the watch's latency (milliseconds). Every write the
  controller makes carries the `resourceVersion` it decided on as a precondition, so a decision on
  an object that moved since is refused (409) and the next pass decides again: a stale read costs
  a pass, never a wrong write. What the controller writes itself goes into the store at once
  (:meth:`Informer.observe`), so its next pass does not decide on its own write's past.
* A watch that ends (the server's ``timeoutSeconds``) resumes from the last `resourceVersion` seen
  (bookmarks keep it current while nothing changes); one the server refuses as too old (410 Gone,
  or an ERROR event with code 410) is followed by a fresh LIST, which replaces the store whole (so
  a delete missed meanwhile is not kept).
* While the store is not in step — no LIST has landed, or the last LIST or watch failed and none
  has worked since — :meth:`Informer.items` says None and the caller LISTs itself: an API server
  that does not answer is the pass's error, as it was before there was a cache.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger("forge.informer")

#: Seconds the server keeps a watch open (it then ends it; the informer resumes at once). client-go
#: picks 5-10 min at random; shorter here keeps a silently dead connection from hiding long.
WATCH_SECONDS = 120
#: Seconds between tries after a LIST or watch failed, doubling up to :data:`MAX_BACKOFF`.
BACKOFF = 0.5
MAX_BACKOFF = 15.0

#: Numbers for the stores' changes, one count for every informer of the process: a mark (see
#: :meth:`Informer.mark`) names one state of one store and is never repeated by another.
_CHANGES = itertools.count(1)


class WatchExpired(Exception):
    """The server no longer has the history since the `resourceVersion` a watch asked for (410)."""


class WatchStream(Protocol):
    """One open watch: its events as (type, object), and a way to end it from another thread."""

    def __iter__(self) -> Iterator[tuple[str, dict[str, Any]]]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Snapshot:
    """A consistent LIST: its items and the `resourceVersion` a watch continues from."""

    items: list[dict[str, Any]]
    resource_version: str


def _key(obj: dict[str, Any]) -> tuple[str, str]:
    md = obj.get("metadata") or {}
    return md.get("namespace") or "", md.get("name") or ""


def _newer(incoming: dict[str, Any], held: dict[str, Any] | None) -> bool:
    """Whether ``incoming`` is at least as new as ``held``. A `resourceVersion` is opaque to
    clients, but every API server backed by etcd hands out its revisions, which only grow: an event
    delivered after the controller put its own (later) write in the store must not take it back.
    Anything that is not a number is taken as newer (the watch's order is the server's)."""
    if held is None:
        return True
    try:
        return int(incoming["metadata"]["resourceVersion"]) >= int(held["metadata"]["resourceVersion"])
    except (KeyError, TypeError, ValueError):
        return True


class Informer:
    """A store of one kind's objects (as one LIST and selector name them), kept by a watch in a
    thread of its own from :meth:`start` until :meth:`stop`."""

    def __init__(self, name: str, lister: Callable[[], Snapshot], watcher: Callable[[str, int], WatchStream]) -> None:
        self.name = name
        self._list = lister
        self._watch = watcher
        self._lock = threading.Lock()
        self._store: dict[tuple[str, str], dict[str, Any]] = {}
        self._version = ""
        #: Whether the store is in step with the server (see the module docstring).
        self._live = False
        #: The number of the store's last change (see :meth:`mark`).
        self._changed = next(_CHANGES)
        self._stopping = threading.Event()
        self._stream: WatchStream | None = None
        self._thread: threading.Thread | None = None
        #: LISTs made (the first included) and watches opened: what a test and /metrics count.
        self.lists = 0
        self.watches = 0

    # -- what a pass reads -------------------------------------------------------------------
    def items(self) -> list[dict[str, Any]] | None:
        """The objects as of the last event, or None while the store is not in step."""
        with self._lock:
            return list(self._store.values()) if self._live else None

    def mark(self) -> int | None:
        """A number that changes whenever the store does (an event applied, a LIST, an object
        given to :meth:`observe`), None while the store is not in step: a reader that saw the same mark
        before has read these very objects already."""
        with self._lock:
            return self._changed if self._live else None

    def observe(self, obj: dict[str, Any]) -> None:
        """Put an object the caller wrote (the server's answer) in the store, if the store holds it
        and it is not older than what the store holds (see :func:`_newer`)."""
        key = _key(obj)
        with self._lock:
            held = self._store.get(key)
            if held is not None and _newer(obj, held):
                self._store[key] = obj
                self._changed = next(_CHANGES)

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self, first: Snapshot | None = None) -> None:
        """Keep the store from now on; ``first``: a LIST the caller made already (no second one)."""
        if first is not None:
            self._replace(first)
        self._thread = threading.Thread(target=self._run, name=f"informer {self.name}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """End the watch (its connection closed, so a read blocked on it returns) and the thread."""
        self._stopping.set()
        stream = self._stream
        if stream is not None:
            stream.close()
        if self._thread is not None:
            self._thread.join(timeout)

    # -- the thread --------------------------------------------------------------------------
    def _run(self) -> None:
        pause = BACKOFF
        while not self._stopping.is_set():
            try:
                if not self._version:
                    self._replace(self._list())
                self._follow()
                pause = BACKOFF
            except WatchExpired:
                log.info("%s: the watch's resourceVersion %s expired: listing again", self.name, self._version)
                self._version = ""
            except Exception as exc:  # the API server down, a connection cut: tell the readers, retry
                if self._stopping.is_set():
                    return
                with self._lock:
                    self._live = False
                log.warning("%s: %s: %s (again in %.1f s)", self.name, type(exc).__name__, exc, pause)
                self._stopping.wait(pause)
                pause = min(pause * 2, MAX_BACKOFF)
                self._version = ""  # from a fresh LIST: what happened meanwhile is not in a watch we trust

    def _replace(self, snapshot: Snapshot) -> None:
        self.lists += 1
        with self._lock:
            self._store = {_key(obj): obj for obj in snapshot.items}
            self._version = snapshot.resource_version
            self._changed = next(_CHANGES)
            self._live = True

    def _follow(self) -> None:
        """One watch from the store's `resourceVersion`, applied event by event until it ends."""
        stream = self._watch(self._version, WATCH_SECONDS)
        self._stream = stream
        self.watches += 1
        try:
            if self._stopping.is_set():
                return
            self._apply(stream)
        finally:
            self._stream = None
            stream.close()

    def _apply(self, events: Iterable[tuple[str, dict[str, Any]]]) -> None:
        for kind, obj in events:
            if kind == "ERROR":
                if obj.get("code") == 410:
                    raise WatchExpired(obj.get("message") or "410 Gone")
                raise RuntimeError(f"the watch said: {obj.get('message') or obj}")
            version = (obj.get("metadata") or {}).get("resourceVersion") or self._version
            with self._lock:
                if kind == "DELETED":
                    if self._store.pop(_key(obj), None) is not None:
                        self._changed = next(_CHANGES)
                elif kind in ("ADDED", "MODIFIED") and _newer(obj, self._store.get(_key(obj))):
                    self._store[_key(obj)] = obj
                    self._changed = next(_CHANGES)
                self._version = version
                self._live = True
