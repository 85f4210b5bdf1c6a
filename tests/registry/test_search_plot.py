"""The report's plot of a search's trials (reconciler/present/searchplot.py): one point per trial
with a value, where its value and number put it, hollow when pruned, the picked one ringed."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

from reconciler.present.searchplot import search_section, trials_plot
from specs.searchresult import SearchResult

SVG = "{http://www.w3.org/2000/svg}"


def _search() -> SearchResult:
    """A study as pick-best writes it: three completed trials, one pruned after an epoch, one failed
    before reporting anything."""
    rows: list[dict[str, Any]] = [
        {"number": 0, "index": 0, "state": "complete", "value": 0.95, "params": {"learningRate": 0.01}, "epochsTrained": 3},
        {"number": 1, "index": 1, "state": "pruned", "value": 0.41, "params": {"learningRate": 0.0001}, "epochsTrained": 1,
         "prunedAtEpoch": 1},
        {"number": 2, "index": 2, "state": "complete", "value": 0.97, "params": {"learningRate": 0.02}, "epochsTrained": 3},
        {"number": 3, "index": 3, "state": "fail", "value": None, "params": {"learningRate": 0.04}, "epochsTrained": 0},
        {"number": 4, "index": 4, "state": "complete", "value": 0.9, "params": {"learningRate": 0.005}, "epochsTrained": 3},
    ]
    return SearchResult.from_json({
        "metric": "accuracy", "goal": "maximize", "best": "models/m/v/trials/2",
        "study": {"name": "m-v", "storage": "models/m/v/search/study.db", "algorithm": "tpe", "earlyStopping": "asha",
                  "bestTrial": 2, "bestValue": 0.97, "bestParams": {"learningRate": 0.02},
                  "states": {"complete": 3, "pruned": 1, "fail": 1}, "trials": rows,
                  "epochsTrained": 10, "epochsBudget": 15, "epochsSaved": 5}})


def _points(svg: str) -> dict[int, tuple[str, ET.Element, list[ET.Element]]]:
    """trial number → (state, its point, the rings drawn around it) of the parsed SVG."""
    root = ET.fromstring(svg)
    out = {}
    for group in root.iter(f"{SVG}g"):
        if group.get("class") == "trial":
            point, *rings = group.findall(f"{SVG}circle")
            out[int(group.get("data-trial", "-1"))] = (group.get("data-state", ""), point, rings)
    return out


def test_each_trial_with_a_value_is_a_point_placed_by_its_number_and_value() -> None:
    search = _search()
    points = _points(trials_plot(search, title="trials"))
    with_value = {r.number: r for r in search.rows() if r.value is not None}
    assert set(points) == set(with_value)  # the failed trial, with no value, is not drawn
    assert {n: state for n, (state, _, _) in points.items()} == {n: r.state for n, r in with_value.items()}
    x = {n: float(p.get("cx", "nan")) for n, (_, p, _) in points.items()}
    y = {n: float(p.get("cy", "nan")) for n, (_, p, _) in points.items()}
    assert sorted(x, key=x.__getitem__) == sorted(x)  # left to right in the order asked
    by_value = sorted(with_value, key=lambda n: with_value[n].value or 0.0)
    assert sorted(y, key=y.__getitem__) == by_value[::-1]  # higher value, higher on the plot


def test_pruned_trials_are_hollow_and_only_the_picked_trial_is_ringed() -> None:
    search = _search()
    assert search.study is not None
    for number, (state, point, rings) in _points(trials_plot(search, title="trials")).items():
        assert (point.get("fill") == "none") == (state != "complete"), (number, point.attrib)
        assert bool(rings) == (number == search.study.best_trial), number


def test_the_section_says_what_was_searched_and_what_was_left_out() -> None:
    text = search_section("m", "v0123456789", _search())
    assert "tpe, early stopping asha: 5 trials (3 complete, 1 fail, 1 pruned)" in text
    assert "picked trial 2" in text and "10 of 15 trial-epochs trained, 5 saved by pruning" in text
    assert "1 without a value not drawn" in text


def test_a_search_without_values_draws_a_note() -> None:
    empty = SearchResult.from_json({"metric": "accuracy", "goal": "maximize", "best": None, "values": {}})
    svg = trials_plot(empty, title="trials")
    assert not _points(svg) and "no trial reported a value" in svg
