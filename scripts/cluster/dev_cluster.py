"""CLI behind scripts/dev-cluster (the logic lives in the devkit package)."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from devkit.cluster import Cluster, default_state_dir  # noqa: E402
from devkit.common import ClusterError  # noqa: E402
from devkit.gobuild import ensure_binaries  # noqa: E402
from devkit.node.node import Node, NodeError  # noqa: E402
from devkit.node.node import default_state_dir as node_state_dir  # noqa: E402
from devkit.prometheus import Prometheus  # noqa: E402


def _exports(cluster: Cluster, prom_url: str | None, operated_url: str | None = None) -> str:
    lines = [f"export KUBECONFIG={shlex.quote(cluster.kubeconfig)}"]
    if prom_url:
        lines.append(f"export FORGE_PROMETHEUS_URL={shlex.quote(prom_url)}")
    if operated_url:  # the Prometheus Operator's Prometheus, a pod: pass it as `--prometheus-url`
        lines.append(f"export FORGE_CLUSTER_PROMETHEUS_URL={shlex.quote(operated_url)}")
    return "\n".join(lines)


def _operated_url(sd: Path) -> str | None:
    p = sd / "prometheus-operated.json"
    return json.loads(p.read_text())["url"] if p.exists() else None


def _prom_state(sd: Path) -> dict | None:
    p = sd / "prometheus.json"
    return json.loads(p.read_text()) if p.exists() else None


#: Where --controller's controller applies what is pushed (the quick-start's `cluster` namespace).
CONTROLLER_TARGET = "forge-quickstart"
GIT_NAMESPACE = "forge-git"


def _install_controller(node: Node, image: str, sd: Path, *, monitoring: bool) -> None:
    """A git server pod, then `forgectl install` of the controller (two pods in forge-system) with one
    source: that server's ``main``, the `cluster` environment in :data:`CONTROLLER_TARGET`."""
    import subprocess

    import yaml
    from kubernetes import client

    from devkit.node import gitdaemon, paths

    api = node.api()
    core = client.CoreV1Api(api)
    try:
        for ns in (GIT_NAMESPACE, CONTROLLER_TARGET):
            try:
                core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
            except client.ApiException as exc:
                if exc.status != 409:
                    raise
        server = gitdaemon.start(core, GIT_NAMESPACE, image)
    finally:
        api.close()
    config = sd / "controller.yaml"
    config.write_text(yaml.safe_dump({
        "apiVersion": "forge.dev/v1alpha1", "kind": "ControllerConfig", "namespace": "forge-system",
        "http": {"address": "0.0.0.0", "port": 8080},
        "sources": [{"name": "quickstart", "url": server.url, "branch": "main", "path": ".", "environment": "cluster",
                     "namespace": CONTROLLER_TARGET, "interval": "10s"}]}))
    env = dict(os.environ, KUBECONFIG=node.kubeconfig)
    root = Path(__file__).resolve().parents[2]
    subprocess.run([str(paths.binary("kubectl")), "apply", "--server-side", "--force-conflicts", "-f",
                    str(root / "docs" / "rbac" / "forgectl-role.yaml")], env=env, check=True, stdout=subprocess.DEVNULL)
    subprocess.run([sys.executable, "-m", "forgectl", "install", "--manage", CONTROLLER_TARGET, "--config", str(config),
                    *(() if monitoring else ("--no-monitoring",))], env=env, check=True, cwd=root, stdout=sys.stderr)
    print(f"# Forge's controller runs in forge-system (config {config}); it applies the `cluster` environment of "
          f"what is pushed to {server.push_url} (branch main) into {CONTROLLER_TARGET}, and `forgectl apply` there is "
          "refused while it leads:\n#   cd <a copy of examples/quickstart> && git init -b main && git add -A && "
          f"git commit -m specs && git push {server.push_url} HEAD:main\n"
          "#   kubectl -n forge-system wait --for=condition=Ready sync/quickstart", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/dev-cluster", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    start = sub.add_parser("start", help="start etcd + kube-apiserver (+ CRDs, + Prometheus)")
    start.add_argument("--prometheus", action="store_true", help="also start a Prometheus (1 s scrape interval)")
    start.add_argument("--no-crds", action="store_true", help="do not install the CRDs")
    start.add_argument("--node", action="store_true",
                       help="also start a node: containerd, kubelet, scheduler, controller-manager, kube-proxy (root)")
    start.add_argument("--argo", action="store_true",
                       help="with --node: also Argo Workflows' controller (devkit/node/argo.py)")
    start.add_argument("--runtime-image", action="store_true",
                       help="with --node: also Forge's runtime image (devkit/node/runtime_image.py; ~7 GB, "
                            "built and imported once)")
    start.add_argument("--seldon", action="store_true",
                       help="with --node: also Seldon Core v1's operator (devkit/node/seldon.py)")
    start.add_argument("--prometheus-operator", action="store_true",
                       help="with --node: also the Prometheus Operator and the Prometheus it manages in "
                            "`monitoring` (devkit/node/promop.py)")
    start.add_argument("--gateway", action="store_true",
                       help="with --node: also Traefik v3 with its Gateway API provider, its GatewayClass and the "
                            "Gateway traefik/forge (devkit/node/traefik.py) for `traffic.router: gatewayAPI`")
    start.add_argument("--controller", action="store_true",
                       help="with --node: also Forge's controller as pods (its image from "
                            "devkit/node/controller_image.py, `forgectl install`), pulling a git server that runs "
                            "on the node (devkit/node/gitdaemon.py) into namespace forge-quickstart")
    start.add_argument("--quickstart", action="store_true",
                       help="the quick-start's cluster as CI runs it: --node --argo --runtime-image --seldon "
                            "--prometheus-operator --gateway --controller")
    start.add_argument("--no-controller", action="store_true",
                       help="with --quickstart: leave Forge's controller out (then `forgectl apply --env cluster` "
                            "and `forgectl reconcile --watch` from this host do its work)")
    sub.add_parser("stop", help="stop what start started, by PID, and remove its data")
    sub.add_parser("env", help="print the export lines")
    sub.add_parser("status", help="print the saved state as JSON")
    sub.add_parser("build", help="build (or reuse) the binaries only")
    args = ap.parse_args(argv)
    sd = default_state_dir()
    try:
        if args.cmd == "build":
            for name, path in ensure_binaries().items():
                print(f"{name}: {path}")
            return 0
        if args.cmd == "start":
            if args.quickstart:
                args.node = args.argo = args.runtime_image = args.seldon = args.prometheus_operator = True
                args.gateway = True
                args.controller = not args.no_controller
            t0 = time.monotonic()
            ps = _prom_state(sd)
            if ps:  # left from an earlier start: end it unless that cluster still runs
                try:
                    running = Cluster.load(sd).alive()
                except ClusterError:
                    running = False
                if running:
                    raise ClusterError(f"a cluster is already running from {sd}; stop it first")
                Prometheus(**ps).stop()
            if args.node and (node_state_dir() / "state.json").exists():
                Node.load(node_state_dir()).stop(quiet=True)  # left from a start that died
            cluster = Cluster.start(sd, install_crds=not args.no_crds, die_with_parent=False, node=args.node)
            if (args.argo or args.runtime_image or args.seldon or args.prometheus_operator or args.gateway
                    or args.controller) and not args.node:
                raise ClusterError("--argo, --runtime-image, --seldon, --prometheus-operator, --gateway and --controller "
                                   "need --node")
            operated_url = gateway = None
            if args.node:
                from devkit.node import argo, promop, runtime_image, seldon, traefik

                extra = [argo.executor_image()] if args.argo else []
                if args.prometheus_operator:
                    extra += promop.images()
                if args.runtime_image:
                    archive, refs, _ = runtime_image.build()
                    extra += [(str(archive), r) for r in refs]
                if args.controller:
                    from devkit.node import controller_image

                    controller_archive, controller_ref, _ = controller_image.build()
                    extra.append((str(controller_archive), controller_ref))
                node = None
                try:
                    node = Node.start(cluster, node_state_dir(), die_with_parent=False, extra_images=extra,
                                      wait_for_other=900)
                    if args.argo:
                        argo.start(cluster, node, ["default"], die_with_parent=False)
                    if args.seldon:
                        seldon.start(cluster, node, die_with_parent=False)
                    if args.gateway:
                        gateway = traefik.start(cluster, node, die_with_parent=False)
                    if args.prometheus_operator:
                        operator = promop.start(cluster, node, die_with_parent=False)
                        operated_url = promop.deploy_prometheus(node, controller=operator)
                        (sd / "prometheus-operated.json").write_text(json.dumps({"url": operated_url}))
                    if args.controller:
                        _install_controller(node, controller_ref, sd, monitoring=not args.no_crds)
                except BaseException:
                    if node is not None:
                        node.stop(quiet=True, keep_logs=True)
                    cluster.stop(quiet=True, keep_logs=True)
                    raise
                print(f"# node {node.name} Ready ({node.versions['KUBERNETES_VERSION']}, containerd, "
                      f"{node.snapshotter}); state and logs: {node.state_dir}", file=sys.stderr)
            prom_url = None
            if args.prometheus:
                prom = Prometheus.start(state_dir=sd / "prometheus", die_with_parent=False)
                (sd / "prometheus.json").write_text(json.dumps(asdict(prom)))
                prom_url = prom.url
            v = cluster.version()
            print(f"# kube-apiserver {v.get('gitVersion')} at {cluster.server}; etcd {cluster.versions['ETCD_VERSION']}",
                  file=sys.stderr)
            if prom_url:
                print(f"# prometheus at {prom_url}", file=sys.stderr)
            if operated_url:
                print(f"# the Prometheus Operator's Prometheus at {operated_url} (a pod; the `cluster` Environment "
                      "names it by its in-cluster Service): forgectl reconcile --prometheus-url "
                      "$FORGE_CLUSTER_PROMETHEUS_URL", file=sys.stderr)
            if gateway is not None:
                ref = gateway.parent_ref()
                print(f"# the Gateway {ref['namespace']}/{ref['name']} (Traefik) listens at {gateway.url}; route an "
                      "Environment through it with\n#   traffic: {router: gatewayAPI, parentRef: "
                      f"{{name: {ref['name']}, namespace: {ref['namespace']}, sectionName: {ref['sectionName']}}}}}",
                      file=sys.stderr)
            print(f"# started in {time.monotonic() - t0:.1f} s (state: {sd})", file=sys.stderr)
            print(_exports(cluster, prom_url, operated_url))
            return 0
        if args.cmd == "env":
            cluster = Cluster.load(sd)
            ps = _prom_state(sd)
            print(_exports(cluster, f"http://127.0.0.1:{ps['port']}" if ps else None, _operated_url(sd)))
            return 0
        if args.cmd == "status":
            cluster = Cluster.load(sd)
            doc = asdict(cluster) | {"alive": cluster.alive(), "prometheus": _prom_state(sd)}
            if (node_state_dir() / "state.json").exists():
                node = Node.load(node_state_dir())
                doc["node"] = asdict(node) | {"alive": node.alive()}
            print(json.dumps(doc, indent=2))
            return 0 if cluster.alive() else 1
        if args.cmd == "stop":
            ps = _prom_state(sd)
            if ps:
                Prometheus(**ps).stop()
            if (node_state_dir() / "state.json").exists():
                Node.load(node_state_dir()).stop()
            try:
                cluster = Cluster.load(sd)
            except ClusterError as e:
                print(f"dev-cluster: {e}", file=sys.stderr)
                return 0
            cluster.stop()
            return 0
    except (ClusterError, NodeError) as e:
        print(f"dev-cluster: error: {e}", file=sys.stderr)
        return 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
