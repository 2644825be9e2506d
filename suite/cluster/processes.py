"""Processes of a run: whether a recorded one is still running (run folders and emulated
namespaces record their owners' pids, so leftovers can be told from live runs), and the rank
processes below a launcher, so none outlives it."""

from __future__ import annotations

import os
import signal
from pathlib import Path


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


def descendants(pid: int) -> set[int]:
    """Every living process below ``pid`` (children, theirs, ...), from /proc. torch elastic
    starts each rank in a session of its own, so a signal to the agent's process group does
    not reach the ranks; this finds them."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def kill_all(pids: set[int]) -> None:
    """SIGKILL those of ``pids`` still alive as Python processes (a pid recycled since it was
    seen is left alone)."""
    for pid in pids:
        if not python_alive(pid):
            continue
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
