"""A search that learns or stops early renders its trials against one Optuna study: each trial
task carries the study (a SQLite file in the version's folder on the workspace volume) and its
index, TPE trials carry no drawn values, and pick-best reads the study. Grid and random searches
without early stopping render as before (no study)."""

from __future__ import annotations

import shutil
from pathlib import Path

from reconciler.load.loader import load_or_raise
from renderers.workflow import plan_steps, render_workflow
from specs import Model

ROOT = Path(__file__).resolve().parents[2]

SEARCH = """\
  search:
    algorithm: {algorithm}
    earlyStopping: {stopping}
    trials: 6
    parallelism: 3
    space:
      learningRate: {{type: logUniform, min: 0.0001, max: 0.1}}
      batchSize: {{type: choice, values: [32, 64, 128]}}
"""


def _steps(tmp_path: Path, algorithm: str, stopping: str, env_name: str = "local",
           database: bool = False) -> tuple[dict, list]:
    root = tmp_path / f"{algorithm}-{stopping}-{env_name}-{database}"
    shutil.copytree(ROOT / "examples" / "quickstart", root)
    model_yaml = root / "model.yaml"
    model_yaml.write_text(model_yaml.read_text().replace("  precision: fp32\n", "  precision: fp32\n" + SEARCH.format(
        algorithm=algorithm, stopping=stopping)))
    if database:
        envs = root / "environments.yaml"
        envs.write_text(envs.read_text().replace("    namespace: forge-quickstart\n",
                                                 "    namespace: forge-quickstart\n    studyDatabase: {secret: forge-studies}\n"))
    specs = load_or_raise([str(root)]).specs
    env = specs.environment(env_name)
    model = specs.get(Model, "digits-mlp")
    assert env is not None and model is not None
    version, steps, _ = plan_steps(specs, model, env)
    workflow = render_workflow(specs, model, env, "forge-quickstart", None).manifest
    return {"version": version, "workflow": workflow}, steps


def test_tpe_with_asha_trials_share_one_study_and_pick_best_reads_it(tmp_path: Path) -> None:
    info, steps = _steps(tmp_path, "tpe", "asha")
    trials = [s for s in steps if s.name.startswith("train-trial-")]
    assert len(trials) == 6 and info["workflow"]["spec"]["parallelism"] == 3
    storage = f"models/digits-mlp/{info['version']}/search/study.db"
    for i, step in enumerate(trials):
        trial = step.config["trial"]
        assert trial["index"] == i and step.config["overrides"] == {}  # TPE asks the study, nothing is drawn here
        assert trial["study"]["storage"] == storage and trial["study"]["name"] == f"digits-mlp-{info['version']}"
        assert trial["study"]["search"]["algorithm"] == "tpe" and trial["study"]["search"]["earlyStopping"] == "asha"
    assert len({s.key for s in trials}) == 6  # one memoized task per trial
    pick = next(s for s in steps if s.name == "pick-best")
    assert pick.config["study"] == trials[0].config["trial"]["study"]
    assert pick.depends == tuple(s.name for s in trials)


def test_random_search_with_median_stopping_keeps_its_drawn_values(tmp_path: Path) -> None:
    _, steps = _steps(tmp_path, "random", "median")
    trials = [s for s in steps if s.name.startswith("train-trial-")]
    assert all(set(s.config["overrides"]) == {"batchSize", "learningRate"} for s in trials)
    assert all(s.config["trial"]["study"]["search"]["earlyStopping"] == "median" for s in trials)


def test_random_search_without_stopping_renders_no_study(tmp_path: Path) -> None:
    _, steps = _steps(tmp_path, "random", "none")
    trials = [s for s in steps if s.name.startswith("train-trial-")]
    assert trials and all("trial" not in s.config for s in trials)
    assert "study" not in next(s for s in steps if s.name == "pick-best").config
    # `earlyStopping: none` is the default: left out of the rendered spec, so versions stay as they were.
    assert "earlyStopping" not in trials[0].config["spec"]["search"]


def test_the_plan_names_the_algorithm_trials_and_parallelism(tmp_path: Path) -> None:
    from renderers.workflow import search_reasons

    info, steps = _steps(tmp_path, "tpe", "asha")
    line, = search_reasons({s.name: {"config": s.config} for s in steps})
    assert line == (f"search: tpe, early stopping asha — 6 trials, 3 at a time, best accuracy (maximize) picked from the study "
                    f"models/digits-mlp/{info['version']}/search/study.db")
    _, plain = _steps(tmp_path, "random", "none")
    assert search_reasons({s.name: {"config": s.config} for s in plain})[0].startswith("search: random, no early stopping — 6 trials")


def test_a_clusters_study_database_reaches_the_trials_and_pick_best_by_its_secret(tmp_path: Path) -> None:
    """With the Environment's `studyDatabase`, the study moves to PostgreSQL: the trials and
    pick-best read its URL from the Secret and name the run by the Workflow's uid; no other step
    sees the Secret, and without it the cluster's study stays the SQLite file it was (same keys)."""
    from renderers.workflow import search_reasons

    info, steps = _steps(tmp_path, "tpe", "asha", "cluster", database=True)
    sqlite_info, sqlite_steps = _steps(tmp_path, "tpe", "asha", "cluster")
    assert info["version"] == sqlite_info["version"]  # where the study is kept is no part of the result
    study = next(s for s in steps if s.name == "pick-best").config["study"]
    assert study["database"] == {"secret": "forge-studies", "key": "url"}
    assert "database" not in next(s for s in sqlite_steps if s.name == "pick-best").config["study"]
    templates = {t["name"]: t for t in info["workflow"]["spec"]["templates"]}
    for step in steps:
        env = {e["name"]: e for e in templates[step.name]["container"]["env"]}
        if step.name.startswith("train-trial-") or step.name == "pick-best":
            assert env["FORGE_STUDY_URL"]["valueFrom"] == {"secretKeyRef": {"name": "forge-studies", "key": "url"}}
            assert env["FORGE_STUDY_RUN"]["value"] == "{{workflow.uid}}"
        else:
            assert "FORGE_STUDY_URL" not in env and "FORGE_STUDY_RUN" not in env, step.name
    # the SQLite render's steps keep their keys; the database's trials are other steps
    plain = {s.name: s.key for s in sqlite_steps}
    assert all(plain[s.name] != s.key for s in steps if s.name.startswith("train-trial-"))
    line, = search_reasons({s.name: {"config": s.config} for s in steps})
    assert line.endswith("picked from the study in the PostgreSQL database of Secret forge-studies")


def test_doctor_asks_for_the_study_databases_secret(tmp_path: Path) -> None:
    """The Secret the trials read is the cluster admin's: `doctor` lists it with the key they read
    (and, for the s3 credentials' optional keys, nothing: an optional key stops no pod)."""
    from renderers.prerequisites import cluster_requirements

    info, _ = _steps(tmp_path, "tpe", "asha", "cluster", database=True)
    secrets = [r for r in cluster_requirements([info["workflow"]]) if r.kind == "Secret"]
    assert [(r.name, r.keys) for r in secrets] == [("forge-quickstart/forge-studies", ("url",))]
    assert secrets[0].why.startswith("Workflow ") and "train-trial-0" in secrets[0].why
    plain, _ = _steps(tmp_path, "tpe", "asha", "cluster")
    assert not [r for r in cluster_requirements([plain["workflow"]]) if r.kind == "Secret"]
