"""Runs that survive: real processes killed, stopped and interrupted mid-run, then resumed,
restarted or recovered. Every run here is a small real gloo run (synthetic data, CPU)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from tests.support.runs import (
    BENCH,
    ENV,
    ONE_RANK,
    TINY,
    alive,
    bench_here,
    finish,
    one_line,
    only_line,
    rank_pid,
    start,
    summary,
    wait_until,
)

PRUNEX = [
    "--method", "prunex", "--dataset", "synthetic", "--synthetic-size", "1024,256",
    "--gpus", "4", "--gpus-per-node", "2", "--batch-size", "16", "--local-steps", "2",
    # the masks freeze after round 12 (not at a share of the run, nor when they stop moving):
    # the cut, from round 4 on, falls before it, so the duals, rho and the masks' agreement
    # cross the checkpoint
    "--freeze-round", "12", "--freeze-share", "1", "--freeze-patience", "100",
    "--checkpoint-every", "3",
    # strict (STRICT below): an op without a deterministic kernel would end the run
    "--deterministic",
    # random labels give the masks nothing to settle on; a fixed round pull keeps them still
    # (adaptive penalties halve it, the masks swap, and the oscillation warning is a 2nd line)
    "--fixed-rho",
]
TOPK = [
    "--method", "topk", "--dataset", "synthetic", "--synthetic-size", "1024,256",
    "--gpus", "2", "--gpus-per-node", "1", "--batch-size", "16", "--checkpoint-every", "4",
]
#: the runs' environment: --deterministic in its strict mode (suite.run.determinism)
STRICT = {**ENV, "PRUNEX_STRICT_DETERMINISM": "1"}
#: long enough that a signal sent once 4-6 iterations are on disk lands well before the last
#: one (a stop asked for at the last iteration is moot: the run ends ok) on a loaded machine
PRUNEX_ITERATIONS, TOPK_ITERATIONS = 16, 24
LONG = ["--iterations", "400"]  # far longer than any test waits: it is stopped first


def assert_same_model(a: Path, b: Path) -> None:
    left = torch.load(a / "model.pt", weights_only=True)
    right = torch.load(b / "model.pt", weights_only=True)
    assert left.keys() == right.keys()
    for key in left:
        assert torch.equal(left[key], right[key]), key


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The reference runs every resumed or restarted run must equal, bit for bit."""
    root = tmp_path_factory.mktemp("reference")
    for run_id, args in (("prunex", [*PRUNEX, "--iterations", str(PRUNEX_ITERATIONS)]),
                         ("topk", [*TOPK, "--iterations", str(TOPK_ITERATIONS)])):
        code, err = finish(start(root, run_id, *args, env=STRICT))
        assert code == 0, err
    return root


@pytest.mark.parametrize(
    "args, iterations, reference, sig",
    [(PRUNEX, PRUNEX_ITERATIONS, "prunex", signal.SIGTERM),
     pytest.param(TOPK, TOPK_ITERATIONS, "topk", signal.SIGINT,  # nox -s integration
                  marks=pytest.mark.integration)],
    ids=["prunex-2x2-SIGTERM", "topk-2x1-Ctrl-C"],
)
def test_interrupt_then_resume_equals_the_uninterrupted_run(
    tmp_path, uninterrupted, args, iterations, reference, sig
):
    proc = start(tmp_path, "cut", *args, "--iterations", str(iterations), env=STRICT)
    folder = tmp_path / "cut"
    wait_until(folder, 4, proc)
    if sig == signal.SIGTERM:
        proc.send_signal(sig)  # the launcher, as a scheduler would
    else:
        os.killpg(proc.pid, sig)  # Ctrl-C reaches the launcher and every rank
    code, err = finish(proc)
    assert code == 1
    assert f"interrupted by {sig.name}" in only_line(err)
    stopped = summary(folder)
    assert stopped["status"] == "interrupted" and stopped["method"] == args[1]
    kept = pd.read_parquet(folder / "iterations.parquet")
    assert kept["iteration"].nunique() >= 4  # every row written before the signal

    resumed = subprocess.run(
        [*BENCH, "run", "--resume", str(folder)], capture_output=True, text=True, env=STRICT,
        timeout=180,
    )
    assert resumed.returncode == 0, resumed.stderr
    done = summary(folder)
    if "--deterministic" in args:
        assert done["nondeterministic_ops"] == []
    assert done["status"] == "ok" and done["resumed_at_iteration"] >= 4
    assert done["iterations"] == iterations
    assert_same_model(folder, uninterrupted / reference)
    rows = pd.read_parquet(folder / "iterations.parquet")
    full = pd.read_parquet(uninterrupted / reference / "iterations.parquet")
    assert rows[["iteration", "rank"]].equals(full[["iteration", "rank"]])  # no gap, no repeat
    assert rows["loss"].tolist() == full["loss"].tolist()
    # each attempt's first iteration is a one-off, out of the means, and so is PruneX's
    # freeze; the summary's first iteration is this attempt's, not iteration 0 of the
    # interrupted one
    start_at = done["resumed_at_iteration"]
    one_offs = {0, start_at}
    if reference == "prunex":  # the freeze's round: the first frozen row follows it
        one_offs.add(int(rows.loc[rows["frozen"].astype(bool), "iteration"].min()) - 1)
    assert set(rows.loc[rows["one_off"], "iteration"]) == one_offs
    slowest = rows.groupby("iteration")["t_iteration"].max()
    assert done["first_iteration_seconds"] == slowest[start_at]
    assert done["iteration_seconds"] == pytest.approx(slowest.drop(sorted(one_offs)).mean())
    if reference == "prunex":
        assert rows["frozen"].any() and not rows["frozen"].all()  # froze inside the run
        assert done["masks_frozen_at"]["round"] > start_at  # after the cut: ADMM crossed it
        assert rows["density"].tolist() == full["density"].tolist()
    assert not (folder / "checkpoints").exists()  # a finished run has nothing to continue


def test_max_restarts_survives_a_killed_rank(tmp_path, uninterrupted):
    proc = start(tmp_path, "restarted", *TOPK, "--iterations", str(TOPK_ITERATIONS),
                 "--max-restarts", "1")
    folder = tmp_path / "restarted"
    wait_until(folder, 6, proc)
    os.kill(rank_pid(folder, 1), signal.SIGKILL)
    code, err = finish(proc, timeout=240)
    assert code == 0, err
    done = summary(folder)
    assert done["status"] == "ok" and done["restarts"] == 1
    assert done["resumed_at_iteration"] >= 4
    assert (folder / "attempts").is_dir()  # the first attempt's errors are kept
    assert_same_model(folder, uninterrupted / "topk")


def test_sigkill_of_a_follower_rank_fails_naming_it_and_keeps_the_rows(tmp_path):
    scratch = tmp_path / "tmp"  # the launcher's temporary folders, apart from other runs'
    scratch.mkdir()
    proc = start(tmp_path, "killed", *TOPK, *LONG, env={**ENV, "TMPDIR": str(scratch)})
    folder = tmp_path / "killed"
    before = wait_until(folder, 3, proc)
    os.kill(rank_pid(folder, 1), signal.SIGKILL)
    code, err = finish(proc)
    assert code == 1
    assert "rank 1 was killed by SIGKILL" in only_line(err)
    failed = summary(folder)
    assert failed["status"] == "failed" and "rank 1 was killed by SIGKILL" in failed["error"]
    assert pd.read_parquet(folder / "iterations.parquet")["iteration"].nunique() >= before
    assert not list(scratch.glob("prunex-launch-*"))  # the launcher's temporary folder is gone


def test_sigkill_of_the_parent_then_recover(tmp_path):
    proc = start(tmp_path, "orphaned", *TOPK, *LONG)
    folder = tmp_path / "orphaned"
    before = wait_until(folder, 2, proc)
    pids = [entry[1] for entry in summary(folder)["processes"]]
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    assert summary(folder)["status"] == "running"
    deadline = time.monotonic() + 60
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.5)
    recovered = subprocess.run(
        [*BENCH, "recover", str(folder)], capture_output=True, text=True, env=ENV, timeout=60
    )
    assert recovered.returncode == 0, recovered.stderr
    failed = summary(folder)
    # the ranks outlived their launcher by a moment (the fork server's end signals them):
    # they stopped on their own and said so, and recover keeps their words
    assert failed["status"] == "interrupted", failed
    assert failed["error"].startswith("interrupted") and "resume" in failed["error"]
    assert failed["method"] == "topk" and failed["gpus"] == 2  # identity from the start
    assert pd.read_parquet(folder / "iterations.parquet")["iteration"].nunique() >= before
    assert not (folder / "parts").exists()




# -- inputs checked before any rank starts, and readers that never crash ---------------------
@pytest.mark.parametrize(
    "args, expected",
    [
        (["--lr", "nan"], "--lr must be finite, got nan"),
        (["--lr", "-1"], "--lr must be positive, got -1.0"),
        (["--momentum", "1.5"], "--momentum must be in [0, 1), got 1.5"),
        (["--weight-decay", "-0.1"], "--weight-decay must be at least 0"),
        (["--checkpoint-every", "0"], "--checkpoint-every must be positive"),
        (["--collective-timeout", "0"], "--collective-timeout must be in [1,"),
        (["--gpus", "4096", "--gpus-per-node", "4", "--synthetic-size", "65536,64"],
         "local CPU ranks need about"),
        (["--gpus", "512", "--gpus-per-node", "4"], "256 training samples cannot fill 512 shards"),
    ],
)
def test_bad_values_are_one_line_before_any_rank(tmp_path, args, expected):

    result = bench_here("run", *TINY, *args, "--results-dir", str(tmp_path / "r"))
    assert expected in one_line(result) and result.exit_code == 2
    assert not (tmp_path / "r").exists() or not list((tmp_path / "r").iterdir())


def test_results_dir_that_is_a_file_is_one_line(tmp_path):

    (tmp_path / "file").write_text("")
    result = bench_here("run", *TINY, "--results-dir", str(tmp_path / "file"))
    assert "is not a writable folder" in one_line(result)


def test_masks_from_is_checked_before_any_rank(tmp_path):

    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(os.urandom(512))
    result = bench_here("run", *TINY, "--masks-from", str(garbage), "--results-dir", str(tmp_path))
    assert f"--masks-from {garbage}: cannot read" in one_line(result)
    foreign = tmp_path / "foreign.pt"
    bits = {"filters": torch.ones(3), "channels": torch.ones(2), "shape": torch.ones(2, 3, 3)}
    torch.save({"some.other.layer": bits}, foreign)
    result = bench_here("run", *TINY, "--masks-from", str(foreign), "--results-dir", str(tmp_path))
    assert "has no mask for layer" in one_line(result)
    assert {p.name for p in tmp_path.iterdir()} == {"garbage.pt", "foreign.pt"}


def test_an_existing_run_folder_is_refused_unless_overwritten(tmp_path):

    old = tmp_path / "same"
    old.mkdir()
    (old / "summary.json").write_text('{"status": "failed", "method": "prunex"}')
    (old / "masks.pt").write_bytes(b"stale")
    args = ["run", *TINY, *ONE_RANK, "--method", "ddp", "--iterations", "2",
            "--results-dir", str(tmp_path), "--run-id", "same"]
    result = bench_here(*args)
    assert "already holds a run" in one_line(result) and "--overwrite" in result.stderr
    proc = subprocess.run([*BENCH, *args, "--overwrite"], capture_output=True, text=True,
                          env=ENV, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert summary(old)["status"] == "ok" and summary(old)["method"] == "ddp"
    assert not (old / "masks.pt").exists()  # nothing of the old run is mixed in


def test_report_lists_damaged_files_and_goes_on(tmp_path):
    import shutil

    from suite.report.render import render

    root = tmp_path / "runs"
    reference = Path(__file__).resolve().parents[1] / "fixtures" / "references" / "cpu-gloo"
    shutil.copytree(reference, root)
    prunex = next(root.glob("prunex-cnn*"))
    (prunex / "masks.pt").write_bytes(os.urandom(300))
    ddp = next(root.glob("ddp-cnn*"))
    data = (ddp / "evals.parquet").read_bytes()
    (ddp / "evals.parquet").write_bytes(data[: len(data) // 2])
    lines = []
    render(root, tmp_path / "report", echo=lines.append)
    damaged = [line for line in lines if line.startswith("skipped unreadable file")]
    assert any("masks.pt" in line for line in damaged)
    assert any("evals.parquet" in line for line in damaged)
    assert "Files left out (unreadable)" in (tmp_path / "report" / "report.md").read_text()


def test_sweep_resumes_a_cell_that_has_a_checkpoint(tmp_path):
    from suite.commands.sweep import Cell, prepare
    from suite.config import RunConfig

    with_checkpoint, without = tmp_path / "a", tmp_path / "b"
    for folder in (with_checkpoint, without):
        folder.mkdir()
        (folder / "manifest.json").write_text("{}")
        (folder / "summary.json").write_text('{"status": "interrupted"}')
    saved = with_checkpoint / "checkpoints" / "it-00000004"
    saved.mkdir(parents=True)
    (saved / ".metadata").write_bytes(b"")
    (saved.parent / "latest.json").write_text('{"folder": "it-00000004", "iterations_done": 4}')
    resumed, restarted = Cell(RunConfig(run_id="a")), Cell(RunConfig(run_id="b"))
    assert prepare(resumed, tmp_path) and resumed.config.resume
    assert (tmp_path / "a").exists()  # continued in place
    assert prepare(restarted, tmp_path) and not restarted.config.resume
    assert (tmp_path / "b.failed-1").exists() and not (tmp_path / "b").exists()
    (tmp_path / "a" / "summary.json").write_text('{"status": "ok"}')
    done = Cell(RunConfig(run_id="a"))
    assert not prepare(done, tmp_path) and done.status == "skipped"
    assert prepare(done, tmp_path, force=True) and done.config.overwrite  # re-recorded
