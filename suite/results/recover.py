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

from suite.errors import BenchError, RunFailed
from suite.processes import python_alive
from suite.results import schema
from suite.results.folder import RunFolder, os_reason
from suite.results.schema import ENDED, PROCESSES, STATUS, Status
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
    summary = _read_summary(folder)
    status = summary.get(STATUS)
    if status in ENDED and not folder.parts.exists():
        return f"{folder.path}: already {status}; nothing to recover", []
    _refuse_live(folder, summary, force=force)
    known = _known_identity(folder)
    unreadable, unmerged = _merge_parts(folder)
    if status in ENDED:
        if unmerged:
            raise RunFailed(f"{folder.path}: the rows left in parts/ could not be merged "
                            f"({unmerged}); nothing changed (status stays {status})")
        return f"{folder.path}: merged the rows left in parts/ (status stays {status})", unreadable
    return _mark_ended(folder, known), unreadable


def _read_summary(folder: RunFolder) -> dict:
    """The folder's summary, or ``{}`` where it is missing, unreadable or torn (a hard kill
    can leave it so): recovering is for exactly such folders."""
    try:
        return folder.summary() or {}
    except (OSError, ValueError):
        return {}


def _refuse_live(folder: RunFolder, summary: dict, *, force: bool) -> None:
    """Refuse a folder whose processes may still be writing it: alive here, or on other
    hosts, which cannot be checked from here (``force`` once the user knows they are gone).

    Raises:
        BenchError: naming the live pids, or the hosts that cannot be checked.
    """
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


def _known_identity(folder: RunFolder) -> dict:
    """What the manifest says of the run's identity, for the summary written on marking it
    ended; ``{}`` where the manifest is missing or unreadable."""
    try:
        return identity_from_manifest(folder.manifest() or {})
    except (OSError, ValueError):
        return {}


def _merge_parts(folder: RunFolder) -> tuple[list[str], str | None]:
    """Merge the rows the ranks left in ``parts/`` into the tables.

    Returns:
        (lines about unreadable parts, why the merge failed or None where it did not).
    """
    try:
        unreadable = folder.merge_parts()
    except OSError as exc:
        return [], os_reason(exc)
    return unreadable, None


def _mark_ended(folder: RunFolder, known: dict) -> str:
    """Mark the folder interrupted or failed, with the ranks' own last words where they wrote
    any (an interruption that checkpointed), else as killed; returns what was done.

    Raises:
        RunFailed: the status could not be written (what it would have been is named).
    """
    # the ranks' own last words where they wrote any (an interruption that checkpointed)
    said = folder.first_rank_error()
    reason = said if said and not said.startswith("rank ") else KILLED + (
        f"; a rank said: {said}" if said else "")
    state = Status.INTERRUPTED if reason.startswith("interrupted") else Status.FAILED
    rows = folder.iterations_recorded()
    try:
        unwritten = folder.mark_failed(reason, status=state, **known)
    except OSError as exc:
        raise RunFailed(f"{folder.path}: would be marked {state} ({reason}), {rows} "
                        f"iteration(s) of rows on disk; nothing could be written "
                        f"({os_reason(exc)})") from None
    notes = "".join(f"; {line}" for line in unwritten)
    return (f"{folder.path}: marked {state} ({reason}), {rows} iteration(s) of rows "
            f"kept{notes}")
