"""Every stall leaves a record, NCCL included.

A rank blocked in a collective whose peer stalled or died cannot say so itself: under NCCL
its main thread waits in a CUDA synchronize until NCCL's own watchdog aborts the process
(SIGABRT), with no error file and unflushed rows lost. So each rank runs a small thread that
knows where the rank is (``Position``: iteration, phase, the last collective issued and
its group) and publishes it once a second to the job's store. Every collective a rank issues
goes through it: the methods' through the Communicator, the runner's own (setup broadcasts,
evaluation counts, BN averages, checkpoints, the final wait for rank 0) through
``watched``. When the rank has waited past ``--collective-timeout`` since it issued a
collective, the thread reads every rank's last position and follows the chain of waits to its
root: the rank that went silent (stopped or dead), or one busy outside any collective. It
hands a line naming that rank first to the rank's ``on_stall`` (which flushes the rows and
writes the ``errors/`` file) and ends the process. The backends' own timeouts are set a margin
later (``backend_timeout``), so this record comes first.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

HOST = socket.gethostname()
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
    #: seconds this wait may last before it is a stall (None: ``--collective-timeout``)
    timeout: float | None = None


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

    def issued(
        self, collective: str, group: str, group_ranks: tuple[int, ...],
        timeout: float | None = None,
    ) -> None:
        self.wait = Wait(collective, group, tuple(group_ranks), time.monotonic(), timeout)

    def waited(self) -> float:
        """Seconds since the collective waited on was issued (0: none)."""
        wait = self.wait
        return time.monotonic() - wait.since if wait else 0.0

    def where(self) -> str:
        return f"iteration {self.iteration}, phase {self.phase}"


#: this rank's position (one per process), updated by the Recorder, the Communicator and the
#: loop's bookkeeping collectives
POSITION = Position()


class StoreTally:
    """The operations this rank sent to the job's store: what the store's host serves per
    rank, which must not grow with the world (a heartbeat a second; a stall's reads of every
    rank happen once, on the way out). The loop files each iteration's share in its row
    (``schema.STORE_OPS``)."""

    def __init__(self):
        self.total = 0
        self._taken = 0

    def add(self, operations: int = 1) -> None:
        self.total += operations

    def take(self) -> int:
        """Operations since the last ``take``."""
        taken, self._taken = self.total - self._taken, self.total
        return taken


STORE_TALLY = StoreTally()


@contextmanager
def watched(
    collective: str, group: str, group_ranks: tuple[int, ...] = (), *,
    phase: str | None = None, timeout: float | None = None,
) -> Iterator[None]:
    """The block issues ``collective`` on ``group`` and waits for its result (a value read
    back, a synchronize, or a blocking call): the watchdog knows it meanwhile. ``group_ranks``
    () means the world; ``timeout`` overrides ``--collective-timeout`` for a wait that
    legitimately takes longer (rank 0 merging every rank's rows)."""
    POSITION.issued(collective, group, group_ranks, timeout)
    yield
    POSITION.at(phase=phase)


def barrier(what: str) -> None:
    """``dist.barrier()`` on the world, known to the watchdog as ``what``."""

    with watched("barrier", f"world ({what})"):
        dist.barrier()


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
        self._store = None  # set once connected; None again when the store's host is lost
        #: set when the connection was tried (``_store`` then says how it went): a slow store
        #: never holds up training, nor the stall checks, which run while it connects
        self._connected = threading.Event()
        self._connecting = threading.Lock()
        self._failed = False  # stop(failed=True) came: the first beat after connecting says so
        self.frozen_here: int | None = None  # the pid of a silent root rank on this host
        self._thread = threading.Thread(target=self._watch, name="prunex-watchdog", daemon=True)

    def start(self) -> Watchdog:
        threading.Thread(target=self._connect, name="prunex-watchdog-connect", daemon=True).start()
        self._thread.start()
        return self

    def stop(self, *, failed: bool = False) -> None:
        """End the heartbeats; ``failed``: with a last one saying this rank ended on an error
        (its peers count it as failed, not silent: it is not the host that was lost). Before
        the store is connected, the connection's first beat says it."""
        self._failed = self._failed or failed
        self._stop.set()
        if failed:
            self._beat(fired=True)

    def _connect(self):
        """The connection to the job's store, made once (by the connecting thread, or by a
        caller that needs it first: that caller waits for it); None where there is none."""
        with self._connecting:
            if not self._connected.is_set():
                self._store = store_client()
                self._connected.set()
                # heard from at once: a rank stopped before its first interval is not "never
                # heard from" but silent since then, with where it was (or failed, if it did)
                self._beat(fired=self._failed)
        return self._store

    def _watch(self) -> None:
        while not self._stop.wait(BEAT_SECONDS):
            self._beat()
            wait = self.position.wait
            limit = self.timeout if wait is None or wait.timeout is None else wait.timeout
            if self.position.waited() > limit and not self._stop.is_set():
                self._fire()
                return

    def _beat(self, fired: bool = False) -> None:
        if self._store is None:
            return
        pos, wait = self.position, self.position.wait
        record = {"iteration": pos.iteration, "phase": pos.phase, "heard": time.time(),
                  "collective": wait and [wait.collective, wait.group],
                  "group_ranks": wait and list(wait.group_ranks), "fired": fired,
                  "host": HOST, "pid": os.getpid()}
        try:
            STORE_TALLY.add()
            self._store.set(KEY.format(rank=self.rank), json.dumps(record))
        except Exception:  # the store's host is gone: the stall check still runs
            self._store = None

    def _fire(self) -> None:
        wait = self.position.wait
        if wait is None:
            return
        members = f" {list(wait.group_ranks)}" if wait.group_ranks else ""
        waited = (
            f"rank {self.rank} waited {time.monotonic() - wait.since:.0f} s (--collective-"
            f"timeout {self.timeout:g}) in {wait.collective} on group {wait.group}{members} at "
            f"{self.position.where()}"
        )
        self._beat(fired=True)  # peers that fire later count this rank as waiting, not silent
        try:
            self.on_stall(self.stall_line(wait, waited))
        finally:
            self.kill_frozen_root()
            os._exit(1)

    def stall_line(self, wait: Wait, waited: str) -> str:
        """The failure line: the root of the chain of waits first (the rank an operator must
        look at), then this rank's own wait and the ranks between."""
        root, path = self.blame(wait)
        if root is None:
            return f"a collective stalled: {waited}; {path}"
        via = f", through rank(s) {', '.join(map(str, path))}" if path else ""
        return f"stalled {root}; {waited}{via}"

    def kill_frozen_root(self) -> None:
        """Kill a root that went silent on this host (stopped, or hung past its own watchdog),
        so it does not outlive the run (torch's agent would wait 30 s on its way out before
        SIGKILL). Only after this rank's report is on disk: the launcher, seeing the root die
        of SIGKILL, ends the run and would otherwise blame the signal, not the stall."""
        if self.frozen_here is not None:
            try:
                os.kill(self.frozen_here, signal.SIGKILL)
            except OSError:
                pass

    def records(self) -> dict[int, dict | None]:
        """Every rank's last heartbeat (None: never heard from), read from the store."""
        found: dict[int, dict | None] = {}
        for peer in range(self.world_size):
            key = KEY.format(rank=peer)
            try:
                STORE_TALLY.add(2)
                found[peer] = json.loads(self._store.get(key)) if self._store.check([key]) else None
            except Exception:
                found[peer] = None
        return found

    def blame(self, wait: Wait) -> tuple[str | None, list[int] | str]:
        """(the root of the chain of waits, the ranks between), from every rank's heartbeat:
        starting at this rank's wait, a peer of the group that was silent longest (stopped or
        dead) is the root; else one elsewhere (another collective or iteration) is followed
        to its own wait, until a silent rank, or one busy outside any collective, is found.
        Without a root: (None, why)."""
        if self._store is None:  # none, lost, or still connecting: nothing to ask
            peers = [r for r in (wait.group_ranks or range(self.world_size)) if r != self.rank]
            return None, f"waiting for one of ranks {peers} (no store to ask which)"
        records, now = self.records(), time.time()
        here = {"collective": [wait.collective, wait.group], "iteration": self.position.iteration,
                "group_ranks": list(wait.group_ranks)}
        current, path, seen = self.rank, [], {self.rank}
        while True:
            peers = [r for r in (here.get("group_ranks") or range(self.world_size))
                     if r != current]
            silent = sorted(
                ((now - records[p]["heard"] if records[p] else math.inf, p) for p in peers
                 if records[p] is None or (now - records[p]["heard"] > STALE_BEATS * BEAT_SECONDS
                                           and not records[p].get("fired"))),
                reverse=True,
            )
            if silent:
                quiet, peer = silent[0]
                record = records[peer]
                if record is not None and record.get("host") == HOST and record.get("pid"):
                    self.frozen_here = int(record["pid"])
                return describe_silent(peer, quiet, record), path
            behind = [p for p in peers if p not in seen and (
                records[p]["collective"] != here["collective"]
                or records[p]["iteration"] != here["iteration"])]
            if not behind:
                return None, f"every peer of the group waits too (ranks {peers})"
            current = behind[0]
            here = records[current]
            if here["collective"] is None:  # not in a collective: busy, or stuck in its own code
                where = f"iteration {here['iteration']}, phase {here['phase']}"
                return f"rank {current} (busy outside any collective at {where})", path
            path.append(current)
            seen.add(current)


    def lost_hosts(self) -> str | None:
        """After a collective failed at once (a peer's connection closed): the other hosts
        whose every rank went silent, as ``lost host pxh2 (ranks 2, 3; last heard at
        iteration 19)``, waiting until a silence that long means lost. None on a one-host run
        (nothing to wait for), when every host still beats, or when the job has no store.
        When the store cannot be reached, its host (MASTER_ADDR, rank 0's) is the one lost."""
        if not os.environ.get("MASTER_ADDR") or not os.environ.get("MASTER_PORT"):
            return None
        if self._connect() is None:
            return f"lost host {os.environ['MASTER_ADDR']} (the job's store)"
        records = self.records()
        hosts = {r["host"] for r in records.values() if r}
        if hosts <= {HOST}:
            return None
        newest = max(r["heard"] for r in records.values() if r and r["host"] != HOST)
        time.sleep(max(0.0, newest + (STALE_BEATS + 1) * BEAT_SECONDS - time.time()))
        try:
            records, now = self.records(), time.time()
        except Exception:
            return f"lost host {os.environ.get('MASTER_ADDR', '?')} (the job's store)"
        by_host: dict[str, list[int]] = {}
        for rank, record in records.items():
            if record:
                by_host.setdefault(record["host"], []).append(rank)
        lost = []
        for host, ranks in by_host.items():
            quiet = [now - records[r]["heard"] > STALE_BEATS * BEAT_SECONDS
                     and not records[r].get("fired") for r in ranks]
            if host != HOST and all(quiet):
                last = max(records[r]["iteration"] or 0 for r in ranks)
                lost.append(f"lost host {host} (ranks {', '.join(map(str, ranks))}; last "
                            f"heard at iteration {last})")
        return "; ".join(lost) or None


def describe_silent(rank: int, quiet: float, record: dict | None) -> str:
    if record is None:
        return f"rank {rank} (never heard from)"
    where = f"iteration {record['iteration']}, phase {record['phase']}"
    return f"rank {rank} (silent for {quiet:.0f} s, last at {where})"


#: how long a rank may take to connect to the job's store: 64 ranks connecting at once to an
#: agent on two busy cores took more than 5 s (the watchdog's old single timeout), which left
#: their heartbeats unpublished and their stalls unexplained (benchmarks/rank_kill.py)
CONNECT_SECONDS = 120.0


def store_client(timeout_seconds: float = 5.0):
    """A connection of the caller's own to the job's store (torchrun's or srun's
    MASTER_ADDR:MASTER_PORT), under this attempt's prefix: connected within
    ``CONNECT_SECONDS`` (a world of ranks connects at once), then each operation within
    ``timeout_seconds`` (the watchdog's are short, so a frozen host cannot hang it). None
    where there is none."""

    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not host or not port:
        return None
    try:
        connect = timedelta(seconds=max(timeout_seconds, CONNECT_SECONDS))
        store = dist.TCPStore(host, int(port), is_master=False, timeout=connect, use_libuv=True)
        store.set_timeout(timedelta(seconds=timeout_seconds))
    except Exception:
        return None
    return dist.PrefixStore(f"watchdog/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}",
                            store)
