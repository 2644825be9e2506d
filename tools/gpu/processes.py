"""Every process a GPU step started, found and stopped: a step's runs start sessions of their
own (a test's ``bench run``, torch elastic's ranks), so neither the step's process group nor
its session holds them, and a parent killed first orphans its children. The caller becomes
their subreaper (Linux's ``PR_SET_CHILD_SUBREAPER``): an orphan of any depth is re-parented
to it instead of to init, so ``descendants`` still finds it, and ``stop_descendants`` kills
and reaps them all, in whatever session or group they are.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
from pathlib import Path

#: prctl's option that keeps orphaned descendants under the caller (linux/prctl.h)
PR_SET_CHILD_SUBREAPER = 36


def adopt_orphans() -> bool:
    """Make this process the subreaper of its descendants; whether the kernel agreed (False
    off Linux: ``descendants`` then finds only those whose parents are alive)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def parents() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state letter) of every process in /proc (zombies are ``Z``)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # ended meanwhile
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses
        state, ppid = stat.rpartition(")")[2].split()[:2]
        found[int(entry.name)] = (int(ppid), state)
    return found


def descendants(root: int | None = None) -> dict[int, str]:
    """pid -> state of every process below ``root`` (default: this one)."""
    root = os.getpid() if root is None else root
    table = parents()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = {}, list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found[pid] = table[pid][1]
        todo += children.get(pid, [])
    return found


def stop_descendants(rounds: int = 50) -> int:
    """SIGKILL every live descendant of this process and reap those that become its own
    zombies, until none is left (a process forking meanwhile is caught by the next round);
    returns how many were killed."""
    killed: set[int] = set()
    for _ in range(rounds):
        live = {pid for pid, state in descendants().items() if state != "Z"}
        reap()
        if not live:
            break
        for pid in live - killed:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        killed |= live
        time.sleep(0.05)
    reap()
    return len(killed)


def reap() -> None:
    """Collect this process's children that have ended (orphans re-parented to it among
    them), so none lingers as a zombie."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def stop_group(pid: int) -> None:
    """SIGKILL the process group ``pid`` leads (a step started with ``start_new_session``)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
