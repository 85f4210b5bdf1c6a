"""The test cluster's lifecycle: etcd + kube-apiserver on free loopback ports, in their own state
directory, with the real CRDs (restored from a cached etcd snapshot when the pins match), stopped
by the PIDs it started."""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import inspect
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from devkit.apiclient import RawClient
from devkit.certs import issue_cert, make_ca, openssl, write_kubeconfig
from devkit.common import ClusterError, Log, cache_dir, stderr_log, versions
from devkit.crds import CRD_PATCHES, CRD_SOURCES, FetchedCrd, fetch_crds, forge_crds
from devkit.gobuild import ensure_binaries
from reconciler.targets.local.processes import free_port, log_tail, running, spawn, stop_pid


def _spawn(argv: Sequence[str], log_path: Path, *, die_with_parent: bool) -> tuple[int, int]:
    """Start one server (own session, output to ``log_path``); returns (pid, start time).

    The start time identifies the process together with its PID, so a later stop never signals an
    unrelated process that reused the PID.
    """
    record = spawn(Path(argv[0]).name, "dev-cluster", argv, log=log_path, die_with_parent=die_with_parent)
    if record.start_ticks == -1:
        raise ClusterError(f"{argv[0]} exited at once; its log ({log_path}) ends with:\n" + log_tail(log_path))
    return record.pid, record.start_ticks


#: etcd's backend quota (its default is 2 GiB; the Argo CRDs and the benches' 50,000 objects fit in 4).
ETCD_QUOTA_BYTES = 4 * 1024**3

# Bump when a change to the servers' flags or the CRD patches makes older snapshots wrong.
# The snapshot holds etcd's data only (bootstrap objects + CRDs, saved before any node joins), so
# it is the same for a cluster with or without a node: ``node`` changes a flag (admission) and the
# certificate, neither of which is stored in etcd; certificates and keys are new at every start.
SNAPSHOT_FORMAT = 1

SERVICE_CIDR = "10.0.0.0/24"  # --service-cluster-ip-range
KUBERNETES_SERVICE_IP = "10.0.0.1"  # the `kubernetes` Service's ClusterIP: the range's first address


def snapshot_dir() -> Path:
    """Where the etcd data of a fresh cluster with the pinned CRDs is cached.

    Keyed by the pinned server versions, every CRD's source digest and patch, and
    SNAPSHOT_FORMAT; anything else changes the key and the next start makes a new one.
    """
    v = versions()
    key = {
        "format": SNAPSHOT_FORMAT,
        "kubernetes": v["KUBERNETES_VERSION"], "etcd": v["ETCD_VERSION"],
        "crds": [[c.sha256, c.patch or ""] for c in CRD_SOURCES],
        "forge-crds": [Path(c.json_path).name for c in forge_crds()],  # deploy/crds/, by their digest
        "patches": {n: hashlib.sha256(inspect.getsource(f).encode()).hexdigest() for n, f in CRD_PATCHES.items()},
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / "etcd-snapshots" / f"k8s-{v['KUBERNETES_VERSION']}-etcd-{v['ETCD_VERSION']}-{digest}"


def default_state_dir() -> Path:
    return Path(os.environ.get("FORGE_DEV_CLUSTER_DIR") or f"/tmp/forge-dev-cluster-{os.getuid()}")


@dataclass
class Cluster:
    """A running etcd + kube-apiserver (+ CRDs).  Created by :meth:`start` or :meth:`load`."""

    state_dir: str
    server: str
    kubeconfig: str
    etcd_url: str
    pids: dict[str, int] = field(default_factory=dict)  # name -> pid
    starts: dict[str, int] = field(default_factory=dict)  # name -> start time (identifies the pid)
    exes: dict[str, str] = field(default_factory=dict)  # name -> binary path
    versions: dict[str, str] = field(default_factory=dict)
    crds: list[dict[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    start_seconds: float = 0.0
    external: bool = False
    etcd_peer_port: int = 0
    die_with_parent: bool = False
    # started for a node (devkit.node): the ServiceAccount admission plugin stays on
    node: bool = False

    # ---- paths -------------------------------------------------------------------------
    @property
    def pki(self) -> Path:
        return Path(self.state_dir) / "pki"

    @property
    def ca_file(self) -> Path:
        return self.pki / "serving-ca.crt"

    # ---- lifecycle ---------------------------------------------------------------------
    @classmethod
    def start(cls, state_dir: str | os.PathLike[str] | None = None, *, install_crds: bool = True,
              die_with_parent: bool = False, node: bool = False, log: Log = stderr_log) -> Cluster:
        """Build-or-reuse the binaries, start etcd + kube-apiserver, install the CRDs, wait ready.

        ``node``: a node (:class:`devkit.node.Node`) will join, whose kube-controller-manager
        creates every namespace's ``default`` ServiceAccount and signs tokens, so the API server
        keeps its ``ServiceAccount`` admission plugin on (pods get a token). Without a node it is
        off: nothing would create the ServiceAccounts, and every pod would be refused.

        ``die_with_parent``: the servers get SIGKILL when the calling process dies (use it from
        pytest and benchmarks; ``scripts/dev-cluster start`` leaves it off so they outlive it).
        A port taken by someone else between choosing it and binding it means a retry on new ports.
        """
        for attempt in range(3):
            try:
                return cls._start_once(state_dir, install_crds=install_crds,
                                       die_with_parent=die_with_parent, node=node, log=log)
            except ClusterError as e:
                if "address already in use" not in str(e) or attempt == 2:
                    raise
                log("a chosen port was taken meanwhile; retrying on new ports")
        raise AssertionError("unreachable")

    @classmethod
    def _start_once(cls, state_dir: str | os.PathLike[str] | None, *, install_crds: bool,
                    die_with_parent: bool, node: bool, log: Log) -> Cluster:
        bins = ensure_binaries(log)
        sd = Path(state_dir) if state_dir else default_state_dir()
        if (sd / "state.json").exists():
            old = cls.load(sd)
            if old.alive():
                raise ClusterError(f"a cluster is already running from {sd} (server {old.server}); stop it first")
            old.stop(quiet=True)
        if sd.exists():
            shutil.rmtree(sd)
        sd.mkdir(parents=True, mode=0o700)
        t0 = time.monotonic()

        # CRD fetch/convert runs in parallel with the servers' start-up
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(2, min(4, os.cpu_count() or 2)))
        crd_future = pool.submit(fetch_crds, log) if install_crds else None

        pki = sd / "pki"
        pki.mkdir()
        make_ca(pki, "serving-ca", "forge-dev serving CA")
        make_ca(pki, "client-ca", "forge-dev client CA")
        # IP:10.0.0.1 is the `kubernetes` Service's ClusterIP (the first address of
        # --service-cluster-ip-range), which in-cluster clients dial and verify (on a node, pods
        # reach this API server there; devkit.node)
        issue_cert(pki, "serving-ca", "apiserver", "/CN=kube-apiserver",
                   server_sans=f"IP:127.0.0.1,IP:{KUBERNETES_SERVICE_IP},DNS:localhost,DNS:kubernetes,"
                               "DNS:kubernetes.default,DNS:kubernetes.default.svc,"
                               "DNS:kubernetes.default.svc.cluster.local")
        issue_cert(pki, "client-ca", "admin", "/O=system:masters/CN=forge-admin")
        openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "sa.key", cwd=pki)
        openssl("ec", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)

        etcd_port, etcd_peer, api_port = free_port(), free_port(), free_port()
        while len({etcd_port, etcd_peer, api_port}) < 3:
            etcd_peer, api_port = free_port(), free_port()
        server = f"https://127.0.0.1:{api_port}"
        cluster = cls(state_dir=str(sd), server=server, kubeconfig=str(sd / "kubeconfig"),
                      etcd_url=f"http://127.0.0.1:{etcd_port}", etcd_peer_port=etcd_peer,
                      exes={k: str(v) for k, v in bins.items()}, versions=versions(),
                      die_with_parent=die_with_parent, node=node)
        write_kubeconfig(Path(cluster.kubeconfig), server, pki / "serving-ca.crt", pki / "admin.crt",
                         pki / "admin.key", "forge-admin")
        snap = snapshot_dir() if install_crds else None
        restored = snap is not None and (snap / "member").is_dir()
        if restored:
            # etcd data saved right after an earlier start installed the same CRDs: the API
            # server then only loads them, instead of validating and establishing 5 MB of schemas
            shutil.copytree(snap, sd / "etcd")
        try:
            cluster._spawn_servers()
            log(f"kube-apiserver ready at {server} after {time.monotonic() - t0:.1f} s")
            if crd_future is not None:
                crds, notes = crd_future.result()
                cluster.notes.extend(notes)
                for n in notes:
                    log("note: " + n)
                raw = cluster.raw_client()
                missing = cluster._unserved_crds(raw, crds) if restored else crds
                if missing:
                    cluster._create_crds(raw, missing, pool)
                cluster._wait_crds(raw, crds)
                cluster.crds = [asdict(c) for c in crds]
                how = "from the cached etcd snapshot" if restored and not missing else "installed"
                log(f"{len(crds)} CRDs established ({how}) after {time.monotonic() - t0:.1f} s")
                if snap is not None and not restored:
                    cluster._save_snapshot(snap)
                    log(f"saved an etcd snapshot with the CRDs for the next start ({time.monotonic() - t0:.1f} s)")
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            cluster.stop(quiet=True, keep_logs=True)
            raise
        pool.shutdown()
        cluster.start_seconds = round(time.monotonic() - t0, 2)
        cluster._save()
        return cluster

    def _spawn_servers(self) -> None:
        """Start etcd, then kube-apiserver, on this cluster's ports and data; wait for /readyz."""
        self._spawn_etcd()
        self._spawn_apiserver()

    def _spawn_etcd(self, quota_bytes: int = ETCD_QUOTA_BYTES) -> None:
        """Start etcd on this cluster's ports and data with a backend quota of ``quota_bytes``; wait
        for its /health."""
        sd = Path(self.state_dir)
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        # etcd: plain HTTP on loopback only, as envtest does; big requests for the Argo CRDs
        self.pids["etcd"], self.starts["etcd"] = _spawn([
            self.exes["etcd"], "--name=forge-dev", f"--data-dir={sd / 'etcd'}",
            f"--listen-client-urls={self.etcd_url}", f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=forge-dev={peer}",
            "--max-request-bytes=8388608", f"--quota-backend-bytes={quota_bytes}",
            "--unsafe-no-fsync=true", "--log-level=warn",
        ], sd / "logs" / "etcd.log", die_with_parent=self.die_with_parent)
        self._save()
        self._wait_etcd(self, sd)

    def restart_etcd(self, *, down_seconds: float = 0.0, quota_bytes: int = ETCD_QUOTA_BYTES) -> None:
        """SIGKILL etcd (a crash: no clean shutdown, as a node losing power or the OOM killer
        would), leave it down for ``down_seconds``, and start it again on the same data and ports
        with a backend quota of ``quota_bytes``; the API server stays up and reconnects by itself.
        For fault drills."""
        if self.external:
            raise ClusterError("restart_etcd needs the cluster's own etcd process")
        pid, ticks = self.pids["etcd"], self.starts["etcd"]
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        stop_pid(pid, ticks)  # reaped and gone before the port is bound again
        time.sleep(down_seconds)
        self._wait_bindable([int(self.etcd_url.rsplit(":", 1)[1]), self.etcd_peer_port])
        self._spawn_etcd(quota_bytes)

    @staticmethod
    def _wait_bindable(ports: list[int], timeout: float = 30.0) -> None:
        """Wait until each port can be bound as etcd binds it (SO_REUSEADDR, as Go's net.Listen).
        CI once saw a restarted etcd refused its peer port ("address already in use") right after
        the killed one was reaped, cause not found (ports taken below the ephemeral range did no
        better); the error names who holds a port still taken."""
        deadline = time.monotonic() + timeout
        for port in ports:
            while True:
                with socket.socket() as s:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    try:
                        s.bind(("127.0.0.1", port))
                        break
                    except OSError:
                        if time.monotonic() > deadline:
                            held = subprocess.run(["ss", "-tanp", f"( sport = :{port} )"], capture_output=True,
                                                  text=True, check=False).stdout
                            raise ClusterError(f"127.0.0.1:{port} still taken {timeout:.0f} s after etcd was killed:\n{held}") from None
                time.sleep(0.2)

    def etcd_db_size(self) -> int:
        """The size of etcd's backend database file in bytes (its own metric), what its quota is
        compared with."""
        with urllib.request.urlopen(self.etcd_url + "/metrics", timeout=5) as resp:
            for line in resp.read().decode().splitlines():
                if line.startswith("etcd_mvcc_db_total_size_in_bytes "):
                    return int(float(line.split()[1]))
        raise ClusterError("etcd's /metrics has no etcd_mvcc_db_total_size_in_bytes")

    def _etcd_alarm(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        """etcd's Maintenance.Alarm through its gRPC gateway (what `etcdctl alarm` sends)."""
        request = urllib.request.Request(self.etcd_url + "/v3/maintenance/alarm", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(request, timeout=5) as resp:
            alarms: list[dict[str, Any]] = json.loads(resp.read() or b"{}").get("alarms") or []
            return alarms

    def etcd_alarms(self) -> list[str]:
        """The alarms etcd has raised (``NOSPACE`` once its backend reached the quota)."""
        return sorted(str(a.get("alarm", "")) for a in self._etcd_alarm({"action": "GET"}))

    def raise_etcd_nospace(self) -> None:
        """Raise etcd's NOSPACE alarm, the state etcd enters by itself when its backend reaches the
        quota: from then on it refuses every write ("etcdserver: mvcc: database space exceeded")
        and serves reads, until the alarm is disarmed. Raised through the same Maintenance.Alarm
        call so a drill can land it at a chosen moment."""
        member = self._etcd_member_id()
        self._etcd_alarm({"action": "ACTIVATE", "memberID": member, "alarm": "NOSPACE"})

    def _etcd_member_id(self) -> str:
        request = urllib.request.Request(self.etcd_url + "/v3/cluster/member/list", data=b"{}",
                                         headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(request, timeout=5) as resp:
            members = json.loads(resp.read()).get("members") or []
        if len(members) != 1:
            raise ClusterError(f"etcd lists {len(members)} members, expected this cluster's one")
        return str(members[0]["ID"])

    def disarm_etcd_alarms(self) -> list[str]:
        """Deactivate every alarm etcd has raised, as `etcdctl alarm disarm` does after the space
        problem is fixed (until then etcd refuses every write with NOSPACE); returns them."""
        raised = self._etcd_alarm({"action": "GET"})
        for alarm in raised:
            self._etcd_alarm({"action": "DEACTIVATE", "memberID": alarm.get("memberID"), "alarm": alarm.get("alarm")})
        return sorted(str(a.get("alarm", "")) for a in raised)

    def _spawn_apiserver(self) -> None:
        """Start kube-apiserver on this cluster's port, etcd and certificates; wait for /readyz."""
        sd = Path(self.state_dir)
        pki = self.pki
        port = self.server.rsplit(":", 1)[1]
        self.pids["kube-apiserver"], self.starts["kube-apiserver"] = _spawn([
            self.exes["kube-apiserver"],
            f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={port}",
            f"--cert-dir={sd / 'apiserver-certs'}",
            f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'client-ca.crt'}",
            "--authorization-mode=RBAC",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--allow-privileged=true",
            # without a node no controller-manager runs, so nothing would create the default
            # ServiceAccount and the plugin would refuse every pod; with one, pods get a token
            *([] if self.node else ["--disable-admission-plugins=ServiceAccount"]),
            "--v=0",
        ], sd / "logs" / "kube-apiserver.log", die_with_parent=self.die_with_parent)
        self._save()
        self._wait_ready(self.raw_client())

    def restart_apiserver(self, *, down_seconds: float = 0.0) -> None:
        """Stop kube-apiserver (SIGTERM, as a node reboot or an upgrade would), leave it down for
        ``down_seconds``, and start it again on the same port and etcd; for fault drills."""
        if self.external:
            raise ClusterError("restart_apiserver needs the cluster's own API server process")
        stop_pid(self.pids["kube-apiserver"], self.starts.get("kube-apiserver", -1))
        time.sleep(down_seconds)
        self._spawn_apiserver()

    def _save_snapshot(self, snap: Path) -> None:
        """Stop both servers, copy etcd's data to ``snap`` (atomically), start them again."""
        for name in ("kube-apiserver", "etcd"):
            stop_pid(self.pids[name], self.starts[name])
        snap.parent.mkdir(parents=True, exist_ok=True)
        tmp = snap.parent / f".{snap.name}.tmp.{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(Path(self.state_dir) / "etcd", tmp)
        try:
            tmp.rename(snap)
        except OSError:  # another session saved it first
            shutil.rmtree(tmp, ignore_errors=True)
        self._spawn_servers()

    @staticmethod
    def _wait_etcd(cluster: Cluster, sd: Path, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not cluster._running("etcd"):
                raise ClusterError("etcd exited:\n" + log_tail(sd / "logs" / "etcd.log"))
            with contextlib.suppress(OSError, ValueError):
                # up is what is waited for: an etcd out of space (NOSPACE, raised at start when its
                # database is over the quota) serves reads and deletes, and a fault drill starts it so
                with urllib.request.urlopen(cluster.etcd_url + "/health?exclude=NOSPACE", timeout=1) as r:
                    if json.loads(r.read()).get("health") == "true":
                        return
            time.sleep(0.05)
        raise ClusterError("etcd not healthy in time:\n" + log_tail(sd / "logs" / "etcd.log"))

    def _wait_ready(self, raw: RawClient, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        last: Any = None
        log_path = Path(self.state_dir) / "logs" / "kube-apiserver.log"
        while time.monotonic() < deadline:
            if not self._running("kube-apiserver"):
                raise ClusterError("kube-apiserver exited:\n" + log_tail(log_path))
            try:
                status, last = raw.request("GET", "/readyz", timeout=2)
                if status == 200:
                    return
            except (OSError, ssl.SSLError) as e:
                last = e
            time.sleep(0.1)
        raise ClusterError(f"kube-apiserver not ready in {timeout:.0f} s ({last}):\n" + log_tail(log_path))

    def _create_crds(self, raw: RawClient, crds: list[FetchedCrd], pool: concurrent.futures.Executor,
                     timeout: float = 120.0) -> None:
        base = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"

        def create(crd: FetchedCrd) -> None:
            body = Path(crd.json_path).read_bytes()
            status, resp = raw.request("POST", base + "?fieldManager=forge-dev-cluster", body, timeout=timeout)
            if status == 409:  # already there: server-side apply the same JSON
                status, resp = raw.request(
                    "PATCH", f"{base}/{crd.name}?fieldManager=forge-dev-cluster&force=true", body,
                    content_type="application/apply-patch+yaml", timeout=timeout)
            if status not in (200, 201):
                raise ClusterError(f"installing CRD {crd.name}: HTTP {status}: {str(resp)[:2000]}")

        list(pool.map(create, crds))

    @staticmethod
    def _discovery_paths(crds: list[FetchedCrd]) -> dict[str, tuple[str, str]]:
        out: dict[str, tuple[str, str]] = {}
        for crd in crds:
            spec = json.loads(Path(crd.json_path).read_text())["spec"]
            version = next(v["name"] for v in spec["versions"] if v.get("served"))
            out[crd.name] = (f"/apis/{spec['group']}/{version}", spec["names"]["plural"])
        return out

    def _served(self, raw: RawClient, pending: dict[str, tuple[str, str]]) -> set[str]:
        served_names: set[str] = set()
        for path in sorted({p for p, _ in pending.values()}):
            status, doc = raw.request("GET", path)
            served = {r.get("name") for r in (doc or {}).get("resources", [])} if status == 200 else set()
            served_names |= {n for n, (p, plural) in pending.items() if p == path and plural in served}
        return served_names

    def _unserved_crds(self, raw: RawClient, crds: list[FetchedCrd]) -> list[FetchedCrd]:
        served = self._served(raw, self._discovery_paths(crds))
        return [c for c in crds if c.name not in served]

    def _wait_crds(self, raw: RawClient, crds: list[FetchedCrd], timeout: float = 120.0) -> None:
        """Wait until every CRD is Established and served.

        The apiserver's discovery lists a CRD's resource only once the CRD's Established
        condition is true (apiextensions-apiserver's DiscoveryController skips the others), and
        polling discovery is cheap; polling the CRDs themselves (1.2 MB each for Argo) would eat
        the CPU the apiserver needs to establish them.  (The tests check the condition itself.)
        """
        pending = self._discovery_paths(crds)
        deadline = time.monotonic() + timeout
        while pending:
            for name in self._served(raw, pending):
                del pending[name]
            if pending:
                if time.monotonic() > deadline:
                    raise ClusterError(f"CRDs not Established in {timeout:.0f} s: {sorted(pending)}")
                time.sleep(0.2)

    @classmethod
    def load(cls, state_dir: str | os.PathLike[str] | None = None) -> Cluster:
        sd = Path(state_dir) if state_dir else default_state_dir()
        try:
            data = json.loads((sd / "state.json").read_text())
        except FileNotFoundError:
            raise ClusterError(f"no cluster state in {sd} (is it started?)") from None
        return cls(**data)

    @classmethod
    def external_from_env(cls) -> Cluster | None:
        """A :class:`Cluster` for ``$FORGE_KUBECONFIG_EXTERNAL`` (not started or stopped by us)."""
        path = os.environ.get("FORGE_KUBECONFIG_EXTERNAL")
        if not path:
            return None
        import yaml

        cfg = yaml.safe_load(Path(path).read_text())
        ctx_name = cfg.get("current-context")
        ctx = next(c["context"] for c in cfg["contexts"] if c["name"] == ctx_name)
        server = next(c["cluster"]["server"] for c in cfg["clusters"] if c["name"] == ctx["cluster"])
        return cls(state_dir=str(Path(path).parent), server=server, kubeconfig=str(path), etcd_url="",
                   external=True)

    def _save(self) -> None:
        p = Path(self.state_dir) / "state.json"
        tmp = p.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        tmp.replace(p)

    def _running(self, name: str) -> bool:
        return name in self.pids and running(self.pids[name], self.starts.get(name, -1))

    def alive(self) -> bool:
        """True while any process this cluster started still runs."""
        return any(self._running(n) for n in self.pids)

    def stop(self, *, quiet: bool = False, keep_logs: bool = False) -> None:
        """Stop exactly the processes this cluster started (apiserver first), remove the data."""
        if self.external:
            return
        for name in ("kube-apiserver", "etcd"):
            if name in self.pids:
                stop_pid(self.pids[name], self.starts.get(name, -1))
        sd = Path(self.state_dir)
        if keep_logs:
            for sub in ("etcd", "pki", "apiserver-certs"):
                shutil.rmtree(sd / sub, ignore_errors=True)
        else:
            shutil.rmtree(sd, ignore_errors=True)
        if not quiet:
            stderr_log(f"stopped (pids {', '.join(f'{k}={v}' for k, v in self.pids.items())})")

    # ---- clients -----------------------------------------------------------------------
    def raw_client(self) -> RawClient:
        return RawClient(self.server, self.ca_file, self.pki / "admin.crt", self.pki / "admin.key")

    def api_client(self, kubeconfig: str | os.PathLike[str] | None = None):
        """A ``kubernetes.client.ApiClient`` for the admin (or the given) kubeconfig."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(kubeconfig or self.kubeconfig))

    def version(self) -> dict[str, Any]:
        status, doc = self.raw_client().request("GET", "/version")
        if status != 200:
            raise ClusterError(f"/version: HTTP {status}")
        return doc

    # ---- more identities -----------------------------------------------------------------
    def user_kubeconfig(self, user: str, groups: Iterable[str] = (), namespace: str = "default",
                        path: str | os.PathLike[str] | None = None) -> Path:
        """A kubeconfig for a client certificate ``CN=user, O=groups`` signed by the client CA.

        The user has no rights until something binds a role to it.
        """
        if self.external:
            raise ClusterError("user_kubeconfig needs the cluster's client CA (not available for an external cluster)")
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in user)
        subject = "".join(f"/O={g}" for g in groups) + f"/CN={user}"
        if not (self.pki / f"user-{safe}.crt").exists():
            issue_cert(self.pki, "client-ca", f"user-{safe}", subject)
        out = Path(path) if path else Path(self.state_dir) / f"kubeconfig-{safe}-{namespace}"
        return write_kubeconfig(out, self.server, self.ca_file, self.pki / f"user-{safe}.crt",
                                self.pki / f"user-{safe}.key", user, namespace)
