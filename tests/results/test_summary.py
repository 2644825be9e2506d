"""The summary's phase means are steady ones; what one-off iterations cost is reported apart,
by phase, beyond a steady iteration (PruneX's freeze, DDP's bucket rebuild)."""

import pandas as pd
import pytest

from suite.results.summary import one_off_seconds, phase_means


def rows() -> pd.DataFrame:
    """Two ranks, four iterations; iteration 0 (the attempt's first) and 2 (the freeze,
    timed under its own phase) are one-off."""
    out = []
    for rank in (0, 1):
        for iteration in range(4):
            row = {"iteration": iteration, "rank": rank, "one_off": iteration in (0, 2),
                   "t_local_compute": 1.0 + (0.5 if iteration == 0 else 0.0),
                   "t_projection": 0.01, "t_freeze": None}
            if iteration == 2:
                row["t_freeze"] = 0.3 + 0.1 * rank
            out.append(row)
    return pd.DataFrame(out)


def test_steady_means_leave_out_one_offs_and_phases_only_they_ran():
    means = phase_means(rows())
    assert means == {"t_local_compute"[2:]: 1.0, "projection": 0.01}


def test_one_offs_are_reported_beyond_a_steady_iteration():
    extra = one_off_seconds(rows())
    assert extra["freeze"] == pytest.approx(0.35)  # mean over ranks of the freeze's seconds
    assert extra["local_compute"] == pytest.approx(0.5)  # the first iteration's extra
    assert "projection" not in extra  # no one-off exceeded a steady iteration there


def test_no_one_off_column_no_one_offs():
    assert one_off_seconds(rows().drop(columns="one_off")) == {}
