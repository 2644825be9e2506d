"""A simulation you can wait for (issue 44): `bench sim` says what it runs within seconds,
estimates its cost here before it starts (and gives a smaller command when that exceeds a few
minutes), shows each cell's replayed iterations and pricing, and says nothing about training
it does not do."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

from suite.config import RunConfig
from suite.run.plan import plan_run
from suite.sim.estimate import PATIENCE_SECONDS, Cell, quicker, smaller_command, time_local_step

BENCH = [sys.executable, "-m", "suite.cli"]


def timed_lines(args: list[str], timeout: float = 300) -> tuple[int, list[tuple[float, str]],
                                                               str]:
    """Run ``bench ARGS``; (exit code, each stderr line with the seconds since the start,
    stdout)."""
    start = time.perf_counter()
    proc = subprocess.Popen([*BENCH, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PRUNEX_PROGRESS": "0"})
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.read()))
    reader.start()
    lines = [(time.perf_counter() - start, line.rstrip("\n")) for line in proc.stderr]
    code = proc.wait(timeout=timeout)
    reader.join()
    return code, lines, "".join(out)


def test_bench_sim_shows_progress_within_seconds_and_its_replay(tmp_path):
    """PruneX on one 2-node step of the paper's 64 GPUs is one round: the masks freeze in
    its last round, which a real run warns about and a simulation must not (it trains and
    evaluates nothing)."""
    code, lines, stdout = timed_lines([
        "sim", "--method", "prunex,ddp", "--gpus", "8,64", "--workload", "cnn-fmnist",
        "--results-dir", str(tmp_path)])
    assert code == 0, lines
    first_at, first = lines[0]
    assert first_at < 10 and first.startswith("bench sim: 4 simulation(s) (prunex, ddp x 8, 64")
    text = "\n".join(line for _, line in lines)
    assert "estimate: " in text and "per stand-in step of cnn-fmnist" in text
    assert "[1/4] prunex 8 GPUs: replayed iteration 1/" in text
    assert "[3/4] ddp 8 GPUs: pricing iterations 11-234 as the last replayed one" in text
    assert "[2/4] prunex 64 GPUs: replayed iteration 1/1" in text
    warnings = [line for line in text.lower().splitlines() if "warning" in line]
    # the one warning: PruneX's default H is a local epoch, shorter on 64 GPUs' shards
    assert warnings == ["warning: prunex's rounds change with the gpu count (h=32 at 8, h=29 "
                        "at 64 local steps: one local epoch, at most 32); for the paper's "
                        "fixed schedule give --local-steps 29"], warnings
    assert "never trained" not in text
    assert len(stdout.strip().splitlines()) == 4  # a line per simulation, as before


def test_a_long_simulation_says_so_with_a_smaller_command():
    cells = [Cell(m, g, 48 // (g // 8), 10, 10 if m == "ddp" else 48)
             for m in ("prunex", "ddp") for g in (8, 16, 32, 64)]
    replay, gpus, seconds = quicker(cells, 10, build_seconds=1.4, step_seconds=0.5,
                                    gpus=[8, 16, 32, 64])
    assert seconds <= PATIENCE_SECONDS and (replay < 10 or gpus != [8, 16, 32, 64])
    argv = ["sim", "--workload", "resnet152-cifar10", "--gpus", "8,16,32,64", "--replay=10"]
    assert smaller_command(argv, replay, gpus) == (
        f"bench sim --workload resnet152-cifar10 --gpus {','.join(map(str, gpus))} "
        f"--replay {replay}")


def test_a_stand_in_step_is_timed_on_one_thread():
    import torch

    before = torch.get_num_threads()
    built, step, parameters = time_local_step(
        plan_run(RunConfig(method="ddp", workload="cnn-fmnist")))
    assert 0 < built < 60 and 0 < step < 10 and 200_000 < parameters < 300_000
    assert torch.get_num_threads() == before  # restored
