"""A run signals and waits for its own processes only: a process a folder names is signalled
only while it still is that process (host and kernel start time), opening a folder for an
attempt clears the earlier attempt's list, and a resume waits for every rank of the run, not
only for its launcher. Real runs (2 CPU ranks, synthetic data) and real processes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from suite.processes import descendants, start_time, stat_fields
from suite.results.folder import RunFolder
from tests.support.runs import (
    BENCH,
    ENV,
    TINY,
    bench,
    bench_here,
    finish,
    one_line,
    one_line_error,
    start,
    summary,
    wait_until,
)

TOPK = ["--method", "topk", *TINY, "--gpus", "2", "--gpus-per-node", "1"]


@pytest.fixture(scope="module")
def stopped(tmp_path_factory) -> Path:
    """A 2-rank run stopped after its third iteration, with a checkpoint to resume."""
    root = tmp_path_factory.mktemp("stopped")
    code, err = finish(start(root, "cut", *TOPK, "--checkpoint-every", "1", "--iterations",
                             "6", env={**ENV, "PRUNEX_STOP_AFTER_ITERATION": "3"}))
    assert code == 1 and summary(root / "cut")["status"] == "interrupted", err
    return root / "cut"


@pytest.fixture
def stranger():
    """A process that is none of the suite's (``sleep``), ended at the test's end."""
    proc = subprocess.Popen(["sleep", "300"])
    yield proc
    proc.kill()
    proc.wait()


def copy_naming(stopped: Path, target: Path, pid: int) -> Path:
    """A copy of the stopped run whose summary names ``pid`` among its processes, as a
    folder written before start times were recorded would (``[host, pid]``)."""
    subprocess.run(["cp", "-r", str(stopped), str(target)], check=True)
    recorded = summary(target)
    recorded["processes"] = [[socket.gethostname(), pid]]
    (target / "summary.json").write_text(json.dumps(recorded))
    return target


def children_of(pid: int) -> list[int]:
    return [child for child, _ in descendants(pid)
            if int((stat_fields(Path(f"/proc/{child}")) or [0, 0])[1]) == pid]


def fork_server_below(launcher: int, timeout: float = 60) -> int:
    """The fork server the launcher's ranks are forked from, once it exists (the launcher
    has its signal handlers installed by then)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in children_of(launcher):
            try:
                if b"forkserver" in Path(f"/proc/{child}/cmdline").read_bytes():
                    return child
            except OSError:
                continue
        time.sleep(0.05)
    raise AssertionError(f"no fork server below {launcher}")


def ranks_below(server: int, count: int, timeout: float = 60) -> list[int]:
    """The ``count`` ranks the fork server forked, once it has: its children that are its
    own forks (the same command line; a helper a preloaded module started is not)."""
    command = Path(f"/proc/{server}/cmdline").read_bytes()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ranks = []
        for child in children_of(server):
            try:
                if Path(f"/proc/{child}/cmdline").read_bytes() == command:
                    ranks.append(child)
            except OSError:
                continue
        if len(ranks) >= count:
            return ranks
        time.sleep(0.02)
    raise AssertionError(f"no {count} ranks below {server}")


def connected(pid: int) -> bool:
    """The process holds a socket: a rank past its start, joining its process group."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:"):
                return True
        except OSError:
            continue
    return False


def running(entry: list) -> bool:
    """A recorded ``[host, pid, start time]`` still runs as itself (not a zombie)."""
    fields = stat_fields(Path(f"/proc/{entry[1]}"))
    same = len(entry) < 3 or (fields is not None and int(fields[19]) == entry[2])
    return fields is not None and same and fields[0] != "Z"


def end_processes(entries: list) -> None:
    """SIGKILL (and SIGCONT, for a stopped one) each recorded process still itself; wait
    until none is left."""
    for entry in entries:
        if running(entry):
            os.kill(entry[1], signal.SIGKILL)
            os.kill(entry[1], signal.SIGCONT)
    deadline = time.monotonic() + 30
    while any(running(entry) for entry in entries) and time.monotonic() < deadline:
        time.sleep(0.1)


def test_a_stranger_named_in_a_copied_folder_survives_a_resume_whose_rank_dies(
        stopped, stranger, tmp_path):
    """The issue's repro: a ``sleep`` whose pid a copied folder's summary names. A resume
    whose rank dies before the ranks record themselves (the launcher then waits for the
    run's ranks and kills those left) ends failed, and the stranger lives: opening the
    folder cleared the earlier attempt's list."""
    folder = copy_naming(stopped, tmp_path / "copy", stranger.pid)
    proc = subprocess.Popen([*BENCH, "run", "--resume", str(folder), "--collective-timeout",
                             "10"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=ENV, start_new_session=True)
    os.kill(ranks_below(fork_server_below(proc.pid), 2)[0], signal.SIGKILL)
    code, err = finish(proc)
    assert code == 1 and "was killed by SIGKILL" in err, err
    assert stranger.poll() is None, "the stranger was killed"
    assert summary(folder)["status"] == "failed"


def test_a_stranger_named_in_a_copied_folder_survives_a_second_signal(
        stopped, stranger, tmp_path):
    """SIGTERM twice to a resume whose ranks are forked but not yet recorded (held stopped,
    so the launcher waits for them): the second signal goes to the run's own ranks only,
    never to the pid the copied folder named."""
    folder = copy_naming(stopped, tmp_path / "copy", stranger.pid)
    proc = subprocess.Popen([*BENCH, "run", "--resume", str(folder)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV, start_new_session=True)
    ranks = ranks_below(fork_server_below(proc.pid), 2)
    deadline = time.monotonic() + 60
    while not all(map(connected, ranks)):  # started: joining the group, not yet recorded
        assert time.monotonic() < deadline, "the ranks never connected"
        time.sleep(0.05)
    try:
        for rank in ranks:
            os.kill(rank, signal.SIGSTOP)
        assert not {entry[1] for entry in summary(folder)["processes"]} & set(ranks)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert proc.poll() is None  # waiting for its stopped ranks: the second signal counts
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
    finally:
        for rank in ranks:
            try:
                os.kill(rank, signal.SIGCONT)
            except ProcessLookupError:
                pass
    code, err = finish(proc)
    assert code == 1, err
    assert stranger.poll() is None, "the stranger was signalled"


def test_only_a_process_with_its_recorded_identity_is_signalled(stranger, tmp_path):
    """A second signal and the launcher's kill of ranks left go to a recorded process only
    while it has the recorded host and start time; its true identity is signalled."""
    from suite.launchers.local import LauncherSignals, wait_for_ranks
    from suite.processes import identity

    here, started = socket.gethostname(), start_time(stranger.pid)
    folder = RunFolder(tmp_path)
    folder.write_summary({"processes": [[here, stranger.pid, started + 1],
                                        [here, stranger.pid],
                                        ["elsewhere", stranger.pid, started]]})
    signals = LauncherSignals(folder, RuntimeError)
    signals.received.append(signal.SIGTERM)
    signals.handle(signal.SIGTERM, None)  # a second signal
    wait_for_ranks(folder, 0.3)
    time.sleep(0.2)
    assert stranger.poll() is None
    folder.write_summary({"processes": [identity(stranger.pid)]})
    wait_for_ranks(folder, 0.3)
    assert stranger.wait(timeout=10) == -signal.SIGKILL


def test_a_resume_is_refused_while_a_rank_of_the_run_lives(tmp_path):
    """SIGSTOP of a rank, SIGKILL of `bench`: `bench run --resume` (and `bench recover`) is
    refused in one line naming the run's live pids, though the launcher's owner file is
    stale; nothing was written, and nothing of the run is left at the end."""
    proc = start(tmp_path, "held", *TOPK, "--checkpoint-every", "1", "--iterations", "400")
    folder = tmp_path / "held"
    wait_until(folder, 3, proc)
    ranks = summary(folder)["processes"]
    try:
        os.kill(ranks[1][1], signal.SIGSTOP)
        proc.kill()
        proc.wait(timeout=30)  # its ranks hold its pipes open: read once they are gone
        refused = bench("run", "--resume", folder)
        for line in (one_line_error(refused), one_line(bench_here("recover", folder))):
            assert "still running (pids" in line and str(ranks[1][1]) in line, line
        assert refused.returncode == 2
        assert summary(folder)["status"] == "running"
    finally:
        end_processes(ranks)
        proc.communicate(timeout=30)
    assert not [entry for entry in ranks if running(entry)]


def test_a_summary_damaged_elsewhere_still_names_its_live_processes(tmp_path):
    """A summary whose metric is damaged (not a valid record) but whose processes are
    readable: the live process it names still stops a second writer, its rank processes are
    still found to signal, and opening an attempt sets the damaged summary aside, keeping the
    attempts' history."""
    from suite.errors import BenchError
    from suite.launchers.local import rank_processes
    from suite.processes import identity
    from suite.results import schema
    from suite.results.lock import refuse_live

    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        folder = RunFolder(tmp_path / "run").create()
        damaged = {schema.STATUS: "running", schema.FINAL_ACCURACY: "not a number",
                   schema.PROCESSES: [identity(sleeper.pid)], schema.ATTEMPTS: ["0a1b2c3d"]}
        (folder.path / "summary.json").write_text(json.dumps(damaged))
        with pytest.raises(BenchError, match=f"still running \\(pids {sleeper.pid} "):
            refuse_live(folder.path)
        assert rank_processes(folder) == [identity(sleeper.pid)]
    finally:
        sleeper.kill()
        sleeper.wait()
    token = folder.open_attempt({schema.STATUS: "running"}, keep=True)
    assert (folder.path / "summary.json.damaged").is_file()
    assert folder.summary()[schema.ATTEMPTS] == ["0a1b2c3d", token]
