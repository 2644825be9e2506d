"""What a figure calls a configuration, computed once per configuration.

A run's display parts (method, options, ranks, setting) depend only on a few of its columns,
so they are computed once per distinct value of those (``IDENTITY``: a groupby over the result
set), not once per run, and never once per pair of runs. A label is the display without the
parts every run of the figure shares (the rank count of a one-size comparison says nothing),
with the workload where there are several, and the recipe (lr, batch, epochs) where two
configurations would otherwise share a label.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from suite.report.style import method_style, options_text
from suite.results import schema
from suite.results.resultset import BATCH_SIZE, DEVICE, LR, SETTING, SHOWN_OPTIONS, column

#: what a run's display parts depend on
IDENTITY = [schema.METHOD, SHOWN_OPTIONS, schema.GPUS, DEVICE, SETTING]
#: the display parts, in the order a label joins them
PARTS = ("method", "options", "ranks", "setting")
#: the parts left out of a label when every run of the figure shares them
SHAREABLE = ("ranks", "setting")
#: the runs frame's column of each run's label (suite.report.load adds it)
LABEL = "label"


def ranks_word(device) -> str:
    """``GPUs`` when the ranks ran on CUDA devices, else ``ranks``."""
    return "GPUs" if str(device).startswith("cuda") else "ranks"


def setting_suffix(setting: str) -> str:
    """Where the run's times come from, unless a plain run: `` (sim PROFILE)`` or
    `` (emulated RATE)``. Runs of different settings never share a line or a label."""
    return "" if setting == "real" else f" ({setting})"


def display_parts(method: str, shown_options: str, gpus, device, setting: str) -> dict[str, str]:
    """The pieces of a figure label: method, options (``shown_options``: sorted JSON),
    ranks, setting."""
    return {
        schema.METHOD: method_style(method).name,
        schema.OPTIONS: options_text(json.loads(shown_options)),
        "ranks": f"{gpus} {ranks_word(device)}",
        "setting": setting_suffix(setting),
    }


def parts_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per run (``runs``' index) its display parts (``PARTS`` columns), computed once per
    distinct ``IDENTITY``."""
    if runs.empty:
        return pd.DataFrame({part: pd.Series(dtype=object) for part in PARTS}, index=runs.index)
    groups = runs.groupby(IDENTITY, dropna=False, sort=False)
    firsts = groups.head(1)
    per_group = pd.DataFrame(
        [display_parts(*(row[k] for k in IDENTITY)) for _, row in firsts.iterrows()],
        columns=list(PARTS), dtype=object,
    )
    return per_group.iloc[groups.ngroup().to_numpy()].set_index(runs.index)


def display(parts) -> str:
    """The full label of one run (nothing left out): ``PruneX, channel keep 0.5, 4 ranks
    (emulated 1gbit)``, from its display parts (a row of ``parts_table``)."""
    return ", ".join(parts[p] for p in PARTS[:-1] if parts[p]) + parts["setting"]


def label_table(runs: pd.DataFrame, parts: pd.DataFrame | None = None) -> pd.Series:
    """Per run (``runs``' index) the label of its configuration: repeats share it, and two
    configurations never do (the recipe values that differ are added where needed). What
    the runs share is judged over ``runs``: a figure of a subset labels that subset.
    ``parts``: ``parts_table`` of ``runs``, when already computed."""
    if runs.empty:
        return pd.Series(dtype=object, index=runs.index)
    parts = parts_table(runs) if parts is None else parts
    shared = {key for key in SHAREABLE if parts[key].nunique(dropna=False) == 1}
    shown = [p for p in PARTS[:-1] if p not in shared]
    columns = [parts[p] for p in shown]
    workloads = column(runs, schema.WORKLOAD)
    if workloads.nunique(dropna=False) > 1:
        columns.append(workloads)
    suffix = parts["setting"] if "setting" not in shared else [""] * len(runs)
    base = [", ".join(p for p in pieces if p) + setting
            for *pieces, setting in zip(*columns, suffix)]
    epochs = [e if e is not None else 0 for e in column(runs, schema.EPOCHS)]
    recipes = list(zip(column(runs, LR), column(runs, BATCH_SIZE),
                       [round(e or 0, 3) for e in epochs], column(runs, schema.DATASET)))
    ambiguous = pd.Series(recipes, dtype=object).groupby(base, sort=False).transform("nunique")
    labels = list(base)
    for i in np.flatnonzero(ambiguous.to_numpy() > 1):
        lr, batch_size = recipes[i][:2]
        labels[i] += f", lr {lr}, batch_size {batch_size}, {epochs[i]:.3g} epochs"
    return pd.Series(labels, index=runs.index, dtype=object)


def line_table(runs: pd.DataFrame, parts: pd.DataFrame | None = None) -> pd.Series:
    """Per run the line it belongs to in a scaling plot: method, options, setting (and the
    workload where there are several), not the rank count. ``parts``: as in label_table."""
    parts = parts_table(runs) if parts is None else parts
    workloads = column(runs, schema.WORKLOAD)
    several = workloads.nunique(dropna=False) > 1
    return pd.Series(
        [", ".join(p for p in (method, options) if p) + setting
         + (f", {workload}" if several else "")
         for method, options, setting, workload in zip(parts[schema.METHOD], parts[schema.OPTIONS],
                                                       parts["setting"], workloads)],
        index=runs.index, dtype=object)
