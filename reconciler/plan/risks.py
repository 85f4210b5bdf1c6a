"""Risk flags: what a change risks, for the top of the plan, each with the spec line that caused it
(pure; the caller passes the specs before and after, the plan's changes and what it knows of the
registry).

A flag names a *change* that makes a bad version likelier to reach users or harder to take back:
a gate loosened or removed, rollback or write-back turned off, a canary step skipped or traffic
jumping, a compression bound widened, a prune of something serving traffic. Two are states rather
than changes, because they are dangerous whenever they are on: fault injection, and a version about
to take traffic whose offline metrics are worse than the one serving (when the registry knows
both). Without a base revision (a plan against the live state) only those two and the prune are
flagged. `forgectl plan --fail-on-risk FLAG[,FLAG]` turns chosen flags into a failing exit code.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from renderers.labels import KIND, MODEL_VERSION, NAME, ROLE, VARIANT
from specs import Compression, Endpoint, Environment, Model, RolloutPolicy, SpecSet

if TYPE_CHECKING:
    from reconciler.load.yamlsource import RawDocument
    from reconciler.plan.change import Change
    from reconciler.registry.records import Record

#: A canary step may move at most this many points of traffic at once before `traffic-jump`
#: flags it (the first step counts from 0 %).
MAX_TRAFFIC_JUMP = 50

#: Every risk flag and what it means (docs/plan-json.md lists the same).
FLAGS: dict[str, str] = {
    "gate-loosened": "a rollout metric or an offline threshold is easier to pass (min lowered, max raised, more "
                     "failures tolerated, fewer measurements, a compare-to-stable margin widened, auto-promotion on)",
    "gate-removed": "a rollout metric, a step's analysis, an offline threshold or an endpoint's rollout policy removed",
    "rollback-disabled": "automatic rollback turned off (`onPrometheusUnreachable` rollback → hold, `inconclusiveLimit` "
                         "removed)",
    "writeback-disabled": "the git write-back after a rollback turned off",
    "fault-injection": "an Endpoint injects errors or latency into its canary, or a Model holds its first training attempt",
    "canary-step-skipped": "a canary step removed, so traffic skips a stage it used to be checked at",
    "traffic-jump": f"traffic to a new version grows by more than {MAX_TRAFFIC_JUMP} points in one step (or all at "
                    "once, blue-green)",
    "offline-metrics-fell": "the version about to take traffic scored worse offline than the version serving",
    "regression-gate-refused": "the rollout policy's regression gate will refuse the version about to take traffic: "
                               "worse than the live version on the same held-out data by more than its margin",
    "compression-bound-widened": "a compressed or exported variant may lose more accuracy than before",
    "prune-live-traffic": "an object serving traffic is deleted",
    "queue-quota-lowered": "a pool's Kueue quota (ClusterQueue nominal quota) is lowered; running work above the new "
                           "quota is preempted or never re-admitted",
}
#: The flag of a plan the target cannot run (a blocker, not a risk: the plan fails).
UNSATISFIABLE = "unsatisfiable"

#: Offline metrics and which way is better.
HIGHER_IS_BETTER = frozenset({"accuracy", "f1", "precision", "recall"})
LOWER_IS_BETTER = frozenset({"loss", "perplexity", "latencyP99Ms"})


@dataclass(frozen=True)
class Finding:
    """A risk flag or a blocker: the flag, a message, the spec (kind, name) and field that caused it
    and, once located, its file and line."""

    flag: str
    message: str
    kind: str = ""
    name: str = ""
    path: str = ""
    file: str = ""
    line: int = 0
    #: Where the capacity it runs into is declared (`file:line`), for blockers.
    declared_at: str = ""
    #: Index path into the document, to find the line; taken from the base revision's document
    #: when ``in_old`` (the field is gone).
    keys: tuple[str | int, ...] = field(default=(), compare=False, repr=False)
    in_old: bool = field(default=False, compare=False, repr=False)
    declared: tuple[str, str, tuple[str | int, ...]] | None = field(default=None, compare=False, repr=False)

    @property
    def where(self) -> str:
        """`file:line`, or ""."""
        return f"{self.file}:{self.line}" if self.file else ""

    def to_json(self) -> dict[str, Any]:
        """Plain data (docs/plan-json.md)."""
        return {"flag": self.flag, "message": self.message, "spec": {"kind": self.kind, "name": self.name},
                "path": self.path, "file": self.file or None, "line": self.line or None,
                "declaredAt": self.declared_at or None}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Finding:
        """Inverse of :meth:`to_json`."""
        spec = data.get("spec") or {}
        return cls(data["flag"], data["message"], spec.get("kind", ""), spec.get("name", ""), data.get("path", ""),
                   data.get("file") or "", data.get("line") or 0, data.get("declaredAt") or "")


def _dump(doc: Any) -> dict[str, Any]:
    return doc.model_dump(mode="json", by_alias=True)["spec"]


def _f(flag: str, message: str, kind: str, name: str, keys: tuple[str | int, ...], path: str, *, in_old: bool = False) -> Finding:
    return Finding(flag, message, kind, name, f"spec.{path}" if path else "spec", keys=("spec", *keys), in_old=in_old)


def _num(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


# -- rollout policies ---------------------------------------------------------------------------

def _bound_risks(kind: str, name: str, prefix: str, keys: tuple[str | int, ...], a: Mapping[str, Any],
                 b: Mapping[str, Any], what: str) -> list[Finding]:
    """min lowered, max raised or either removed, between two versions of one gate."""
    out = []
    for bound, looser in (("min", lambda x, y: y < x), ("max", lambda x, y: y > x)):
        old, new = a.get(bound), b.get(bound)
        if old is None:
            continue
        if new is None:
            out.append(_f("gate-loosened", f"{what}: `{bound}` {_num(old)} removed", kind, name, keys, prefix))
        elif looser(old, new):
            out.append(_f("gate-loosened", f"{what}: `{bound}` {_num(old)} → {_num(new)}", kind, name,
                          keys + (bound,), f"{prefix}.{bound}"))
    return out


def _metric_risks(kind: str, name: str, i: int, a: Mapping[str, Any], b: Mapping[str, Any]) -> list[Finding]:
    metric = b["name"]
    prefix = f"metrics[{metric}]"
    keys: tuple[str | int, ...] = ("metrics", i)
    what = f"rollout metric `{metric}`"
    out = _bound_risks(kind, name, prefix, keys, a, b, what)
    cts_a, cts_b = a.get("compareToStable") or {}, b.get("compareToStable") or {}
    for margin in ("maxIncrease", "maxDecrease"):
        old, new = cts_a.get(margin), cts_b.get(margin)
        if old is None:
            continue
        if new is None or new > old:
            shown = "removed" if new is None else f"→ {_num(new)}"
            out.append(_f("gate-loosened", f"{what}: `compareToStable.{margin}` {_num(old)} {shown}", kind, name,
                          keys + ("compareToStable",), f"{prefix}.compareToStable.{margin}"))
    if b.get("failureLimit", 0) > a.get("failureLimit", 0):
        out.append(_f("gate-loosened", f"{what}: `failureLimit` {a['failureLimit']} → {b['failureLimit']} (more failed "
                      "measurements tolerated)", kind, name, keys + ("failureLimit",), f"{prefix}.failureLimit"))
    if b.get("count", 0) < a.get("count", 0):
        out.append(_f("gate-loosened", f"{what}: `count` {a['count']} → {b['count']} (fewer measurements)", kind, name,
                      keys + ("count",), f"{prefix}.count"))
    old_lim, new_lim = a.get("inconclusiveLimit"), b.get("inconclusiveLimit")
    if old_lim is not None and new_lim is None:
        out.append(_f("rollback-disabled", f"{what}: `inconclusiveLimit` {old_lim} removed: missing data now holds the "
                      "rollout forever instead of rolling back", kind, name, keys, prefix))
    elif old_lim is not None and new_lim > old_lim:
        out.append(_f("gate-loosened", f"{what}: `inconclusiveLimit` {old_lim} → {new_lim}", kind, name,
                      keys + ("inconclusiveLimit",), f"{prefix}.inconclusiveLimit"))
    return out


def _jumps(policy: Mapping[str, Any]) -> list[tuple[int, int, int]]:
    """(from %, to %, step index) of each canary step; blue-green is one jump 0 → 100."""
    if policy.get("strategy") == "blueGreen":
        return [(0, 100, -1)]
    weights = [s["weight"] for s in (policy.get("canary") or {}).get("steps", [])]
    return [(w0, w1, i) for i, (w0, w1) in enumerate(zip([0, *weights], weights))]


def _steps_text(policy: Mapping[str, Any]) -> str:
    if policy.get("strategy") == "blueGreen":
        return "blue-green (0 → 100 %)"
    return " → ".join(f"{s['weight']} %" for s in (policy.get("canary") or {}).get("steps", []))


def policy_risks(kind: str, name: str, a: Mapping[str, Any], b: Mapping[str, Any]) -> list[Finding]:
    """Risks of changing a RolloutPolicy spec from ``a`` to ``b`` (dicts by alias)."""
    out: list[Finding] = []
    old_metrics = {m["name"]: m for m in a.get("metrics", [])}
    new_metrics = {m["name"]: (i, m) for i, m in enumerate(b.get("metrics", []))}
    for i, metric in enumerate(a.get("metrics", [])):
        if metric["name"] not in new_metrics:
            out.append(_f("gate-removed", f"rollout metric `{metric['name']}` removed", kind, name, ("metrics", i),
                          f"metrics[{metric['name']}]", in_old=True))
    for metric_name, (i, metric) in new_metrics.items():
        if metric_name in old_metrics:
            out += _metric_risks(kind, name, i, old_metrics[metric_name], metric)
    # Analyses per step, steps by weight (weights increase strictly, so a weight names a step).
    if a.get("strategy") == "canary" and b.get("strategy") == "canary":
        old_steps = {s["weight"]: s for s in a["canary"]["steps"]}
        new_steps = {s["weight"]: (i, s) for i, s in enumerate(b["canary"]["steps"])}
        for weight, (i, step) in new_steps.items():
            if weight in old_steps:
                gone = [m for m in old_steps[weight].get("analysis", []) if m not in step.get("analysis", [])]
                if gone:
                    out.append(_f("gate-removed", f"canary step {weight} %: analysis {', '.join(f'`{g}`' for g in gone)} "
                                  "removed", kind, name, ("canary", "steps", i, "analysis"), f"canary.steps[{i}].analysis"))
        skipped = [w for w in old_steps if w not in new_steps]
        if skipped:
            out.append(_f("canary-step-skipped", f"canary step{'s' if len(skipped) > 1 else ''} "
                          f"{', '.join(f'{w} %' for w in skipped)} removed: {_steps_text(a)} became {_steps_text(b)}",
                          kind, name, ("canary", "steps"), "canary.steps"))
    if a.get("strategy") == "blueGreen" and b.get("strategy") == "blueGreen":
        ba, bb = a["blueGreen"], b["blueGreen"]
        gone = [m for m in ba.get("analysis", []) if m not in bb.get("analysis", [])]
        if gone:
            out.append(_f("gate-removed", f"blue-green analysis {', '.join(f'`{g}`' for g in gone)} removed", kind, name,
                          ("blueGreen", "analysis"), "blueGreen.analysis"))
        if not ba.get("autoPromote", True) and bb.get("autoPromote", True):
            out.append(_f("gate-loosened", "blue-green `autoPromote` false → true: the switch no longer waits for "
                          "`forgectl rollout promote`", kind, name, ("blueGreen", "autoPromote"), "blueGreen.autoPromote"))
    old_jump = max((w1 - w0 for w0, w1, _ in _jumps(a)), default=0)
    for w0, w1, i in _jumps(b):
        if w1 - w0 > MAX_TRAFFIC_JUMP and w1 - w0 > old_jump:
            if i < 0:
                out.append(_f("traffic-jump", f"blue-green moves all traffic at once (0 → 100 %); it was {_steps_text(a)}",
                              kind, name, ("strategy",), "strategy"))
            else:
                out.append(_f("traffic-jump", f"canary step {i + 1} moves traffic {w0} % → {w1} % (+{w1 - w0} points, more "
                              f"than {MAX_TRAFFIC_JUMP}); the largest step was +{old_jump}", kind, name,
                              ("canary", "steps", i, "weight"), f"canary.steps[{i}].weight"))
            break
    if a.get("onPrometheusUnreachable") == "rollback" and b.get("onPrometheusUnreachable") != "rollback":
        out.append(_f("rollback-disabled", "`onPrometheusUnreachable` rollback → hold: an unreachable Prometheus no longer "
                      "rolls back", kind, name, ("onPrometheusUnreachable",), "onPrometheusUnreachable"))
    if (a.get("gitWriteback") or {}).get("enabled") and not (b.get("gitWriteback") or {}).get("enabled"):
        out.append(_f("writeback-disabled", "`gitWriteback.enabled` true → false: a rollback no longer commits the revert, "
                      "so the repository keeps claiming a version that is not live", kind, name,
                      ("gitWriteback", "enabled"), "gitWriteback.enabled"))
    return out


# -- models, compression, endpoints -----------------------------------------------------------

def model_risks(name: str, a: Mapping[str, Any], b: Mapping[str, Any]) -> list[Finding]:
    """Offline evaluation thresholds loosened or removed between two versions of a Model spec."""
    out: list[Finding] = []
    old = {t["metric"]: t for t in (a.get("evaluation") or {}).get("thresholds", [])}
    new = {t["metric"]: (i, t) for i, t in enumerate((b.get("evaluation") or {}).get("thresholds", []))}
    for i, t in enumerate((a.get("evaluation") or {}).get("thresholds", [])):
        if t["metric"] not in new:
            out.append(_f("gate-removed", f"offline threshold on `{t['metric']}` removed: nothing stops a worse model "
                          "before serving", "Model", name, ("evaluation", "thresholds", i),
                          f"evaluation.thresholds[{t['metric']}]", in_old=True))
    for metric, (i, t) in new.items():
        if metric in old:
            out += _bound_risks("Model", name, f"evaluation.thresholds[{metric}]", ("evaluation", "thresholds", i),
                                old[metric], t, f"offline threshold on `{metric}`")
    return out


def compression_risks(name: str, a: Mapping[str, Any], b: Mapping[str, Any]) -> list[Finding]:
    """Accuracy bounds widened between two versions of a Compression spec."""
    out: list[Finding] = []
    kind = "Compression"
    if b.get("maxAccuracyDrop", 0) > a.get("maxAccuracyDrop", 0):
        out.append(_f("compression-bound-widened", f"`maxAccuracyDrop` {_num(a['maxAccuracyDrop'])} → "
                      f"{_num(b['maxAccuracyDrop'])} points", kind, name, ("maxAccuracyDrop",), "maxAccuracyDrop"))

    def bound(spec: Mapping[str, Any], variant: Mapping[str, Any]) -> float:
        own = variant.get("maxAccuracyDrop")
        return float(own if own is not None else spec.get("maxAccuracyDrop", 0))

    old_variants = {v["name"]: v for v in a.get("variants", [])}
    for i, v in enumerate(b.get("variants", [])):
        was = old_variants.get(v["name"])
        # A variant that follows the spec-wide bound in both versions is covered by the flag above.
        if was is not None and (v.get("maxAccuracyDrop") is not None or was.get("maxAccuracyDrop") is not None):
            before, after = bound(a, was), bound(b, v)
            if after > before:
                out.append(_f("compression-bound-widened", f"variant `{v['name']}` may lose {_num(after)} points of accuracy "
                              f"(was {_num(before)})", kind, name, ("variants", i), f"variants[{v['name']}].maxAccuracyDrop"))
    ea, eb = a.get("export") or {}, b.get("export") or {}
    if ea and eb:
        if eb.get("maxAbsDiff", 0) > ea.get("maxAbsDiff", 0):
            out.append(_f("compression-bound-widened", f"export `maxAbsDiff` {_num(ea['maxAbsDiff'])} → "
                          f"{_num(eb['maxAbsDiff'])} (ONNX may differ more from PyTorch)", kind, name,
                          ("export", "maxAbsDiff"), "export.maxAbsDiff"))
        ia, ib = ea.get("int8") or {}, eb.get("int8") or {}
        before = float(ia["maxAccuracyDrop"] if ia.get("maxAccuracyDrop") is not None else a.get("maxAccuracyDrop", 0))
        after = float(ib["maxAccuracyDrop"] if ib.get("maxAccuracyDrop") is not None else b.get("maxAccuracyDrop", 0))
        own = ia.get("maxAccuracyDrop") is not None or ib.get("maxAccuracyDrop") is not None
        if ib.get("enabled", True) and after > before and own:
            out.append(_f("compression-bound-widened", f"ONNX Runtime INT8 may lose {_num(after)} points (was "
                          f"{_num(before)})", kind, name, ("export", "int8", "maxAccuracyDrop"), "export.int8.maxAccuracyDrop"))
    return out


def fault_injection_risks(head: SpecSet, base: SpecSet | None) -> list[Finding]:
    """Endpoints with fault injection on (a state: flagged whether or not this change turned it on)."""
    out = []
    for endpoint in head.of(Endpoint):
        faults = endpoint.spec.fault_injection
        if faults is None or (faults.error_rate == 0 and faults.added_latency_ms == 0):
            continue
        parts = [f"{faults.error_rate * 100:g} % errors"] if faults.error_rate else []
        parts += [f"+{faults.added_latency_ms:g} ms"] if faults.added_latency_ms else []
        before = base.get(Endpoint, endpoint.name) if base is not None else None
        was = before is not None and before.spec.fault_injection is not None and (
            before.spec.fault_injection.error_rate or before.spec.fault_injection.added_latency_ms)
        when = " (already on at the base revision)" if was else (" (turned on by this change)" if base is not None else "")
        out.append(_f("fault-injection", f"endpoint `{endpoint.name}` injects {' and '.join(parts)} into every canary"
                      f"{when}: a drill setting, never for production", "Endpoint", endpoint.name,
                      ("faultInjection",), "faultInjection"))
    out += [_model_fault_risk(model, base) for model in head.of(Model) if _training_faults(model)]
    return out


def _training_faults(model: Model | None) -> str:
    """What a Model's `faultInjection` does to its first training attempt, in words ("" for nothing)."""
    faults = model.spec.fault_injection if model is not None else None
    if faults is None:
        return ""
    parts = [f"holds its first training attempt for {faults.hold_first_attempt_seconds} s"] \
        if faults.hold_first_attempt_seconds else []
    if faults.kill_first_attempt:
        parts.append("kills its first training attempt (SIGKILL)")
    return " and ".join(parts)


def _model_fault_risk(model: Model, base: SpecSet | None) -> Finding:
    """A Model whose first training attempt holds or is killed (a drill of the retry path): every
    version it trains waits, or fails once, before it trains."""
    was = base is not None and _training_faults(base.get(Model, model.name))
    when = " (already on at the base revision)" if was else (" (turned on by this change)" if base is not None else "")
    return _f("fault-injection", f"model `{model.name}` {_training_faults(model)}{when}: a drill setting, never for "
              "production", "Model", model.name, ("faultInjection",), "faultInjection")


def spec_risks(base: SpecSet, head: SpecSet, base_env: Environment | None, head_env: Environment | None) -> list[Finding]:
    """Every change-based risk between the specs at the base revision and the head."""
    out: list[Finding] = []
    for policy in head.of(RolloutPolicy):
        old = base.get(RolloutPolicy, policy.name)
        if old is not None:
            out += policy_risks("RolloutPolicy", policy.name, _dump(old), _dump(policy))
    # An endpoint moved to another policy: the old policy against the new one.
    for endpoint in head.of(Endpoint):
        old_endpoint = base.get(Endpoint, endpoint.name)
        if old_endpoint is None:
            continue
        try:
            old_policy = base.policy_of(old_endpoint, base_env)
            new_policy = head.policy_of(endpoint, head_env)
        except Exception:  # noqa: BLE001 - a dangling reference is the loader's to report
            continue
        keys: tuple[str | int, ...] = ("rolloutPolicyRef",)
        if old_policy is not None and new_policy is None:
            out.append(_f("gate-removed", f"endpoint `{endpoint.name}` no longer has a rollout policy (was "
                          f"`{old_policy.name}`)", "Endpoint", endpoint.name, keys, "rolloutPolicyRef"))
        elif old_policy is not None and new_policy is not None and old_policy.name != new_policy.name:
            for finding in policy_risks("Endpoint", endpoint.name, _dump(old_policy), _dump(new_policy)):
                out.append(replace(finding, message=f"policy `{old_policy.name}` → `{new_policy.name}`: {finding.message}",
                                   path="spec.rolloutPolicyRef", keys=("spec", *keys), in_old=False))
    for model in head.of(Model):
        old_model = base.get(Model, model.name)
        if old_model is not None:
            out += model_risks(model.name, _dump(old_model), _dump(model))
    for compression in head.of(Compression):
        old_compression = base.get(Compression, compression.name)
        if old_compression is not None:
            out += compression_risks(compression.name, _dump(old_compression), _dump(compression))
    return out


# -- the plan's changes and the registry -------------------------------------------------------

def _labels(obj: Mapping[str, Any] | None) -> Mapping[str, str]:
    return ((obj or {}).get("metadata", {}).get("labels")) or {}


def prune_risks(changes: Iterable[Change]) -> list[Finding]:
    """Deletions of SeldonDeployments that carry traffic."""
    out = []
    for change in changes:
        if change.action.value != "delete" or change.ref.kind != "SeldonDeployment" or change.before is None:
            continue
        live = [p for p in change.before.get("spec", {}).get("predictors", []) if int(p.get("traffic", 0) or 0) > 0]
        if not live:
            continue
        shares = ", ".join(f"{p.get('name')} {p.get('traffic')} %" for p in live)
        labels = _labels(change.before)
        out.append(Finding("prune-live-traffic", f"SeldonDeployment {change.ref.namespace}/{change.ref.name} is deleted "
                           f"while serving traffic ({shares}): its endpoint goes down", labels.get(KIND, ""),
                           labels.get(NAME, ""), "spec", keys=("spec",), in_old=True))
    return out


def quota_risks(changes: Iterable[Change]) -> list[Finding]:
    """Updates of a ClusterQueue that lower a nominal quota (reconciler/plan/queues.py), one flag
    per queue, saying how much is in use when the live status was read; a plan against the live
    state and a pull request's both raise it."""
    from reconciler.plan.queues import LoweredQuota, lowered_quotas
    from specs.base import quantity_value

    by_queue: dict[str, list[LoweredQuota]] = {}
    for low in lowered_quotas(changes):
        by_queue.setdefault(low.change.ref.name, []).append(low)
    out = []
    for name, lows in sorted(by_queue.items()):
        # the accelerator first: cpu and memory usually follow it (derived from the GPU quota)
        lows.sort(key=lambda low: (low.resource in ("cpu", "memory"), low.resource))
        labels = _labels(lows[0].change.after)
        moves = ", ".join(f"{low.resource} {low.old} → {low.new}" for low in lows)
        running = [f"{low.in_use} {low.resource} in use now" + (", above the new quota"
                   if quantity_value(low.in_use) > quantity_value(low.new) else "")
                   for low in lows if low.in_use is not None]
        first = lows[0].resource
        keys: tuple[str | int, ...] = ("spec", "queue", "quota", first if first in ("cpu", "memory") else "gpus")
        out.append(Finding("queue-quota-lowered", f"ClusterQueue {name}: quota lowered, {moves}"
                           + (f"; {'; '.join(running)}" if running else ""), labels.get(KIND, ""), labels.get(NAME, ""),
                           ".".join(str(k) for k in keys), keys=keys))
    return out


def metric_risks(changes: Iterable[Change], records: Iterable[Record]) -> list[Finding]:
    """A version about to take traffic (an endpoint's new canary or stable) whose offline metrics
    the registry knows to be worse than those of the version serving now."""
    records = list(records)
    by_version = {(r.model, r.version): r for r in records}
    out = []
    for change in changes:
        if change.ref.kind != "SeldonDeployment" or change.after is None or change.action.value not in ("create", "update"):
            continue
        labels = _labels(change.after)
        roles = {p.get("labels", {}).get(ROLE, p.get("name")): p.get("labels", {}) for p in change.after["spec"].get("predictors", [])}
        live_roles = {p.get("labels", {}).get(ROLE, p.get("name")): p.get("labels", {})
                      for p in (change.before or {}).get("spec", {}).get("predictors", [])}
        incoming = roles.get("canary") or roles.get("stable")
        serving = (live_roles.get("stable") if change.before else None)
        if not incoming or not serving or incoming.get(MODEL_VERSION) == serving.get(MODEL_VERSION):
            continue
        model = next((r.model for r in records if r.version == incoming.get(MODEL_VERSION)), "")
        new = by_version.get((model, incoming.get(MODEL_VERSION, "")))
        old = by_version.get((model, serving.get(MODEL_VERSION, "")))
        if new is None or old is None:
            continue
        worse = []
        for metric in sorted(set(new.evaluation) & set(old.evaluation)):
            a, b = old.evaluation[metric], new.evaluation[metric]
            if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or isinstance(a, bool):
                continue
            if metric in HIGHER_IS_BETTER and b < a or metric in LOWER_IS_BETTER and b > a:
                worse.append(f"{metric} {a:.4g} → {b:.4g}")
        variant = incoming.get(VARIANT)
        va, vb = old.variants.get(variant or ""), new.variants.get(variant or "")
        fa, fb = (va.figures.accuracy if va else None), (vb.figures.accuracy if vb else None)
        if variant != "base" and isinstance(fa, (int, float)) and isinstance(fb, (int, float)) and fb < fa:
            worse.append(f"variant `{variant}` accuracy {fa:.4g} → {fb:.4g}")
        if worse:
            out.append(Finding("offline-metrics-fell", f"version {incoming.get(MODEL_VERSION)} of model `{model}` scored worse "
                               f"offline than version {serving.get(MODEL_VERSION)}, which serves now: {'; '.join(worse)}",
                               labels.get(KIND, "Endpoint"), labels.get(NAME, ""), "spec.modelRef", keys=("spec", "modelRef")))
    return out


def _incoming_and_serving(change: Change) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """Labels of the predictor about to take traffic and of the one serving now, when they differ."""
    if change.ref.kind != "SeldonDeployment" or change.after is None or change.before is None \
            or change.action.value not in ("create", "update"):
        return None
    roles = {p.get("labels", {}).get(ROLE, p.get("name")): p.get("labels", {}) for p in change.after["spec"].get("predictors", [])}
    live = {p.get("labels", {}).get(ROLE, p.get("name")): p.get("labels", {}) for p in change.before.get("spec", {}).get("predictors", [])}
    incoming, serving = roles.get("canary") or roles.get("stable"), live.get("stable")
    if not incoming or not serving or incoming.get(MODEL_VERSION) == serving.get(MODEL_VERSION):
        return None
    return incoming, serving


def regression_risks(changes: Iterable[Change], records: Iterable[Record], specs: SpecSet,
                     env: Environment) -> tuple[list[Finding], list[str]]:
    """The rollout policies' regression gates, judged now with what the registry knows: a flag for
    each the controller will refuse, and a note with the numbers for each it can judge or skip
    (the same function the controller runs: reconciler/rollout/regression.py)."""
    from reconciler.rollout.regression import regression_gate
    from specs import Endpoint

    by_version = {(r.model, r.version): r for r in records}

    def record_json(model: str, version: str | None) -> dict[str, Any] | None:
        # The gate reads a record's JSON form (the rollout controller hands it the same).
        found = by_version.get((model, version or ""))
        return found.to_json() if found is not None else None

    risks: list[Finding] = []
    notes: list[str] = []
    for change in changes:
        pair = _incoming_and_serving(change)
        if pair is None:
            continue
        incoming, serving = pair
        name = _labels(change.after or {}).get(NAME, "")
        endpoint = specs.get(Endpoint, name)
        policy = specs.policy_of(endpoint, env) if endpoint is not None else None
        gate = policy.spec.regression_gate if policy is not None else None
        if endpoint is None or gate is None:
            continue
        model = endpoint.spec.model_ref
        result = regression_gate(gate, record_json(model, incoming.get(MODEL_VERSION)),
                                 record_json(model, serving.get(MODEL_VERSION)), endpoint.spec.variant)
        notes.append(f"endpoint `{name}`: {result.detail}")
        if result.passed is False:
            risks.append(Finding("regression-gate-refused", f"endpoint `{name}`: {result.detail}", "Endpoint", name,
                                 "spec.modelRef", keys=("spec", "modelRef")))
    return risks, notes


# -- where ----------------------------------------------------------------------------------------

def locate(findings: Iterable[Finding], head: Mapping[tuple[str, str], RawDocument],
           base: Mapping[tuple[str, str], RawDocument] | None = None) -> list[Finding]:
    """Each finding with the file and line of its field: in the head's documents, or the base's
    when the field (or the whole document) is gone."""
    base = base or {}
    out = []
    for f in findings:
        key = (f.kind, f.name)
        first, second = (base, head) if f.in_old else (head, base)
        raw = first.get(key) or second.get(key)
        located = f
        if raw is not None:
            keys = f.keys if (raw is first.get(key)) else f.keys[:1]
            line, _ = raw.position(keys)
            located = replace(f, file=raw.file, line=line)
        if f.declared is not None:
            kind, name, keys = f.declared
            declared = head.get((kind, name)) or base.get((kind, name))
            if declared is not None:
                line, _ = declared.position(keys)
                located = replace(located, declared_at=f"{declared.file}:{line}")
        out.append(located)
    return out
