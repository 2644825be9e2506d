"""A rank that stalls (SIGSTOP) is named, whichever it is: a follower or a leader of the last
node, rank 0, or one stopped during an evaluation. Its peers' watchdogs report the stall at
--collective-timeout, before the backend's own timeout; the line the summary and stderr show
names the root of the chain of waits (the stopped rank), not a peer that was waiting itself;
the run ends failed within the timeout plus 40 s with the rows it flushed, and no rank
process outlives it. Two scenarios run at a time (they mostly wait)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.support.runs import (
    alive,
    finish,
    only_line,
    rank_pid,
    start,
    streamed_iterations,
    summary,
)

TIMEOUT = 8
#: 2 nodes x 2 ranks of PruneX: intra-node all-reduces, the leaders' exchange, broadcasts
RUN = ["--method", "prunex", "--dataset", "synthetic", "--synthetic-size", "1024,256",
       "--gpus", "4", "--gpus-per-node", "2", "--batch-size", "16", "--local-steps", "2",
       "--iterations", "400", "--fixed-rho", "--collective-timeout", str(TIMEOUT)]
#: evaluations that take most of each iteration's time: a stop lands in one
EVALUATING = ["--synthetic-size", "256,4096", "--eval-every", "1"]
SCENARIOS = {
    "follower-of-the-last-node": (3, []),
    "leader-of-the-last-node": (2, []),
    "rank-0": (0, []),
    "during-an-evaluation": (1, EVALUATING),
}


def stop_one(tmp_path: Path, name: str):
    rank, extra = SCENARIOS[name]
    proc = start(tmp_path, name, *RUN, *extra)
    folder = tmp_path / name
    deadline = time.monotonic() + 120
    while streamed_iterations(folder) < 2:
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "the run did not start"
        time.sleep(0.2)
    pids = {r: rank_pid(folder, r) for r in range(4)}
    before = streamed_iterations(folder)
    os.kill(pids[rank], signal.SIGSTOP)
    return proc, folder, pids, before, time.monotonic()


def check(proc, folder, pids, before, stopped_at, rank):
    try:
        code, err = finish(proc, timeout=TIMEOUT + 60)
        ended = time.monotonic() - stopped_at
    finally:
        for pid in pids.values():
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert code == 1 and ended < TIMEOUT + 40, (code, ended, err)
    line = only_line(err)
    assert f"stalled rank {rank} (silent for" in line, line
    assert f"--collective-timeout {TIMEOUT}" in line, line
    failed = summary(folder)
    assert failed["status"] == "failed" and failed["error"].startswith(f"stalled rank {rank} ")
    assert pd.read_parquet(folder / "iterations.parquet")["iteration"].nunique() >= before
    assert not [pid for pid in pids.values() if alive(pid)]


@pytest.mark.parametrize(
    "pair",
    [("follower-of-the-last-node", "rank-0"),
     pytest.param(("leader-of-the-last-node", "during-an-evaluation"),  # nox -s integration
                  marks=pytest.mark.integration)],
    ids=lambda pair: "+".join(pair),
)
def test_the_stopped_rank_is_named(tmp_path, pair):
    stopped = [stop_one(tmp_path, name) for name in pair]
    for name, scenario in zip(pair, stopped):
        check(*scenario, SCENARIOS[name][0])
