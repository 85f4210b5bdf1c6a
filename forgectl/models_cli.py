"""`forgectl models`: the model registry, its lineage, diffs and the leaderboard.

    forgectl models [MODEL] [-o json]          versions with lineage, then the leaderboard
    forgectl models show MODEL@VERSION         one version: lineage, evaluation, every variant's figures
    forgectl models diff A B                   what changed in the specs and in the metrics (A, B: MODEL@VERSION;
                                               B may be a bare version of A's model; `diff MODEL`: the last two)
    forgectl models report [--html FILE]       the leaderboard (terminal table, JSON, or a self-contained HTML file)

Parsing and printing only: the records come from `reconciler.observe.models` (built by
`reconciler.registry.records`, which also picks what `diff` compares), the ranking from
`reconciler.registry.leaderboard`, the page from `reconciler.present.report`.
"""

from __future__ import annotations

import json
import time
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer
from rich.console import JustifyMethod
from rich.markup import escape
from rich.table import Table
from typer.core import TyperGroup

from forgectl.options import NO_OVERRIDES, SpecsOpt, TargetFlags, with_target_flags
from forgectl.shell import open_environment, out, print_json
from specs.searchresult import SearchResult

if TYPE_CHECKING:
    from reconciler.registry.leaderboard import Board
    from reconciler.registry.records import Delta, Record


class _ListByDefault(TyperGroup):
    """`forgectl models [MODEL] …` runs `list`; `show`, `diff` and `report` are subcommands."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if not args or (args[0] not in self.commands and args[0] not in ("--help", "-h")):
            args = ["list", *args]
        return super().parse_args(ctx, args)


app = typer.Typer(cls=_ListByDefault, help="The model registry: versions with lineage, diffs and the leaderboard.",
                  no_args_is_help=False, add_completion=False, pretty_exceptions_enable=False)


class Output(str, Enum):
    text = "text"
    json = "json"


class GroupBy(str, Enum):
    dataset = "dataset"
    model = "model"


EnvOpt = Annotated[str | None, typer.Option("--env", "-e", help="Environment (default: the one marked default, else `local`).")]
OutOpt = Annotated[Output, typer.Option("--output", "-o", help="text or json.")]
ByOpt = Annotated[GroupBy, typer.Option("--by", help="Leaderboards per dataset or per model family.")]
BatchOpt = Annotated[int, typer.Option("--batch", help="Batch size whose latency the leaderboard shows.", min=1)]


def _records(specs: list[str] | None, env: str | None, flags: TargetFlags,
             model: str | None = None) -> tuple[str, list[Record]]:
    """The environment's name and its registry records (of ``model`` only, when given)."""
    from reconciler.observe.models import collect

    ctx = open_environment(specs, None, env, flags)
    return ctx.environment.name, collect(ctx.target, model)


def _console() -> Any:
    return out


def _e(value: Any) -> str:
    return escape("" if value is None else str(value))


def _num(value: Any) -> Any:
    return f"{value:.4g}" if isinstance(value, float) else value


def _served(record: Record) -> str:
    parts = []
    for s in record.served_by or ():
        if s.live:
            parts.append(f"{s.endpoint} {s.role} {s.variant or ''} {s.traffic} %".replace("  ", " "))
        else:
            parts.append(f"{s.endpoint} {s.role} (last rollout {s.rollout or '?'}, not live)")
    return ", ".join(parts) or "—"


def _parents(record: Record) -> str:
    return ", ".join(f"{p.model}@{(p.version or '?')[:12]} ({p.relation})" for p in record.lineage.parents) or "—"


def versions_table(records: list[Record]) -> Table:
    table = Table(title="Model versions", title_justify="left", show_lines=False)
    for col in ("model", "version", "registered", "git revision", "dataset (digest)", "spec digest", "workflow", "parents", "served by"):
        table.add_column(col, overflow="fold")
    for r in records:
        line = r.lineage
        table.add_row(_e(r.model), _e(r.version), _e(r.registered_at), _e(line.git_revision or "—"),
                      _e(f"{line.dataset} {(line.dataset_digest or '')[:19]}…"), _e((line.spec_digest or "")[:12]),
                      _e(line.workflow), _e(_parents(r)), _e(_served(r)))
    return table


def board_table(board: Board) -> Table:
    from reconciler.present.report import fmt_bytes, fmt_metric, fmt_ms

    metric = board.metric
    better = "higher is better" if board.goal == "maximize" else "lower is better"
    table = Table(title=f"Leaderboard: {board.group} — {metric} ({better}); latency at batch {board.batch}; "
                        "★ Pareto front (metric, size, p50)", title_justify="left")
    for col, justify in (("#", "right"), ("", "center"), ("model", "left"), ("version", "left"), ("variant", "left"),
                         ("runtime", "left"), (metric, "right"), ("size", "right"), ("params", "right"), ("p50", "right"),
                         ("p99", "right"), ("rows/s", "right"), ("memory", "right")):
        table.add_column(_e(col), justify=cast(JustifyMethod, justify), overflow="fold")
    for r in board.rows:
        f = r.figures
        table.add_row(str(r.rank), "[yellow]★[/yellow]" if r.pareto else "", _e(r.model), _e(r.version[:8]),
                      _e(r.variant), _e(f"{f.runtime} {f.kind}"), fmt_metric(metric, r.metric),
                      fmt_bytes(f.size_bytes), "—" if f.parameters is None else f"{f.parameters:,}",
                      fmt_ms(f.p50_ms), fmt_ms(f.p99_ms), "—" if f.throughput is None else f"{f.throughput:,.0f}",
                      fmt_bytes(f.memory_bytes))
    return table


@app.command("list")
@with_target_flags
def list_models(
    model: Annotated[str | None, typer.Argument(help="Only this model.")] = None,
    specs: SpecsOpt = None, env: EnvOpt = None, output: OutOpt = Output.text, by: ByOpt = GroupBy.dataset,
    batch: BatchOpt = 1, flags: TargetFlags = NO_OVERRIDES,
) -> None:
    """Registered versions with their lineage, then the leaderboard."""
    from reconciler.registry.leaderboard import leaderboards

    environment, records = _records(specs, env, flags, model)
    boards = leaderboards(records, by.value, batch)
    if output is Output.json:
        print_json({"environment": environment, "versions": [r.to_json() for r in records],
                    "leaderboards": [b.to_json() for b in boards]}, default=str)
        return
    console = _console()
    if not records:
        console.print(f"no registered model versions{f' of {_e(model)}' if model else ''} in environment {_e(environment)} "
                      "(a version is registered when its workflow succeeds: `forgectl apply`)")
        return
    console.print(versions_table(records))
    for board in boards:
        console.print(board_table(board))
        for note in board.notes:
            console.print(f"[yellow]note:[/yellow] {_e(note)}")


@app.command("show")
@with_target_flags
def show(
    ref: Annotated[str, typer.Argument(help="MODEL@VERSION (a unique version prefix is enough; MODEL alone: the newest).")],
    specs: SpecsOpt = None, env: EnvOpt = None, output: OutOpt = Output.text,
    flags: TargetFlags = NO_OVERRIDES,
) -> None:
    """One version: lineage, evaluation, every variant's figures per batch size, the rejected
    variants with why, built artifacts."""
    from reconciler.present.report import fmt_bytes, fmt_ms
    from reconciler.registry.records import find

    _, records = _records(specs, env, flags)
    record = find(records, ref)
    if output is Output.json:
        print_json(record.to_json(), default=str)
        return
    console = _console()
    lineage = record.lineage
    console.print(f"[bold]{_e(record.model)}@{_e(record.version)}[/bold]  registered {_e(record.registered_at)} "
                  f"in {_e(record.environment)}")
    for label, value in (("workflow", lineage.workflow), ("git revision", lineage.git_revision),
                         ("spec digest", lineage.spec_digest),
                         ("dataset", f"{lineage.dataset} version {lineage.dataset_version} {lineage.dataset_digest}"),
                         ("parents", _parents(record)), ("served by", _served(record))):
        console.print(f"  {label:<13} {_e(value or '—')}")
    evaluation = record.evaluation
    if evaluation:
        console.print("  evaluation    " + _e(", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in sorted(evaluation.items()))))
    for line in trust_lines(record):
        console.print("  " + _e(line))
    hw = record.hardware or {}
    if hw:
        console.print(f"  measured on   {_e(hw.get('cpu'))} ({_e(hw.get('machine'))}, {_e(hw.get('cores'))} cores, "
                      f"{_e(hw.get('threads'))} thread(s)); built for {_e(hw.get('hardwareTarget'))}"
                      + (f" — {_e(hw['note'])}" if hw.get("note") else ""))
    batches = sorted({b for v in record.variants.values() for b in v.figures.batches}, key=int)
    table = Table(title="Variants", title_justify="left")
    for col in ("variant", "runtime", "accuracy", "size", "params", "memory", *[f"batch {b} p50 / p99 / rows/s" for b in batches]):
        table.add_column(_e(col), overflow="fold")
    for name, variant in record.variants.items():
        f = variant.figures
        cells = [f"{fmt_ms(p.p50_ms)} / {fmt_ms(p.p99_ms)} / {p.throughput or 0:,.0f}" if (p := f.at(b)) else "—" for b in batches]
        accuracy = "—" if f.accuracy is None else f"{100 * f.accuracy:.2f} %"
        table.add_row(_e(name), _e(f"{f.runtime} {f.kind}"), accuracy, fmt_bytes(f.size_bytes),
                      "—" if f.parameters is None else f"{f.parameters:,}", fmt_bytes(f.memory_bytes), *cells)
    console.print(table)
    for name, reason in record.rejected.items():
        console.print(f"  variant {_e(name)}: [red]rejected[/red] — {_e(reason)}")
    for name, report in record.artifacts.items():
        state = "[green]built[/green]" if report.get("built") else "[yellow]not built[/yellow]"
        console.print(f"  artifact {_e(name)}: {state}" + (f" — {_e(report.get('reason'))}" if report.get("reason") else
                                                           f" ({fmt_bytes(report.get('sizeBytes'))})"))
    if record.search:
        search = SearchResult.from_json(record.search)
        console.print("  " + _e(search_line(search)))
        console.print(trials_table(search))
        chart = trials_chart(search)
        if chart is not None:
            console.print(chart)


def trust_lines(record: Record) -> list[str]:
    """`models show` lines for the privacy budget, robustness, explanations and auto-labels of a version."""
    lines = []
    privacy = record.privacy or {}
    if privacy:
        lines.append(f"{'privacy':<13} DP-SGD ε {privacy.get('epsilonSpent', float('nan')):.4g} spent of "
                     f"{privacy.get('epsilonTarget', float('nan')):g} at δ {privacy.get('delta', float('nan')):g} "
                     f"({privacy.get('accountant')} accountant; noise σ {privacy.get('noiseMultiplier', float('nan')):.4g}, "
                     f"clip {privacy.get('maxGradNorm', float('nan')):g}, {privacy.get('steps')} steps) — covers `base` only")
    robust = record.robustness or {}
    if robust:
        parts = [f"{a.upper()} {100 * robust[f'{a}Accuracy']:.2f} %" for a in robust.get("attacks", [])
                 if isinstance(robust.get(f"{a}Accuracy"), (int, float))]
        lines.append(f"{'robustness':<13} L∞ ε {robust.get('epsilon'):g}: " + ", ".join(parts)
                     + f" (clean {100 * robust.get('cleanAccuracy', float('nan')):.2f} %, {robust.get('rows')} test rows)")
    explained = record.explanations or {}
    if explained:
        agreement = ", ".join(f"{m} {v:.3g}" for m, v in (explained.get("agreement") or {}).items())
        verdict = "passed" if explained.get("sanityPassed") else "FAILED"
        lines.append(f"{'explanations':<13} {', '.join(explained.get('methods') or [])} on {explained.get('rows')} test rows; "
                     f"randomised-weights sanity: rank correlation {explained.get('sanityRankCorrelation')} "
                     f"({verdict}, < {explained.get('sanityBound')})"
                     + (f"; agreement with {explained.get('primary')}: {agreement}" if agreement else "")
                     + (f"; {explained.get('maps')} PNG maps" if explained.get("maps") else "")
                     + (f" in {explained['folder']}" if explained.get("folder") else ""))
    labeling = record.labeling or {}
    if labeling:
        agreed = (labeling.get("agreement") or {}).get("autoLabels")
        gate = labeling.get("gate") or {}
        lines.append(f"{'labels':<13} {labeling.get('autoLabelled')} of {labeling.get('rows')} rows auto-labelled by "
                     f"{labeling.get('model')} at confidence {labeling.get('confidence')}, {labeling.get('toReview')} to review"
                     + (f"; agreement with held-back labels {agreed:.4f}" if isinstance(agreed, (int, float)) else "")
                     + (f" (gate ≥ {gate.get('minAgreement')}: {'passed' if gate.get('passed') else 'FAILED'})" if gate else ""))
    return lines


def search_line(search: SearchResult) -> str:
    """`models show`'s line for the search that trained a version: the best trial, the count of
    each state (pruned ones among them) and, with early stopping, the epochs pruning saved."""
    study = search.study
    if study is None:
        best = search.values.get(search.best) if search.best is not None else None
        return (f"{'search':<13} {len(search.values)} trials, best {search.metric} ({search.goal}) "
                f"{_num(best)} from {search.best}")
    states = study.states
    line = (f"{'search':<13} {study.algorithm}, early stopping {study.early_stopping}: "
            f"{sum(states.values())} trials ({', '.join(f'{n} {k}' for k, n in sorted(states.items()))}); "
            f"best trial {study.best_trial}, {search.metric} {_num(study.best_value)} "
            f"with {json.dumps(dict(study.best_params), sort_keys=True)}")
    if study.epochs_budget:
        line += (f"; {study.epochs_trained} of {study.epochs_budget} trial-epochs trained, "
                 f"{study.epochs_saved} saved by pruning")
    return line + f" — study {study.name} in {study.storage}"


def trials_table(search: SearchResult) -> Table:
    """The search's trials, best first (pruned and failed trials after the completed ones)."""
    rows = search.rows()
    total = search.study.trials_total if search.study is not None else len(rows)
    shown = f"{len(rows)} of {total}" if total != len(rows) else f"{len(rows)}"
    table = Table(title=f"Search trials ({shown}): {search.metric} ({search.goal}), best first", title_justify="left")
    for col in ("trial", "state", search.metric or "value", "epochs", "pruned at", "hyperparameters"):
        table.add_column(_e(col), overflow="fold")
    for r in rows:
        params = ", ".join(f"{k} {_num(v)}" for k, v in sorted(r.params.items()))
        table.add_row(_e(f"{r.number}{' *' if search.is_best(r) else ''}"), _e(r.state),
                      _e(_num(r.value) if r.value is not None else "—"),
                      _e("—" if r.epochs_trained is None else r.epochs_trained), _e(r.pruned_at or "—"),
                      _e(params or r.output or "—"))
    return table


def trials_chart(search: SearchResult, width: int = 32) -> Table | None:
    """The search as it ran: each trial's value as a bar in the order the trials were numbered,
    with the best value so far — whether the sampler learned (TPE's later trials scoring higher)
    and where the pruner stopped trials shows at a glance. None without a study or a value."""
    from rich.bar import Bar

    if search.study is None:
        return None
    rows = sorted((r for r in search.rows() if r.value is not None), key=lambda r: r.number)
    if not rows:
        return None
    values = [float(r.value) for r in rows if r.value is not None]
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1.0
    better = max if search.goal == "maximize" else min
    best: float | None = None
    kept = f" (the best {len(search.rows())} of {search.study.trials_total} kept)" \
        if search.study.trials_total > len(search.rows()) else ""
    table = Table(title=f"Search trials in order{kept}: {search.metric}, bars from {_num(lo)} to {_num(hi)}",
                  title_justify="left")
    for col in ("trial", "state", search.metric or "value", "", "best so far"):
        table.add_column(_e(col), overflow="fold")
    for r in rows:
        value = float(r.value) if r.value is not None else lo
        if r.state == "complete":
            best = value if best is None else better(best, value)
        # a pruned trial's bar is its last reported value, drawn dim: it never competed for best
        bar = Bar(size=span, begin=0, end=max(value - lo, span / (2 * width)), width=width,
                  color="green" if search.is_best(r) else "grey50" if r.state != "complete" else "blue")
        table.add_row(_e(f"{r.number}{' *' if search.is_best(r) else ''}"), _e(r.state), _e(_num(value)), bar,
                      _e(_num(best) if best is not None else "—"))
    return table


@app.command("diff")
@with_target_flags
def diff(
    a: Annotated[str, typer.Argument(help="MODEL@VERSION (or MODEL alone: its last two versions).")],
    b: Annotated[str | None, typer.Argument(help="MODEL@VERSION, or a VERSION of A's model.")] = None,
    specs: SpecsOpt = None, env: EnvOpt = None, output: OutOpt = Output.text,
    flags: TargetFlags = NO_OVERRIDES,
) -> None:
    """What changed between two versions: the specs, the evaluation, and each variant's figures."""
    from reconciler.present.report import fmt_bytes, fmt_metric, fmt_ms
    from reconciler.registry.records import diff as diff_records
    from reconciler.registry.records import pair

    _, records = _records(specs, env, flags)
    ra, rb = pair(records, a, b)
    result = diff_records(ra, rb)
    if output is Output.json:
        print_json(result.to_json(), default=str)
        return
    console = _console()
    console.print(f"[bold]{_e(ra.model)}@{_e(ra.version[:12])} → {_e(rb.model)}@{_e(rb.version[:12])}[/bold]")
    console.print("[bold]Specs[/bold]")
    for line in result.spec_changes or ("no spec change (same inputs: a runtime or rendering change)",):
        console.print(f"  {_e(line)}")
    if result.evaluation:
        console.print("[bold]Evaluation[/bold]")
        for key, change in result.evaluation.items():
            if change.a != change.b:
                delta = f" ({change.delta:+.4g})" if change.delta is not None else ""
                console.print(f"  {_e(key)}: {_e(_num(change.a))} → {_e(_num(change.b))}{delta}")
    table = Table(title="Variants (A → B)", title_justify="left")
    for col in ("variant", "accuracy", "size", "p50 (batch 1)", "p99 (batch 1)", "rows/s"):
        table.add_column(col, overflow="fold")

    def cell(change: Delta | None, fmt: Any, points: bool = False) -> str:
        if change is None:
            return "—"
        text = f"{fmt(change.a)} → {fmt(change.b)}"
        if points and change.delta is not None:
            return text + f" ({100 * change.delta:+.2f} pt)"
        if change.ratio is not None:
            return text + f" ({100 * (change.ratio - 1):+.0f} %)"
        return text

    for name, changes in result.variants.items():
        if changes.only:
            table.add_row(_e(name), f"only in {'A' if changes.only == 'a' else 'B'}", "", "", "", "")
            continue
        figures = changes.figures
        table.add_row(_e(name), cell(figures.get("accuracy"), lambda v: fmt_metric("accuracy", v), points=True),
                      cell(figures.get("sizeBytes"), fmt_bytes), cell(figures.get("p50Ms"), fmt_ms), cell(figures.get("p99Ms"), fmt_ms),
                      cell(figures.get("throughput"), lambda v: "—" if v is None else f"{v:,.0f}"))
    console.print(table)


@app.command("report")
@with_target_flags
def report(
    html_file: Annotated[Path | None, typer.Option("--html", help="Write a self-contained HTML report (plots + tables) here.")] = None,
    model: Annotated[str | None, typer.Option("--model", help="Only this model's versions.")] = None,
    specs: SpecsOpt = None, env: EnvOpt = None, output: OutOpt = Output.text, by: ByOpt = GroupBy.dataset,
    batch: BatchOpt = 1, flags: TargetFlags = NO_OVERRIDES,
) -> None:
    """The leaderboard: a terminal table, JSON, or an HTML file that opens offline."""
    from reconciler.present.report import html_report
    from reconciler.registry.leaderboard import leaderboards

    environment, records = _records(specs, env, flags, model)
    boards = leaderboards(records, by.value, batch)
    if html_file is not None:
        page = html_report(boards, records, environment=environment,
                           generated=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()))
        html_file.write_text(page)
        _console().print(f"wrote {_e(html_file)} ({len(page.encode()) / 1024:.0f} KiB, {len(records)} version(s), "
                         f"{sum(len(b.rows) for b in boards)} row(s)); it needs no network to open")
        return
    if output is Output.json:
        print_json({"environment": environment, "leaderboards": [b.to_json() for b in boards]}, default=str)
        return
    for board in boards:
        _console().print(board_table(board))
    if not boards:
        _console().print(f"no registered model versions in environment {_e(environment)}")
