"""A phase's time is the measure of the union of its spans: overlapping spans (DDP's bucket
all-reduces queued one behind another on one NCCL stream) count once, disjoint ones add up."""

from __future__ import annotations

import pytest
import torch

from suite.cluster import phases
from suite.cluster.recorder import Mark, Recorder, union_seconds


def at(seconds: float) -> Mark:
    """A CPU mark at ``seconds`` on the recorder's clock."""
    mark = Mark.__new__(Mark)
    mark.seconds, mark.event = seconds, None
    return mark


@pytest.mark.parametrize(
    ("intervals", "union"),
    [
        ([], 0.0),
        ([(0.0, 1.0), (2.0, 3.5)], 2.5),  # disjoint: they add up
        ([(0.0, 4.0), (1.0, 2.0), (1.5, 3.0)], 4.0),  # nested in the first
        ([(0.0, 2.0), (1.0, 3.0), (2.5, 5.0)], 5.0),  # chained overlaps
        ([(3.0, 4.0), (0.0, 1.0), (0.5, 1.5)], 2.5),  # in any order
        ([(1.0, 2.0), (2.0, 3.0)], 2.0),  # touching
    ],
)
def test_union_of_intervals(intervals, union):
    assert union_seconds(intervals) == pytest.approx(union)


def test_spans_queued_behind_each_other_count_as_their_union():
    """Eight bucket all-reduces issued during backward, 10 ms apart, each taking 30 ms of the
    link after the one before it: each span runs from its launch to its completion, so the
    k-th also holds its wait behind the k-1 before it. Their sum grows with the square of
    the bucket count; the link was busy for the union."""
    recorder = Recorder(0, torch.device("cpu"))
    recorder.begin_iteration(0)
    origin = recorder._origin.seconds
    done = 0.0
    for k in range(8):
        issued = 0.010 * k
        done = max(done, issued) + 0.030
        recorder.add_span(phases.ALLREDUCE, at(origin + issued), at(origin + done))
    recorder.add_span(phases.LOCAL_COMPUTE, at(origin), at(origin + 0.1))
    row = recorder.end_iteration()
    assert row["t_allreduce"] == pytest.approx(8 * 0.030)  # 0 .. 0.24 s, not the 0.96 s sum
    assert row["t_local_compute"] == pytest.approx(0.1)


def test_a_phase_timed_twice_in_sequence_adds_up():
    recorder = Recorder(0, torch.device("cpu"))
    recorder.begin_iteration(0)
    origin = recorder._origin.seconds
    recorder.add_span(phases.PACK, at(origin + 0.0), at(origin + 0.2))
    recorder.add_span(phases.PACK, at(origin + 0.5), at(origin + 0.6))
    recorder.add_time(phases.PACK, 0.05)  # priced time (the simulator) adds to the union
    assert recorder.end_iteration()["t_pack"] == pytest.approx(0.35)
