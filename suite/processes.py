"""Processes of a run: whether a recorded one is still running (run folders and emulated
namespaces record their owners' pids, so leftovers can be told from live runs), the rank
processes below a launcher, so none outlives it, and this process's torch threads where its
work is many small kernels (``single_threaded``).

A process the suite may signal or wait for is recorded by its identity, ``[host, pid, start
time]`` (``identity``): a pid alone names whatever process the kernel gave that number later,
a stranger's included, so nothing is signalled whose host and kernel start time
(``/proc/PID/stat`` field 22) are not the recorded ones (``runs_as_recorded``).
"""

from __future__ import annotations

import functools
import os
import signal
import socket
from pathlib import Path

import torch


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def python_alive(pid: int) -> bool:
    """Alive and a Python process (a recycled pid of something else does not count)."""
    if not pid_alive(pid):
        return False
    try:
        return b"python" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True


def descendants(pid: int) -> set[tuple[int, int]]:
    """Every living process below ``pid`` (children, theirs, ...) from /proc, as (pid, start
    time) so a pid recycled later is never taken for it. torch elastic starts each rank in a
    session of its own, so a signal to the agent's process group does not reach the ranks;
    this finds them."""
    parents: dict[int, list[tuple[int, int]]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = stat_fields(entry)
        if fields is not None:
            parents.setdefault(int(fields[1]), []).append((int(entry.name), int(fields[19])))
    found, todo = set(), [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child[0])
    return found


def stat_fields(proc: Path) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state, ppid, ...; the
    start time is index 19), or None when the process is gone."""
    try:
        fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields if len(fields) > 19 else None


def start_time(pid: int) -> int | None:
    fields = stat_fields(Path(f"/proc/{pid}"))
    return int(fields[19]) if fields is not None else None


def alive(process: tuple[int, int]) -> bool:
    """The process (pid, start time) still runs (not a later one with its pid)."""
    return start_time(process[0]) == process[1]


def identity(pid: int | None = None) -> list:
    """``[host, pid, start time]`` of ``pid`` (this process by default): what a run folder
    records of a process the suite may later signal or wait for."""
    pid = os.getpid() if pid is None else pid
    return [socket.gethostname(), pid, start_time(pid)]


def recorded_pid(entry) -> tuple[str, int, int | None] | None:
    """(host, pid, start time or None) of a recorded ``[host, pid(, start time)]`` (a folder
    written before start times were recorded has none); None for anything else."""
    if not isinstance(entry, (list, tuple)) or len(entry) not in (2, 3):
        return None
    host, pid, *started = entry
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return None
    started = started[0] if started else None
    if started is not None and (not isinstance(started, int) or isinstance(started, bool)):
        return None
    return str(host), pid, started


def runs_as_recorded(entry) -> bool:
    """The process ``entry`` (``identity``) records runs on this host as itself: its pid is
    alive and started when it was recorded to. An entry without a start time, of another
    host or malformed never matches: nothing may be signalled on its word."""
    recorded = recorded_pid(entry)
    if recorded is None or recorded[0] != socket.gethostname() or recorded[2] is None:
        return False
    return start_time(recorded[1]) == recorded[2]


def may_still_run(entry) -> bool:
    """What a writer must wait for: ``runs_as_recorded``, or for an entry recorded without a
    start time (an older folder), a Python process with its pid on this host (a recycled pid
    of anything else does not count). Never this process itself."""
    recorded = recorded_pid(entry)
    if recorded is None or recorded[0] != socket.gethostname() or recorded[1] == os.getpid():
        return False
    if recorded[2] is None:
        return python_alive(recorded[1])
    return runs_as_recorded(entry)


def signal_recorded(entries, signum: int) -> None:
    """Send ``signum`` to each recorded process still running as itself (``runs_as_recorded``),
    this process aside."""
    for entry in entries:
        if runs_as_recorded(entry) and entry[1] != os.getpid():
            try:
                os.kill(int(entry[1]), signum)
            except (ProcessLookupError, PermissionError):
                pass


def kill_all(processes: set[tuple[int, int]]) -> None:
    """SIGKILL those of ``processes`` (pid, start time) still alive as themselves."""
    for process in processes:
        if not alive(process):
            continue
        try:
            os.kill(process[0], signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def single_threaded(function):
    """Run ``function`` with torch on one thread (the threads as they were afterwards). Work
    of many small kernels (a simulation's replay on stand-in batches, ``bench inspect``'s
    checks on a batch of four images, the input-size search) gains nothing from a second
    thread and loses much when the cores are busy: on this loaded 2-core machine a
    ResNet-152 stand-in step took 30x longer on two threads than on one, a GhostNetV3
    forward at 48 px 18 s instead of 0.18 s (load 8.5). Real CPU ranks run one thread each
    too."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return function(*args, **kwargs)
        finally:
            torch.set_num_threads(threads)

    return wrapper
