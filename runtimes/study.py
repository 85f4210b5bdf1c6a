"""A search's Optuna study: the trials that learn (`tpe`) or stop early (`asha`, `median`).

Every trial task of a search opens the same study, kept in an RDB storage all of them reach — a
SQLite file on the workspace volume (one node; SQLite serialises the writers, and the trials write
a few rows per epoch). Optuna's samplers and pruners do the deciding; this module only wires them to
the train step:

- :func:`start_trial` opens the study and asks it for this task's trial. `tpe` suggests each
  dimension of the search space (TPE learns from the trials finished so far; `constant_liar` keeps
  parallel trials from asking for the same point); `grid` and `random` trials keep the values the
  renderer wrote (``overrides``), recorded as user attributes, so only the pruner reads the study.
  A retried task finds its own trial still RUNNING and carries on with it: the same values, so its
  checkpoint still fits.
- :meth:`TrialRun.report` gives the validation metric after each epoch and says whether the
  pruner stops the trial; :meth:`TrialRun.finish` records the end (COMPLETE with the final value,
  or PRUNED).
- :func:`study_summary` is what the pick-best step reads: the best completed trial and the counts.

The choices Optuna leaves open are fixed here, once: ASHA with rungs at 1, 3, 9, … epochs
(``min_resource=1``, ``reduction_factor=3``); the median rule from the second epoch on, after a
quarter of the trials (at least one, at most five) have reported; TPE's random start-up trials a
quarter of the trials (2 to 10). Samplers are seeded from the spec's digest.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtimes._step import in_workspace
from runtimes.errors import StepFailed
from specs.model import Choice, IntRange, Search, Uniform
from specs.searchresult import TrialRow
from specs.stepconfig import STUDY_RUN_ENV, STUDY_URL_ENV, SearchStudy

log = logging.getLogger("forge.study")

#: How long a trial waits for the SQLite file's lock (seconds): parallel trials write at once.
LOCK_TIMEOUT_S = 60


def _storage(study: SearchStudy) -> Any:
    import optuna

    if study.database is not None:
        url = os.environ.get(STUDY_URL_ENV, "")
        if not url:
            raise StepFailed(f"the study {study.name} is kept in the database of Secret {study.database.secret} "
                             f"(key {study.database.key}), but ${STUDY_URL_ENV} is empty in this step")
        # pool_pre_ping: a trial's connection idles through an epoch, and the server may drop it.
        return optuna.storages.RDBStorage(url=url, engine_kwargs={"pool_pre_ping": True})
    path = in_workspace(study.storage)
    path.parent.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{Path(path).resolve()}"
    return optuna.storages.RDBStorage(url=url, engine_kwargs={"connect_args": {"timeout": LOCK_TIMEOUT_S}})


#: PostgreSQL's SQLSTATEs for a `CREATE` that another session's won: duplicate table, duplicate object.
DUPLICATE_PGCODES = ("42P07", "42710")


def study_name(study: SearchStudy) -> str:
    """The study's name in its storage: the model and version, and in a database (which outlives
    the workspace the trials' outputs are on) the run too, so a version trained again on a fresh
    workspace never picks a trial whose output is gone."""
    run = os.environ.get(STUDY_RUN_ENV, "") if study.database is not None else ""
    return f"{study.name}-{run}" if run else study.name


def _sampler(search: Search, seed: int) -> Any:
    import optuna

    if search.algorithm == "tpe":
        startup = max(2, min(10, search.trials // 4))
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup, constant_liar=True)
    # grid / random trials carry the values the renderer drew; the sampler suggests nothing.
    return optuna.samplers.RandomSampler(seed=seed)


def _pruner(search: Search) -> Any:
    import optuna

    if search.early_stopping == "asha":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=3, min_early_stopping_rate=0)
    if search.early_stopping == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=max(1, min(5, search.trials // 4)), n_warmup_steps=1)
    return optuna.pruners.NopPruner()


def open_study(study: SearchStudy, index: int = 0) -> Any:
    """The search's study, created by the first trial to get there (the others load it). Creating
    the tables of a new storage races between parallel trials — in a SQLite file both stamp
    Alembic's version row; in PostgreSQL both may issue the same `CREATE TABLE` (a duplicate table
    or type): a lost race is retried, and then finds the tables made. Each trial task seeds its sampler
    with the study's seed plus its index: parallel processes seeded alike would draw the same
    start-up trials."""
    import optuna
    import sqlalchemy.exc

    search = study.search
    for attempt in range(6):
        try:
            return optuna.create_study(
                storage=_storage(study), study_name=study_name(study), load_if_exists=True,
                sampler=_sampler(search, study.seed + index), pruner=_pruner(search),
                direction="maximize" if search.goal == "maximize" else "minimize",
            )
        except (sqlalchemy.exc.OperationalError, sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError) as exc:
            # a locked file, the other trial stamped the schema's version first, or (PostgreSQL)
            # created a table first; any other programming error is not a race
            if isinstance(exc, sqlalchemy.exc.ProgrammingError) and getattr(exc.orig, "pgcode", None) not in DUPLICATE_PGCODES:
                raise
            if attempt == 5:
                raise StepFailed(f"cannot open the study {study.name} in {study.where}: {exc}") from None
            time.sleep(0.5 * 2**attempt)
    raise AssertionError("unreachable")


def _suggest(trial: Any, search: Search) -> dict[str, float | int | str]:
    params: dict[str, float | int | str] = {}
    for name in sorted(search.space):
        dim = search.space[name]
        if isinstance(dim, Choice):
            params[name] = trial.suggest_categorical(name, list(dim.values))
        elif isinstance(dim, IntRange):
            params[name] = trial.suggest_int(name, dim.min, dim.max)
        elif isinstance(dim, Uniform):
            params[name] = trial.suggest_float(name, dim.min, dim.max, log=dim.type == "logUniform")
    return params


@dataclass
class TrialRun:
    """One trial task's trial in the study."""

    study: Any
    trial: Any
    params: dict[str, float | int | str]
    metric: str
    reported: int = 0
    pruned_at: int | None = None

    @property
    def number(self) -> int:
        return int(self.trial.number)

    def report(self, metrics: dict[str, float], epoch: int) -> bool:
        """Report the validation metric after ``epoch`` (1-based); True when the pruner stops the trial."""
        value = metrics.get(self.metric)
        if value is None or not math.isfinite(value):
            log.warning("trial %d: no finite %s after epoch %d; nothing reported", self.number, self.metric, epoch)
            return False
        self.trial.report(float(value), epoch)
        self.reported = max(self.reported, epoch)
        if self.trial.should_prune():
            self.pruned_at = epoch
            return True
        return False

    def finish(self, metrics: dict[str, float]) -> str:
        """Record how the trial ended: PRUNED, or COMPLETE with its final validation metric."""
        import optuna

        self.trial.set_user_attr("epochsTrained", self.reported)
        if self.pruned_at is not None:
            self.study.tell(self.trial, state=optuna.trial.TrialState.PRUNED)
            return "pruned"
        value = metrics.get(self.metric)
        if value is None or not math.isfinite(value):
            self.study.tell(self.trial, state=optuna.trial.TrialState.FAIL)
            return "failed"
        self.study.tell(self.trial, float(value))
        return "complete"


def start_trial(study_config: SearchStudy, index: int, output: str, overrides: dict[str, float | int | str]) -> TrialRun:
    """This task's trial: its own RUNNING trial when the task is a retry, else a new one asked of
    the study (with values suggested by TPE, or the rendered ``overrides`` recorded)."""
    import optuna

    study = open_study(study_config, index)
    mine = [t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
            if t.user_attrs.get("index") == index]
    if mine:
        trial = optuna.trial.Trial(study, mine[-1]._trial_id)
        log.info("trial task %d: carrying on with trial %d (a retry)", index, trial.number)
    else:
        trial = study.ask()
        trial.set_user_attr("index", index)
        trial.set_user_attr("output", output)
        if overrides:
            trial.set_user_attr("overrides", dict(overrides))
    search = study_config.search
    params = _suggest(trial, search) if search.algorithm == "tpe" else {}
    return TrialRun(study, trial, params, search.metric)


@dataclass(frozen=True)
class StudySummary:
    """What the pick-best step reads of a study."""

    best_output: str | None
    best_value: float | None
    best_number: int | None
    best_params: dict[str, Any]
    values: dict[str, float]
    states: dict[str, int]
    epochs_trained: int
    trials: tuple[TrialRow, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"bestTrial": self.best_number, "bestValue": self.best_value, "bestParams": self.best_params,
                "best": self.best_output, "states": self.states, "epochsTrained": self.epochs_trained,
                "trials": [t.to_json() for t in self.trials]}


def _row(trial: Any) -> TrialRow:
    """A frozen trial as a leaderboard row: its asked values (TPE) or the rendered ones it recorded."""
    import optuna

    steps = sorted(trial.intermediate_values)
    last = trial.intermediate_values[steps[-1]] if steps else None
    value = trial.value if trial.state == optuna.trial.TrialState.COMPLETE else last
    index = trial.user_attrs.get("index")
    return TrialRow(
        number=int(trial.number), index=int(index) if index is not None else None, state=trial.state.name.lower(),
        value=float(value) if value is not None else None,
        params=dict(trial.params) or dict(trial.user_attrs.get("overrides", {})),
        epochs_trained=int(trial.user_attrs.get("epochsTrained", len(steps))),
        pruned_at=steps[-1] if trial.state == optuna.trial.TrialState.PRUNED and steps else None,
    )


def study_summary(study_config: SearchStudy) -> StudySummary:
    """The best completed trial of the study (pruned ones never win), every trial's state and the
    epochs the trials trained in all (what pruning saved is the rest of the budget)."""
    import optuna

    study = optuna.load_study(study_name=study_name(study_config), storage=_storage(study_config))
    trials = study.get_trials(deepcopy=False)
    rows = tuple(_row(t) for t in trials)
    states: dict[str, int] = {}
    for row in rows:
        states[row.state] = states.get(row.state, 0) + 1
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE and t.value is not None]
    values = {str(t.user_attrs.get("output")): float(t.value) for t in complete}
    epochs = sum(row.epochs_trained or 0 for row in rows)
    if not complete:
        return StudySummary(None, None, None, {}, values, states, epochs, rows)
    pick = (max if study_config.search.goal == "maximize" else min)(complete, key=lambda t: float(t.value))
    best = next(row for row in rows if row.number == pick.number)
    return StudySummary(str(pick.user_attrs.get("output")), float(pick.value), pick.number, dict(best.params), values,
                        states, epochs, rows)
