"""A real one-node Kubernetes on this machine, joined to the test cluster's API server.

:meth:`Node.start` takes a running :class:`devkit.cluster.Cluster` (etcd + kube-apiserver, see
``docs/test-cluster.md``) and adds what makes pods run:

* ``containerd`` (Debian's package) with a config, root, state and socket of its own under the
  node's state directory, the ``overlayfs`` snapshotter (``native`` when overlayfs fails), ``runc``
  (Debian), CNI from Debian's ``containernetworking-plugins`` (bridge + host-local + portmap +
  loopback), the sandbox image :func:`images.build_pause` built here;
* ``kubelet``, ``kube-scheduler``, ``kube-controller-manager`` and ``kube-proxy`` (iptables
  mode) of the same ``k8s.io/kubernetes`` pin as the API server (``scripts/cluster/build.sh node``),
  each with a client certificate of its own identity signed by the cluster's client CA;
* images from :mod:`devkit.node.images`, imported with ``ctr -n k8s.io images import``;
* cluster DNS: CoreDNS (``scripts/cluster/build.sh coredns``) deployed as a cluster runs it, the
  Deployment ``coredns`` behind the Service ``kube-dns`` at :data:`CLUSTER_DNS_IP`
  (:mod:`devkit.node.coredns`), which the kubelet's ``clusterDNS`` gives every pod as its name server
  (search path ``<namespace>.svc.cluster.local svc.cluster.local cluster.local``). ``Node.start``
  returns once it answers.

Every server listens on 127.0.0.1 (free ports). Host-wide things it touches, and gives back at
:meth:`Node.stop`: a bridge ``forge0`` (the pods' network, its gateway address is the node's
InternalIP), kube-proxy's and CNI's iptables rules, a cgroup ``/forge-node`` in each v1
hierarchy, and the sysctls the kubelet and the pod network need (the old values are saved in
``state.json`` and restored). Only one node runs per machine (kube-proxy owns the host's
``KUBE-*`` chains): a second start is refused while the first runs.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from devkit.node import coredns, images, paths

Log = Callable[[str], None]

# The API server reaches a kubelet (logs, exec, port-forward) at the node's first address of its
# --kubelet-preferred-address-types, Hostname by default: a node named "127.0.0.1" (as upstream's
# hack/local-up-cluster.sh names it) is dialled on loopback, where the kubelet listens.
NODE_NAME = os.environ.get("FORGE_NODE_NAME", "127.0.0.1")
BRIDGE = "forge0"
POD_CIDR = os.environ.get("FORGE_NODE_POD_CIDR", "10.244.0.0/24")
CLUSTER_CIDR = os.environ.get("FORGE_NODE_CLUSTER_CIDR", "10.244.0.0/16")
SERVICE_CIDR = "10.0.0.0/24"  # the API server's --service-cluster-ip-range (devkit.cluster)
KUBERNETES_SERVICE_IP = "10.0.0.1"  # the `kubernetes` Service's ClusterIP (first of SERVICE_CIDR)
CLUSTER_DNS_IP = coredns.CLUSTER_DNS_IP  # the kube-dns Service's ClusterIP: the kubelet's clusterDNS
CLUSTER_DOMAIN = coredns.CLUSTER_DOMAIN
APISERVER_CHAIN = "FORGE-NODE-APISERVER"
CGROUP_ROOT = "forge-node"
# the v1 hierarchies, and cgroup2's "unified" one of a hybrid set-up (runc mirrors each container's
# cgroup there): the node's cgroup root is made in, and removed from, each that is mounted
CGROUP_HIERARCHIES = ("cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "blkio", "pids", "hugetlb",
                      "net_cls", "net_prio", "perf_event", "systemd", "unified")
# Debian packages the node runs on (installed with apt-get when missing, like the harness does for Prometheus)
HOST_PACKAGES = {"containerd": "containerd", "runc": "runc", "/usr/lib/cni/bridge": "containernetworking-plugins",
                 "iptables": "iptables", "gcc": "gcc", "/usr/lib/x86_64-linux-gnu/libc.a": "libc6-dev"}
NODE_COMPONENTS = ("kubelet", "kube-scheduler", "kube-controller-manager", "kube-proxy", "kubectl")

# The sysctls changed while the node runs. The kubelet itself sets the kernel.* / vm.* ones at
# start (its setupKernelTunables, protectKernelDefaults=false); they are saved first and restored.
SYSCTLS = {
    "net/ipv4/ip_forward": "1",
    "net/bridge/bridge-nf-call-iptables": "1",
    "net/bridge/bridge-nf-call-ip6tables": "1",
    "vm/overcommit_memory": None, "vm/panic_on_oom": None, "kernel/panic": None, "kernel/panic_on_oops": None,
    "kernel/keys/root_maxkeys": None, "kernel/keys/root_maxbytes": None,
    "net/ipv4/conf/all/route_localnet": None,  # kube-proxy (localhost NodePorts)
}

STORAGE_CLASS = "forge-hostpath"  # the default StorageClass: hostPath volumes the node makes
VOLUMES = 12  # hostPath PersistentVolumes made at start (each binds one claim for the node's life)
VOLUME_SIZE = "100Gi"  # what each declares (hostPath enforces no size)
# the PriorityClasses Forge's rendered pods name (renderers.pods.PRIORITY_CLASSES)
PRIORITY_CLASSES = {"forge-high": 1000, "forge-medium": 500, "forge-low": 100}

LOCK = Path("/run/forge-node.lock")  # one node per machine
ACTIVE = Path("/run/forge-node.active")  # the running node's state dir


_LOCK_HELD = False  # this process holds LOCK (Node.start's claim, or a stop): stop must not take it again


def _set_lock_held(held: bool) -> None:
    global _LOCK_HELD
    _LOCK_HELD = held


# the names that keep an image's snapshots while a newer build of it is imported (_import_holding)
HOLD_PREFIX = "forge.local/import-hold/"


class NodeError(RuntimeError):
    """The node could not be started or stopped."""


def _stderr_log(msg: str) -> None:
    print(f"[node] {msg}", file=sys.stderr, flush=True)


def default_state_dir() -> Path:
    return Path(os.environ.get("FORGE_NODE_DIR") or f"/tmp/forge-node-{os.getuid()}")


def _run(argv: list[str], *, check: bool = True, **kw: Any) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, **kw)
    if check and proc.returncode != 0:
        raise NodeError(f"{' '.join(argv)}: exit {proc.returncode}: {(proc.stderr or proc.stdout).strip()}")
    return proc


def ensure_host_packages(log: Log = _stderr_log) -> None:
    missing = sorted({pkg for what, pkg in HOST_PACKAGES.items()
                      if not (Path(what).exists() if what.startswith("/") else shutil.which(what))})
    if not missing:
        return
    log(f"installing Debian packages for the node: {' '.join(missing)}")
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    if _run(sudo + ["apt-get", "install", "-y", "-q", *missing], check=False, env=env).returncode != 0:
        _run(sudo + ["apt-get", "update", "-q"], env=env)
        _run(sudo + ["apt-get", "install", "-y", "-q", *missing], env=env)


def ensure_binaries(log: Log = _stderr_log) -> dict[str, Path]:
    bins = {n: paths.binary(n) for n in NODE_COMPONENTS}
    if not all(os.access(p, os.X_OK) for p in bins.values()):
        log("building kubelet, kube-scheduler, kube-controller-manager, kube-proxy, kubectl "
            "(first time only; about 3-4 min on 2 cores once kube-apiserver is built)")
        proc = subprocess.run(["nice", "-n", "10", str(paths.BUILD_SH), "node"])
        if proc.returncode != 0:
            raise NodeError(f"scripts/cluster/build.sh node failed (exit {proc.returncode})")
    return bins


def ensure_images(log: Log = _stderr_log) -> dict[str, tuple[str, str]]:
    """{role: (archive path, image ref)} of the node's own images (CoreDNS's binary is built the first
    time: several minutes)."""
    pause = images.build_pause(log)
    busybox = images.build_busybox(log)
    return {"pause": (str(pause[0]), pause[1]), "busybox": (str(busybox[0]), busybox[1]),
            "coredns": coredns.image(log)}


def _mountpoints_under(root: Path) -> list[str]:
    """Mount points at or below ``root``, deepest first (from /proc/self/mountinfo)."""
    out = []
    r = str(root.resolve())
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mp = line.split()[4].encode().decode("unicode_escape")
        if mp == r or mp.startswith(r + "/"):
            out.append(mp)
    return sorted(set(out), key=lambda p: p.count("/"), reverse=True)


def unmount_under(root: Path) -> list[str]:
    done = []
    for _ in range(3):
        mps = _mountpoints_under(root)
        if not mps:
            break
        for mp in mps:
            if subprocess.run(["umount", mp], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", mp], capture_output=True)
            done.append(mp)
    return done


def _read_sysctl(key: str) -> str | None:
    try:
        return Path("/proc/sys", key).read_text().strip()
    except OSError:
        return None


def _write_sysctl(key: str, value: str) -> None:
    Path("/proc/sys", key).write_text(value + "\n")


@dataclass
class Node:
    state_dir: str
    cluster_state_dir: str
    server: str
    name: str = NODE_NAME
    node_ip: str = ""
    pids: dict[str, int] = field(default_factory=dict)
    starts: dict[str, int] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    exes: dict[str, str] = field(default_factory=dict)
    images: dict[str, list[str]] = field(default_factory=dict)
    sysctls_saved: dict[str, str] = field(default_factory=dict)
    snapshotter: str = "overlayfs"
    restrict_oom: bool = False
    versions: dict[str, str] = field(default_factory=dict)
    start_seconds: float = 0.0
    die_with_parent: bool = False
    notes: list[str] = field(default_factory=list)
    # the process running Node.start (pid, start ticks): while it runs and the node is not up yet,
    # the node counts as starting, not as dead (it has no processes of its own at first)
    owner: list[int] = field(default_factory=list)

    # ---- paths ---------------------------------------------------------------------------
    @property
    def sd(self) -> Path:
        return Path(self.state_dir)

    @property
    def containerd_sock(self) -> str:
        return str(self.sd / "containerd" / "containerd.sock")

    @property
    def kubeconfig(self) -> str:
        """The cluster's admin kubeconfig."""
        return str(Path(self.cluster_state_dir) / "kubeconfig")

    @property
    def containerd_root(self) -> Path:
        """containerd's root (content store, unpacked snapshots, metadata) is kept between starts
        in the cache, keyed by containerd's version and the snapshotter, so an image imported
        once (the runtime image is several GB) is not imported again. One node per machine (LOCK)
        uses it at a time; containers never outlive a node (``stop`` removes them, ``start``
        removes any a node that died left)."""
        ver = _run(["containerd", "--version"], check=False).stdout.split()
        return paths.cache_dir() / "containerd" / f"root-{ver[2] if len(ver) > 2 else 'unknown'}-{self.snapshotter}"

    def log_path(self, name: str) -> Path:
        return self.sd / "logs" / f"{name}.log"

    # ---- lifecycle -----------------------------------------------------------------------
    @classmethod
    def start(cls, cluster: Any, state_dir: str | os.PathLike[str] | None = None, *,
              die_with_parent: bool = False, log: Log = _stderr_log,
              extra_images: list[tuple[str, str]] = (), wait_for_other: float = 0.0) -> Node:
        """Start containerd, kubelet, scheduler, controller-manager and kube-proxy for ``cluster``;
        return when the node is Ready. ``extra_images``: (archive, ref) pairs to import too.
        ``wait_for_other``: seconds to wait for another running node to stop (one per machine)."""
        if os.geteuid() != 0:
            raise NodeError("the node needs root (containerd, runc, iptables, cgroups, mounts)")
        t0 = time.monotonic()
        if not getattr(cluster, "node", True):
            log("note: the cluster was started without node=True: its API server's ServiceAccount admission "
                "is off, so pods get no service-account token (in-cluster clients such as Argo's executor fail)")
        ensure_host_packages(log)
        bins = ensure_binaries(log)
        imgs = ensure_images(log)
        sd = Path(state_dir) if state_dir else default_state_dir()
        LOCK.parent.mkdir(parents=True, exist_ok=True)
        with open(LOCK, "a+") as lockf:
            fcntl.flock(lockf, fcntl.LOCK_EX)
            _set_lock_held(True)
            try:
                node = cls._claim(cluster, sd, lockf, bins, imgs, extra_images, die_with_parent,
                                  wait_for_other, log)
            finally:
                _set_lock_held(False)
        try:
            node._host_setup(log)
            node._pki(cluster)
            node._rbac(cluster)
            node._start_containerd(log)
            node._remove_containers(log)  # any a node that died left in the persistent root
            node._import_images(log)
            node._start_kubelet()
            node._start_control(cluster)
            node._start_kube_proxy()
            node._wait_ready(log, t0)
            node._cluster_objects()
            node._start_dns(cluster, log)
        except BaseException:
            log(f"node start failed; logs in {sd / 'logs'}")
            node.stop(quiet=True, keep_logs=True)
            raise
        node.start_seconds = round(time.monotonic() - t0, 2)
        node._save()
        log(f"node {node.name} Ready after {node.start_seconds:.1f} s")
        return node

    @classmethod
    def _claim(cls, cluster: Any, sd: Path, lockf: Any, bins: dict[str, Path], imgs: dict[str, tuple[str, str]],
               extra_images: Any, die_with_parent: bool, wait_for_other: float, log: Log) -> Node:
        """Under LOCK: wait for (or clean up after) another node, then record this one as the
        machine's active node."""
        waited, said = time.monotonic(), False
        while ACTIVE.exists():
            other = Path(ACTIVE.read_text().strip())
            try:
                old = cls.load(other)
            except NodeError:
                ACTIVE.unlink()
                break
            starting = (not old.start_seconds and len(old.owner) == 2
                        and paths.running(old.owner[0], old.owner[1]))
            if not old.alive() and not starting:
                log(f"cleaning up after a node that died ({other})")
                old.stop(quiet=True)
                break
            if time.monotonic() - waited > wait_for_other:
                raise NodeError(f"a node is already running from {other} (one per machine: kube-proxy "
                                f"owns the host's KUBE-* chains); stop it first")
            if not said:
                said = True
                log(f"waiting up to {wait_for_other:.0f} s for the node running from {other} to stop (one per machine)")
            fcntl.flock(lockf, fcntl.LOCK_UN)
            time.sleep(2)
            fcntl.flock(lockf, fcntl.LOCK_EX)
        # No node runs now, so whatever a node holds host-wide and is still here was left by one
        # that vanished without a stop and without a record to stop it by (its state directory
        # removed, /run cleared): a leftover FORGE-NODE-APISERVER chain alone fails the next start
        # ("Chain already exists"), leftover KUBE-* chains route Services to pods long gone.
        left = host_leftovers()
        if left:
            log(f"removing what a node that vanished left on this host: {', '.join(left[:6])}"
                + (f" and {len(left) - 6} more" if len(left) > 6 else ""))
            kube_proxy = bins.get("kube-proxy")
            give_back_host(log, str(kube_proxy) if kube_proxy else None)
        if sd.exists():
            with contextlib.suppress(NodeError):
                cls.load(sd).stop(quiet=True)
            unmount_under(sd)
            shutil.rmtree(sd, ignore_errors=True)
        sd.mkdir(parents=True, mode=0o700)
        node = cls(state_dir=str(sd), cluster_state_dir=str(cluster.state_dir), server=cluster.server,
                   exes={k: str(v) for k, v in bins.items()}, versions=paths.versions(),
                   die_with_parent=die_with_parent,
                   images={k: list(v) for k, v in imgs.items()},
                   owner=[os.getpid(), paths.start_ticks(os.getpid()) or -1])
        node.images.update({ref: [arch, ref] for arch, ref in extra_images})
        ACTIVE.write_text(str(sd) + "\n")
        node._save()
        return node

    @classmethod
    def load(cls, state_dir: str | os.PathLike[str] | None = None) -> Node:
        sd = Path(state_dir) if state_dir else default_state_dir()
        try:
            data = json.loads((sd / "state.json").read_text())
        except (FileNotFoundError, NotADirectoryError):
            raise NodeError(f"no node state in {sd} (is it started?)") from None
        return cls(**data)

    def _save(self) -> None:
        p = self.sd / "state.json"
        tmp = p.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        tmp.replace(p)

    def _spawn(self, name: str, argv: list[str]) -> None:
        rec = paths.spawn(name, "forge-node", argv, log=self.log_path(name), die_with_parent=self.die_with_parent)
        self.pids[name], self.starts[name] = rec.pid, rec.start_ticks
        self._save()
        if rec.start_ticks == -1:
            raise NodeError(f"{name} exited at once; its log ends with:\n{_tail(self.log_path(name))}")

    def running(self, name: str) -> bool:
        return name in self.pids and paths.running(self.pids[name], self.starts.get(name, -1))

    def alive(self) -> bool:
        return any(self.running(n) for n in self.pids)

    # ---- host ------------------------------------------------------------------------------
    def _host_setup(self, log: Log) -> None:
        for key, want in SYSCTLS.items():
            cur = _read_sysctl(key)
            if cur is None:
                if want is not None:
                    raise NodeError(f"/proc/sys/{key} is missing (br_netfilter / bridge support needed)")
                continue
            self.sysctls_saved[key] = cur
            if want is not None and cur != want:
                _write_sysctl(key, want)
        self._save()
        # the pods' bridge, made here so that its gateway address (the node's InternalIP) exists
        # before the kubelet starts; the CNI bridge plugin finds and reuses it
        gw = POD_CIDR.split("/")[0].rsplit(".", 1)[0] + ".1"
        prefix = POD_CIDR.split("/")[1]
        if _run(["ip", "link", "show", BRIDGE], check=False).returncode == 0:
            _run(["ip", "link", "del", BRIDGE])
        _run(["ip", "link", "add", BRIDGE, "type", "bridge"])
        _run(["ip", "addr", "add", f"{gw}/{prefix}", "dev", BRIDGE])
        _run(["ip", "link", "set", BRIDGE, "up"])
        self.node_ip = gw
        self._apiserver_route()
        # the kubelet's cgroup root, in every mounted v1 hierarchy
        for sub in _cgroup_dirs():
            (sub / CGROUP_ROOT).mkdir(exist_ok=True)
        self._save()

    def _apiserver_route(self) -> None:
        """Pods reach the API server at the `kubernetes` Service (10.0.0.1:443). The API server
        listens on 127.0.0.1 only and advertises 127.0.0.1, which an Endpoint may not hold, so the
        Service has no endpoints; instead the pods' traffic to 10.0.0.1:443 is DNATed to the API
        server's loopback port (route_localnet on the pods' bridge only lets it through)."""
        port = self.server.rsplit(":", 1)[1]
        _write_sysctl(f"net/ipv4/conf/{BRIDGE}/route_localnet", "1")
        _run(["iptables", "-t", "nat", "-N", APISERVER_CHAIN])
        _run(["iptables", "-t", "nat", "-A", APISERVER_CHAIN, "-d", f"{KUBERNETES_SERVICE_IP}/32", "-p", "tcp",
              "--dport", "443", "-j", "DNAT", "--to-destination", f"127.0.0.1:{port}",
              "-m", "comment", "--comment", "forge node: pods to the loopback API server"])
        _run(["iptables", "-t", "nat", "-I", "PREROUTING", "1", "-i", BRIDGE, "-j", APISERVER_CHAIN])

    def _pki(self, cluster: Any) -> None:
        pki = self.sd / "pki"
        pki.mkdir()
        cpki = Path(cluster.pki)
        for f in ("client-ca.crt", "client-ca.key", "serving-ca.crt"):
            shutil.copy2(cpki / f, pki / f)
        idents = {
            "kubelet": f"/O=system:nodes/CN=system:node:{self.name}",
            "kube-scheduler": "/CN=system:kube-scheduler",
            "kube-controller-manager": "/CN=system:kube-controller-manager",
            "kube-proxy": "/CN=system:kube-proxy",
        }
        for name, subject in idents.items():
            paths.issue_cert(pki, "client-ca", name, subject)
            paths.write_kubeconfig(self.sd / f"{name}.kubeconfig", self.server, pki / "serving-ca.crt",
                                        pki / f"{name}.crt", pki / f"{name}.key", name)
        (pki / "client-ca.key").unlink()

    def _rbac(self, cluster: Any) -> None:
        """The kubelet's rights: the API server runs RBAC only (no Node authorizer), and the
        bootstrap ``system:node`` ClusterRoleBinding has no subjects, so bind it to this node."""
        raw = cluster.raw_client()
        body = {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": f"forge:node:{self.name}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:node"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": f"system:node:{self.name}"}],
        }
        status, doc = raw.request("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
                                  json.dumps(body).encode())
        if status not in (200, 201, 409):
            raise NodeError(f"creating the node's ClusterRoleBinding: HTTP {status}: {doc}")

    # ---- containerd ------------------------------------------------------------------------
    def _containerd_config(self) -> str:
        c = self.sd / "containerd"
        cni = self.sd / "cni"
        # FORGE_NODE_RUNC: another runc binary (e.g. a wrapper that keeps each bundle's config.json
        # and runc's log, to see why a container does not start)
        runc_binary = f'\n        BinaryName = "{os.environ["FORGE_NODE_RUNC"]}"' if os.environ.get("FORGE_NODE_RUNC") else ""
        return f'''version = 2
root = "{self.containerd_root}"
state = "{c / 'state'}"
[grpc]
  address = "{self.containerd_sock}"
[ttrpc]
  address = "{self.containerd_sock}.ttrpc"
[debug]
  level = "info"
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{c / 'opt'}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{self.images['pause'][1]}"
  enable_selinux = false
  disable_apparmor = true
  restrict_oom_score_adj = {"true" if self.restrict_oom else "false"}
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "{self.snapshotter}"
    default_runtime_name = "runc"
    discard_unpacked_layers = false
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{c / 'runc'}"{runc_binary}
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni / 'net.d'}"
    max_conf_num = 1
'''

    def _cni_config(self) -> dict[str, Any]:
        return {
            "cniVersion": "0.4.0", "name": "forge",
            "plugins": [
                {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": True, "hairpinMode": True,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_CIDR, "gateway": self.node_ip}]],
                          "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(self.sd / "cni" / "ipam")}},
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }

    def ctr(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return _run(["ctr", "-a", self.containerd_sock, "-n", "k8s.io", *args], check=check, timeout=timeout)

    def _start_containerd(self, log: Log) -> None:
        if not _has_cap_sys_resource() and not self.restrict_oom:
            # without CAP_SYS_RESOURCE nobody here may lower an oom_score_adj: runc's
            # "nsexec: failed to update /proc/self/oom_score_adj: Permission denied" for every pod
            # sandbox (-998). containerd's restrict_oom_score_adj keeps every container's at or
            # above containerd's own (as for rootless containerd).
            self.restrict_oom = True
            self.notes.append("no CAP_SYS_RESOURCE in the bounding set: containerd restrict_oom_score_adj = true")
            log(self.notes[-1])
        c = self.sd / "containerd"
        c.mkdir()
        (self.sd / "cni" / "net.d").mkdir(parents=True)
        (self.sd / "cni" / "net.d" / "10-forge.conflist").write_text(json.dumps(self._cni_config(), indent=2))
        (c / "config.toml").write_text(self._containerd_config())
        self._spawn("containerd", ["containerd", "--config", str(c / "config.toml")])
        deadline = time.monotonic() + 30
        while True:
            if not self.running("containerd"):
                raise NodeError(f"containerd exited:\n{_tail(self.log_path('containerd'))}")
            if Path(self.containerd_sock).exists() and self.ctr("version", check=False).returncode == 0:
                break
            if time.monotonic() > deadline:
                raise NodeError(f"containerd not answering after 30 s:\n{_tail(self.log_path('containerd'))}")
            time.sleep(0.1)
        plugins = self.ctr("plugins", "ls").stdout
        ok = {ln.split()[1] for ln in plugins.splitlines()[1:] if ln.split()[-1] == "ok"
              and ln.startswith("io.containerd.snapshotter.v1")}
        if "overlayfs" not in ok:
            self.notes.append(f"containerd's overlayfs snapshotter is not available here ({sorted(ok)}); using native")
            log(self.notes[-1])
            # restart with the native snapshotter (slower: full copies)
            paths.stop_pid(self.pids["containerd"], self.starts["containerd"])
            self.snapshotter = "native"
            shutil.rmtree(c)
            self._start_containerd(log)

    def _import_images(self, log: Log) -> None:
        """Import each archive unless containerd's (persistent) store already has every image it
        names at the same manifest digest."""
        from devkit.node.runtime_image import archive_refs

        t = time.monotonic()
        have: dict[str, str] = {}
        for ln in self.ctr("images", "ls").stdout.splitlines()[1:]:
            f = ln.split()
            if len(f) >= 3:
                have[f[0]] = f[2]
        imported, kept = [], []
        for archive in sorted({a for a, _ in self.images.values()}):
            refs = archive_refs(archive)
            if refs and all(have.get(r) == d for r, d in refs.items()):
                kept.append(Path(archive).name)
                continue
            ti = time.monotonic()
            self._import_holding(archive, [r for r in refs if r in have], log)
            imported.append(f"{Path(archive).name} ({time.monotonic() - ti:.1f} s)")
        self._prune_images(log)
        self.notes.append(f"images imported: {', '.join(imported) or 'none'}; already in containerd's store: "
                          f"{', '.join(kept) or 'none'}")
        log(f"{self.notes[-1]} ({time.monotonic() - t:.1f} s)")

    def _import_holding(self, archive: str, replaced: list[str], log: Log) -> None:
        """``ctr images import`` of ``archive`` while the images it renames stay referenced.

        The import points each name at its new manifest first and unpacks after. A layer chain
        the new image shares with the old one (the controller image's base and requirements)
        is found already unpacked and skipped, but is not added to the import's lease, so a
        garbage collection in that window removes it and the next layer fails with "parent
        snapshot ... does not exist" (CI, 2026-12-06). A hold tag on each old image keeps its
        snapshots until the unpack has labelled the new image's own; the tags go after it, and
        ``_prune_images`` lets containerd's GC take what only the old image used. One retry
        covers any other collection that lands mid-unpack."""
        holds = [f"{HOLD_PREFIX}{i}:{os.getpid()}" for i in range(len(replaced))]
        for ref, hold in zip(replaced, holds):
            self.ctr("images", "tag", "--force", ref, hold)
        try:
            for attempt in (1, 2):
                try:
                    self.ctr("images", "import", f"--snapshotter={self.snapshotter}", archive, timeout=1800)
                    return
                except NodeError as e:
                    if attempt == 2 or "does not exist" not in str(e):
                        raise
                    log(f"importing {Path(archive).name} lost a snapshot mid-unpack; importing it again: {e}")
        finally:
            if holds:
                self.ctr("images", "rm", *holds, check=False)

    def _prune_images(self, log: Log) -> None:
        """The store is kept between starts: drop images no name points at any more (the CRI
        plugin keeps a ``sha256:<id>`` reference to every image it saw, so a runtime image that
        a newer build replaced would stay, unnamed, for good); containerd's GC then frees their
        content and snapshots, the layers shared with the current images excepted."""
        refs = {}
        for ln in self.ctr("images", "ls").stdout.splitlines()[1:]:
            f = ln.split()
            if len(f) >= 3:
                refs[f[0]] = f[2]
        holds = [r for r in refs if r.startswith(HOLD_PREFIX)]  # a run killed mid-import left them
        named = {d for r, d in refs.items() if not r.startswith(("sha256:", HOLD_PREFIX))}
        stale = holds + [r for r, d in refs.items() if r.startswith("sha256:") and d not in named]
        if stale:
            self.ctr("images", "rm", "--sync", *stale, check=False)
            log(f"removed {len(stale)} image(s) no name points at from containerd's store")

    # ---- kubelet -----------------------------------------------------------------------------
    def _start_kubelet(self) -> None:
        kd = self.sd / "kubelet"
        kd.mkdir()
        self.ports["kubelet"] = paths.free_port()
        self.ports["kubelet-healthz"] = paths.free_port()
        cfg = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "address": "127.0.0.1", "port": self.ports["kubelet"], "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": self.ports["kubelet-healthz"],
            # the API server has no --kubelet-client-certificate (devkit.cluster), so its calls for
            # logs/exec come without one: anonymous, on loopback only
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False},
                               "x509": {"clientCAFile": str(self.sd / "pki" / "client-ca.crt")}},
            "authorization": {"mode": "AlwaysAllow"},
            "cgroupDriver": "cgroupfs", "cgroupRoot": "/" + CGROUP_ROOT, "cgroupsPerQOS": True,
            "enforceNodeAllocatable": ["pods"],
            "containerRuntimeEndpoint": "unix://" + self.containerd_sock,
            "failSwapOn": False, "protectKernelDefaults": False,
            # every pod's name server is the cluster's CoreDNS (pods of dnsPolicy Default, CoreDNS's own,
            # get resolvConf: the host's)
            "clusterDNS": [CLUSTER_DNS_IP], "clusterDomain": CLUSTER_DOMAIN, "resolvConf": "/etc/resolv.conf",
            # imported images cannot be pulled again: never garbage-collect them
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
            "podLogsDir": str(self.sd / "pod-logs"),
            "volumePluginDir": str(self.sd / "volume-plugins"),
            "serializeImagePulls": False, "registerNode": True, "rotateCertificates": False,
            "nodeStatusUpdateFrequency": "4s", "syncFrequency": "10s",
            "fileCheckFrequency": "10s", "staticPodPath": "",
            "maxPods": 110,
        }
        (kd / "config.json").write_text(json.dumps(cfg, indent=2))
        self._spawn("kubelet", [
            self.exes["kubelet"], f"--config={kd / 'config.json'}",
            f"--kubeconfig={self.sd / 'kubelet.kubeconfig'}", f"--root-dir={kd / 'root'}",
            f"--cert-dir={kd / 'pki'}", f"--hostname-override={self.name}", f"--node-ip={self.node_ip}",
            "--v=1",
        ])

    # ---- control plane's controllers ------------------------------------------------------------
    def _start_control(self, cluster: Any) -> None:
        cpki = Path(cluster.pki)
        self.ports["kube-scheduler"] = paths.free_port()
        self._spawn("kube-scheduler", [
            self.exes["kube-scheduler"], f"--kubeconfig={self.sd / 'kube-scheduler.kubeconfig'}",
            "--bind-address=127.0.0.1", f"--secure-port={self.ports['kube-scheduler']}",
            "--leader-elect=false", "--v=1",
        ])
        self.ports["kube-controller-manager"] = paths.free_port()
        self._spawn("kube-controller-manager", [
            self.exes["kube-controller-manager"],
            f"--kubeconfig={self.sd / 'kube-controller-manager.kubeconfig'}",
            "--bind-address=127.0.0.1", f"--secure-port={self.ports['kube-controller-manager']}",
            "--leader-elect=false", "--use-service-account-credentials=true",
            f"--service-account-private-key-file={cpki / 'sa.key'}",
            f"--root-ca-file={cpki / 'serving-ca.crt'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}", f"--cluster-cidr={CLUSTER_CIDR}",
            "--allocate-node-cidrs=false", "--node-monitor-grace-period=40s", "--node-monitor-period=1s",
            "--v=1",
        ])

    def _start_kube_proxy(self) -> None:
        self.ports["kube-proxy-healthz"] = paths.free_port()
        self.ports["kube-proxy-metrics"] = paths.free_port()
        cfg = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(self.sd / "kube-proxy.kubeconfig")},
            "mode": "iptables", "clusterCIDR": CLUSTER_CIDR, "hostnameOverride": self.name,
            "bindAddress": "127.0.0.1",
            "healthzBindAddress": f"127.0.0.1:{self.ports['kube-proxy-healthz']}",
            "metricsBindAddress": f"127.0.0.1:{self.ports['kube-proxy-metrics']}",
            # NodePorts answer on loopback only (iptables rules; no socket is opened)
            "nodePortAddresses": ["127.0.0.0/8"],
            "iptables": {"localhostNodePorts": True, "syncPeriod": "30s", "minSyncPeriod": "1s"},
            # leave the host's conntrack table sizes and timeouts as they are
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        }
        p = self.sd / "kube-proxy.json"
        p.write_text(json.dumps(cfg, indent=2))
        self._spawn("kube-proxy", [self.exes["kube-proxy"], f"--config={p}", "--v=1"])

    # ---- readiness -----------------------------------------------------------------------------
    def api(self):
        """A ``kubernetes.client.ApiClient`` (admin) for the cluster this node belongs to."""
        from kubernetes import config

        return config.new_client_from_config(config_file=self.kubeconfig)

    def _raw(self) -> Any:
        cpki = Path(self.cluster_state_dir) / "pki"
        return paths.RawClient(self.server, cpki / "serving-ca.crt", cpki / "admin.crt", cpki / "admin.key")

    def _healthz(self, port: int, path: str = "/healthz", scheme: str = "http") -> bool:
        ctx = ssl._create_unverified_context() if scheme == "https" else None
        try:
            with urllib.request.urlopen(f"{scheme}://127.0.0.1:{port}{path}", timeout=2, context=ctx) as r:
                return r.status == 200
        except Exception:
            return False

    def _wait_ready(self, log: Log, t0: float, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        raw = self._raw()
        reported = set()
        while True:
            for name in self.pids:
                if not self.running(name):
                    raise NodeError(f"{name} exited:\n{_tail(self.log_path(name))}")
            checks = {
                "kube-scheduler": self._healthz(self.ports["kube-scheduler"], scheme="https"),
                "kube-controller-manager": self._healthz(self.ports["kube-controller-manager"], scheme="https"),
                "kube-proxy": self._healthz(self.ports["kube-proxy-healthz"]),
                "kubelet": self._healthz(self.ports["kubelet-healthz"]),
            }
            status, doc = raw.request("GET", f"/api/v1/nodes/{self.name}")
            ready = status == 200 and any(c.get("type") == "Ready" and c.get("status") == "True"
                                          for c in (doc.get("status") or {}).get("conditions") or [])
            taints = [t.get("key") for t in ((doc.get("spec") or {}).get("taints") or [])] if status == 200 else []
            checks["node Ready"] = ready
            # the node lifecycle controller lifts not-ready only after Ready: until then nothing schedules
            checks["node untainted"] = ready and not taints
            for k, v in checks.items():
                if v and k not in reported:
                    reported.add(k)
                    log(f"{k} up after {time.monotonic() - t0:.1f} s")
            if all(checks.values()):
                return
            if time.monotonic() > deadline:
                waiting = [k for k, v in checks.items() if not v]
                raise NodeError(f"node not ready after {timeout:.0f} s (waiting for {waiting}); "
                                f"kubelet log:\n{_tail(self.log_path('kubelet'))}")
            time.sleep(0.5)

    # ---- what a cluster admin provides (docs/cluster-prerequisites.md) --------------------------------
    def _cluster_objects(self) -> None:
        """The default StorageClass with its volumes, and the PriorityClasses Forge's pods name
        (renderers.pods.PRIORITY_CLASSES, the values docs/cluster-prerequisites.md suggests).

        Storage: ``forge-hostpath`` (``kubernetes.io/no-provisioner``) and :data:`VOLUMES`
        hostPath PersistentVolumes of :data:`VOLUME_SIZE`, ReadWriteOnce and ReadWriteMany (one
        node: every pod sees the same directory), directories ``<state>/volumes/pv-N`` with mode
        0777 as local-path-provisioner makes them, because hostPath ignores ``fsGroup`` and
        Forge's pods run as uid 1000 (the controller-manager's in-tree hostPath provisioner makes
        ``0750 root`` directories, which they cannot write). ``Retain``: a deleted claim leaves its
        volume Released; ``Node.stop`` removes volumes and directories."""
        raw = self._raw()
        objs = [("/apis/storage.k8s.io/v1/storageclasses", {
            "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": STORAGE_CLASS,
                         "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
            "provisioner": "kubernetes.io/no-provisioner", "reclaimPolicy": "Retain",
            "volumeBindingMode": "Immediate",
        })]
        for n in range(VOLUMES):
            d = self.sd / "volumes" / f"pv-{n}"
            d.mkdir(parents=True)
            d.chmod(0o777)
            objs.append(("/api/v1/persistentvolumes", {
                "apiVersion": "v1", "kind": "PersistentVolume",
                "metadata": {"name": f"forge-node-pv-{n}", "labels": {"forge.dev/node-volume": "true"}},
                "spec": {"capacity": {"storage": VOLUME_SIZE}, "accessModes": ["ReadWriteOnce", "ReadWriteMany"],
                         "persistentVolumeReclaimPolicy": "Retain", "storageClassName": STORAGE_CLASS,
                         "hostPath": {"path": str(d), "type": "Directory"}}}))
        for name, value in PRIORITY_CLASSES.items():
            objs.append(("/apis/scheduling.k8s.io/v1/priorityclasses", {
                "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
                "value": value, "globalDefault": False,
                "description": "Forge (docs/cluster-prerequisites.md); made by the forge test node"}))
        for path, body in objs:
            status, doc = raw.request("POST", path, json.dumps(body).encode())
            if status not in (200, 201, 409):
                raise NodeError(f"creating {body['kind']} {body['metadata']['name']}: HTTP {status}: {doc}")

    def _start_dns(self, cluster: Any, log: Log) -> None:
        """CoreDNS, the cluster's DNS (:mod:`devkit.node.coredns`): every pod's name server."""
        if not getattr(cluster, "node", True):  # no service-account token: its kubernetes plugin cannot list
            self.notes.append("no cluster DNS: the cluster was started without node=True")
            log(self.notes[-1])
            return
        dns = coredns.start(self, log=log)
        self.notes.append(f"CoreDNS {dns.version} at {dns.service_ip} ({dns.domain}) ready after {dns.start_seconds} s")

    def _remove_volumes(self, log: Log) -> None:
        """The node's PersistentVolumes (their directories go with the state directory)."""
        with contextlib.suppress(Exception):
            self._raw().request("DELETE", "/api/v1/persistentvolumes?labelSelector=forge.dev%2Fnode-volume%3Dtrue")

    # ---- stop ------------------------------------------------------------------------------------
    def stop(self, *, quiet: bool = False, keep_logs: bool = False) -> None:
        """Stop the node's pods and processes (by PID), give back everything host-wide it took.

        Under the machine's node LOCK, so that a start waiting for this node never takes a node
        half-way through its stop for a dead one and tears it down at the same time."""
        if _LOCK_HELD:
            self._stop(quiet=quiet, keep_logs=keep_logs)
            return
        LOCK.parent.mkdir(parents=True, exist_ok=True)
        with open(LOCK, "a+") as lockf:
            fcntl.flock(lockf, fcntl.LOCK_EX)
            _set_lock_held(True)
            try:
                self._stop(quiet=quiet, keep_logs=keep_logs)
            finally:
                _set_lock_held(False)

    def _stop(self, *, quiet: bool, keep_logs: bool) -> None:
        log = (lambda m: None) if quiet else _stderr_log
        t0 = time.monotonic()
        # The host-wide state (the /forge-node cgroups, KUBE-* chains, the bridge, sysctls) is the
        # machine's active node's. A node that is not the active one — stopped already (a second
        # stop, e.g. a test's and then its fixture's) while another has started since — must leave
        # it alone: tearing it down killed the other node's kubelet ("cgroup [forge-node] has some
        # missing paths"). No active node at all: whatever is left is ours to remove.
        try:
            owns_host = ACTIVE.read_text().strip() == str(self.sd)
        except OSError:
            owns_host = True
        # 1. no new pods: the host-run controllers (Argo's, Seldon's, the Prometheus Operator:
        # devkit.node.controllers records each in <state>/controllers/), the kube controllers and
        # the scheduler first
        for record in sorted((self.sd / "controllers").glob("*.json")):
            if record.exists():
                with contextlib.suppress(Exception):
                    ctl = json.loads(record.read_text())
                    paths.stop_pid(ctl["pid"], ctl["start_ticks"], timeout=5)
        for name in ("kube-controller-manager", "kube-scheduler"):
            if name in self.pids:
                paths.stop_pid(self.pids[name], self.starts.get(name, -1))
        # 2. the pods: the kubelet stops them (CNI teardown included) when they are deleted
        if self.running("kubelet") and self.running("containerd"):
            with contextlib.suppress(Exception):
                self._delete_pods(log)
        for name in ("kubelet", "kube-proxy"):
            if name in self.pids:
                paths.stop_pid(self.pids[name], self.starts.get(name, -1))
        # 3. whatever the kubelet left: kill and remove the containers through containerd
        if self.running("containerd"):
            self._remove_containers(log)
        if "containerd" in self.pids:
            paths.stop_pid(self.pids["containerd"], self.starts.get("containerd", -1))
        # a node that died (die_with_parent) leaves its containers running: whatever is still in
        # the node's cgroup is a pod's process
        if owns_host:
            _kill_cgroup_procs(log)
        self._kill_shims(log)
        # 4. host-wide state
        self._remove_volumes(log)
        unmount_under(self.sd)
        if owns_host:
            self.notes += [f"cgroup {root} left behind" for root in give_back_host(log, self.exes.get("kube-proxy"))]
            for key, val in self.sysctls_saved.items():
                with contextlib.suppress(OSError):
                    if _read_sysctl(key) != val:
                        _write_sysctl(key, val)
        with contextlib.suppress(Exception):
            self._raw().request("DELETE", f"/api/v1/nodes/{self.name}")
        # /var/log/containers: the kubelet's symlinks (a fixed path) into our pod logs
        with contextlib.suppress(OSError):
            for link in Path("/var/log/containers").iterdir():
                if link.is_symlink() and os.readlink(link).startswith(str(self.sd)):
                    link.unlink()
        if keep_logs:
            for sub in ("containerd", "kubelet", "pki", "cni", "volumes"):
                shutil.rmtree(self.sd / sub, ignore_errors=True)
        else:
            shutil.rmtree(self.sd, ignore_errors=True)
        with contextlib.suppress(OSError):
            if ACTIVE.read_text().strip() == str(self.sd):
                ACTIVE.unlink()
        log(f"node stopped in {time.monotonic() - t0:.1f} s "
            f"(pids {', '.join(f'{k}={v}' for k, v in self.pids.items())})")

    def _delete_pods(self, log: Log, timeout: float = 30.0) -> None:
        raw = self._raw()
        status, doc = raw.request("GET", f"/api/v1/pods?fieldSelector=spec.nodeName%3D{self.name}")
        if status != 200:
            return
        for pod in doc.get("items") or []:
            md = pod["metadata"]
            # a grace period of 1 s, not 0: a pod removed from the API at once is killed by the
            # kubelet with its spec's terminationGracePeriodSeconds (30 s for a PID 1 that ignores SIGTERM)
            raw.request("DELETE", f"/api/v1/namespaces/{md['namespace']}/pods/{md['name']}",
                        json.dumps({"gracePeriodSeconds": 1}).encode())
        # the kubelet kills the containers, then stops each sandbox (CNI teardown); it removes
        # them only at its next garbage collection, which _remove_containers does instead
        # A pod that was already terminating keeps its longer grace period in the kubelet; after
        # 5 s, what still runs gets SIGKILL through containerd (the kubelet then stops the sandbox).
        t = time.monotonic()
        killed = False
        while time.monotonic() < t + timeout:
            tasks = [ln.split() for ln in self.ctr("tasks", "ls", check=False).stdout.splitlines()[1:]]
            running = [f[0] for f in tasks if f and f[-1] == "RUNNING"]
            if not running:
                return
            if not killed and time.monotonic() > t + 5:
                killed = True
                for cid in running:
                    self.ctr("tasks", "kill", "-s", "SIGKILL", cid, check=False)
            time.sleep(0.3)
        log(f"some containers still ran {timeout:.0f} s after their pods were deleted; removing them through containerd")

    def _remove_containers(self, log: Log) -> None:
        for cid in self.ctr("tasks", "ls", "-q", check=False).stdout.split():
            self.ctr("tasks", "kill", "-s", "SIGKILL", cid, check=False)
        time.sleep(0.5)
        for cid in self.ctr("tasks", "ls", "-q", check=False).stdout.split():
            self.ctr("tasks", "rm", "-f", cid, check=False)
        for cid in self.ctr("containers", "ls", "-q", check=False).stdout.split():
            self.ctr("containers", "rm", cid, check=False)

    def _kill_shims(self, log: Log) -> None:
        """containerd-shim-runc-v2 processes of *this* containerd (their command line names our
        socket) outlive containerd; end them by PID."""
        for pid_dir in Path("/proc").iterdir():
            if not pid_dir.name.isdigit():
                continue
            pid = int(pid_dir.name)
            try:
                argv = [a.decode(errors="replace") for a in (pid_dir / "cmdline").read_bytes().split(b"\0") if a]
            except OSError:
                continue
            if argv and argv[0].endswith("containerd-shim-runc-v2") and self.containerd_sock in argv:
                ticks = paths.start_ticks(pid)
                if ticks is not None:
                    log(f"ending containerd-shim pid {pid}")
                    paths.stop_pid(pid, ticks, timeout=5)


def _cgroup_dirs() -> list[Path]:
    """The node's cgroup hierarchies on this host (v1 ones, and cgroup2's ``unified``)."""
    base = Path("/sys/fs/cgroup")
    return [base / s for s in CGROUP_HIERARCHIES if (base / s / "cgroup.procs").exists()]


def _forge_cni_rule(rule: str) -> bool:
    return 'name: \\"forge\\"' in rule or 'name: "forge"' in rule


def _remove_cni_iptables() -> None:
    """The bridge plugin's ipMasq chains (``CNI-…``, comment ``name: "forge" id: …``) of pods
    whose teardown did not run."""
    rules = _run(["iptables", "-t", "nat", "-S", "POSTROUTING"], check=False).stdout.splitlines()
    for rule in rules:
        if _forge_cni_rule(rule):
            args = rule.split()
            chain = args[args.index("-j") + 1] if "-j" in args else None
            subprocess.run(["iptables", "-t", "nat", *(["-D"] + _split_rule(rule)[1:])], capture_output=True)
            if chain and chain.startswith("CNI-"):
                subprocess.run(["iptables", "-t", "nat", "-F", chain], capture_output=True)
                subprocess.run(["iptables", "-t", "nat", "-X", chain], capture_output=True)
    # chains of ours no POSTROUTING rule points at any more (a teardown cut short between
    # its two steps) stay otherwise, and would outlive every later node
    for rule in _run(["iptables", "-t", "nat", "-S"], check=False).stdout.splitlines():
        args = rule.split()
        if len(args) > 1 and args[0] == "-A" and args[1].startswith("CNI-") and _forge_cni_rule(rule):
            subprocess.run(["iptables", "-t", "nat", "-F", args[1]], capture_output=True)
            subprocess.run(["iptables", "-t", "nat", "-X", args[1]], capture_output=True)


def _kill_cgroup_procs(log: Log) -> None:
    """SIGKILL whatever runs in the node's cgroups (a dead node's pods), until none is left."""
    for attempt in range(20):
        pids = set()
        for sub in _cgroup_dirs():
            root = sub / CGROUP_ROOT
            for d, _, files in os.walk(root, onerror=lambda e: None):
                if "cgroup.procs" in files:
                    with contextlib.suppress(OSError):
                        pids.update(int(p) for p in (Path(d) / "cgroup.procs").read_text().split())
        if not pids:
            return
        if attempt == 0:
            log(f"killing {len(pids)} process(es) left in the node's cgroup")
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, 9)
        time.sleep(0.2)


def _remove_cgroups(log: Log) -> list[str]:
    """Remove the node's cgroup trees; return the roots that could not be removed."""
    left = []
    for sub in _cgroup_dirs():
        root = sub / CGROUP_ROOT
        if not root.exists():
            continue
        # bottom-up; a directory that vanished meanwhile (the kernel, or the kubelet) is fine
        dirs = [Path(d) for d, _, _ in os.walk(root, topdown=False, onerror=lambda e: None) if Path(d) != root]
        for d in [*dirs, root]:
            with contextlib.suppress(OSError):
                d.rmdir()
        if root.exists():
            log(f"could not remove cgroup {root} (processes left in it?)")
            left.append(str(root))
    return left


def host_leftovers() -> list[str]:
    """What a node holds host-wide and is still here: its iptables chains and CNI rules, the
    pods' bridge, its cgroups. Empty on a host no node runs on or has left anything on."""
    found = [f"{ipt} -t {table} {r}" for ipt, table, rules in _iptables_rules() for r in rules
             if r.startswith(("-N KUBE-", "-N FORGE-NODE-")) or (r.startswith("-A") and _forge_cni_rule(r))]
    if _run(["ip", "link", "show", BRIDGE], check=False).returncode == 0:
        found.append(f"link {BRIDGE}")
    found += [f"cgroup {sub / CGROUP_ROOT}" for sub in _cgroup_dirs() if (sub / CGROUP_ROOT).exists()]
    return found


def give_back_host(log: Log, kube_proxy: str | None = None) -> list[str]:
    """Remove everything a node holds host-wide (see :func:`host_leftovers`) and return the
    cgroups that could not be removed. ``kube_proxy``: its binary, whose ``--cleanup`` goes first.

    Only under the machine's node LOCK, by the machine's one node (stopping) or by a start that
    found what a node that vanished without a stop left (its state directory gone with it)."""
    _kill_cgroup_procs(log)
    if kube_proxy and Path(kube_proxy).exists():
        _run([kube_proxy, "--cleanup", "--proxy-mode=iptables"], check=False)
    _remove_cni_iptables()
    remove_kube_iptables()
    _run(["ip", "link", "del", BRIDGE], check=False)
    return _remove_cgroups(log)


def _has_cap_sys_resource() -> bool:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapBnd:"):
            return bool(int(line.split()[1], 16) & (1 << 24))  # CAP_SYS_RESOURCE = 24
    return True


def remove_kube_iptables() -> None:
    """Remove every ``KUBE-*`` and ``FORGE-NODE-*`` chain and the rules that jump to them, in
    iptables and ip6tables: kube-proxy's (``kube-proxy --cleanup`` removes most), the kubelet's
    own (KUBE-FIREWALL, KUBE-KUBELET-CANARY), which nothing else removes, and the node's API server
    route. Only one node runs per machine (see LOCK)."""
    prefixes = ("KUBE-", "FORGE-NODE-")
    for ipt, table, rules in _iptables_rules():
        for rule in rules:
            args = _split_rule(rule)
            if args[:1] == ["-A"] and "-j" in args and args[args.index("-j") + 1].startswith(prefixes) \
                    and not args[1].startswith(prefixes):
                subprocess.run([ipt, "-t", table, "-D", *args[1:]], capture_output=True)
        chains = [r.split()[1] for r in rules if r.startswith(("-N KUBE-", "-N FORGE-NODE-"))]
        for c in chains:
            subprocess.run([ipt, "-t", table, "-F", c], capture_output=True)
        for c in chains:
            subprocess.run([ipt, "-t", table, "-X", c], capture_output=True)


def _iptables_rules() -> Iterator[tuple[str, str, list[str]]]:
    """(iptables or ip6tables, table, its rules as ``-S`` prints them) for each table a node writes."""
    for ipt in ("iptables", "ip6tables"):
        if not shutil.which(ipt):
            continue
        for table in ("filter", "nat", "mangle"):
            yield ipt, table, _run([ipt, "-t", table, "-S"], check=False).stdout.splitlines()


def _tail(path: Path, n: int = 40) -> str:
    return "\n".join(paths.log_tail(path, limit=20000).splitlines()[-n:])


def _split_rule(rule: str) -> list[str]:
    import shlex

    return shlex.split(rule)
