"""Per-iteration and per-evaluation records of one rank.

Phases are named by the constants of ``suite.cluster.phases``, shared by every method and
by the reports; a name that is neither built in nor declared fails at its first use. A phase's
time in an iteration is the measure of the union of its spans, each an interval from the
iteration's start mark: on CPU wall clock, on CUDA two CUDA events recorded on the stream the
work runs on (a comm hook's end is recorded in its future's callback, which torch runs on a
stream that waits for the collective), so timing neither synchronizes the device inside an
iteration nor stops at a kernel's launch, and the events are read once, after the one
synchronize at the iteration's end. The union matters where spans overlap: NCCL runs a group's
collectives one after another on one stream, so DDP's bucket k is launched during backward and
its span also holds its wait behind buckets 0..k-1; their sum would grow with the square of
the bucket count while the link is busy for their union. ``t_iteration`` is wall clock on both.
"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager

import torch

from suite.cluster.phases import known_phase
from suite.cluster.watchdog import POSITION
from suite.results import schema


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Mark:
    """A point in time: host wall clock on CPU; on CUDA an event on ``device``'s current
    stream, named by the device: a comm hook's callback runs on the thread that completed
    its future (gloo's worker), whose current device is that thread's, not the rank's (with 4
    ranks on 2 GPUs, rank 1's end would land on GPU 0, where its begin is not); torch makes
    the future's stream current on the rank's device there, so the event waits for the
    collective all the same."""

    __slots__ = ("seconds", "event")

    def __init__(self, device: torch.device):
        if device.type == "cuda":
            self.event = torch.cuda.Event(enable_timing=True)
            self.event.record(torch.cuda.current_stream(device))
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
    """One rank's records (``ctx.recorder``): the current iteration's phase seconds, bytes per
    link and method scalars, and the evaluation and layer rows.

    Examples:
        ```python
        with ctx.recorder.phase(phases.LOCAL_COMPUTE):
            loss = train_one_batch()
        ctx.recorder.set(density=0.5)  # a column of this iteration's row
        ```
    """

    def __init__(self, rank: int, device: torch.device):
        self.rank = rank
        self.device = device
        self.iterations: list[dict] = []
        self.evals: list[dict] = []
        self.layers: list[dict] = []
        self._row: dict | None = None
        self._seconds: dict[str, float] = defaultdict(float)  # priced seconds (the simulator)
        self._spans: list[tuple[str, Mark, Mark]] = []  # read at the iteration's end
        self._origin: Mark | None = None  # the iteration's start, spans are offsets from it
        self._bytes: dict[str, float] = defaultdict(float)
        self._started = 0.0
        self._flushed = dict.fromkeys(schema.TABLES, 0)  # rows already on disk
        self._chunks = 0
        self._last_flush = time.monotonic()

    # -- iteration rows ---------------------------------------------------------------
    def begin_iteration(self, iteration: int) -> None:
        """The previous iteration ended with a synchronize (and the loop's agreement reads a
        value back), so nothing of it is still running on the device."""
        self._row = {schema.ITERATION: iteration, schema.RANK: self.rank}
        POSITION.at(iteration=iteration, phase="iteration start")
        self._seconds.clear()
        self._bytes.clear()
        self._spans.clear()
        self._started = time.perf_counter()
        self._origin = self.mark()

    def end_iteration(self, **values) -> dict:
        """Close the iteration ``begin_iteration`` opened: the device is synchronized once
        (every event and collective of it complete), then its row (wall seconds, each phase's
        seconds, bytes per link, the ``set`` scalars and ``values``) is appended to
        ``iterations``.

        Args:
            **values: further columns of the row (the loop's loss, samples, epoch).

        Returns:
            The row.
        """
        synchronize(self.device)  # the iteration's one synchronize: every event is complete
        POSITION.at()  # and so is every collective it issued
        row = self._row
        assert row is not None, "end_iteration without begin_iteration"
        for phase, seconds in phase_unions(self._origin, self._spans).items():
            self._seconds[phase] += seconds
        self._spans.clear()
        row[schema.T_ITERATION] = self.iteration_seconds()
        for phase, seconds in self._seconds.items():
            row[schema.phase_column(phase)] = seconds
        for link in schema.LINKS:
            row[schema.bytes_column(link)] = self._bytes.get(link, 0.0)
        row.update(values)
        self.iterations.append(row)
        self._row = None
        return row

    def iteration_seconds(self) -> float:
        """Wall clock since ``begin_iteration`` (the simulator prices it instead)."""
        return time.perf_counter() - self._started

    def add_time(self, phase: str, seconds: float) -> None:
        """Seconds that count toward ``phase`` without a span (what the simulator prices)."""
        if self._row is not None:
            self._seconds[known_phase(phase)] += seconds

    def mark(self) -> Mark:
        """Now, on the clock phases are timed with (see the module docstring)."""
        return Mark(self.device)

    def add_span(self, phase: str, begin: Mark, end: Mark) -> None:
        """The interval from ``begin`` to ``end`` belongs to ``phase`` (read at the iteration's
        end; a phase's spans count as their union). Thread-safe: comm hooks' callbacks may run
        on other threads (``list.append`` is atomic)."""
        if self._row is not None:
            self._spans.append((known_phase(phase), begin, end))

    def add_bytes(self, link: str, nbytes: float) -> None:
        """Count ``nbytes`` sent on ``link`` (``intra`` or ``inter``) in this iteration's row,
        as the communicator's ring model attributes them; outside an iteration (evaluation,
        setup) nothing is counted."""
        if self._row is not None:
            self._bytes[link] += nbytes

    def set(self, **values) -> None:
        """Method-specific scalars for the current row (density, mask drift, ...)."""
        if self._row is not None:
            self._row.update(values)

    @contextmanager
    def phase(self, name: str):
        """Time the block under the declared phase ``name`` (a context manager): the
        iteration's row gets its seconds, overlapping spans of one phase counted once, and
        the watchdog names it when a collective inside stalls.

        Args:
            name: a phase declared with ``suite.api.declare_phase`` (or a built-in one).
        """
        POSITION.phase = known_phase(name)  # a collective issued before stays waited on
        begin = self.mark()
        try:
            yield
        finally:
            self.add_span(name, begin, self.mark())

    # -- other tables -----------------------------------------------------------------
    def add_eval(self, **values) -> None:
        """A row of the ``evals`` table (the loop adds one per evaluation, on rank 0)."""
        self.evals.append(dict(values))

    def add_layer_rows(self, rows: list[dict]) -> None:
        """Rows of the ``layers`` table: per-layer values of a method (PruneX: each layer's
        residuals and penalties per round), written with the next flush."""
        self.layers.extend(rows)

    # -- streaming to disk --------------------------------------------------------------
    def flush_due(self, every_seconds: float) -> bool:
        """Whether ``every_seconds`` have passed since rows were last taken for disk
        (``take_unflushed``, or since the recorder was made): the loop streams rows at that
        pace, not every iteration."""
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


def phase_unions(origin: Mark, spans: list[tuple[str, Mark, Mark]]) -> dict[str, float]:
    """Phase -> the measure of the union of its spans, each read as an interval of seconds
    from ``origin`` (on CUDA every event must have completed)."""
    intervals: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for phase, begin, end in spans:
        intervals[phase].append((origin.until(begin), origin.until(end)))
    return {phase: union_seconds(found) for phase, found in intervals.items()}


def union_seconds(intervals: list[tuple[float, float]]) -> float:
    """The total length covered by ``intervals`` (start, end): overlapping and nested ones
    count once, disjoint ones add up."""
    total, reach = 0.0, -float("inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue  # inside what is already counted
        total += end - max(start, reach)
        reach = end
    return total
