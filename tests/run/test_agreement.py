"""The ranks' batched agreement (suite.run.agreement.Agreement) on real gloo ranks: what it
settles, how its interval grows, and that every rank stops on the same non-finite loss."""

from __future__ import annotations

import math

import pytest
import torch

from tests.support.distributed import run_each


def settle_twelve(rank: int, agree_seconds: float) -> dict:
    """Twelve fast iterations; rank 1 is asked to stop during iteration 5."""
    from suite.run import agreement as batched

    agreement = batched.Agreement(torch.device("cpu"))
    agreement.agree_seconds = agree_seconds
    batches, stops = [], []
    for it in range(12):
        row = {"iteration": it, "bytes_inter": 10.0 * (rank + 1), "bytes_intra": 1.0}
        agreement.add(row, float(it + rank))
        if agreement.due:
            settled = agreement.settle(stop=rank == 1 and it >= 5, checkpoint_due=rank == 0)
            batches.append([(s.row["iteration"], s.mean_loss, s.inter_bytes, s.intra_bytes)
                            for s in settled.iterations])
            stops.append((settled.stop, settled.checkpoint_due))
    return {"batches": batches, "stops": stops, "left": len(agreement.pending)}


def test_fast_iterations_agree_less_often_and_every_rank_settles_the_same(runs):
    first, second = runs["fast"]
    assert first == second  # the same iterations, means and sums, and the same intervals
    sizes = [len(batch) for batch in first["batches"]]
    assert sizes == [1, 2, 4] and first["left"] == 5  # the interval doubles: 1, 2, 4, then 8
    assert [it for batch in first["batches"] for it, *_ in batch] == list(range(7))
    for it, mean_loss, inter, intra in sum(first["batches"], []):
        assert (mean_loss, inter, intra) == (it + 0.5, 30.0, 2.0)
    # rank 1's stop request (iteration 5) and rank 0's timed checkpoint reach both ranks
    assert first["stops"] == [(False, True), (False, True), (True, True)]


def test_slow_iterations_agree_every_iteration(runs):
    first, second = runs["slow"]
    assert first == second
    assert [len(batch) for batch in first["batches"]] == [1] * 12 and first["left"] == 0


def nonfinite_at_two(rank: int) -> str:
    from suite.run import agreement as batched

    agreement = batched.Agreement(torch.device("cpu"))
    for it in range(4):
        loss = math.nan if (rank, it) == (1, 2) else 1.0
        agreement.add({"iteration": it, "bytes_inter": 0.0, "bytes_intra": 0.0}, loss)
    agreement.interval = 4
    with pytest.raises(batched.NonFiniteLoss) as raised:
        agreement.settle(stop=False, checkpoint_due=False)
    return str(raised.value)


def test_a_nonfinite_loss_stops_every_rank_naming_its_iteration(runs):
    messages = runs["nonfinite"]
    assert messages[0] == messages[1]
    assert messages[0].startswith("non-finite loss at iteration 2 on 1 rank(s)")


@pytest.fixture(scope="module")
def runs():
    """Every run this file checks, on one pair of ranks."""
    return run_each(2, {"fast": (settle_twelve, (1.0,)), "slow": (settle_twelve, (0.0,)),
                        "nonfinite": (nonfinite_at_two, ())})
