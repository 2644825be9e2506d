"""A run folder is input and has one owner: a checkpoint whose metadata would run code is
refused before anything of it runs; a run that is still going is neither resumed nor
overwritten by a second `bench run`; an owner that is gone is taken over, saying so."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
from pathlib import Path

import pytest

from suite.errors import BenchError
from suite.results.lock import OWNER, Owner, acquire, check_free, release
from suite.run.checkpoint import latest_checkpoint, read_metadata, safe_reader
from tests.support.runs import ENV, TINY, Planted, bench, finish, start, summary, wait_until

TOPK = ["--method", "topk", *TINY, "--gpus", "2", "--gpus-per-node", "1",
        "--checkpoint-every", "1"]


@pytest.fixture(scope="module")
def stopped(tmp_path_factory) -> Path:
    """A 2-rank run stopped after its third iteration, with a checkpoint to resume."""
    root = tmp_path_factory.mktemp("stopped")
    code, err = finish(start(root, "cut", *TOPK, "--iterations", "6",
                             env={**ENV, "PRUNEX_STOP_AFTER_ITERATION": "3"}))
    assert code == 1 and summary(root / "cut")["status"] == "interrupted", err
    assert latest_checkpoint(root / "cut") is not None
    return root / "cut"


def test_a_checkpoint_whose_metadata_runs_code_is_refused(stopped, tmp_path):
    """The repro of the issue: `.metadata` overwritten with a pickle that calls os.system.
    `bench run --resume` exits 2 in one line before any rank, and nothing ran; the ranks'
    reader (the same for --max-restarts and a sweep's resume) refuses it too."""
    folder = tmp_path / "crafted"
    subprocess.run(["cp", "-r", str(stopped), str(folder)], check=True)
    _, checkpoint = latest_checkpoint(folder)
    target = tmp_path / "ran"
    (checkpoint / ".metadata").write_bytes(pickle.dumps(Planted(target)))
    proc = bench("run", "--resume", folder)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "names posix.system" in lines[0] and "refused" in lines[0]
    assert not target.exists()
    for read in (lambda: read_metadata(checkpoint), lambda: safe_reader(checkpoint)
                 .read_metadata()):
        with pytest.raises(BenchError, match="names posix.system"):
            read()
    assert not target.exists()
    sweep = bench("sweep", "--method", "topk", *TINY, "--gpus", "2", "--gpus-per-node", "1",
                  "--iterations", "6", "--results-dir", tmp_path / "sweep", "--dry-run")
    assert sweep.returncode == 0  # nothing to resume there: the check costs a sweep nothing


def test_a_damaged_metadata_is_one_line(stopped, tmp_path):
    folder = tmp_path / "damaged"
    subprocess.run(["cp", "-r", str(stopped), str(folder)], check=True)
    _, checkpoint = latest_checkpoint(folder)
    (checkpoint / ".metadata").write_bytes(os.urandom(64))
    proc = bench("run", "--resume", folder)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "unreadable" in proc.stderr or "names" in proc.stderr


def test_the_real_metadata_reads_as_dcp_wrote_it(stopped):
    _, checkpoint = latest_checkpoint(stopped)
    metadata = read_metadata(checkpoint)
    assert any(key.startswith("rank0/") for key in metadata.state_dict_metadata)


@pytest.mark.integration  # a real run of a minute: nox -s integration
def test_a_live_run_is_neither_resumed_nor_overwritten(tmp_path):
    """While a run goes, `--resume` of its folder and a second `bench run` of its id with
    --overwrite are refused in one line naming the owner; the run ends ok, unharmed."""
    proc = start(tmp_path, "live", *TOPK, "--iterations", "400")  # stopped long before
    folder = tmp_path / "live"
    wait_until(folder, 2, proc)
    resumed = bench("run", "--resume", folder)
    again = bench("run", "--results-dir", tmp_path, "--run-id", "live", "--overwrite", *TOPK,
                  "--iterations", "4")
    for refused in (resumed, again):
        assert refused.returncode == 2, refused.stderr
        (line,) = refused.stderr.strip().splitlines()
        assert f"is in use by pid {proc.pid} on " in line, line
    proc.send_signal(signal.SIGTERM)
    code, _ = finish(proc)
    assert code == 1 and summary(folder)["status"] == "interrupted"
    assert not (folder / OWNER).exists()  # given up once the run said how it ended


def test_a_stale_owner_is_taken_over(stopped, tmp_path):
    """A resume after the owner died (its owner file left behind) takes the folder over with
    a line saying so, and finishes."""
    folder = tmp_path / "orphan"
    subprocess.run(["cp", "-r", str(stopped), str(folder)], check=True)
    gone = subprocess.Popen(["true"])
    gone.wait()
    owner = {**Owner.me().__dict__, "pid": gone.pid, "started": 1}
    (folder / OWNER).write_text(json.dumps(owner))
    proc = bench("run", "--resume", folder)
    assert proc.returncode == 0, proc.stderr
    assert f"took over from a stale owner (pid {gone.pid} on " in proc.stderr
    assert summary(folder)["status"] == "ok" and not (folder / OWNER).exists()


def test_the_lock_is_one_owner_at_a_time(tmp_path):
    """Two takers of one folder in two processes: the second is refused while the first
    lives; a damaged owner file is stale."""
    acquire(tmp_path)
    code = ("import sys; from suite.results.lock import acquire; from suite.errors import "
            "BenchError\ntry:\n    acquire(sys.argv[1])\nexcept BenchError as e:\n    "
            "print(e); sys.exit(2)")
    other = subprocess.run([os.sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                           text=True, env=ENV)
    assert other.returncode == 2 and f"in use by pid {os.getpid()}" in other.stdout
    check_free(tmp_path)  # this process's own hold is no obstacle to itself
    release(tmp_path)
    (tmp_path / OWNER).write_text("{")
    said = []
    acquire(tmp_path, say=said.append)
    assert said and "owner file is damaged" in said[0]
    release(tmp_path)
    assert not (tmp_path / OWNER).exists()


def fork_server_of(pid: int) -> int:
    """The fork server below a launcher: its child whose command is the server's (the ranks
    forked from it carry the same command line, one level further down)."""
    from suite.processes import descendants, stat_fields

    for child, _ in descendants(pid):
        fields = stat_fields(Path(f"/proc/{child}"))
        try:
            command = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if fields is not None and int(fields[1]) == pid and b"forkserver" in command:
            return child
    raise AssertionError(f"no fork server below {pid}")


def assert_nothing_left(launcher: int, folder: Path) -> None:
    """No rank of the run, nor the launcher, still runs."""
    from suite.processes import python_alive

    pids = [entry[1] for entry in summary(folder).get("processes") or []]
    assert not [pid for pid in [launcher, *pids] if python_alive(pid)]


def test_the_fork_servers_death_records_the_ranks_reason(tmp_path):
    """SIGKILL of the fork server the ranks came from: the launcher waits for the ranks to
    stop on their own (they checkpoint and say so) before it merges; the run ends
    interrupted with their words, and the rows counted are the rows on disk."""
    proc = start(tmp_path, "server", *TOPK, "--iterations", "400")
    folder = tmp_path / "server"
    wait_until(folder, 3, proc)
    os.kill(fork_server_of(proc.pid), signal.SIGKILL)
    code, err = finish(proc)
    assert code == 1, err
    ended = summary(folder)
    assert ended["status"] == "interrupted" and "--resume" in ended["error"], ended
    import pandas as pd

    rows = pd.read_parquet(folder / "iterations.parquet")
    assert ended["iterations_recorded"] == rows["iteration"].nunique()
    assert not (folder / "parts").exists()
    assert_nothing_left(proc.pid, folder)


def test_a_second_signal_still_ends_the_run_recorded(tmp_path):
    """SIGTERM, then another half a second later, to the launcher: exit 1 (not 143), the run
    interrupted and recorded, no rank left."""
    import time

    proc = start(tmp_path, "twice", *TOPK, "--iterations", "400")
    folder = tmp_path / "twice"
    wait_until(folder, 3, proc)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    code, err = finish(proc)
    assert code == 1, err
    assert summary(folder)["status"] == "interrupted"
    assert_nothing_left(proc.pid, folder)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small file system needs root")
def test_a_full_disk_ends_failed_saying_no_space(tmp_path):
    """Results on a 600 KiB tmpfs: the ranks fill it within a few iterations; the run ends
    failed with "no space left on device" in one line, the summary says so (rewritten in
    place), and nothing is left running."""
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs", str(mount)], check=True)
    try:
        proc = start(mount, "full", *TOPK[:-2], "--iterations", "400")
        code, err = finish(proc)
        assert code == 1, err
        lines = [line for line in err.strip().splitlines() if line.strip()]
        assert len(lines) == 1 and "no space left on device" in lines[0].lower(), err
        ended = summary(mount / "full")
        assert ended["status"] == "failed" and "space" in ended["error"].lower()
        assert_nothing_left(proc.pid, mount / "full")
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
