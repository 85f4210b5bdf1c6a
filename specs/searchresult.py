"""A hyperparameter search's result, as the pick-best step writes it (``trials.json``), the
register step keeps it in the registry and `forgectl models show` prints it.

The file crosses three rooms (a runtime writes it, another runtime summarises it, the CLI reads
it back from a registry record), so its shape and its one ranking of the trials live here, at the
seam both sides import. A search without a study (``grid`` or ``random`` with no early stopping)
has only ``values``, one per trial output folder; with a study, the study's counts and trials.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: The trial state Optuna names a trial that ran to its end (`TrialState.COMPLETE`, lower-cased).
COMPLETE = "complete"


@dataclass(frozen=True)
class TrialRow:
    """One trial of the study as ``trials.json`` records it (a row of the leaderboard)."""

    number: int
    #: The trial task's index in the fan-out (None for a trial no task of this search started).
    index: int | None
    state: str
    #: The final validation metric (complete), else the last one reported (pruned, running).
    value: float | None
    params: Mapping[str, Any]
    #: None in a row that does not say (a search without a study).
    epochs_trained: int | None
    #: The epoch after which the pruner stopped it (pruned trials only).
    pruned_at: int | None
    #: The trial's output folder, for a search without a study (its rows are its ``values``).
    output: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The row as ``trials.json`` holds it."""
        return {"number": self.number, "index": self.index, "state": self.state, "value": self.value,
                "params": dict(self.params), "epochsTrained": self.epochs_trained, "prunedAtEpoch": self.pruned_at}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TrialRow:
        """A row of ``trials.json`` (missing keys read as unknown)."""
        value = data.get("value")
        epochs = data.get("epochsTrained")
        return cls(number=int(data.get("number", 0)), index=data.get("index"), state=str(data.get("state", "")),
                   value=None if value is None else float(value), params=dict(data.get("params") or {}),
                   epochs_trained=None if epochs is None else int(epochs), pruned_at=data.get("prunedAtEpoch"),
                   output=data.get("output"))


def rank_key(goal: str | None) -> Callable[[TrialRow], tuple[bool, bool, float, int]]:
    """The leaderboard's order for a search that ``goal``s its metric: completed trials first (a
    pruned trial's value is an early epoch's, not comparable), then trials with a value, best value
    first, then by trial number."""
    sign = -1.0 if goal == "maximize" else 1.0
    return lambda row: (row.state != COMPLETE, row.value is None, sign * (row.value or 0.0), row.number)


def ranked(rows: Iterable[TrialRow], goal: str | None) -> list[TrialRow]:
    """``rows`` best first (:func:`rank_key`)."""
    return sorted(rows, key=rank_key(goal))


@dataclass(frozen=True)
class Study:
    """The study part of ``trials.json``: where it is kept, how it searched, what it found."""

    name: str | None
    storage: str | None
    algorithm: str | None
    early_stopping: str | None
    best_trial: int | None
    best_value: float | None
    best_params: Mapping[str, Any]
    #: How many trials ended in each state.
    states: Mapping[str, int]
    #: Its trials, as recorded (the register step keeps the best :data:`SUMMARY_TRIALS`).
    trials: tuple[TrialRow, ...]
    #: How many trials the study had (more than ``trials`` once summarised).
    trials_total: int
    epochs_trained: int | None = None
    epochs_budget: int | None = None
    epochs_saved: int | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Study:
        """The ``study`` object of ``trials.json``."""
        trials = tuple(TrialRow.from_json(t) for t in data.get("trials") or ())
        return cls(name=data.get("name"), storage=data.get("storage"), algorithm=data.get("algorithm"),
                   early_stopping=data.get("earlyStopping"), best_trial=data.get("bestTrial"),
                   best_value=data.get("bestValue"), best_params=dict(data.get("bestParams") or {}),
                   states=dict(data.get("states") or {}), trials=trials,
                   trials_total=int(data.get("trialsTotal", len(trials))), epochs_trained=data.get("epochsTrained"),
                   epochs_budget=data.get("epochsBudget"), epochs_saved=data.get("epochsSaved"))


@dataclass(frozen=True)
class SearchResult:
    """``trials.json``: the metric searched, its goal, the best trial's output folder, each
    completed trial's value by output folder, and the study when there was one."""

    metric: str | None
    goal: str | None
    best: str | None
    values: Mapping[str, float] = field(default_factory=dict)
    study: Study | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SearchResult:
        """``trials.json`` (or a registry record's ``search``)."""
        study = data.get("study")
        return cls(metric=data.get("metric"), goal=data.get("goal"), best=data.get("best"),
                   values={str(k): float(v) for k, v in (data.get("values") or {}).items()},
                   study=Study.from_json(study) if study else None)

    def rows(self) -> list[TrialRow]:
        """The trials best first: the study's, or one complete row per value without a study."""
        if self.study is not None and self.study.trials:
            return ranked(self.study.trials, self.goal)
        rows = (TrialRow(i, None, COMPLETE, v, {}, None, None, folder)
                for i, (folder, v) in enumerate(sorted(self.values.items())))
        return ranked(rows, self.goal)

    def is_best(self, row: TrialRow) -> bool:
        """Whether ``row`` is the trial the search picked."""
        if self.study is not None:
            return row.number == self.study.best_trial
        return row.output is not None and row.output == self.best


def summarised(search: Mapping[str, Any], keep: int) -> dict[str, Any]:
    """``trials.json`` as the registry keeps it: with a study, its trials cut to the best ``keep``
    (``trialsTotal`` says how many there were) and without the per-folder values its trials repeat."""
    study = search.get("study")
    if not study:
        return dict(search)
    rows = [TrialRow.from_json(t) for t in study.get("trials") or ()]
    summary = {k: v for k, v in search.items() if k != "values"}
    summary["study"] = {**study, "trials": [r.to_json() for r in ranked(rows, search.get("goal"))[:keep]],
                        "trialsTotal": len(rows)}
    return summary
