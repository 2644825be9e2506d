"""A signal at any moment from ``bench run``'s start ends it not ok, in one line: during its
imports (exit 130, nothing run), while its ranks start, or while they train (the folder says
``interrupted``); and a finished run ends with one line of what it did."""

from __future__ import annotations

import json
import os
import re
import signal
import time

import pytest

from tests.support.runs import ENV, TINY, bench, only_line, processes_with, start

RUN = ["--method", "ddp", "--workload", "cnn-fmnist", *TINY, "--gpus", "2",
       "--gpus-per-node", "1", "--epochs", "20"]


@pytest.mark.parametrize(("after", "sig"), [(0.3, signal.SIGTERM), (1.0, signal.SIGINT),
                                             (3.0, signal.SIGINT)])
def test_a_signal_from_the_start_on_ends_the_run_not_ok_in_one_line(tmp_path, after, sig):
    marker = f"PRUNEX_TEST_MARK={os.getpid()}-{tmp_path.name}"
    proc = start(tmp_path, "early", *RUN, env={**ENV, "PRUNEX_TEST_MARK": marker.split("=")[1]})
    time.sleep(after)
    os.killpg(proc.pid, sig)  # as a terminal's Ctrl-C: the whole foreground group
    out, err = proc.communicate(timeout=120)
    deadline = time.monotonic() + 10  # the fork server ends with its launcher, ranks with it
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_with(marker) == []  # no rank, agent or fork server left behind
    line = only_line(err)  # no traceback of the imports, the fork server or a starting rank
    name = signal.Signals(sig).name
    summary = tmp_path / "early" / "summary.json"
    if proc.returncode == 130:  # still importing or planning: nothing started
        assert line == f"Error: interrupted by {name} before any rank started: nothing was run"
        assert not summary.exists()
    else:
        assert proc.returncode == 1, (out, err)
        assert f"stopped: interrupted by {name}" in line
        assert json.loads(summary.read_text())["status"] == "interrupted"
    assert "results:" not in out


def test_a_finished_run_ends_with_one_line_of_what_it_did(tmp_path):
    proc = bench("run", *RUN[:-1], "0.1", "--results-dir", tmp_path, env=ENV)
    assert proc.returncode == 0, proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    found = re.fullmatch(r"ok: accuracy ([0-9.]+) %, wall ([0-9.]+) s, training ([0-9.]+) s, "
                         r"inter-node ([0-9.]+) MB; results: (\S+)", last)
    assert found, last
    summary = json.loads((tmp_path / os.path.basename(found[5]) / "summary.json").read_text())
    assert float(found[1]) == pytest.approx(100 * summary["final_accuracy"], abs=0.005)
    assert float(found[3]) == pytest.approx(summary["train_seconds"], abs=0.05)
    assert float(found[4]) == pytest.approx(summary["inter_node_bytes_total"] / 1e6, rel=1e-3)


def test_a_ctrl_c_while_the_fork_server_starts_is_kept_for_the_launcher(monkeypatch):
    """The fork server starts with SIGINT blocked, so that a Ctrl-C cannot kill it while it
    preloads; the launcher used to ignore SIGINT for that, and a Ctrl-C in the window was
    lost: the run went on to its end (this file's first test, now and then, under load).
    Now the launcher gets it, and a rank forked later unblocks it."""
    from multiprocessing import forkserver

    from suite.cluster import ranks

    def a_ctrl_c_meanwhile():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)

    monkeypatch.setattr(forkserver, "ensure_running", a_ctrl_c_meanwhile)
    with pytest.raises(KeyboardInterrupt):
        ranks.preload_rank_modules()
        time.sleep(0.5)  # never reached: raised by the time the mask is restored
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, set())
