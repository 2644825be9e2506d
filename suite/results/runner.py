"""How busy the runner was over a run, for the manifest (``runner_load``): a time measured on
a busy runner says more about the other jobs than about the code, so the gate judges time only
where the runner was quiet (suite.gate.compare).

The load that matters is the one outside the run: a nightly of 4 CPU ranks on 2 cores keeps
the cores busy by itself, and that is the same every night; what differs from one night to the
next is the CPU that other processes and the hypervisor took. It is measured exactly, from
CPU time: /proc/stat's busy time of all cores over the run, less the CPU time of the run's own
processes on this host (/proc/<pid>/stat), plus /proc/stat's steal, each per second of the
run; /proc/loadavg's load averages at both ends are kept beside it for people. Rank 0 samples
at setup and at the end; where /proc is missing (not Linux) nothing is recorded and time is
judged as before.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from suite.results import schema

#: /proc/stat's cpu line: user nice system idle iowait irq softirq steal (guest time is inside
#: user already)
_BUSY_FIELDS = (0, 1, 2, 5, 6)
_STEAL_FIELD = 7


def _ticks() -> int:
    return os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpu_line() -> list[int] | None:
    try:
        first = Path("/proc/stat").read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    return [int(value) for value in first[1:]] if first and first[0] == "cpu" else None


def _process_ticks(pid: int) -> int:
    """utime + stime of ``pid`` (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of proc(5))


def _load_average() -> list[float] | None:
    try:
        return [float(v) for v in Path("/proc/loadavg").read_text().split()[:3]]
    except (OSError, ValueError):
        return None


def own_pids(processes: list | None) -> list[int]:
    """The run's processes on this host, from the summary's ``processes`` ([host, pid] per
    rank) and this process."""
    here = socket.gethostname()
    pids = {os.getpid()}
    for entry in processes or []:
        if entry and entry[0] == here:
            pids.add(int(entry[1]))
    return sorted(pids)


def sample(pids: list[int]) -> dict | None:
    """The counters at one moment (what the manifest keeps until the run ends)."""
    cpu = _cpu_line()
    if cpu is None:
        return None
    return {"time": time.time(), "cpu": cpu, "own": sum(_process_ticks(p) for p in pids),
            "load": _load_average()}


def load_over(start: dict | None, end: dict | None) -> dict | None:
    """``runner_load`` from two samples: the cores, the load averages at both ends, and per
    second of the run the cores taken by other processes, by steal and by the run itself."""
    if not start or not end:
        return None
    span = end["time"] - start["time"]
    if span <= 0:
        return None
    ticks = _ticks()
    delta = [b - a for a, b in zip(start["cpu"], end["cpu"])]
    busy = sum(delta[i] for i in _BUSY_FIELDS if i < len(delta)) / ticks
    steal = (delta[_STEAL_FIELD] if len(delta) > _STEAL_FIELD else 0) / ticks
    own = max(0, end["own"] - start["own"]) / ticks
    others = max(0.0, busy - own) / span
    return {
        schema.CORES: len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        schema.LOAD_AVERAGE_START: start.get("load"),
        schema.LOAD_AVERAGE_END: end.get("load"),
        schema.OTHERS_CORES: round(others, 3),
        schema.STEAL_CORES: round(steal / span, 3),
        schema.OWN_CORES: round(own / span, 3),
        schema.OUTSIDE_LOAD: round(others + steal / span, 3),
        schema.SPAN_SECONDS: round(span, 3),
    }


def busy(load: dict | None, max_share: float) -> str | None:
    """``runner busy (load 1.3 on 2 cores)`` where the load outside the run took more than
    ``max_share`` of the cores (None: quiet, or not recorded)."""
    if not load or load.get(schema.OUTSIDE_LOAD) is None or not load.get(schema.CORES):
        return None
    outside, cores = float(load[schema.OUTSIDE_LOAD]), int(load[schema.CORES])
    if outside <= max_share * cores:
        return None
    return f"runner busy (load {outside:.2g} on {cores} cores)"
