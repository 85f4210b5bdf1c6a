"""`forgectl experiment …`: an Endpoint's A/B experiment — status (arms, counts, effect, interval,
the rule that fired) and stop. The controller itself runs in `forgectl reconcile`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from forgectl.options import NO_OVERRIDES, EndpointArg, SpecsOpt, TargetFlags, with_target_flags
from forgectl.shell import one_endpoint, print_json

if TYPE_CHECKING:
    from reconciler.controller.watch import Controllers
    from reconciler.load.endpoints import DesiredEndpoint

app = typer.Typer(help="A/B experiments of endpoints: status and stop (the decision runs in `forgectl reconcile`).",
                  no_args_is_help=True)


def _context(specs_paths: list[str] | None, env: str | None, flags: TargetFlags,
             endpoint: str) -> tuple[Controllers, DesiredEndpoint]:
    """The controllers and the Endpoint, which must have an experiment."""
    from reconciler.diagnostics import ForgeError

    controllers, desired = one_endpoint(specs_paths, env, flags, endpoint)
    if desired.endpoint.spec.experiment is None:
        raise ForgeError(f"Endpoint {endpoint!r} has no `experiment` in its spec")
    return controllers, desired


def status_data(endpoint: str, model: str, version: str, saved: dict[str, Any] | None) -> dict[str, Any]:
    """The JSON of `experiment status`."""
    return {"endpoint": endpoint, "model": model, "desiredVersion": version, "experiment": saved}


def status_text(data: dict[str, Any]) -> str:
    """The terminal view of `experiment status`."""
    x = data["experiment"]
    if not x:
        return f"{data['endpoint']}: experiment not started yet (run `forgectl apply` / `forgectl reconcile`)"
    lines = [f"{data['endpoint']}: {x['phase']}" + (f" — winner {x['winner']}" if x.get("winner") else ""),
             f"  {x['reason']}", "",
             f"  {'arm':<12} {'version':<13} {'variant':<12} {'share':>5} {'successes':>10} {'trials':>10} {'rate':>8}"]
    for arm in x["arms"]:
        c = x.get("counts", {}).get(arm["name"], {})
        trials = c.get("trials", 0.0)
        rate = f"{c['successes'] / trials:.4f}" if trials else "-"
        mark = " (control)" if arm["name"] == x["control"] else ""
        lines.append(f"  {arm['name']:<12} {arm['version']:<13} {arm['variant']:<12} {arm['share']:>4}% "
                     f"{c.get('successes', 0):>10.0f} {trials:>10.0f} {rate:>8}{mark}")
    comparisons = (x.get("decision") or {}).get("comparisons") or []
    if comparisons:
        lines += ["", f"  {'vs control':<12} {'effect':>9} {'interval':>22} {'p (always valid)':>17} {'P(beats)':>9} verdict"]
        for c in comparisons:
            p = f"{c['pValue']:.4g}" if c.get("pValue") is not None else "-"
            prob = f"{c['probabilityToBeat']:.3f}" if c.get("probabilityToBeat") is not None else "-"
            interval = f"[{c['low']:+.4f}, {c['high']:+.4f}]"
            lines.append(f"  {c['arm']:<12} {c['effect']:>+9.4f} {interval:>22} {p:>17} {prob:>9} {c['verdict']}")
    for g in x.get("guardrails") or []:
        lines.append(f"  guardrail {g['metric']} on {g['arm']}: {g['verdict']} ({g['detail']})")
    lines.append(f"  looks: {x.get('looks', 0)}")
    if x.get("writeback"):
        lines.append(f"  write-back: {x['writeback']}")
    return "\n".join(lines)


@app.command("status")
@with_target_flags
def status(
    endpoint: EndpointArg,
    specs_paths: SpecsOpt = None,
    env: Annotated[str | None, typer.Option("--env", "-e", help="Environment name.")] = None,
    output: Annotated[str, typer.Option("--output", "-o", help="text or json.")] = "text",
    flags: TargetFlags = NO_OVERRIDES,
) -> None:
    """Arms, counts per arm, effect with its interval, p-value or probability to beat control, and the rule."""
    controllers, desired = _context(specs_paths, env, flags, endpoint)
    rollout = controllers.backend.load_state(endpoint)
    data = status_data(endpoint, desired.model, desired.version, rollout.experiment if rollout else None)
    if output == "json":
        print_json(data)
    else:
        print(status_text(data))


@app.command("stop")
@with_target_flags
def stop(
    endpoint: EndpointArg,
    specs_paths: SpecsOpt = None,
    env: Annotated[str | None, typer.Option("--env", "-e", help="Environment name.")] = None,
    flags: TargetFlags = NO_OVERRIDES,
) -> None:
    """Stop a running experiment now: control serves all traffic."""
    from reconciler.diagnostics import ForgeError

    controllers, desired = _context(specs_paths, env, flags, endpoint)
    try:
        state = controllers.experiments.stop(desired.endpoint, desired.version)
    except ValueError as exc:
        raise ForgeError(str(exc)) from exc
    print(state.reason)


def experiment_lines(data: dict[str, Any]) -> list[str]:
    """The lines `rollout status` adds for an endpoint's experiment and shadow."""
    lines = []
    x = (data.get("rollout") or {}).get("experiment")
    if x:
        lines.append(f"experiment: {x['phase']}" + (f", winner {x['winner']}" if x.get("winner") else "")
                     + f" — {x['reason']} (details: forgectl experiment status {data['endpoint']})")
        if x.get("writeback"):
            lines.append(f"experiment write-back: {x['writeback']}")
    s = data.get("shadow")
    if s and s.get("held"):
        lines.append(f"shadow: not started — {s['held']}")
    elif s:
        agreement = f"{s['agreement']:.2%}" if s.get("agreement") is not None else "-"
        distance = f"{s['meanProbabilityDistance']:.4f}" if s.get("meanProbabilityDistance") is not None else "-"
        latency = f"{s['meanLatencySeconds'] * 1000:.1f} ms" if s.get("meanLatencySeconds") is not None else "-"
        lines.append(f"shadow: {s['mirrored']} mirrored, {s['answered']} answered, {s['failed']} failed, "
                     f"agreement {agreement} of {s['compared']}, mean probability distance {distance}, "
                     f"mean latency {latency}")
    return lines
