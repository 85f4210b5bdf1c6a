"""The local target's weighted router: one HAProxy (Debian's ``/usr/sbin/haproxy``) per endpoint in
front of its stable and canary model servers.

Why HAProxy rather than nginx or a hand-written proxy:

- weights, addresses and server states change at runtime through its admin socket
  (``set server be/x weight|addr|state``) — no reload, no restart, no dropped connection; nginx
  open source needs a config reload for an upstream change (and the reload re-creates workers);
- ``state drain`` stops new requests to a server while its in-flight ones finish, and ``show stat``
  says when none are left, so a server is only ever stopped once it is idle;
- active health checks (``/v2/health/ready``), layer-7 retries on connection failures, and a
  built-in Prometheus exporter (``USE_PROMEX``: ``haproxy_backend_*`` / ``haproxy_server_*``);
- a Debian package, a single small process.

Why one HAProxy per endpoint (and not one per environment with a backend per endpoint): the
configuration of a running HAProxy never changes — adding or removing an endpoint starts or stops
its own process, and never reloads (re-execs) a router that other endpoints' traffic goes through.
Each endpoint keeps its own port, its own socket and its own log; the cost is a few MB per endpoint.

Slots. The backend pre-declares four servers, two per role: ``stable-a``/``stable-b`` and
``canary-a``/``canary-b``. One slot of a role is active; the other is where a *replacement* server
(a new version, a changed config) is put in beside it: the new slot gets the address and weight and
goes ``ready``; once HAProxy's health check says it is UP the old slot is set to ``drain``, and
when it holds no session it goes to ``maint``. With only one slot per role, replacing the stable
server while a canary is live would need to shift all traffic to the canary for a moment.

State lives in the StateDB: the process record ``router/<endpoint>`` (PID + start time) and the kv
entry ``router/<endpoint>`` (ports, folder, the address and weight of every slot). ``ensure()``
reuses a running router, or starts one again on the same ports and restores its slots.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import urllib.request
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reconciler.targets.local import processes
from reconciler.targets.local.state import StateDB

HAPROXY = "/usr/sbin/haproxy"
BACKEND = "be"
#: Slot families: the rollout's two roles, and four for the arms of an experiment (an arm's name is
#: mapped to a free `armN` family and keeps it while it is routed).
ROLES = ("stable", "canary", "arm0", "arm1", "arm2", "arm3")
ARM_FAMILIES = ROLES[2:]
SLOTS = {role: (f"{role}-a", f"{role}-b") for role in ROLES}
#: The header the backend hashes on (`balance hdr(...)`, `hash-type consistent`): set by the
#: frontend from the sticky header or cookie, removed from what clients send. Without it HAProxy
#: falls back to weighted round robin, so an endpoint without `sticky` balances as before.
STICKY_HEADER = "X-Forge-Sticky"
#: Bumped when the generated configuration changes meaning: a router running an older one is
#: started again (same port, slots restored) the next time it is ensured.
CONFIG_VERSION = 2
Addr = tuple[str, int]
Sticky = tuple[str, str] | None  # ("header" | "cookie", name)
KEEP: Any = object()  # ensure(): keep the recorded sticky setting


class RouterError(RuntimeError):
    """The router could not be started or changed (a message for the user)."""


def ensure_package(binary: str, package: str) -> str:
    """Path of ``binary``; installs Debian's ``package`` with apt-get when it is missing."""
    if os.access(binary, os.X_OK):
        return binary
    found = shutil.which(Path(binary).name)
    if found:
        return found
    if shutil.which("apt-get") is None:
        raise RouterError(f"{binary} is missing and apt-get is not available: install the {package} package")
    sudo: list[str] = []
    if os.geteuid() != 0:
        if shutil.which("sudo") is None:
            raise RouterError(f"{binary} is missing: run `sudo apt-get install -y {package}`")
        sudo = ["sudo", "-n"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "--no-install-recommends", package]):
        proc = subprocess.run(sudo + cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RouterError(f"{binary} is missing and `{' '.join(cmd)}` failed "
                              f"(install the {package} package yourself): {proc.stderr.strip()[-1500:]}")
    found = binary if os.access(binary, os.X_OK) else shutil.which(Path(binary).name)
    if not found:
        raise RouterError(f"apt-get installed {package} but {binary} is not there")
    return found


@dataclass(frozen=True)
class ServerStat:
    """One slot as HAProxy reports it (``show stat``)."""

    slot: str
    addr: str
    status: str  # UP, DOWN, MAINT, DRAIN, NOLB, "UP 1/2", ...
    weight: int
    sessions: int  # current sessions (in flight)
    queued: int
    total: int  # sessions since start
    check: str  # last health check result (L7OK, L4CON, INI, ...)

    @property
    def up(self) -> bool:
        return self.status.startswith("UP") or self.status == "DRAIN"


class Router:
    """The HAProxy of one endpoint (see the module docstring)."""

    def __init__(self, db: StateDB, state_dir: str | os.PathLike[str], endpoint: str, *,
                 health_path: str = "/v2/health/ready", haproxy: str = HAPROXY) -> None:
        self.db, self.endpoint, self.health_path, self.haproxy = db, endpoint, health_path, haproxy
        self.state_dir = Path(state_dir)
        self.dir = self.state_dir / "routers" / endpoint
        self.name = f"router/{endpoint}"

    # -- state -------------------------------------------------------------------------------
    def _state(self) -> dict[str, Any]:
        state = self.db.kv_get(self.name)
        return state if isinstance(state, dict) else {}

    def _save(self, state: dict[str, Any]) -> None:
        self.db.kv_set(self.name, state)

    @property
    def port(self) -> int | None:
        return self._state().get("port")

    @property
    def url(self) -> str:
        """Where clients send requests (``http://127.0.0.1:PORT``)."""
        port = self.port
        if not port:
            raise RouterError(f"the router of endpoint {self.endpoint!r} was never started")
        return f"http://127.0.0.1:{port}"

    @property
    def metrics_target(self) -> str:
        """``host:port`` of the router's Prometheus exporter (path ``/metrics``)."""
        port = self._state().get("metrics_port")
        if not port:
            raise RouterError(f"the router of endpoint {self.endpoint!r} was never started")
        return f"127.0.0.1:{port}"

    def running(self) -> bool:
        record = self.db.process(self.name)
        return record is not None and processes.alive(record)

    # -- lifecycle ---------------------------------------------------------------------------
    def ensure(self, timeout: float = 20.0, sticky: Sticky = KEEP) -> str:
        """Start the router unless it runs; idempotent across ``forgectl`` invocations. Returns its URL.

        ``sticky`` (``("header", "x-user-id")`` or ``("cookie", "uid")``) is part of the written
        configuration: a router running with another setting (or an older configuration) is
        started again on the same port with its slots restored."""
        state = self._state()
        if sticky is KEEP:
            recorded = (state.get("config") or {}).get("sticky")
            sticky = (recorded[0], recorded[1]) if recorded else None
        wanted = {"version": CONFIG_VERSION, "sticky": list(sticky) if sticky else None}
        if self.running() and state.get("port"):
            if state.get("config") == wanted:
                return self.url
            record = self.db.process(self.name)
            if record is not None:
                processes.stop(record)
                self.db.forget_process(self.name)
            deadline = time.monotonic() + 5.0  # keep the endpoint's URL: wait for its port
            while time.monotonic() < deadline and not port_free(state["port"]):
                time.sleep(0.05)
        self.sticky = sticky
        exe = ensure_package(self.haproxy, "haproxy")
        self.dir.mkdir(parents=True, exist_ok=True)
        log = self.dir / "haproxy.log"
        port, metrics_port = state.get("port"), state.get("metrics_port")
        last = ""
        for attempt in range(4):
            if attempt or not port or not port_free(port):
                port = processes.free_port()
            if attempt or not metrics_port or metrics_port == port or not port_free(metrics_port):
                metrics_port = processes.free_port()
            (self.dir / "haproxy.cfg").write_text(self._config(port, metrics_port))
            with suppress(FileNotFoundError):
                (self.dir / "admin.sock").unlink()
            offset = log.stat().st_size if log.exists() else 0
            record = processes.spawn(self.name, "router", [exe, "-db", "-f", "haproxy.cfg"], env=_plain_env(),
                                     cwd=self.dir, log=log, info={"endpoint": self.endpoint, "port": port,
                                                                  "metrics_port": metrics_port})
            self.db.record_process(record)
            slots = state.get("slots") or {}
            self._save({**state, "port": port, "metrics_port": metrics_port, "dir": str(self.dir), "slots": slots,
                        "config": wanted})
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if not processes.alive(record):
                    break
                with suppress(OSError, RouterError):
                    self._cmd("show info")
                    with socket.create_connection(("127.0.0.1", port), timeout=1):
                        pass
                    self._restore(slots)
                    return self.url
                time.sleep(0.05)
            last = log_tail(log, offset)
            processes.stop(record)
            self.db.forget_process(self.name)
            if "bind" not in last and "address already in use" not in last.lower():
                break
        raise RouterError(f"haproxy for endpoint {self.endpoint!r} did not start:\n{last}")

    def stop(self) -> None:
        """Stop the router (by its recorded PID) and forget its state."""
        record = self.db.process(self.name)
        if record is not None:
            processes.stop(record)
            self.db.forget_process(self.name)
        self.db.kv_set(self.name, None)

    def _config(self, port: int, metrics_port: int) -> str:
        servers = "\n".join(f"    server {slot} 127.0.0.1:1 weight 0 disabled check"
                            for role in ROLES for slot in SLOTS[role])
        sticky = getattr(self, "sticky", None)
        rules = [f"    http-request del-header {STICKY_HEADER}"]
        if sticky is not None:
            kind, name = sticky
            fetch = f"req.hdr({name})" if kind == "header" else f"req.cook({name})"
            rules.append(f"    http-request set-header {STICKY_HEADER} %[{fetch}] if {{ {fetch} -m found }}")
        frontend_rules = "\n".join(rules)
        return f"""# Generated by forgectl (local target) for endpoint {self.endpoint}; runtime changes go
# through the admin socket, this file is never reloaded.
global
    stats socket unix@admin.sock mode 600 level admin
    stats timeout 10s
    nbthread 2
    maxconn 4096

defaults
    mode http
    timeout connect 2s
    timeout client 120s
    timeout server 120s
    timeout queue 30s
    timeout http-keep-alive 10s
    timeout check 2s
    retries 3
    option redispatch 1
    retry-on conn-failure empty-response junk-response

frontend fe
    bind 127.0.0.1:{port}
{frontend_rules}
    default_backend {BACKEND}

frontend metrics
    bind 127.0.0.1:{metrics_port}
    http-request use-service prometheus-exporter if {{ path /metrics }}
    http-request return status 200 content-type text/plain string "ok\\n" if {{ path /healthz }}

backend {BACKEND}
    # a user's requests (the sticky header) land on one server; without it weighted round robin
    balance hdr({STICKY_HEADER})
    hash-type consistent
    option httpchk GET {self.health_path}
    http-check expect status 200
    default-server inter 500ms fastinter 250ms downinter 250ms rise 1 fall 3
{servers}
"""

    # -- the admin socket ----------------------------------------------------------------------
    def _cmd(self, command: str) -> str:
        """One runtime-API command over the admin socket; returns HAProxy's answer."""
        path = self.dir / "admin.sock"
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            if len(os.fsencode(path)) < 100:
                s.connect(str(path))
            else:  # a socket path longer than sun_path allows: connect through the folder's fd
                fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY)
                try:
                    s.connect(f"/proc/self/fd/{fd}/admin.sock")
                finally:
                    os.close(fd)
            s.sendall(command.encode() + b"\n")
            chunks = []
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
        answer = b"".join(chunks).decode(errors="replace").strip()
        if command.startswith("set ") and answer and "changed" not in answer and "no need to change" not in answer:
            raise RouterError(f"haproxy refused `{command}`: {answer}")
        if command.startswith("show ") and answer.startswith(("Unknown command", "No such", "Permission denied")):
            raise RouterError(f"haproxy refused `{command}`: {answer}")
        return answer

    def servers(self) -> dict[str, ServerStat]:
        """The four slots, as HAProxy sees them now."""
        text = self._cmd(f"show stat {BACKEND} 4 -1")
        lines = text.splitlines()
        if not lines or not lines[0].startswith("# "):
            raise RouterError(f"unexpected `show stat` answer: {text[:300]}")
        header = lines[0][2:].split(",")
        out: dict[str, ServerStat] = {}
        for line in lines[1:]:
            row = dict(zip(header, line.split(",")))
            if row.get("pxname") != BACKEND or row.get("svname") in ("BACKEND", "FRONTEND"):
                continue
            out[row["svname"]] = ServerStat(row["svname"], row.get("addr", ""), row.get("status", ""),
                                            int(row.get("weight") or 0), int(row.get("scur") or 0),
                                            int(row.get("qcur") or 0), int(row.get("stot") or 0),
                                            row.get("check_status", ""))
        return out

    # -- changing where traffic goes --------------------------------------------------------------
    def set(self, stable: Addr | None, canary: Addr | None, canary_weight: int, *,
            up_timeout: float = 30.0, drain_timeout: float = 60.0) -> None:
        """Send ``canary_weight`` percent of requests to ``canary`` and the rest to ``stable``.

        ``None`` takes a role out. A changed address is put in a fresh slot and must pass the health
        check before the old slot is drained; a slot is set to ``maint`` only once its in-flight
        requests have finished — so a caller may stop the old server when this returns."""
        if not 0 <= canary_weight <= 100:
            raise RouterError(f"canary weight must be 0..100, not {canary_weight}")
        weights = {"stable": (100 - canary_weight) if canary is not None else 100, "canary": canary_weight}
        if stable is None:
            weights["canary"] = 100 if canary is not None else 0
        wanted = {role: (addr, weights[role]) for role, addr in (("stable", stable), ("canary", canary)) if addr is not None}
        self.set_roles(wanted, up_timeout=up_timeout, drain_timeout=drain_timeout)

    def set_roles(self, wanted: dict[str, tuple[Addr, int]], *, sticky: Sticky = KEEP,
                  up_timeout: float = 30.0, drain_timeout: float = 60.0) -> None:
        """Route to exactly the roles in ``wanted`` (role → (address, weight in percent)); every other
        role is drained and put in maintenance. `stable` and `canary` have their own slots; any other
        role (an experiment's arm) takes a free `armN` slot family and keeps it while it is routed."""
        if any(not 0 <= w <= 100 for _, w in wanted.values()):
            raise RouterError(f"weights must be 0..100: {wanted}")
        self.ensure(sticky=sticky)
        state = self._state()
        slots: dict[str, Any] = state.get("slots") or {}
        families: dict[str, str] = dict(state.get("families") or {})
        for role in list(families):
            if role not in wanted:
                families.pop(role)
        for role in wanted:
            if role in ("stable", "canary") or role in families:
                continue
            free = [f for f in ARM_FAMILIES if f not in families.values()]
            if not free:
                raise RouterError(f"endpoint {self.endpoint!r}: at most {len(ARM_FAMILIES)} arms can be routed")
            families[role] = free[0]
        by_family = {(role if role in ("stable", "canary") else families[role]): item for role, item in wanted.items()}
        to_drain: list[str] = []
        for family in ROLES:
            active = slots.get(family)
            if family not in by_family:
                if active:
                    to_drain.append(active["slot"])
                slots.pop(family, None)
                continue
            addr, weight = by_family[family]
            where = f"{addr[0]}:{addr[1]}"
            if active and active["addr"] == where:
                self._cmd(f"set server {BACKEND}/{active['slot']} weight {weight}")
                slots[family] = {**active, "weight": weight}
                continue
            fresh = SLOTS[family][1] if active and active["slot"] == SLOTS[family][0] else SLOTS[family][0]
            self._enable(fresh, addr, weight, up_timeout)
            if active:
                to_drain.append(active["slot"])
            slots[family] = {"slot": fresh, "addr": where, "weight": weight}
        # persist before draining: a crash while draining leaves the new slots recorded
        self._save({**state, "slots": slots, "families": families})
        for slot in to_drain:
            self._disable(slot, drain_timeout)

    def _enable(self, slot: str, addr: Addr, weight: int, up_timeout: float) -> None:
        """Point ``slot`` at ``addr``; it gets ``weight`` only once the server answers the health path
        (asked directly, and by HAProxy's own check). Until then its weight is 0: no request goes there."""
        self._cmd(f"set server {BACKEND}/{slot} state maint")
        self._cmd(f"set server {BACKEND}/{slot} weight 0")
        self._cmd(f"set server {BACKEND}/{slot} addr {addr[0]} port {addr[1]}")
        self._cmd(f"set server {BACKEND}/{slot} state ready")
        probe = f"http://{addr[0]}:{addr[1]}{self.health_path}"
        deadline = time.monotonic() + up_timeout
        probed = False
        while True:
            probed = probed or http_ok(probe, timeout=2.0)
            stat = self.servers().get(slot)
            if probed and stat is not None and stat.status == "UP" and stat.check.startswith("L7OK"):
                break
            if time.monotonic() > deadline:
                self._cmd(f"set server {BACKEND}/{slot} state maint")
                raise RouterError(f"endpoint {self.endpoint!r}: the server at {addr[0]}:{addr[1]} did not pass the router's "
                                  f"health check ({self.health_path}) within {up_timeout:g}s (status {stat.status if stat else '?'}, "
                                  f"check {stat.check if stat else '?'})")
            time.sleep(0.05)
        self._cmd(f"set server {BACKEND}/{slot} weight {weight}")

    def _disable(self, slot: str, drain_timeout: float) -> None:
        """Drain ``slot`` (no new requests; in-flight ones finish), then put it in maintenance."""
        self._cmd(f"set server {BACKEND}/{slot} state drain")
        deadline = time.monotonic() + drain_timeout
        while time.monotonic() < deadline:
            stat = self.servers().get(slot)
            if stat is None or (stat.sessions == 0 and stat.queued == 0):
                break
            time.sleep(0.05)
        self._cmd(f"set server {BACKEND}/{slot} state maint")
        self._cmd(f"set server {BACKEND}/{slot} weight 0")

    def _restore(self, slots: dict[str, Any]) -> None:
        """Put the recorded slots back into a freshly started HAProxy."""
        for role in ROLES:
            active = slots.get(role)
            if not active:
                continue
            host, _, port = active["addr"].rpartition(":")
            try:
                self._enable(active["slot"], (host, int(port)), int(active["weight"]), up_timeout=5.0)
            except RouterError:
                pass  # its server is gone: the next set() replaces it

    def traffic(self) -> dict[str, dict[str, Any]]:
        """Per role: the address and weight the router now uses, and HAProxy's status of it."""
        state = self._state()
        slots = state.get("slots") or {}
        names = {family: role for role, family in (state.get("families") or {}).items()}
        stats = self.servers() if self.running() else {}
        out = {}
        for family, active in slots.items():
            stat = stats.get(active["slot"])
            out[names.get(family, family)] = {**active, "status": stat.status if stat else "STOPPED"}
        return out


def _plain_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL", "TZ")}


def port_free(port: int) -> bool:
    """Whether HAProxy could bind ``port`` now: it sets SO_REUSEADDR, so connections of a stopped
    router still in TIME_WAIT do not hold the port."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def log_tail(path: Path, offset: int = 0, limit: int = 3000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")[-limit:]
    except OSError:
        return ""


def http_ok(url: str, timeout: float = 2.0) -> bool:
    """True when ``GET url`` answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status == 200
    except (OSError, ValueError):
        return False
