"""A rank's connection to the job's store at scale: connecting may take long (64 ranks
connect at once to one agent), each operation may not (the watchdog must never hang on a
frozen store's host), and the connecting happens off the training thread."""

from __future__ import annotations

import json
import socket
import threading
import time
from datetime import timedelta

import torch.distributed as dist

from suite.cluster import watchdog
from suite.cluster.watchdog import CONNECT_SECONDS, POSITION, Watchdog, store_client


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_connecting_may_take_long_each_operation_may_not(monkeypatch):
    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, use_libuv=True,
                           timeout=timedelta(seconds=30))
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    seen = []
    real = dist.TCPStore

    def recording(*args, **kwargs):  # the real store, its connect timeout noted
        seen.append(kwargs["timeout"])
        return real(*args, **kwargs)

    monkeypatch.setattr(watchdog.dist, "TCPStore", recording)
    client = store_client(5.0)
    assert seen == [timedelta(seconds=CONNECT_SECONDS)]
    assert client.timeout == timedelta(seconds=5)
    client.set("k", "v")
    assert server.get("watchdog/0/k") == b"v"


def test_the_watchdog_connects_on_its_own_thread(monkeypatch):
    """Built on the training thread, it holds no store yet: a slow store never delays the
    rank's start; its thread connects, then beats."""
    calls = []
    monkeypatch.setattr(watchdog, "store_client", lambda *a, **k: calls.append(1))
    dog = Watchdog(0, 1, POSITION, 300.0, on_stall=lambda line: None)
    assert dog._store is None and calls == []
    dog.start()
    dog._thread.join(timeout=0.2)
    dog.stop()
    assert calls == [1]


def slow_store(monkeypatch, store):
    """``store_client`` answers ``store`` once the returned event is set (a store still
    connecting until then)."""
    release = threading.Event()

    def connect(*args, **kwargs):
        release.wait(30)
        return store

    monkeypatch.setattr(watchdog, "store_client", connect)
    return release


def test_a_stall_is_caught_while_the_store_still_connects(monkeypatch):
    """The stall check does not wait for the connection: a rank whose store takes long still
    fires on time, with a line saying there was no store to ask."""
    release = slow_store(monkeypatch, dist.HashStore())
    lines, exits = [], []
    monkeypatch.setattr(watchdog.os, "_exit", exits.append)
    position = watchdog.Position()
    dog = Watchdog(0, 3, position, 1.0, on_stall=lines.append)
    position.issued("all_reduce", "world", ())
    started = time.monotonic()
    dog.start()
    dog._thread.join(timeout=10)
    release.set()
    assert exits == [1] and time.monotonic() - started < 5
    assert "waiting for one of ranks [1, 2] (no store to ask which)" in lines[0], lines


def test_a_rank_that_failed_before_its_store_connected_says_so_once_connected(monkeypatch):
    """stop(failed=True) while connecting: the connection's first heartbeat says the rank
    failed (its peers count it as failed, not as a lost host)."""
    store = dist.HashStore()
    release = slow_store(monkeypatch, store)
    dog = Watchdog(2, 3, watchdog.Position(), 300.0, on_stall=lambda line: None).start()
    dog.stop(failed=True)
    release.set()
    deadline = time.monotonic() + 10
    while not store.check([watchdog.KEY.format(rank=2)]):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert json.loads(store.get(watchdog.KEY.format(rank=2)))["fired"] is True


def test_a_job_without_a_store_names_no_lost_host(monkeypatch):
    """No MASTER_ADDR (a one-process run): nothing is known lost."""
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    assert Watchdog(0, 2, watchdog.Position(), 30.0, lambda line: None).lost_hosts() is None
