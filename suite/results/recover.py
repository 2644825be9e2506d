"""``bench recover RUN_DIR``: finalize a run folder whose processes were killed too hard to
say anything (SIGKILL of the launcher, a node lost, the OOM killer).

Its ranks streamed their rows into ``parts/``; recovering merges them into the tables and marks
the run failed, so reports and comparisons count it as the failure it was. A folder whose
processes still live is refused: they are still writing it.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from suite.errors import BenchError
from suite.processes import python_alive
from suite.results import schema
from suite.results.folder import RunFolder
from suite.results.schema import ENDED, ITERATIONS_RECORDED, PROCESSES, STATUS
from suite.results.upgrade import identity_from_manifest

KILLED = "killed: its processes ended without recording why (finalized by bench recover)"


def live_processes(summary: dict) -> tuple[list[int], list[str]]:
    """(pids of the run still alive on this host, other hosts whose processes cannot be
    checked from here)."""
    here = socket.gethostname()
    launcher = summary.get(schema.LAUNCHER) or {}
    pairs = ([(launcher.get(schema.LAUNCHER_HOST), launcher.get(schema.LAUNCHER_PID))]
             if launcher else [])
    pairs += [tuple(p) for p in summary.get(PROCESSES) or []]
    alive, elsewhere = [], set()
    for host, pid in pairs:
        if host != here:
            elsewhere.add(str(host))
        elif pid is not None and pid != os.getpid() and python_alive(int(pid)):
            alive.append(int(pid))
    return sorted(set(alive)), sorted(elsewhere)


def recover(run_dir: str | Path, *, force: bool = False) -> tuple[str, list[str]]:
    """Finalize ``run_dir``; returns (what was done, lines about unreadable parts)."""
    folder = RunFolder(run_dir)
    if not folder.path.is_dir():
        raise BenchError(f"{folder.path} is not a run folder")
    try:
        summary = folder.summary() or {}
    except (OSError, ValueError):
        summary = {}
    status = summary.get(STATUS)
    if status in ENDED and not folder.parts.exists():
        return f"{folder.path}: already {status}; nothing to recover", []
    alive, elsewhere = live_processes(summary)
    if alive and not force:
        raise BenchError(
            f"{folder.path} is still running (pids {', '.join(map(str, alive))}); stop it "
            "first (SIGTERM lets it stop cleanly)"
        )
    if elsewhere and not force:
        raise BenchError(
            f"{folder.path} has processes on {', '.join(elsewhere)}, which cannot be checked "
            "from here; --force once they are gone"
        )
    try:
        known = identity_from_manifest(folder.manifest() or {})
    except (OSError, ValueError):
        known = {}
    unreadable = folder.merge_parts()
    if status in ENDED:
        return f"{folder.path}: merged the rows left in parts/ (status stays {status})", unreadable
    folder.mark_failed(KILLED, **known)
    rows = (folder.summary() or {}).get(ITERATIONS_RECORDED, 0)
    return f"{folder.path}: marked failed, {rows} iteration(s) of rows kept", unreadable
