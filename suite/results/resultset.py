"""A result set read once: every run folder under a root as one row of a frame, and the
columns a reader needs of the runs' tables as one long frame per table.

``bench report``, ``bench compare`` and ``bench trend`` read a set through
``read_result_set``, so a set of 10,000 runs costs one pass over its folders (two small
JSON files and the asked columns of each table) and everything after is a frame operation,
never a walk over the runs per figure or per pair of runs (asv's one reader of result sets).

The frame ``runs`` holds, per run, every key of its ``summary.json`` (schema names) as the JSON
holds it (``dtype=object``, so an integer stays an integer next to a missing value; call
``infer_objects()`` for pandas' dtypes) and the run view's columns below, taken from the
manifest and the method's declared defaults (suite.results.view.RunView says what each means;
where a summary key and a view column share a name, ``started``, the manifest's wins).
A table's frame holds the asked columns of every run's table, one after another in the runs'
order, with ``run_index``, the run's row in ``runs``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from suite.errors import BenchError
from suite.results import schema, summary
from suite.results.folder import TABLES
from suite.results.schema import Status
from suite.results.view import RunView, first_line, run_folders

# -- the run view's columns, next to the summary's keys ------------------------------------------
#: the run folder (str) and its RunView (what an activity check or a mask reader is given)
FOLDER = "folder"
VIEW = "view"
#: RunView.machine_class, RunView.setting
MACHINE_CLASS = "machine_class"
SETTING = "setting"
#: RunView.configuration and RunView.shown_options as sorted JSON (hashable, groupable)
CONFIGURATION = "configuration"
SHOWN_OPTIONS = "shown_options"
#: the manifest's recipe: batch size, lr, and its schedule (``schedule_of``)
BATCH_SIZE = schema.BATCH_SIZE
LR = schema.LR
LR_SCHEDULE = schema.LR_SCHEDULE
#: the manifest's device (``cpu``, ``cuda``), git revision and start time
DEVICE = "device"
COMMIT = "commit"
STARTED = schema.STARTED
#: the manifest's phases that ran during local_compute (DDP's comm hooks; None: not recorded)
OVERLAPPED_PHASES = schema.OVERLAPPED_PHASES
#: every run view column, in the order ``runs`` holds them
VIEW_COLUMNS = (FOLDER, VIEW, MACHINE_CLASS, SETTING, CONFIGURATION, SHOWN_OPTIONS, BATCH_SIZE,
                LR, LR_SCHEDULE, DEVICE, COMMIT, STARTED, OVERLAPPED_PHASES)
#: the summary's keys ``runs`` always has (None where a run lacks one)
IDENTITY_KEYS = (schema.RUN_ID, schema.STATUS, schema.METHOD, schema.WORKLOAD, schema.DATASET,
                 schema.GPUS, schema.SEED, schema.EPOCHS)
#: a table frame's column naming the run's row in ``runs``
RUN_INDEX = "run_index"

#: which columns of a table to read: their names, or a test of a name
Columns = Sequence[str] | Callable[[str], bool]
#: method -> its options' declared defaults (None: the method is not installed here)
Declared = Callable[[str], "dict | None"]


def nothing_declared(method: str) -> None:
    return None


@dataclass
class ResultSet:
    """The runs of a result set and the asked columns of their tables.

    Attributes:
        runs: one row per run (folder order, index 0..n-1): the summary's keys and the run
            view's columns (``VIEW_COLUMNS``), ``dtype=object``.
        tables: table name -> the asked columns of every run's table, with ``run_index``.
        columns: table name -> per run (``runs``' index) the tuple of asked columns its file
            had, in the file's order; None where the run has no readable table.
        skipped: a line per folder left out (unreadable summary; with ``finished_only``, a
            run that did not end ok).
    """

    runs: pd.DataFrame
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    columns: dict[str, pd.Series] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.runs)

    @property
    def unreadable(self) -> list[str]:
        """Every file of the runs that could not be read, with the reason."""
        return [line for view in self.runs[VIEW] for line in view.unreadable]

    def table(self, name: str) -> pd.DataFrame:
        """The long frame of ``name`` (empty, with ``run_index`` only, when none was read)."""
        return self.tables.get(name, pd.DataFrame({RUN_INDEX: pd.Series(dtype="int64")}))


def column(frame: pd.DataFrame, key: str) -> pd.Series:
    """``frame[key]``, or a column of None where no run has the key (as ``summary.get``)."""
    if key in frame:
        return frame[key]
    return pd.Series([None] * len(frame), index=frame.index, dtype=object)


def read_result_set(
    path: str | Path,
    declared: Declared = nothing_declared,
    tables: Mapping[str, Columns] | None = None,
    finished_only: bool = False,
) -> ResultSet:
    """Every run folder under ``path`` (or ``path`` itself), read once.

    Args:
        path: a run folder or a tree of them.
        declared: each method's option defaults (``METHODS.defaults``), asked once per method,
            so runs are matched by their resolved settings (RunView.configuration).
        tables: table name (``iterations``, ``evals``, ``layers``) -> the columns to read;
            a column a file lacks is left out of that run's rows (NaN in the long frame).
        finished_only: leave out runs that did not end ok (each with a line in ``skipped``).

    Returns:
        The result set; its ``runs`` is empty when no folder could be read (the caller
        says what that means for its command).

    Examples:
        ```python
        runs = read_result_set("results", METHODS.defaults,
                               tables={"evals": ["iteration", "accuracy"]})
        last = runs.table("evals").groupby("run_index").accuracy.last()
        ```
    """
    views, skipped = [], []
    for folder in run_folders(path):
        try:
            view = RunView.read(folder)
        except BenchError as exc:
            skipped.append(str(exc))
            continue
        if finished_only and view.status != Status.OK:
            skipped.append(f"{folder}: status {view.status!r}")
            continue
        views.append(view)
    return result_set(views, declared, tables, skipped)


def result_set(
    views: Iterable[RunView],
    declared: Declared = nothing_declared,
    tables: Mapping[str, Columns] | None = None,
    skipped: list[str] | None = None,
) -> ResultSet:
    """The result set of runs already read (``RunView`` objects, e.g. made in memory); their
    tables are read from their folders. ``read_result_set`` finds and reads the views; the
    arguments are its own."""
    views = list(views)
    defaults: dict[str, dict | None] = {}
    rows = []
    for view in views:
        method = view.summary.get(schema.METHOD)
        if method not in defaults:
            defaults[method] = declared(method) if method is not None else None
        rows.append({**view.summary, schema.RUN_ID: view.run_id,
                     **view_columns(view, defaults[method])})
    # a key a summary lacks is None (as summary.get says), not NaN
    keys = dict.fromkeys([*IDENTITY_KEYS, *(key for row in rows for key in row),
                          *VIEW_COLUMNS])
    runs = pd.DataFrame({key: pd.Series([row.get(key) for row in rows], dtype=object)
                         for key in keys})
    read = {name: read_tables(views, name, wanted) for name, wanted in (tables or {}).items()}
    return ResultSet(runs, {name: frame for name, (frame, _) in read.items()},
                     {name: present for name, (_, present) in read.items()}, skipped or [])


def view_columns(view: RunView, declared: dict | None) -> dict:
    """The run view's columns of one run (``VIEW_COLUMNS``)."""
    recipe = view.recipe
    return {
        FOLDER: str(view.folder),
        VIEW: view,
        MACHINE_CLASS: view.machine_class,
        SETTING: view.setting,
        CONFIGURATION: json.dumps(view.configuration(declared), sort_keys=True),
        SHOWN_OPTIONS: json.dumps(view.shown_options(declared), sort_keys=True),
        BATCH_SIZE: recipe.get(schema.BATCH_SIZE),
        LR: recipe.get(schema.LR),
        LR_SCHEDULE: schedule_of(recipe) if recipe else None,
        DEVICE: view.manifest.get(schema.DEVICE),
        COMMIT: view.manifest.get(schema.GIT_REVISION),
        STARTED: view.manifest.get(schema.STARTED),
        OVERLAPPED_PHASES: view.manifest.get(schema.OVERLAPPED_PHASES),
    }


def schedule_of(recipe: dict) -> str:
    """``cosine+warmup0.1`` or ``constant``: the lr schedule a manifest's recipe names."""
    # runs recorded before schedules existed trained at a constant lr
    kind = recipe.get(schema.LR_SCHEDULE, "constant")
    warmup = recipe.get(schema.WARMUP_EPOCHS) or 0
    return f"{kind}+warmup{warmup:g}" if warmup else kind


def final_train_losses(views: list[RunView]) -> list[float | None]:
    """Each run's final training loss: its summary's, or for a run of format 1 summarized
    before the key existed, from its rows (the iterations and losses of all such runs read at
    once: the part of suite.results.upgrade that needs rows)."""
    losses = [view.summary.get(schema.FINAL_TRAIN_LOSS) for view in views]
    older = [i for i, view in enumerate(views) if schema.FINAL_TRAIN_LOSS not in view.summary]
    if older:
        rows, recorded = read_tables([views[i] for i in older], "iterations",
                                     (schema.ITERATION, schema.LOSS))
        from_rows = summary.final_train_losses(rows, RUN_INDEX)
        for position, i in enumerate(older):
            columns = recorded[position] or ()
            losses[i] = from_rows.get(position) if schema.LOSS in columns else None
    return losses


def read_tables(
    views: list[RunView], name: str, wanted: Columns
) -> tuple[pd.DataFrame, pd.Series]:
    """The asked columns of every view's table ``name``, read once into one frame.

    Args:
        views: the runs, whose position is their ``run_index``.
        name: ``iterations``, ``evals`` or ``layers``.
        wanted: the columns to read (names, or a test of a name).

    Returns:
        The frame (each run's rows together, in the runs' order and the file's row order,
        with ``run_index``; a column some files lack is NaN in the others' rows), and per
        view the columns its file had (None: no readable table). A damaged file is listed
        in its view's ``unreadable``, as RunView.table lists it.
    """
    if name not in TABLES:
        raise ValueError(f"unknown table {name!r}; known: {', '.join(TABLES)}")
    keep = wanted if callable(wanted) else set(wanted).__contains__
    parts, lengths, owners, present = [], [], [], []
    for position, view in enumerate(views):
        path = view.folder / f"{name}.parquet"
        table = None
        if path.exists():
            try:
                file = pq.ParquetFile(path, memory_map=True)
                columns = [c for c in file.schema_arrow.names if keep(c)]
                table = file.read(columns=columns, use_threads=False)
            except Exception as exc:  # pyarrow raises several kinds for a damaged file
                view.unreadable.append(f"{path}: {type(exc).__name__}: {first_line(exc)}")
        present.append(None if table is None else tuple(table.column_names))
        if table is not None and table.num_rows:
            parts.append(table.replace_schema_metadata(None))
            lengths.append(table.num_rows)
            owners.append(position)
    if parts:
        frame = pa.concat_tables(parts, promote_options="permissive").to_pandas()
    else:
        frame = pd.DataFrame()
    frame[RUN_INDEX] = np.repeat(np.asarray(owners, dtype="int64"), lengths)
    return frame, pd.Series(present, dtype=object)
