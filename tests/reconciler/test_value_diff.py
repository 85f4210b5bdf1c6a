"""How a changed value reads in a plan (reconciler/plan/diff.py, reconciler/plan/reasons.py): long strings
as the tokens around the change, multi-line strings as unified diffs, spec lists of named items
paired by name."""

from __future__ import annotations

import json

from reconciler.plan.diff import INLINE_LIMIT, FieldChange, token_hunks, tokens, value_diff
from reconciler.specdiff import spec_changes, spec_diff
from specs.rollout import BUILTIN_TEMPLATES


def test_tokens_keep_numbers_and_names_whole() -> None:
    assert tokens('rate(x{a="b"}[5m]) < 0.995') == ["rate", "(", "x", "{", "a", "=", '"', "b", '"', "}", "[", "5m", "]",
                                                    ")", " ", "<", " ", "0.995"]
    assert tokens("lr=1e-3") == ["lr", "=", "1e-3"]


def test_long_promql_shows_the_tokens_around_the_change() -> None:
    """The issue's case: two long queries that differ past any fixed-width cut."""
    old = BUILTIN_TEMPLATES["success-rate"].replace("{window}", "10s") + " < 0.99"
    new = old.replace(" < 0.99", " < 0.995")
    assert len(old) > INLINE_LIMIT and old[:INLINE_LIMIT] == new[:INLINE_LIMIT]
    shown = value_diff(old, new)
    assert shown == {"kind": "tokens", "more": 0, "hunks": [
        {"before": '…,forge_role="{role}"}[10s])) < ', "old": "0.99", "new": "0.995", "after": ""}]}


def test_json_args_diff_names_the_key() -> None:
    config = {"step": "train", "spec": {"architecture": {"type": "mlp", "hiddenSizes": [256, 128]},
                                        "hyperparameters": {"learningRate": 0.002, "batchSize": 64, "epochs": 30}}}
    old = json.dumps(config, sort_keys=True)
    config["spec"]["hyperparameters"]["learningRate"] = 0.005
    config["spec"]["architecture"]["hiddenSizes"] = [512, 128]
    new = json.dumps(config, sort_keys=True)
    hunks = value_diff(old, new)["hunks"]
    assert [(h["old"], h["new"]) for h in hunks] == [("256", "512"), ("0.002", "0.005")]
    assert hunks[1]["before"].endswith('"learningRate": ')
    assert all(len(h["before"]) <= 33 and len(h["after"]) <= 33 for h in hunks)  # ≤ CONTEXT + "…"


def test_nearby_changes_share_a_hunk_and_far_ones_do_not() -> None:
    [hunk] = token_hunks("a=1, b=2, " + "x" * 200, "a=3, b=4, " + "x" * 200)
    assert (hunk["old"], hunk["new"]) == ("1, b=2", "3, b=4")
    far = token_hunks("a=1 " + "y " * 100 + "b=2", "a=3 " + "y " * 100 + "b=4")
    assert [(h["old"], h["new"]) for h in far] == [("1", "3"), ("2", "4")]


def test_multi_line_values_get_a_unified_diff() -> None:
    old = "\n".join(f"line {i}" for i in range(10))
    new = old.replace("line 5", "line five")
    shown = value_diff(old, new)
    assert shown["kind"] == "lines"
    assert shown["lines"] == [["@@", "-4,5 +4,5"], [" ", "line 3"], [" ", "line 4"], ["-", "line 5"], ["+", "line five"],
                              [" ", "line 6"], [" ", "line 7"]]


def test_short_values_and_other_types_are_shown_as_they_are() -> None:
    assert value_diff("a", "b") is None and value_diff(1, 2) is None and value_diff(["x" * 200], ["y" * 200]) is None
    assert "valueDiff" not in FieldChange("change", "p", "a", "b").to_json()
    long_change = FieldChange("change", "p", "x" * 200 + "a", "x" * 200 + "b").to_json()
    assert long_change["valueDiff"]["hunks"][0]["old"] == "x" * 200 + "a"  # one identifier token
    assert FieldChange.from_json(long_change) == FieldChange("change", "p", "x" * 200 + "a", "x" * 200 + "b")


def test_very_long_strings_stay_linear() -> None:
    old = "a " * 300_000
    new = "b " + old[2:]
    [hunk] = value_diff(old, new)["hunks"]
    assert (hunk["old"], hunk["new"]) == ("a", "b")


def test_spec_lists_of_named_items_are_paired_by_name() -> None:
    old = {"metrics": [{"name": "success-rate", "min": 0.99}, {"name": "latency-p99", "max": 0.2}],
           "evaluation": {"thresholds": [{"metric": "accuracy", "min": 0.95}]},
           "variants": [{"name": "int8", "stages": [{"type": "prune", "sparsity": 0.5}, {"type": "quantize"}]}]}
    new = {"metrics": [{"name": "latency-p99", "max": 0.2}, {"name": "success-rate", "min": 0.995}, {"name": "errors", "max": 0.01}],
           "evaluation": {"thresholds": [{"metric": "accuracy", "min": 0.97}]},
           "variants": [{"name": "int8", "stages": [{"type": "prune", "sparsity": 0.7}, {"type": "quantize"}]}]}
    assert spec_changes(old, new) == [
        "`metrics[success-rate].min` 0.99 → 0.995",
        '`metrics[errors]` ∅ → {"name": "errors", "max": 0.01}',
        "`evaluation.thresholds[accuracy].min` 0.95 → 0.97",
        "`variants[int8].stages[prune].sparsity` 0.5 → 0.7",
    ]
    change = spec_diff(old, new)[0]
    assert change.keys == ("metrics", 1, "min")  # the index in the newer document, to find its line


def test_unnamed_items_are_aligned_so_a_removed_step_reads_as_removed() -> None:
    old = {"steps": [{"weight": 10}, {"weight": 50}, {"weight": 100}]}
    new = {"steps": [{"weight": 10}, {"weight": 100}]}
    [change] = spec_diff(old, new)
    assert (change.op, change.path, change.keys, change.in_old) == ("remove", "steps[1]", ("steps", 1), True)
    [changed] = spec_diff(old, {"steps": [{"weight": 10}, {"weight": 60}, {"weight": 100}]})
    assert changed.line() == "`steps[1].weight` 50 → 60"


def test_unset_optional_fields_are_not_changes() -> None:
    assert spec_diff({"a": None}, {}) == [] and spec_diff({}, {"a": None}) == []
    assert spec_changes({"fault": None}, {"fault": {"errorRate": 0.5}}) == ["`fault.errorRate` ∅ → 0.5"]
