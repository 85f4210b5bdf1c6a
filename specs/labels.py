"""Merging reviewed labels into a data set's rows (pure: no I/O, no pandas).

Shared by the `merge-labels` runtime (`python -m runtimes merge-labels`) and `forgectl labels
merge`, so both accept and refuse the same rows. A table is its file's name and its rows, each
row with the line it came from (CSV: the line its record starts on; Parquet: its row number + 2,
as if it had a header line), so every refusal names the file and line.

Which rows merge: every auto-label (rows the model labelled at or above the confidence), then every
reviewed row whose label column is filled (an empty label leaves the row out). A merged row holds
the source's columns in the source's order; each must be present and non-empty, and when the
Dataset names its `classes` the label must be one of them (or a class index).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


class LabelsError(ValueError):
    """A reviewed or auto-labelled row that cannot merge, with where it is."""

    def __init__(self, file: str, line: int, message: str) -> None:
        super().__init__(f"{file}:{line}: {message}")
        self.file = file
        self.line = line
        self.message = message


@dataclass(frozen=True)
class Table:
    """A file's rows: (line, values by column)."""

    file: str
    columns: tuple[str, ...]
    rows: Sequence[tuple[int, Mapping[str, object]]] = ()


@dataclass(frozen=True)
class Merged:
    """The rows to append to the source (values in the source's column order) and the counts."""

    rows: list[list[object]] = field(default_factory=list)
    auto_labelled: int = 0
    accepted: int = 0
    rejected: int = 0


def blank(value: object) -> bool:
    """Whether a cell is empty: None, NaN or only whitespace."""
    if value is None:
        return True
    if isinstance(value, float):
        return math.isnan(value)
    return not str(value).strip()


def _check_label(table: Table, line: int, value: object, classes: Sequence[str]) -> None:
    if not classes:
        return
    text = str(value).strip()
    if text in classes:
        return
    if text.isdigit() and int(text) < len(classes):
        return
    shown = ", ".join(classes[:10]) + (", …" if len(classes) > 10 else "")
    raise LabelsError(table.file, line, f"label {text!r} is not one of the Dataset's classes ({shown})")


def _rows(table: Table, columns: Sequence[str], label: str, classes: Sequence[str],
          reviewed: bool) -> tuple[list[list[object]], int]:
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise LabelsError(table.file, 1, f"no column {', '.join(repr(c) for c in missing[:5])} "
                          f"(the source's columns: {', '.join(columns[:8])}{', …' if len(columns) > 8 else ''})")
    out: list[list[object]] = []
    left_out = 0
    for line, values in table.rows:
        if reviewed and blank(values.get(label)):
            left_out += 1
            continue
        empty = [c for c in columns if blank(values.get(c))]
        if empty:
            raise LabelsError(table.file, line, f"empty {', '.join(repr(c) for c in empty[:5])}")
        _check_label(table, line, values[label], classes)
        out.append([values[c] for c in columns])
    return out, left_out


def merge_rows(columns: Sequence[str], label: str, auto: Table, reviewed: Table,
               classes: Sequence[str] = ()) -> Merged:
    """The rows to append to a source with ``columns`` (``label`` among them): the auto-labels,
    then the accepted reviewed rows. :class:`LabelsError` for the first row that cannot merge."""
    if label not in columns:
        raise LabelsError(auto.file, 1, f"the source has no label column {label!r}")
    auto_rows, _ = _rows(auto, columns, label, classes, reviewed=False)
    accepted, rejected = _rows(reviewed, columns, label, classes, reviewed=True)
    return Merged(auto_rows + accepted, len(auto_rows), len(accepted), rejected)


def csv_table(file: str, text: str) -> Table:
    """A CSV file's rows as a :class:`Table` (the header is line 1; values stay the text they were)."""
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader)
    except StopIteration:
        raise LabelsError(file, 1, "empty file (no header line)") from None
    twice = sorted({c for c in header if header.count(c) > 1})
    if twice:  # a row would silently keep the last one's value (a probability merged as a feature)
        raise LabelsError(file, 1, f"the column(s) {', '.join(repr(c) for c in twice[:5])} appear more than once "
                          "in the header")
    rows: list[tuple[int, Mapping[str, object]]] = []
    line = reader.line_num + 1
    try:
        for record in reader:
            if record:
                if len(record) != len(header):
                    raise LabelsError(file, line, f"{len(record)} field(s), the header has {len(header)}")
                rows.append((line, dict(zip(header, record))))
            line = reader.line_num + 1
    except csv.Error as exc:
        raise LabelsError(file, line, f"not CSV: {exc}") from None
    return Table(file, tuple(header), rows)


def append_csv(text: str, rows: Sequence[Sequence[object]]) -> str:
    """``text`` (a CSV file) with ``rows`` appended in its own line ending; its lines unchanged, so
    a diff of the source shows only the merged rows."""
    newline = "\r\n" if "\r\n" in text else "\n"
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer, lineterminator=newline)
    writer.writerows([["" if blank(v) else v for v in row] for row in rows])
    if text and not text.endswith(("\n", "\r")):
        text += newline
    return text + buffer.getvalue()
