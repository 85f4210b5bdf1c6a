"""Ask the upstream projects' own code what a rendered object means.

Forge follows the controllers' semantics rather than approximating them (docs: DESIGN.md,
"Semantics belong to the controllers"). This module is the one door to that code:

* ``forge-judge`` (the Go module in ``judges/``, built by ``scripts/cluster/build.sh judge``
  from the Go module proxy, cached under ``~/.cache/forge`` by source and pinned versions):
  Argo Workflows' ``validate.ValidateWorkflow`` and expression evaluation, the Kubeflow
  Training Operator's PyTorchJob validating webhook, and the Pod Security admission's evaluator
  (``k8s.io/pod-security-admission``) over the pods an object makes;
* ``promtool`` from Debian's ``prometheus`` package, for PrometheusRule groups;
* ``seldon-judge`` (the Go module in ``judges/seldon``, built by ``judges/seldon/build.sh`` from
  Seldon Core v1.17.1's operator source in ``../shared/vendor-src``, which the Go module proxy
  refuses, and its other dependencies from the proxy): the operator's validating webhook for a
  SeldonDeployment and its controller's Deployments, Services (and Istio routes) for it.

Every function runs a process and returns the upstream verdict; none of them reinterprets it.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from reconciler.diagnostics import ForgeError

REPO_ROOT = Path(__file__).resolve().parents[3]
BUILD_SCRIPT = REPO_ROOT / "scripts" / "cluster" / "build.sh"
SELDON_BUILD_SCRIPT = REPO_ROOT / "judges" / "seldon" / "build.sh"

TaskResult = str | Mapping[str, Any]
"""A dependency's result for :func:`argo_eval_depends`: its node phase (``"Succeeded"``), or
``{"phase": …, "continueOn": {"failed": bool, "error": bool}, "children": [phase, …], "daemoned": bool}``
for a task with ``continueOn``, a fan-out (``children``: a TaskGroup's child phases) or a daemon."""


class UpstreamError(ForgeError):
    """An upstream judge could not run (no Go, build failed, bad input, expression error)."""


# --------------------------------------------------------------------------------------------
# forge-judge
# --------------------------------------------------------------------------------------------


@functools.cache
def judge_binary() -> Path:
    """Path of ``forge-judge``: ``$FORGE_JUDGE_BIN``, or built (first time) and reused from the cache.

    The first build compiles Argo Workflows and the Training Operator (minutes); its log goes to
    stderr. Later calls find the binary keyed by the sources and versions and return at once.
    """
    if override := os.environ.get("FORGE_JUDGE_BIN"):
        return Path(override)
    if shutil.which("go") is None:
        raise UpstreamError("forge-judge needs Go to build (`go` is not on PATH); install Go or set FORGE_JUDGE_BIN")
    if not BUILD_SCRIPT.is_file():
        raise UpstreamError(f"forge-judge is built from the source checkout; {BUILD_SCRIPT} is missing (set FORGE_JUDGE_BIN)")
    # stdout is the path; the build's progress stays visible on stderr
    proc = subprocess.run([str(BUILD_SCRIPT), "judge"], stdout=subprocess.PIPE, stderr=sys.stderr, text=True)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise UpstreamError(f"scripts/cluster/build.sh judge failed (exit {proc.returncode}); see its output above")
    return Path(lines[-1])


def _judge(subcommand: str, payload: Any) -> Any:
    proc = subprocess.run(
        [str(judge_binary()), subcommand], input=json.dumps(payload), capture_output=True, text=True, timeout=300,
    )
    if proc.returncode != 0:
        raise UpstreamError(f"forge-judge {subcommand}: {proc.stderr.strip() or f'exit {proc.returncode}'}")
    return json.loads(proc.stdout)


def flux_semver(ranges: Sequence[str], tags: Sequence[str]) -> list[dict[str, Any]]:
    """For each range, what Masterminds/semver v3 says of it as Flux's source-controller reads a
    GitRepository's `ref.semver`: ``{"range", "error"}`` when it refuses the range, else
    ``{"range", "admits"}``, the tags (in the order given) that are versions and in the range."""
    return list(_judge("semver", {"ranges": list(ranges), "tags": list(tags)}))


def argo_validate_many(manifests: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    """:func:`argo_validate` for many Workflows in one process; one error list per manifest."""
    if not manifests:
        return []
    return [v["errors"] for v in _judge("argo-validate", list(manifests))]


def argo_validate(manifest: Mapping[str, Any]) -> list[str]:
    """Argo's errors for a Workflow; empty when valid.

    Strict decoding into ``wfv1.Workflow`` (unknown or duplicate fields, bad quantities), then
    ``validate.ValidateWorkflow`` with the options of each of its callers: the controller,
    ``argo submit`` and ``argo lint`` (each message says which one).
    """
    return argo_validate_many([manifest])[0]


def pytorchjob_validate_many(objs: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    """:func:`pytorchjob_validate` for many PyTorchJobs in one process."""
    if not objs:
        return []
    return [v["errors"] for v in _judge("pytorchjob-validate", list(objs))]


def pytorchjob_validate(obj: Mapping[str, Any]) -> list[str]:
    """The Training Operator's errors for creating a PyTorchJob (strict decode, then its webhook)."""
    return pytorchjob_validate_many([obj])[0]


def pod_security_many(objs: Sequence[Mapping[str, Any]], *, level: str = "restricted", version: str = "latest",
                      argo_executor: Mapping[str, Any] | None = None,
                      pytorch_init_container_template: str | None = None) -> list[dict[str, Any]]:
    """The Pod Security admission's verdict on every pod each object makes: per object
    ``{"ok", "errors", "pods": [{"pod", "containers", "ok", "forbidden"}]}``, an error worded as the API server's
    refusal (``<pod>: violates PodSecurity "restricted:latest": …``).

    ``policy.NewEvaluator(policy.DefaultChecks())`` of ``k8s.io/pod-security-admission`` at
    ``level`` and ``version`` (a namespace's ``pod-security.kubernetes.io/enforce`` and
    ``…/enforce-version`` labels). Objects: what the admission reads pods from (Pod, Deployment, Job,
    …), Argo Workflows (one pod per template that runs one, assembled as the workflow-controller
    does), PyTorchJobs (one per replica type; inside a Workflow's resource template too) and
    SeldonDeployments (one per predictor component). The containers the controllers add are
    judged only when their configuration is given: ``argo_executor`` (the workflow-controller
    ConfigMap's ``executor`` container: Argo's ``init`` and ``wait`` containers, and a resource
    template's ``main``), ``pytorch_init_container_template`` (the Training Operator's
    ``--pytorch-init-container-template-file``; ``""`` for its built-in one: its own
    ``SetClusterSpec`` adds the container to the workers).
    """
    if not objs:
        return []
    payload: dict[str, Any] = {"level": level, "version": version, "objects": list(objs)}
    if argo_executor is not None:
        payload["argoExecutor"] = dict(argo_executor)
    if pytorch_init_container_template is not None:
        payload["trainingOperator"] = {"initContainerTemplate": pytorch_init_container_template}
    verdicts = _judge("pod-security", payload)
    # strict: a judge answering fewer verdicts than it was asked must fail, not judge less
    return [v for _, v in zip(objs, verdicts, strict=True)]


def _eval(payload: dict[str, Any]) -> bool:
    out = _judge("argo-expr", payload)
    if "error" in out:
        raise UpstreamError(f"Argo cannot evaluate {payload['expression']!r}: {out['error']}")
    return bool(out["value"])


def argo_eval_retry(
    expression: str,
    exit_code: int | None,
    phase: str,
    *,
    duration_seconds: float = 0.0,
    message: str = "",
    retries: int = 0,
    retry_policy: str | None = None,
    limit: int | None = None,
) -> bool:
    """Would Argo's controller retry a step whose last attempt ended like this?

    ``phase`` is the attempt's node phase (``"Failed"``: the container exited non-zero;
    ``"Error"``: it never ran or was killed), ``exit_code`` its container's exit code (None when
    there is none: Argo then says ``"-1"``), ``retries`` the attempts before it. The controller's
    scope (``lastRetry.exitCode`` etc., all strings) is built from these, the ``retryPolicy``
    gate applied, then ``retryStrategy.expression`` evaluated. ``limit`` counts like Argo's.
    """
    payload: dict[str, Any] = {
        "mode": "retry",
        "expression": expression,
        "scope": {"exitCode": exit_code, "phase": phase, "durationSeconds": duration_seconds,
                  "message": message, "retries": retries},
    }
    if retry_policy is not None:
        payload["retryPolicy"] = retry_policy
    if limit is not None:
        payload["limit"] = limit
    return _eval(payload)


def argo_eval_depends(expression: str, task_phases: Mapping[str, TaskResult]) -> bool:
    """Would Argo's DAG run a task with this ``depends``, given its dependencies' results?

    Bare task names expand as Argo expands them (``(a.Succeeded || a.Skipped || a.Daemoned)``,
    plus what ``continueOn`` allows). A dependency missing from ``task_phases`` is an error (the
    controller would still be waiting).
    """
    return _eval({"mode": "depends", "expression": expression, "scope": dict(task_phases)})


def argo_eval_when(expression: str, parameters: Mapping[str, str]) -> bool:
    """Would Argo run a step with this ``when``? ``parameters`` are what it substitutes
    (``{"tasks.evaluate.outputs.result": "pass"}``) before evaluating."""
    return _eval({"mode": "when", "expression": expression, "scope": dict(parameters)})


# --------------------------------------------------------------------------------------------
# promtool
# --------------------------------------------------------------------------------------------


def promtool_binary() -> str:
    """``$FORGE_PROMTOOL_BIN``, or the ``promtool`` of Debian's prometheus package."""
    candidates = [os.environ.get("FORGE_PROMTOOL_BIN"), shutil.which("promtool"), "/usr/bin/promtool"]
    if prom := os.environ.get("FORGE_PROMETHEUS_BIN"):
        candidates.append(str(Path(prom).with_name("promtool")))
    for exe in candidates:
        if exe and os.access(exe, os.X_OK):
            return exe
    raise UpstreamError("promtool not found: install Debian's prometheus package (apt-get install prometheus) "
                        "or set FORGE_PROMTOOL_BIN")


def promtool_check_rules(prometheus_rule_manifest: Mapping[str, Any]) -> list[str]:
    """``promtool check rules`` on a PrometheusRule's ``spec.groups``; empty when it passes.

    The groups are written as a Prometheus rules file, which is what the Prometheus Operator
    generates from the object. Messages name the object instead of the temporary file.
    """
    name = (prometheus_rule_manifest.get("metadata") or {}).get("name", "PrometheusRule")
    groups = (prometheus_rule_manifest.get("spec") or {}).get("groups") or []
    with tempfile.TemporaryDirectory(prefix="forge-promtool-") as tmp:
        path = Path(tmp) / f"{name}.rules.json"  # JSON is YAML: promtool reads it as a rules file
        path.write_text(json.dumps({"groups": groups}, indent=2))
        proc = subprocess.run([promtool_binary(), "check", "rules", str(path)], capture_output=True, text=True, timeout=120)
        if proc.returncode == 0:
            return []
        out = (proc.stdout + proc.stderr).replace(str(path), name)
    lines = [ln.strip() for ln in out.splitlines()]
    errors = [ln for ln in lines if ln and not ln.startswith("Checking ") and ln != "FAILED:"]
    return errors or [f"promtool check rules exited {proc.returncode}"]


# --------------------------------------------------------------------------------------------
# seldon-judge (Seldon Core v1's operator)
# --------------------------------------------------------------------------------------------

SeldonIngress = str
"""How the operator is installed, for :func:`seldon_render`: ``"none"`` (its code's default: no
Istio, no Ambassador), ``"istio"`` (``ISTIO_ENABLED=true``) or ``"ambassador"`` (v1 Mappings)."""


@functools.cache
def seldon_judge_binary() -> Path:
    """Path of ``seldon-judge``: ``$FORGE_SELDON_JUDGE_BIN``, or built (first time) and reused from the cache.

    The build needs Go, the module proxy (for the operator's dependencies) and the operator's
    source beside the checkout (``../shared/vendor-src/seldon-core-v1.17.1``, or
    ``$FORGE_SELDON_OPERATOR_SRC``); the first one takes about two minutes, its log on stderr.
    """
    if override := os.environ.get("FORGE_SELDON_JUDGE_BIN"):
        return Path(override)
    if shutil.which("go") is None:
        raise UpstreamError("seldon-judge needs Go to build (`go` is not on PATH); install Go or set FORGE_SELDON_JUDGE_BIN")
    if not SELDON_BUILD_SCRIPT.is_file():
        raise UpstreamError(f"seldon-judge is built from the source checkout; {SELDON_BUILD_SCRIPT} is missing (set FORGE_SELDON_JUDGE_BIN)")
    proc = subprocess.run([str(SELDON_BUILD_SCRIPT)], check=False, stdout=subprocess.PIPE, stderr=sys.stderr, text=True)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise UpstreamError(f"judges/seldon/build.sh failed (exit {proc.returncode}); see its output above")
    return Path(lines[-1])


def _seldon(args: Sequence[str], payload: Any) -> Any:
    # The operator reads its settings (ports, Istio, Ambassador, executor, default user …) from its
    # environment: give it none of ours, so its code's defaults (what -ingress does not set) apply.
    env = {k: v for k in ("PATH", "HOME", "TMPDIR", "LANG") if (v := os.environ.get(k)) is not None}
    proc = subprocess.run([str(seldon_judge_binary()), *args], input=json.dumps(payload), capture_output=True,
                          text=True, timeout=300, env=env, check=False)
    if proc.returncode != 0:
        raise UpstreamError(f"seldon-judge {' '.join(args)}: {proc.stderr.strip() or f'exit {proc.returncode}'}")
    return json.loads(proc.stdout)


def seldon_validate_many(objs: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    """:func:`seldon_validate` for many SeldonDeployments in one process."""
    if not objs:
        return []
    return [v["errors"] for v in _seldon(["validate"], list(objs))]


def seldon_validate(obj: Mapping[str, Any]) -> list[str]:
    """Seldon Core v1's errors for creating a SeldonDeployment; empty when it is admitted.

    Strict decoding into the operator's ``machinelearning.seldon.io/v1`` type (unknown or
    duplicate fields, bad quantities), then its validating webhook (``ValidateCreate``), then the
    same validation after ``Default()``, the defaulting its controller runs on every reconcile
    (such messages start with ``after Default():``). One message per field error.
    """
    return seldon_validate_many([obj])[0]


def seldon_render_many(objs: Sequence[Mapping[str, Any]], *, ingress: SeldonIngress = "none") -> list[list[dict[str, Any]]]:
    """:func:`seldon_render` for many SeldonDeployments in one process."""
    if not objs:
        return []
    verdicts = _seldon(["render", "-ingress", ingress], list(objs))
    out = []
    # strict: a judge that answers fewer verdicts than it was asked must fail, not judge less
    for obj, v in zip(objs, verdicts, strict=True):
        if v["errors"]:
            name = (obj.get("metadata") or {}).get("name", "SeldonDeployment")
            raise UpstreamError(f"Seldon Core rejects SeldonDeployment {name}:\n  " + "\n  ".join(v["errors"]))
        out.append(v.get("objects") or [])
    return out


def seldon_render(obj: Mapping[str, Any], *, ingress: SeldonIngress = "none") -> list[dict[str, Any]]:
    """What Seldon Core v1's controller creates for a SeldonDeployment.

    After :func:`seldon_validate` (a rejection raises :class:`UpstreamError` with the operator's
    messages), one pass of the operator's own ``Reconcile`` against controller-runtime's fake
    client: the Deployments, Services, HorizontalPodAutoscalers and PodDisruptionBudgets it
    creates, as manifests sorted by kind and name. With ``ingress="istio"`` the Deployments are
    then marked available and the controller reconciles again, adding its VirtualServices and
    DestinationRules (the only place, with Ambassador's Mappings, where Seldon v1 applies a
    predictor's ``traffic``).
    """
    return seldon_render_many([obj], ingress=ingress)[0]
