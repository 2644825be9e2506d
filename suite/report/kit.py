"""What a method's own figures draw with: the report's figure, labels and style, handed to
every figure a method declares at registration (``figures=``) as its ``kit`` argument. A
plugin imports only ``suite.api``, below the report; the report passes it the rest, so a
method's panels look like the suite's (paper sizes, colours, labels, the shared context
under the title) without the plugin reaching into the framework.

A declared figure is ``fn(runs, out, kit, width=None) -> kit.Figure | kit.Skipped``: ``runs``
the result set (``runs.runs``: one row per run; ``runs.table("layers")``: a table's rows of
every run, their run in ``kit.RUN_INDEX``), ``out`` the report's folder.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.ticker import MaxNLocator

from suite.report.figures import Figure, Skipped, finish
from suite.report.labels import label_table
from suite.report.style import legend_outside, log_scale, paper_figure, series_styles
from suite.results import schema
from suite.results.resultset import RUN_INDEX, ResultSet, column

__all__ = ["Figure", "Skipped", "ResultSet", "RUN_INDEX", "finish", "label_table",
           "legend_outside", "log_scale", "paper_figure", "round_axis", "series_styles",
           "trained_rows"]


def trained_rows(runs: ResultSet, rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` of a runs' table less those of simulated runs, whose residuals, penalties
    and masks come from stand-in batches (a simulation trains nothing)."""
    simulated = np.array([bool(s) for s in column(runs.runs, schema.SIMULATED)], dtype=bool)
    return rows[~simulated[rows[RUN_INDEX].to_numpy()]] if len(rows) else rows


def round_axis(ax, rounds: pd.Series) -> None:
    """An x axis of whole rounds (one round alone gets a round either side)."""
    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if rounds.nunique() == 1:
        ax.set_xlim(rounds.iloc[0] - 1, rounds.iloc[0] + 1)
