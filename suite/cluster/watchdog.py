"""Every stall leaves a record, NCCL included.

A rank blocked in a collective whose peer stalled or died cannot say so itself: under NCCL
its main thread waits in a CUDA synchronize until NCCL's own watchdog aborts the process
(SIGABRT), with no error file and unflushed rows lost. So each rank runs a small thread that
knows where the rank is (:class:`Position`: iteration, phase, the last collective issued and
its group) and publishes it once a second to the job's store. When the rank has waited past
``--collective-timeout`` since it issued a collective, the thread reads every rank's last
position, names the ranks it was waiting for (those no longer heard from first, then those
behind), hands that line to the rank's ``on_stall`` (which flushes the rows and writes the
``errors/`` file) and ends the process. The backends' own timeouts are set a margin later
(:func:`backend_timeout`), so this record comes first.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

#: seconds between two heartbeats; a rank not heard from for STALE_BEATS of them is stalled
BEAT_SECONDS = 1.0
STALE_BEATS = 4
KEY = "prunex/position/{rank}"


def backend_timeout(collective_timeout: float) -> timedelta:
    """The gloo/NCCL timeout: ``--collective-timeout`` plus a margin (a quarter, at least
    10 s) in which the watchdog writes its record before the backend aborts."""
    return timedelta(seconds=collective_timeout + max(10.0, collective_timeout / 4))


@dataclass(frozen=True)
class Wait:
    """A collective issued and not yet known complete (one object, so the watchdog thread
    never reads half of an update)."""

    collective: str
    group: str
    group_ranks: tuple[int, ...]
    since: float


@dataclass
class Position:
    """Where the rank is; set by the Recorder, the Communicator and the loop at every phase
    and collective (attribute writes only: the training thread pays nothing measurable).

    A collective counts as waited on from its issue until the rank knows it complete: the
    end-of-iteration synchronize, or a value read back from it. Under NCCL a collective
    returns once queued, so a phase change does not clear it."""

    iteration: int = -1
    phase: str = "setup"
    wait: Wait | None = None

    def at(self, iteration: int | None = None, phase: str | None = None) -> None:
        """Progress the device has completed: nothing is waited on any more."""
        if iteration is not None:
            self.iteration = iteration
        if phase is not None:
            self.phase = phase
        self.wait = None

    def issued(self, collective: str, group: str, group_ranks: tuple[int, ...]) -> None:
        self.wait = Wait(collective, group, tuple(group_ranks), time.monotonic())

    def waited(self) -> float:
        """Seconds since the collective waited on was issued (0: none)."""
        wait = self.wait
        return time.monotonic() - wait.since if wait else 0.0

    def where(self) -> str:
        return f"iteration {self.iteration}, phase {self.phase}"


#: this rank's position (one per process), updated by the Recorder, the Communicator and the
#: loop's bookkeeping collectives
POSITION = Position()


def barrier(what: str) -> None:
    """``dist.barrier()`` on the world, known to the watchdog as ``what``."""
    import torch.distributed as dist

    POSITION.issued("barrier", f"world ({what})", ())
    dist.barrier()
    POSITION.at()


class Watchdog:
    """The rank's watchdog thread (a daemon: it never keeps a finished rank alive)."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        position: Position,
        timeout_seconds: float,
        on_stall: Callable[[str], None],
    ):
        self.rank, self.world_size, self.position = rank, world_size, position
        self.timeout = timeout_seconds
        self.on_stall = on_stall
        self._stop = threading.Event()
        self._store = store_client()
        self._thread = threading.Thread(target=self._watch, name="prunex-watchdog", daemon=True)

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(BEAT_SECONDS):
            self._beat()
            if self.position.waited() > self.timeout and not self._stop.is_set():
                self._fire()
                return

    def _beat(self, fired: bool = False) -> None:
        if self._store is None:
            return
        pos, wait = self.position, self.position.wait
        record = {"iteration": pos.iteration, "phase": pos.phase, "heard": time.time(),
                  "collective": wait and [wait.collective, wait.group], "fired": fired}  # fmt: skip
        try:
            self._store.set(KEY.format(rank=self.rank), json.dumps(record))
        except Exception:  # the store's host is gone: the stall check still runs
            self._store = None

    def _fire(self) -> None:
        wait = self.position.wait
        if wait is None:
            return
        members = f" {list(wait.group_ranks)}" if wait.group_ranks else ""
        line = (
            f"a collective waited {time.monotonic() - wait.since:.0f} s (--collective-timeout "
            f"{self.timeout:g}) on rank {self.rank}: {wait.collective} on group {wait.group}"
            f"{members} at {self.position.where()}; {self.blame(wait)}"
        )
        self._beat(fired=True)  # peers that fire later count this rank as waiting, not silent
        try:
            self.on_stall(line)
        finally:
            os._exit(1)

    def blame(self, wait: Wait) -> str:
        """Which of the group's ranks this one waited for, from their last heartbeats: those
        silent longest (stopped or dead), else those elsewhere (another collective or an
        earlier iteration). Keys never written are skipped without waiting on them."""
        peers = [r for r in (wait.group_ranks or range(self.world_size)) if r != self.rank]
        if self._store is None:
            return f"waiting for one of ranks {peers} (no store to ask which)"
        now, silent, behind = time.time(), [], []
        mine = [wait.collective, wait.group]
        for peer in peers:
            key = KEY.format(rank=peer)
            try:
                record = json.loads(self._store.get(key)) if self._store.check([key]) else None
            except Exception:
                record = None
            if record is None:
                silent.append((math.inf, f"rank {peer} (never heard from)"))
                continue
            quiet = now - record["heard"]
            where = f"iteration {record['iteration']}, phase {record['phase']}"
            if quiet > STALE_BEATS * BEAT_SECONDS and not record.get("fired"):
                silent.append((quiet, f"rank {peer} (silent for {quiet:.0f} s, last at {where})"))
            elif record["collective"] != mine or record["iteration"] != self.position.iteration:
                behind.append(f"rank {peer} (at {where})")
        named = [text for _, text in sorted(silent, reverse=True)] or behind
        if not named:
            return f"every peer of the group waits too (ranks {peers})"
        return "waiting for " + ", ".join(named) + " (stalled)"


def store_client():
    """A connection of this thread's own to the job's store (torchrun's or srun's
    MASTER_ADDR:MASTER_PORT), with a short timeout so a frozen host cannot hang the watchdog;
    None where there is none."""
    import torch.distributed as dist

    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not host or not port:
        return None
    try:
        store = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=5),
                              use_libuv=True)  # fmt: skip
    except Exception:
        return None
    return dist.PrefixStore(f"watchdog/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}",
                            store)  # fmt: skip
