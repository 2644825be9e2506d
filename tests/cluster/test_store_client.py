"""A rank's connection to the job's store at scale: connecting may take long (64 ranks
connect at once to one agent), each operation may not (the watchdog must never hang on a
frozen store's host), and the connecting happens off the training thread."""

from __future__ import annotations

import socket
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
