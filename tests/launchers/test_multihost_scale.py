"""The mission's scale on the multi-host SLURM of tools/cluster-up (issue 62): 64 ranks on 8
hosts of 8, one agent per host, every process group of the run formed across the hosts
(2,016 gloo pairs), and nothing left behind. Root only; minutes of both cores, so run on
purpose (``nox -s scale``), not in CI; benchmarks/measured/cluster_wire_64.md keeps what it
measured."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from tests.launchers.test_multihost import host_processes, sh, wait_for_jobs

REPO = Path(__file__).resolve().parents[2]
HOSTS, RANKS = 8, 8
BENCH = [sys.executable, "-m", "suite.cli"]

pytestmark = [
    pytest.mark.scale,
    pytest.mark.skipif(os.geteuid() != 0, reason="tools/cluster-up needs root"),
    pytest.mark.skipif(any(shutil.which(t) is None for t in ("slurmd", "munged", "ip", "nsenter")),
                       reason="needs slurm-wlm, munge, iproute2 and util-linux"),
]


@pytest.fixture(scope="module")
def cluster():
    """Eight hosts of 8 CPUs as SLURM counts them (they share this machine's cores)."""
    sh(REPO / ".ci" / "slurm-down", check=False)
    sh(REPO / "tools" / "cluster-down", check=False)
    up = sh(REPO / "tools" / "cluster-up", HOSTS, "--cpus", RANKS, timeout=180)
    yield up.stdout
    down = sh(REPO / "tools" / "cluster-down", check=False, timeout=120)
    assert down.returncode == 0, down.stderr


def test_64_ranks_on_8_hosts_end_ok_with_a_leader_per_host(cluster, tmp_path):
    started = time.monotonic()
    sh(*BENCH, "run", "--launcher", "slurm", "--method", "ddp", "--gpus", HOSTS * RANKS,
       "--gpus-per-node", RANKS, "--device", "cpu", "--dataset", "synthetic",
       "--synthetic-size", "1024,64", "--batch-size", "8", "--iterations", "3",
       "--eval-every", "100000", "--slurm-cpus-per-task", RANKS, "--results-dir", tmp_path,
       "--run-id", "r64")
    wait_for_jobs(limit=900)
    folder = tmp_path / "r64"
    summary = json.loads((folder / "summary.json").read_text())
    manifest = json.loads((folder / "manifest.json").read_text())
    assert summary["status"] == "ok", summary.get("error")
    topology = manifest["topology"]
    assert topology["hosts"] == [f"pxh{i}" for i in range(1, HOSTS + 1)]
    assert topology["leaders"] == list(range(0, HOSTS * RANKS, RANKS))
    assert topology["world_size"] == 64 and not topology["emulated_nodes"]
    recorded, wire = summary["inter_node_bytes_total"], summary["wire_inter_bytes_total"]
    assert recorded > 0 and 1.0 <= wire / recorded <= 1.06, (wire, recorded)
    for i in range(1, HOSTS + 1):  # every rank, agent and fork server gone from every host
        assert not [p for p in host_processes(f"pxh{i}") if "python" in p], i
    print(f"64 ranks on 8 hosts: {time.monotonic() - started:.0f} s, wire/recorded "
          f"{wire / recorded:.4f}")
