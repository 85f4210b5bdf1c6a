"""A search's ``trials.json`` read back as typed values: one leaderboard order for the register
step's summary and for `forgectl models show` (the runtime end to end is tests/runtimes/test_search.py)."""

from __future__ import annotations

from rich.console import Console

from forgectl.models_cli import search_line, trials_chart, trials_table
from specs.searchresult import SearchResult, summarised

STUDY = {
    "metric": "accuracy", "goal": "maximize", "best": "trials/t-2", "values": {"trials/t-0": 0.91, "trials/t-2": 0.95},
    "study": {
        "name": "digits-mlp-v1", "storage": "search/study.db", "algorithm": "tpe", "earlyStopping": "asha",
        "bestTrial": 2, "bestValue": 0.95, "bestParams": {"learningRate": 0.01}, "states": {"complete": 2, "pruned": 2},
        "epochsTrained": 6, "epochsBudget": 12, "epochsSaved": 6,
        "trials": [
            # a pruned trial's last value is an early epoch's: higher here, and still after the completed ones
            {"number": 0, "index": 0, "state": "complete", "value": 0.91, "params": {"learningRate": 0.1},
             "epochsTrained": 4, "prunedAtEpoch": None},
            {"number": 1, "index": 1, "state": "pruned", "value": 0.97, "params": {"learningRate": 0.3},
             "epochsTrained": 1, "prunedAtEpoch": 1},
            {"number": 2, "index": 2, "state": "complete", "value": 0.95, "params": {"learningRate": 0.01},
             "epochsTrained": 4, "prunedAtEpoch": None},
            {"number": 3, "index": 3, "state": "pruned", "value": None, "params": {"learningRate": 0.5},
             "epochsTrained": 0, "prunedAtEpoch": None},
        ],
    },
}


def test_the_leaderboard_puts_completed_trials_first_best_first() -> None:
    result = SearchResult.from_json(STUDY)
    assert [r.number for r in result.rows()] == [2, 0, 1, 3]
    assert [result.is_best(r) for r in result.rows()] == [True, False, False, False]


def test_minimize_ranks_the_lowest_value_first() -> None:
    result = SearchResult.from_json({**STUDY, "goal": "minimize"})
    assert [r.number for r in result.rows()] == [0, 2, 1, 3]


def test_the_registry_keeps_the_best_trials_in_the_same_order_and_counts_them_all() -> None:
    kept = summarised(STUDY, 2)
    assert "values" not in kept
    assert [t["number"] for t in kept["study"]["trials"]] == [2, 0]
    assert kept["study"]["trialsTotal"] == 4
    again = SearchResult.from_json(kept)
    assert again.study is not None and again.study.trials_total == 4
    assert [r.number for r in again.rows()] == [2, 0]


def test_models_show_prints_the_study_line_and_its_table() -> None:
    console = Console(width=400, record=True)
    result = SearchResult.from_json(summarised(STUDY, 3))
    console.print(search_line(result))
    console.print(trials_table(result))
    text = console.export_text()
    assert "tpe, early stopping asha: 4 trials (2 complete, 2 pruned); best trial 2, accuracy 0.95" in text
    assert "6 of 12 trial-epochs trained, 6 saved by pruning — study digits-mlp-v1 in search/study.db" in text
    assert "Search trials (3 of 4): accuracy (maximize), best first" in text
    assert text.index("2 *") < text.index("│ 0 ") < text.index("│ 1 ")


def test_a_search_without_a_study_ranks_its_values() -> None:
    plain = {"metric": "loss", "goal": "minimize", "best": "trials/b", "values": {"trials/a": 0.4, "trials/b": 0.2}}
    result = SearchResult.from_json(plain)
    assert [r.output for r in result.rows()] == ["trials/b", "trials/a"]
    console = Console(width=400, record=True)
    console.print(search_line(result))
    console.print(trials_table(result))
    text = console.export_text()
    assert "2 trials, best loss (minimize) 0.2 from trials/b" in text
    assert "1 *" in text and "trials/b" in text


def test_models_show_draws_the_trials_in_the_order_they_ran() -> None:
    """The chart under the table: trials by number (a trial with no value left out), each value a
    bar between the lowest and the highest, and the best completed value so far — a pruned trial's
    higher early value never counts as the best."""
    result = SearchResult.from_json(STUDY)
    chart = trials_chart(result, width=20)
    assert chart is not None
    console = Console(width=200, record=True)
    console.print(chart)
    text = console.export_text()
    assert "Search trials in order: accuracy, bars from 0.91 to 0.97" in text
    lines = [ln for ln in text.splitlines() if ln.startswith("│")]
    assert [ln.split("│")[1].strip() for ln in lines] == ["0", "1", "2 *"]
    assert [ln.split("│")[-2].strip() for ln in lines] == ["0.91", "0.91", "0.95"]
    bars = [ln.split("│")[4] for ln in lines]
    assert len(bars[0].strip()) < len(bars[2].strip()) < len(bars[1].strip())  # 0.91 < 0.95 < 0.97
    kept = SearchResult.from_json(summarised(STUDY, 2))
    console = Console(width=200, record=True)
    console.print(trials_chart(kept))
    assert "Search trials in order (the best 2 of 4 kept)" in console.export_text()
    assert trials_chart(SearchResult.from_json({"metric": "loss", "goal": "minimize", "best": "a", "values": {"a": 0.2}})) is None
