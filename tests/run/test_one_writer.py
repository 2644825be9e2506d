"""One writer per run folder: a second sweep of a grid never moves or runs a cell another
sweep is running, a cell in use is never touched, and rows carry their attempt, so a late
chunk of an earlier attempt or another run's rows are refused at merge, never merged as
duplicates. Real sweeps (2 CPU ranks, synthetic data) and the committed reference runs."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time

import pandas as pd
import pytest

from suite.errors import BenchError
from suite.processes import start_time
from suite.results.folder import RunFolder
from suite.results.lock import OWNER, Owner
from tests.report.varied_runs import REFERENCE
from tests.support.runs import (
    BENCH,
    ENV,
    TINY,
    bench,
    bench_here,
    finish,
    one_line,
    one_line_error,
    summary,
    wait_until,
)

TOPK = ["--method", "topk", *TINY, "--gpus", "2", "--gpus-per-node", "1"]


@pytest.mark.integration  # a real run of a minute: nox -s integration
def test_two_sweeps_of_one_grid_never_share_a_cell(tmp_path):
    """The second `bench sweep` of a grid whose cell the first is running is refused in one
    line and moves nothing; the first ends ok with each (iteration, rank) row once."""
    grid = ["sweep", *TOPK, "--iterations", "20", "--results-dir", tmp_path]
    first = subprocess.Popen([*BENCH, *map(str, grid)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=ENV, start_new_session=True)
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob("topk-*/summary.json")):
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()
        time.sleep(0.2)
    (cell,) = tmp_path.glob("topk-*")
    wait_until(cell, 2, first)
    ranks = summary(cell)["processes"]
    try:
        for entry in ranks:  # held mid-run, so the second sweep surely meets it live
            os.kill(entry[1], signal.SIGSTOP)
        second = bench(*grid)
    finally:
        for entry in ranks:
            os.kill(entry[1], signal.SIGCONT)
    line = one_line_error(second)
    assert second.returncode == 2 and "is in use by pid" in line, line
    code, err = finish(first)
    assert code == 0, err
    rows = pd.read_parquet(cell / "iterations.parquet")
    assert len(rows) == 20 * 2 and not rows.duplicated(["iteration", "rank"]).any()
    assert summary(cell)["status"] == "ok" and not list(tmp_path.glob("*.failed-*"))


@pytest.fixture
def stranger():
    proc = subprocess.Popen(["sleep", "300"])
    yield proc
    proc.kill()
    proc.wait()


def test_a_sweep_never_moves_a_cell_in_use(tmp_path, stranger):
    """Past the preflight (two sweeps racing), a cell whose folder another live process holds,
    or whose recorded rank still runs, fails untouched."""
    from suite.commands.sweep import Cell, prepare
    from suite.config import RunConfig
    from suite.processes import identity

    held = {**Owner.me().__dict__, "pid": stranger.pid, "started": start_time(stranger.pid)}
    for name, owner, processes in (("held", held, []),
                                   ("ranked", None, [identity(stranger.pid)])):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "summary.json").write_text(json.dumps({"status": "running",
                                                         "processes": processes}))
        if owner:
            (folder / OWNER).write_text(json.dumps(owner))
        with pytest.raises(BenchError, match="in use by|still running"):
            prepare(Cell(RunConfig(run_id=name)), tmp_path)
        assert folder.is_dir() and not list(tmp_path.glob(f"{name}.failed-*"))


def test_rows_of_another_attempt_are_refused_at_merge(tmp_path):
    """Rows carry their attempt: a late chunk of an earlier attempt and one of another run
    are kept aside (refused/, named in one line), never merged as duplicates."""
    folder = RunFolder(tmp_path)
    folder.write_summary({"attempts": ["0000aaaa", "1111bbbb"]})
    for attempt, loss in (("1111bbbb", 1.0), ("0000aaaa", 2.0), ("2222cccc", 3.0)):
        folder.attempt = attempt
        folder.write_rank_chunk(0, 0, {"iterations": [{"iteration": 0, "rank": 0,
                                                        "loss": loss}]})
    lines = folder.merge_parts()
    assert folder.table("iterations").loss.tolist() == [1.0]
    assert len(lines) == 1 and "2 chunk file(s)" in lines[0] and "refused" in lines[0]
    assert "earlier attempts and another run" in lines[0]
    assert len(list((tmp_path / "refused").iterdir())) == 2


def test_recover_of_a_folder_mixing_two_runs_is_one_line(tmp_path):
    """Issue 68's repro: a killed run's parts/ holds its own rows and another run's (the
    committed ddp and topk references). `bench recover` says so in one line (exit 2) and
    changes nothing; with the other run's rows moved out it recovers the run's own."""
    ddp, topk = (next(REFERENCE.glob(f"{m}-cnn-*")) for m in ("ddp", "topk"))
    folder = tmp_path / "killed"
    shutil.copytree(ddp, folder)
    (folder / "summary.json").write_text(json.dumps(
        {**summary(folder), "status": "running", "attempts": ["0a0a0a0a"]}))
    own, other = RunFolder(folder), RunFolder(folder)
    own.attempt, other.attempt = "0a0a0a0a", "b1b1b1b1"
    rows = pd.read_parquet(folder / "iterations.parquet")
    own.write_rank_chunk(0, 0, {"iterations": rows.assign(iteration=rows.iteration + 1000)})
    other.write_rank_chunk(0, 0, {"iterations": pd.read_parquet(topk / "iterations.parquet")})
    line = one_line(bench_here("recover", folder))
    assert "another run" in line and "nothing changed" in line, line
    assert summary(folder)["status"] == "running" and len(list(own.parts.iterdir())) == 2
    for chunk in own.parts.glob("*-ab1b1b1b1-*"):
        chunk.rename(tmp_path / chunk.name)
    assert bench_here("recover", folder).exit_code == 0
    assert summary(folder)["status"] == "failed"
    merged = pd.read_parquet(folder / "iterations.parquet")
    assert len(merged) == 2 * len(rows) and not merged.duplicated(["iteration", "rank"]).any()


def test_recover_of_an_older_folder_mixing_two_runs_is_one_line(tmp_path):
    """A folder from before attempts (chunks named without one) holding another run's rows
    that cannot share a table with its own (a loss column of text): one line, exit 2,
    nothing changed, where a traceback ended `bench recover` before."""
    ddp, topk = (next(REFERENCE.glob(f"{m}-cnn-*")) for m in ("ddp", "topk"))
    folder = tmp_path / "killed"
    shutil.copytree(ddp, folder)
    (folder / "summary.json").write_text(json.dumps({**summary(folder), "status": "running"}))
    (folder / "parts").mkdir()
    rows = pd.read_parquet(folder / "iterations.parquet")
    rows.assign(iteration=rows.iteration + 1000).to_parquet(
        folder / "parts" / "iterations-rank00000-p1-000000.parquet", index=False)
    pd.read_parquet(topk / "iterations.parquet").assign(loss="x").to_parquet(
        folder / "parts" / "iterations-rank00000-p2-000000.parquet", index=False)
    line = one_line(bench_here("recover", folder))
    assert "do not fit together" in line and "nothing changed" in line, line
    assert summary(folder)["status"] == "running" and len(list((folder / "parts").iterdir())) == 2
    assert pd.read_parquet(folder / "iterations.parquet").equals(rows)
