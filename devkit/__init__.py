"""Forge's development harness: what the tests, ``scripts/`` and ``bench/`` start (dev-only; not
part of the ``forgectl`` distribution).

A real, throw-away Kubernetes control plane and Prometheus, by concern:

* :mod:`devkit.common` — the pins (``scripts/cluster/versions.env``), the cache, the error type;
* :mod:`devkit.gobuild` — etcd and kube-apiserver built from the Go module proxy, ``go mod download``;
* :mod:`devkit.crds` — the real CRDs (Argo, Seldon, Prometheus Operator, Gateway API, Training Operator), pinned by sha256;
* :mod:`devkit.certs` — CAs, certificates and kubeconfigs (openssl);
* :mod:`devkit.apiclient` — a tiny stdlib HTTPS client for start-up;
* :mod:`devkit.cluster` — the cluster's lifecycle (start, load, stop, identities);
* :mod:`devkit.rbac` — forgectl's RBAC (docs/rbac/forgectl-role.yaml);
* :mod:`devkit.prometheus` — Debian's Prometheus with a generated config;
* :mod:`devkit.namespaces` — a namespace removed with what is in it (no namespace controller runs).

What the tests and the benches both run (bench/, scripts/ and devkit/ depend on devkit/, never on tests/):

* :mod:`devkit.runtime_steps` — runtime steps and model servers as processes (``Runner``, ``Server``);
* :mod:`devkit.digits` — the digits dataset and MLP configs they prepare, train and serve;
* :mod:`devkit.rollout` — traffic split by the live weights; :mod:`devkit.rollout_harness` — the
  quick-start's rollout on the API server (apply, controller, a Workflow ended by hand).
* :mod:`devkit.pods` — a Pod for a model server run as a process, Ready while it answers (the
  kubelet's part where no node runs).

Processes, ports, log tails, package installs and Prometheus's start-up are the local target's own
layer (:mod:`reconciler.targets.local.processes`), shared, not repeated here. Library use::

    from devkit.cluster import Cluster
    from devkit.prometheus import Prometheus
    cluster = Cluster.start()               # build-or-reuse, start, install CRDs, wait ready
    api = cluster.api_client()              # kubernetes.client.ApiClient (admin)
    prom = Prometheus.start(targets=["127.0.0.1:8000"])
    ...
    prom.stop(); cluster.stop()

``pyyaml`` is needed once to convert the CRD YAML to JSON (cached), and the ``kubernetes`` package
for :meth:`Cluster.api_client`.
"""
