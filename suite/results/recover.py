"""``bench recover RUN_DIR``: finalize a run folder whose processes were killed too hard to
say anything (SIGKILL of the launcher, a node lost, the OOM killer).

Its ranks streamed their rows into ``parts/``; recovering merges them into the tables and marks
the run failed, so reports and comparisons count it as the failure it was. A folder whose
processes still live is refused: they are still writing it.
"""

from __future__ import annotations

from pathlib import Path

from suite.errors import BenchError, RunFailed, os_reason
from suite.results.ending import Ending
from suite.results.folder import RunFolder
from suite.results.lock import release, take
from suite.results.schema import ENDED, STATUS
from suite.results.upgrade import identity_from_manifest

KILLED = "killed: its processes ended without recording why (finalized by bench recover)"


def recover(run_dir: str | Path, *, force: bool = False) -> tuple[str, list[str]]:
    """Finalize ``run_dir``; returns (what was done, lines about unreadable parts). The folder
    is taken first (``suite.results.lock.take``): refused while its run's processes may still
    write it (``force``: the user says those on other hosts are gone), or holding links.

    Raises:
        BenchError: the folder is not one, is in use, or ``parts/`` holds rows of another
            attempt or run (nothing changed).
    """
    folder = RunFolder(run_dir)
    if not folder.path.is_dir():
        raise BenchError(f"{folder.path} is not a run folder")
    summary = _read_summary(folder)
    status = summary.get(STATUS)
    if status in ENDED and not folder.parts.exists():
        return f"{folder.path}: already {status}; nothing to recover", []
    take(folder.path, other_hosts_ok=False, force=force, full_disk_ok=True)
    try:
        foreign = folder.foreign_parts(folder.attempts()[-1:])
        if foreign:
            raise BenchError(f"{folder.path}: {folder.describe_foreign(foreign)}: refused, "
                             "nothing changed (move them out of parts/ to recover the rest)")
        known = _known_identity(folder)
        unreadable, unmerged = _merge_parts(folder)
        if status in ENDED:
            if unmerged:
                raise RunFailed(f"{folder.path}: the rows left in parts/ could not be merged "
                                f"({unmerged}); nothing changed (status stays {status})")
            return (f"{folder.path}: merged the rows left in parts/ (status stays {status})",
                    unreadable)
        return _mark_ended(folder, known), unreadable
    finally:
        release(folder.path)


def _read_summary(folder: RunFolder) -> dict:
    """The folder's summary, or ``{}`` where it is missing, unreadable or torn (a hard kill
    can leave it so): recovering is for exactly such folders."""
    try:
        return folder.summary() or {}
    except (OSError, ValueError):
        return {}


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

    Raises:
        BenchError: the rows do not fit one table (another run's rows); nothing changed.
    """
    try:
        unreadable = folder.merge_parts()
    except OSError as exc:
        return [], os_reason(exc)
    except BenchError as exc:  # rows of runs of other shapes: checked before any was written
        raise BenchError(f"{folder.path}: {exc}; nothing changed") from None
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
    ending = Ending.of(reason)
    rows = folder.iterations_recorded()
    try:
        unwritten = folder.record_ending(ending, **known)
    except OSError as exc:
        raise RunFailed(f"{folder.path}: would be marked {ending.status} ({reason}), {rows} "
                        f"iteration(s) of rows on disk; nothing could be written "
                        f"({os_reason(exc)})") from None
    notes = "".join(f"; {line}" for line in unwritten)
    return (f"{folder.path}: marked {ending.status} ({reason}), {rows} iteration(s) of rows "
            f"kept{notes}")
