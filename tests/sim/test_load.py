"""The replay's host-timed phases (projection, pack, Top-K's compress, ...) priced alike on a
busy machine: another process that takes the core from the replay adds nothing to a price,
and cannot lift a simulated parallel efficiency above 1 (issue 63: the docs' paper-scale
example priced Top-K at 1.040 while other work used the cores)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from suite.cluster import phases
from suite.data.datasets import dataset_spec
from suite.sim.pricing import SimRecorder
from suite.sim.standins import SimLoader


def test_time_the_replay_is_not_running_is_not_priced():
    """A phase of a few ms of work during which the thread is off the core for 0.3 s (what
    the OS does when another process takes the core; a sleep is the same to the thread) is
    priced for its work alone; on the wall clock it was 0.3 s."""
    loader = SimLoader(dataset_spec("fmnist"), 64, 1, 8, 0)
    recorder = SimRecorder(0, torch.device("cpu"), loader, step_seconds=0.0,
                           backward_fraction=0.5, overlap_efficiency=1.0, host_scale=1.0)
    work = torch.randn(1_000_000)
    recorder.begin_iteration(0)
    with recorder.phase(phases.COMPRESS):
        torch.topk(work.abs(), 10_000)
        time.sleep(0.3)
    priced = recorder.end_iteration()["t_compress"]
    assert 0 < priced < 0.15, priced


#: the child: three ``bench sim`` calls of Top-K in one process pinned to one core, the
#: 8-GPU cell quiet, then with two busy loops pinned to the same core (the replay gets a third
#: of it), then the 16-GPU cell quiet: a load that comes and goes between a sweep's cells
LOADED_SWEEP = r"""
import os, subprocess, sys
from suite.cli import main
out, profile = sys.argv[1:3]
core = {min(os.sched_getaffinity(0))}
os.sched_setaffinity(0, core)
for name, gpus, busy in (("quiet8", 8, 0), ("loaded8", 8, 2), ("quiet16", 16, 0)):
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"],
                              preexec_fn=lambda: os.sched_setaffinity(0, core))
             for _ in range(busy)]
    try:
        main(["sim", "--method", "topk", "--gpus", str(gpus), "--profile", profile,
              "--workload", "resnet18-cifar10", "--dataset", "synthetic", "--batch-size", "8",
              "--iterations", "4", "--replay", "4", "--results-dir", f"{out}/{name}"],
             standalone_mode=False)
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
"""


def sweep_profile(tmp_path: Path) -> str:
    """Host-timed phases priced at about this host's speed (its memory bandwidth is 10-20
    GB/s), compute nearly free, and an inter-node link on which 16 GPUs' all-gather of the
    top 1 % costs about as much more than 8 GPUs' as the host-timed phases cost in all
    (0.36 s; Top-K's compress of ResNet-18 varies by 15 % in CPU time here): no noise of the
    host's prices lifts 16 GPUs above efficiency 1."""
    profile = {
        "name": "loaded",
        "gpus_per_node": 4,
        "links": {"intra": {"alpha_s": 1e-6, "bandwidth_Bps": 1e11},
                  "inter": {"alpha_s": 1e-5, "bandwidth_Bps": 2e7}},
        "memory_bandwidth": {"bandwidth_Bps": 1e10},
        "compute": {"steps": {"resnet18-cifar10@8": {"seconds": 0.001}}},
    }
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile))
    return str(path)


@pytest.mark.integration  # three simulations of ResNet-18, one on a third of a core: 20-80 s
def test_a_busy_core_neither_changes_host_timed_prices_nor_lifts_efficiency(tmp_path):
    """Top-K on ResNet-18 (its compress ~0.2 s of CPU a step here), the 8-GPU cell
    simulated quiet and again while two busy loops share its core: its host-timed phases are
    priced near alike (the best of three iterations: 0.96-1.02 in four sweeps on one machine,
    1.25 on an Intel VM whose two CPUs share a physical core, where the loops slow the
    thread's own CPU seconds; on the wall clock 2.7x apart, and 0.5x where only the host's
    bandwidth was timed on it), and against the quiet 16-GPU cell neither draws an
    efficiency above 1 (issue 63's criterion)."""
    env = {k: v for k, v in os.environ.items() if k != "PRUNEX_HOST_MEMORY_BANDWIDTH"}
    env["PRUNEX_PROGRESS"] = "0"  # each call measures the host's bandwidth, loaded or not
    proc = subprocess.run([sys.executable, "-c", LOADED_SWEEP, str(tmp_path),
                           sweep_profile(tmp_path)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    host = {}
    for name in ("quiet8", "loaded8"):
        (summary,) = (tmp_path / name).rglob("summary.json")
        rows = pd.read_parquet(summary.parent / "iterations.parquet")
        leader = rows[rows["rank"] == 0].iloc[1:]  # the first pays first-call costs
        host[name] = (leader.t_compress + leader.t_decompress).min()  # the best of three
    assert 1 / 1.5 < host["loaded8"] / host["quiet8"] < 1.5, host
    for name in ("quiet8", "loaded8"):
        assert efficiency(tmp_path / name, tmp_path / "quiet16") < 1.0, name


def efficiency(base: Path, scaled: Path) -> float:
    """Parallel efficiency of the run under ``scaled`` over the one under ``base`` (training
    seconds per epoch, as ``bench sim`` checks it)."""
    (small,), (large,) = ([json.loads(p.read_text()) for p in d.rglob("summary.json")]
                          for d in (base, scaled))
    per_epoch = [s["train_seconds"] / s["epochs"] for s in (small, large)]
    return per_epoch[0] / per_epoch[1] / (large["gpus"] / small["gpus"])
