"""The finished runs under a results directory, as the report's figures and tables draw them:
one result set (suite.results.resultset), read once with only the table columns the figures
draw, and the columns every figure shares (labels, display parts, final density) added once."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from suite.cluster import phases
from suite.errors import BenchError
from suite.plugins.registry import METHODS
from suite.report.labels import LABEL, PARTS, label_table, parts_table
from suite.results import schema
from suite.results.resultset import (
    OVERLAPPED_PHASES,
    RUN_INDEX,
    ResultSet,
    read_result_set,
    result_set,
)
from suite.results.view import RunView

#: the columns of ``evals.parquet`` the suite's figures draw
EVAL_COLUMNS = (schema.ITERATION, schema.EPOCH, schema.TRAIN_SECONDS, schema.ACCURACY,
                schema.INTER_NODE_BYTES)
#: the runs frame's columns of the display parts (suite.report.labels.PARTS): ``part_method``
PART_PREFIX = "part_"
#: the runs frame's column of the density of the pruned layers at the end (1.0: dense)
FINAL_DENSITY = "final_density"


def is_comm_column(column: str) -> bool:
    """A communication phase's seconds (``t_inter_allreduce``)."""
    prefix = schema.PHASE_PREFIX
    return column.startswith(prefix) and phases.is_communication(column[len(prefix):])


def iteration_column(column: str) -> bool:
    """The columns of ``iterations.parquet`` the figures draw."""
    drawn = (schema.ITERATION, schema.EPOCH, schema.BYTES_INTER, schema.DENSITY)
    return column in drawn or is_comm_column(column)


TABLE_COLUMNS = {schema.ITERATIONS_TABLE: iteration_column, schema.EVALS_TABLE: EVAL_COLUMNS}


def either(test, extra: frozenset):
    """A column test that also takes the ``extra`` columns."""
    return lambda column: test(column) or column in extra


def table_columns() -> dict:
    """The table columns a report reads: its own figures' (``TABLE_COLUMNS``) and those the
    registered methods' figures declare (``figure_reads``)."""
    wanted = {name: set() for name in schema.TABLES}
    for draw in METHODS.figures():
        for name, columns in getattr(draw, "reads", {}).items():
            wanted[name].update(columns)
    merged = {}
    for name in schema.TABLES:
        own, extra = TABLE_COLUMNS.get(name, ()), frozenset(wanted[name])
        if callable(own):
            merged[name] = either(own, extra)
        elif own or extra:
            merged[name] = (*own, *sorted(extra - set(own)))
    return merged


def load_runs(results_dir: str | Path) -> tuple[ResultSet, list[str]]:
    """Finished (status ok) runs anywhere under ``results_dir`` with the columns figures share
    (``with_report_columns``), and a line per run skipped."""
    root = Path(results_dir)
    if not root.is_dir():
        raise BenchError(f"{root} is not a directory of run folders")
    runs = read_result_set(root, METHODS.defaults, table_columns(), finished_only=True)
    if not len(runs):
        why = f"; skipped {runs.skipped[0]}" if runs.skipped else ""
        raise BenchError(f"no finished run folders under {root}{why}")
    return with_report_columns(runs), runs.skipped


def report_runs(views: Iterable[RunView]) -> ResultSet:
    """Runs already read (``RunView`` objects, e.g. made in memory) as ``load_runs``
    gives them: their tables read from their folders, the figures' columns added."""
    return with_report_columns(result_set(views, METHODS.defaults, table_columns()))


def with_report_columns(runs: ResultSet) -> ResultSet:
    """``runs`` with the columns every figure reads added to its frame: the display parts
    (computed once per configuration), the label of each run's configuration, its final
    density and the phases that overlapped its compute."""
    frame = runs.runs
    parts = parts_table(frame)
    for part, values in parts.items():
        frame[PART_PREFIX + part] = values
    frame[LABEL] = label_table(frame, parts)
    frame[FINAL_DENSITY] = final_densities(runs)
    frame[OVERLAPPED_PHASES] = pd.Series(
        [overlapped_phases(recorded) for recorded in frame[OVERLAPPED_PHASES]],
        index=frame.index, dtype=object)
    return runs


def overlapped_phases(recorded: list | None) -> tuple[str, ...]:
    """Phases that ran during local_compute (DDP's comm hooks), as the manifest says (a
    version-1 folder's: suite.results.upgrade)."""
    return tuple(recorded or ())


def final_densities(runs: ResultSet) -> pd.Series:
    """Per run the density of the pruned layers at the end (PruneX: the last recorded
    density); 1.0 for dense methods."""
    rows = runs.table("iterations")
    last = pd.Series(dtype=float)
    if schema.DENSITY in rows:
        recorded = rows[rows[schema.DENSITY].notna()]
        last = recorded.groupby(RUN_INDEX)[schema.DENSITY].last()
    return pd.Series([float(last[i]) if i in last.index else 1.0 for i in range(len(runs))],
                     index=runs.runs.index, dtype=object)


def parts_of(frame: pd.DataFrame) -> pd.DataFrame:
    """The display parts ``with_report_columns`` added to ``frame`` (as parts_table)."""
    return pd.DataFrame({part: frame[PART_PREFIX + part] for part in PARTS}, index=frame.index)
