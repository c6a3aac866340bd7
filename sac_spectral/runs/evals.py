"""``<run_dir>/evals.csv``: every evaluation of a run, appended as the run goes.

A plain CSV that a report (or a person) can read while the run is still going, without
TensorBoard or the checkpoint. Its columns are the run kind's (:attr:`RunKind.columns
<sac_spectral.runs.kinds.RunKind>`); an empty cell is not measured. RL runs write one row per seed
and evaluation, continual runs one row per task end:

    step,seed,updates,return,episodes,wall_time_s           # RL: mean return over `episodes`
    task,iteration,seed,train_acc,test_acc,loss,test_loss,wall_time_s   # continual

The first column orders the rows. A run resumed from its checkpoint re-runs the steps after that
checkpoint and evaluates them again, so appending rows for key *k* first drops every row whose key
is ≥ *k* (a CSV append and the next checkpoint are not atomic together: a kill between them leaves
rows the resumed run writes again). A line cut short by a kill mid-write is dropped as well. The
file therefore never holds a key twice, and its rows are those of the uninterrupted run.
"""

from __future__ import annotations

import csv
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sac_spectral.runs.layout import EVALS

#: a cell written from an int (floats are written with their point or exponent)
INTEGER = re.compile(r"^-?\d+$")


def _cell(value: Any) -> str:
    return "" if value is None else repr(float(value)) if isinstance(value, float) else str(value)


def _migrated(lines: list[str], columns: Sequence[str]) -> list[str]:
    """A file's lines under the header of ``columns``: a file written before some of them (its
    columns all among them) gets empty cells there; any other is left as it is."""
    old = lines[0].rstrip("\n").split(",") if lines else []
    if not old or old == list(columns) or not set(old) <= set(columns):
        return lines
    cells = (dict(zip(old, line.rstrip("\n").split(","))) for line in lines[1:])
    return [",".join(columns) + "\n"] + [",".join(row.get(c, "") for c in columns) + "\n" for row in cells]


def append_rows(path: Path, columns: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> None:
    """Append ``rows`` (all with the same first-column key) to the CSV at ``path``, after dropping
    rows whose key is at or past theirs and a cut-off last line (a file written before a column
    was added keeps its rows, that column empty)."""
    header = ",".join(columns) + "\n"
    key = float(rows[0][columns[0]])
    written = path.read_text().splitlines(keepends=True) if path.exists() else []
    lines = _migrated(written[:-1] if written and not written[-1].endswith("\n") else written, columns)
    kept = [header] + ([ln for ln in lines[1:] if float(ln.split(",", 1)[0]) < key] if lines[:1] == [header] else [])
    if kept != written:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text("".join(kept))
        os.replace(tmp, path)
    with path.open("a") as f:
        f.write("".join(",".join(_cell(row.get(c)) for c in columns) + "\n" for row in rows))


#: columns whose cells may be names (a task sequence's tasks) rather than numbers
TEXT_COLUMNS = ("task",)


def _value(cell: str | None, text: bool) -> int | float | str | None:
    """A cell's number (an int where written from one), or None if empty or missing (a row of
    fewer columns); a ``text`` column's cell that is no number stays text, elsewhere it is a
    ``ValueError``."""
    if cell is None or cell == "":
        return None
    if INTEGER.match(cell):
        return int(cell)
    try:
        return float(cell)
    except ValueError:
        if text:
            return cell
        raise


def read_evals(run_dir: Path) -> list[dict[str, int | float | str | None]]:
    """The rows of ``<run_dir>/evals.csv`` ([] if there is none), numbers parsed (the names in
    :data:`TEXT_COLUMNS` kept), a cut-off last line skipped."""
    path = Path(run_dir) / EVALS
    if not path.is_file():
        return []
    text = path.read_text()
    if not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
    rows = []
    for raw in csv.DictReader(text.splitlines()):
        rows.append({k: _value(v, k in TEXT_COLUMNS) for k, v in raw.items()})
    return rows
