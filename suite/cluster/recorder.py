"""Per-iteration and per-evaluation records of one rank.

Phases are named by the constants of :mod:`suite.cluster.phases`, shared by every method and
by the reports. On CPU a phase is seconds of wall clock. On CUDA it is the time between two
CUDA events recorded on the stream the work runs on (a comm hook's end is recorded in its
future's callback, which torch runs on a stream that waits for the collective), so timing
neither synchronizes the device inside an iteration nor stops at a kernel's launch: the events
are read once, after the one synchronize at the iteration's end. ``t_iteration`` is wall clock
on both.
"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager

import torch

from suite.cluster.watchdog import POSITION

LINKS = ("intra", "inter")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Mark:
    """A point in time: host wall clock on CPU, a CUDA event on the current stream on CUDA."""

    __slots__ = ("seconds", "event")

    def __init__(self, device: torch.device):
        if device.type == "cuda":
            self.event = torch.cuda.Event(enable_timing=True)
            self.event.record()
            self.seconds = None
        else:
            self.event = None
            self.seconds = time.perf_counter()

    def until(self, end: Mark) -> float:
        """Seconds from this mark to ``end`` (CUDA: both events must have completed)."""
        if self.event is not None:
            return self.event.elapsed_time(end.event) / 1000.0
        return end.seconds - self.seconds


class Recorder:
    def __init__(self, rank: int, device: torch.device):
        self.rank = rank
        self.device = device
        self.iterations: list[dict] = []
        self.evals: list[dict] = []
        self.layers: list[dict] = []
        self._row: dict | None = None
        self._seconds: dict[str, float] = defaultdict(float)
        self._pending: list[tuple[str, Mark, Mark]] = []  # CUDA spans, read at the iteration's end
        self._bytes: dict[str, float] = defaultdict(float)
        self._started = 0.0
        self._flushed = {"iterations": 0, "evals": 0, "layers": 0}  # rows already on disk
        self._chunks = 0
        self._last_flush = time.monotonic()

    # -- iteration rows ---------------------------------------------------------------
    def begin_iteration(self, iteration: int) -> None:
        """The previous iteration ended with a synchronize (and the loop's agreement reads a
        value back), so nothing of it is still running on the device."""
        self._row = {"iteration": iteration, "rank": self.rank}
        POSITION.at(iteration=iteration, phase="iteration start")
        self._seconds.clear()
        self._bytes.clear()
        self._pending.clear()
        self._started = time.perf_counter()

    def end_iteration(self, **values) -> dict:
        synchronize(self.device)  # the iteration's one synchronize: every event is complete
        POSITION.at()  # and so is every collective it issued
        row = self._row
        assert row is not None, "end_iteration without begin_iteration"
        for phase, begin, end in self._pending:
            self._seconds[phase] += begin.until(end)
        self._pending.clear()
        row["t_iteration"] = self.iteration_seconds()
        for phase, seconds in self._seconds.items():
            row[f"t_{phase}"] = seconds
        for link in LINKS:
            row[f"bytes_{link}"] = self._bytes.get(link, 0.0)
        row.update(values)
        self.iterations.append(row)
        self._row = None
        return row

    def iteration_seconds(self) -> float:
        """Wall clock since ``begin_iteration`` (the simulator prices it instead)."""
        return time.perf_counter() - self._started

    def add_time(self, phase: str, seconds: float) -> None:
        if self._row is not None:
            self._seconds[phase] += seconds

    def mark(self) -> Mark:
        """Now, on the clock phases are timed with (see the module docstring)."""
        return Mark(self.device)

    def add_span(self, phase: str, begin: Mark, end: Mark) -> None:
        """The time from ``begin`` to ``end`` counts toward ``phase``; CUDA spans are read at
        the iteration's end. Thread-safe: comm hooks' callbacks may run on other threads."""
        if self._row is None:
            return
        if end.event is not None:
            self._pending.append((phase, begin, end))
        else:
            self.add_time(phase, begin.until(end))

    def add_bytes(self, link: str, nbytes: float) -> None:
        if self._row is not None:
            self._bytes[link] += nbytes

    def set(self, **values) -> None:
        """Method-specific scalars for the current row (density, mask drift, ...)."""
        if self._row is not None:
            self._row.update(values)

    @contextmanager
    def phase(self, name: str):
        POSITION.phase = name  # a collective issued before stays waited on (NCCL: queued)
        begin = self.mark()
        try:
            yield
        finally:
            self.add_span(name, begin, self.mark())

    # -- other tables -----------------------------------------------------------------
    def add_eval(self, **values) -> None:
        self.evals.append(dict(values))

    def add_layer_rows(self, rows: list[dict]) -> None:
        self.layers.extend(rows)

    # -- streaming to disk --------------------------------------------------------------
    def flush_due(self, every_seconds: float) -> bool:
        return time.monotonic() - self._last_flush >= every_seconds

    def take_unflushed(self) -> tuple[int, dict[str, list[dict]]]:
        """(chunk number, table -> rows not yet on disk); the rows count as flushed, so the
        caller must write them (an atomic chunk file each)."""
        chunk = {}
        for table in self._flushed:
            rows = getattr(self, table)
            if len(rows) > self._flushed[table]:
                chunk[table] = rows[self._flushed[table] :]
                self._flushed[table] = len(rows)
        self._chunks += 1
        self._last_flush = time.monotonic()
        return self._chunks - 1, chunk
