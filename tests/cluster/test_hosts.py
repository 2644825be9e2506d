"""The pieces of a multi-host run that run without one (issue 53): srun's tasks per node read
and an uneven step refused, the interface a host's name resolves to, the hosts of each start
kept across a resume, and the lost hosts named from the heartbeats in a real TCPStore."""

from __future__ import annotations

import json
import socket
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from suite.cluster import watchdog
from suite.cluster.topology import lay_out
from suite.cluster.wire import WireCounters, host_interface, interface_address
from suite.errors import BenchError
from suite.launchers.local import check_even_step, slurm_tasks_per_node
from suite.results.folder import RunFolder
from suite.run.setup import hosts_per_attempt


@pytest.mark.parametrize("spec, counts", [("4(x2),3", [4, 4, 3]), ("2", [2]),
                                          ("2(x3)", [2, 2, 2]), ("weird", [])])
def test_srun_tasks_per_node_are_read_from_its_spec(monkeypatch, spec, counts):
    monkeypatch.delenv("SLURM_STEP_TASKS_PER_NODE", raising=False)
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", spec)
    assert slurm_tasks_per_node() == counts


def test_an_uneven_step_is_one_line_and_an_even_one_passes(monkeypatch):
    monkeypatch.setenv("SLURM_STEP_TASKS_PER_NODE", "2,1")
    with pytest.raises(BenchError, match=r"^srun placed 2\+1 tasks on its 2 nodes"):
        check_even_step()
    monkeypatch.setenv("SLURM_STEP_TASKS_PER_NODE", "2(x3)")
    check_even_step()


def test_a_name_on_loopback_has_no_host_interface_and_counters_read_the_namespace():
    assert host_interface("localhost") is None
    assert interface_address("lo") == "127.0.0.1"
    tx, rx, frames = WireCounters("lo").read()
    assert tx >= 0 and rx >= 0 and frames >= 0
    with pytest.raises(FileNotFoundError, match="no interface nope0"):
        WireCounters("nope0").read()


def topology_on(hosts: list[str]):
    return lay_out(0, len(hosts), 2, world_pg=None, new_group=lambda ranks: None,
                   emulated=False, hostnames=hosts)


def test_each_start_adds_its_hosts_and_keeps_the_earlier_ones(tmp_path):
    folder = RunFolder(tmp_path / "run")
    folder.create()
    first = hosts_per_attempt(folder, topology_on(["a", "a", "b", "b"]))
    assert first == [["a", "b"]]
    folder.write_manifest({"hosts_per_attempt": first})
    assert hosts_per_attempt(folder, topology_on(["b", "b", "c", "c"])) == [["a", "b"],
                                                                          ["b", "c"]]


def test_the_hosts_whose_every_rank_went_silent_are_named(monkeypatch):
    """Ranks 2 and 3 on host h2 last beat 10 s ago, rank 4 on h3 failed (its last beat says
    so), this rank's host answers: only h2 is lost."""
    port = 29000 + int(time.time()) % 1000
    master = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=5),
                           use_libuv=True)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    dog = watchdog.Watchdog(0, 5, watchdog.Position(), 30.0, on_stall=lambda line: None)
    now = time.time()
    beats = {0: (watchdog.HOST, now, False), 1: (watchdog.HOST, now, False),
             2: ("h2", now - 10, False), 3: ("h2", now - 11, False), 4: ("h3", now - 10, True)}
    prefix = dist.PrefixStore("watchdog/0", master)
    for rank, (host, heard, fired) in beats.items():
        prefix.set(watchdog.KEY.format(rank=rank), json.dumps(
            {"iteration": 7 + rank, "phase": "x", "heard": heard, "collective": None,
             "group_ranks": None, "fired": fired, "host": host, "pid": 1}))
    started = time.monotonic()
    assert dog.lost_hosts() == "lost host h2 (ranks 2, 3; last heard at iteration 10)"
    assert time.monotonic() - started < watchdog.STALE_BEATS + 2
    assert socket.gethostname() == watchdog.HOST
