"""Per-iteration and per-evaluation records of one rank.

Phases are named by the constants of :mod:`suite.cluster.phases`, shared by every method and
by the reports. Timings are seconds of wall clock; on CUDA the device is synchronized around
each timed block so the number covers the kernels, not just their launch.
"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager

import torch

LINKS = ("intra", "inter")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Recorder:
    def __init__(self, rank: int, device: torch.device):
        self.rank = rank
        self.device = device
        self.iterations: list[dict] = []
        self.evals: list[dict] = []
        self.layers: list[dict] = []
        self._row: dict | None = None
        self._seconds: dict[str, float] = defaultdict(float)
        self._bytes: dict[str, float] = defaultdict(float)
        self._started = 0.0
        self._flushed = {"iterations": 0, "evals": 0, "layers": 0}  # rows already on disk
        self._chunks = 0
        self._last_flush = time.monotonic()

    # -- iteration rows ---------------------------------------------------------------
    def begin_iteration(self, iteration: int) -> None:
        synchronize(self.device)
        self._row = {"iteration": iteration, "rank": self.rank}
        self._seconds.clear()
        self._bytes.clear()
        self._started = time.perf_counter()

    def end_iteration(self, **values) -> dict:
        synchronize(self.device)
        row = self._row
        assert row is not None, "end_iteration without begin_iteration"
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

    def add_bytes(self, link: str, nbytes: float) -> None:
        if self._row is not None:
            self._bytes[link] += nbytes

    def set(self, **values) -> None:
        """Method-specific scalars for the current row (density, mask drift, ...)."""
        if self._row is not None:
            self._row.update(values)

    @contextmanager
    def phase(self, name: str):
        synchronize(self.device)
        start = time.perf_counter()
        try:
            yield
        finally:
            synchronize(self.device)
            self.add_time(name, time.perf_counter() - start)

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
