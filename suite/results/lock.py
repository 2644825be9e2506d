"""One owner per run folder: the process that runs (or resumes) a run holds ``owner.json`` in
its folder from before its ranks start until it has said how the run ended.

The file is made with ``O_CREAT | O_EXCL``, so of two ``bench run`` of one run id, or a
``--resume`` of a run that is still going, exactly one gets it; the other is refused in one
line naming the owner (host, pid, since when, the command). An owner that is gone leaves a
stale file, which the next start takes over, saying so: on the same host the owner is gone
when its pid no longer runs or runs another process (its start time differs); on another host
it is gone when it was this SLURM job's earlier start (a requeue); otherwise it cannot be
checked from here and the refusal says how to take the folder over by hand.

The owner is one process; a run has more. Whoever writes into a run folder (a run, a resume, a
sweep's cell, ``bench recover``, ``bench export``) takes it with ``take``: the lock, then a
refusal while a process the run records (its launcher, its ranks, by identity:
``suite.processes``) still runs here, such as a rank of an earlier attempt that outlived its
launcher, and of a folder holding links. ``check_free`` is the same check taking nothing, for
preflights.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from suite.errors import BenchError, os_reason
from suite.processes import may_still_run, recorded_pid, start_time
from suite.results import schema
from suite.results.folder import RunFolder
from suite.results.records import read_json_file

OWNER = "owner.json"
#: an owner file is a few hundred bytes; a larger one is not ours
OWNER_BYTES = 64 << 10


@dataclass(frozen=True)
class Owner:
    """Who holds a run folder.

    Attributes:
        host: the owner's host name.
        pid: its process id there.
        started: its start time (``suite.processes.start_time``), to tell it from a reused
            pid.
        since: when it took the folder (ISO time).
        job: its SLURM job id (None outside a job).
        command: what it runs, for the refusal's line.
    """

    host: str
    pid: int
    started: int | None
    since: str
    job: str | None
    command: str

    @classmethod
    def me(cls) -> Owner:
        return cls(socket.gethostname(), os.getpid(), start_time(os.getpid()),
                   time.strftime("%Y-%m-%dT%H:%M:%S%z"), os.environ.get("SLURM_JOB_ID"),
                   " ".join(Path(a).name if i == 0 else a for i, a in enumerate(sys.argv))[:200])

    def describe(self) -> str:
        job = f", SLURM job {self.job}" if self.job else ""
        return f"pid {self.pid} on {self.host}{job} since {self.since} ({self.command})"

    def gone(self) -> str | None:
        """Why this owner is known to be gone (None: it may still run)."""
        if self.host == socket.gethostname():
            now = start_time(self.pid)
            if now is None:
                return f"pid {self.pid} on {self.host} is gone"
            if self.started is not None and now != self.started:
                return f"pid {self.pid} on {self.host} is another process now"
            return None
        if self.job and self.job == os.environ.get("SLURM_JOB_ID"):
            return f"it was SLURM job {self.job}'s earlier start (requeued)"
        return None


def read_owner(path: Path) -> Owner | None:
    """The owner a file names; None where it is damaged (a crash while writing it)."""
    try:
        data = read_json_file(path, what="owner file", limit=OWNER_BYTES)
        return Owner(**{k: data[k] for k in Owner.__dataclass_fields__})
    except (OSError, ValueError, KeyError, TypeError):
        return None


def acquire(folder: Path, *, say=None, force: bool = False, full_disk_ok: bool = False) -> Owner:
    """Take ``folder`` for this process (it is made if missing); ``say`` gets the line about a
    stale owner taken over; ``force``: an owner on another host, which cannot be checked from
    here, is taken over too (the user says it is gone); ``full_disk_ok``: on a disk too full
    for the owner file the folder is used without it (``bench recover``, made for full disks,
    once no live owner holds it).

    Raises:
        BenchError: another process holds it.
    """
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BenchError(f"run folder {folder} could not be made ({os_reason(exc)}); nothing "
                         "was changed") from None
    path = folder / OWNER
    me = Owner.me()
    for _ in range(3):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            owner = read_owner(path)
            if owner is not None and (owner.host, owner.pid) == (me.host, me.pid):
                return me  # this process took it already (a launcher's second start)
            why = "its owner file is damaged" if owner is None else owner.gone()
            if why is None and force and owner.host != me.host:
                why = f"--force: {owner.host} cannot be checked from here"
            if why is None:
                hint = ("" if owner.host == me.host else
                        f"; if it is gone, remove {path} to take the folder over")
                raise BenchError(f"run folder {folder} is in use by {owner.describe()}: wait "
                                 f"for it to end or stop it first (SIGTERM){hint}") from None
            try:  # aside, then made anew: of two takers only one renames it
                path.rename(path.with_name(f".{OWNER}.stale-{me.pid}"))
                path.with_name(f".{OWNER}.stale-{me.pid}").unlink()
            except FileNotFoundError:
                pass
            if say is not None:
                say(f"run folder {folder}: took over from a stale owner ({why})")
            continue
        except OSError as exc:  # a read-only folder
            raise BenchError(f"run folder {folder} cannot be written: {OWNER} could not be "
                             f"made ({os_reason(exc)}); nothing was changed") from None
        write_owner(fd, path, me, full_disk_ok=full_disk_ok)
        return me
    raise BenchError(f"run folder {folder}: could not take it over (another start raced for it)")


def write_owner(fd: int, path: Path, me: Owner, *, full_disk_ok: bool = False) -> None:
    """``me`` into the owner file just made (``fd``); on a full disk the file goes again, so
    no empty owner is left to be taken for a damaged one.

    Raises:
        BenchError: it could not be written (on a full disk, only without ``full_disk_ok``).
    """
    try:
        with os.fdopen(fd, "w") as out:
            out.write(json.dumps(asdict(me)) + "\n")
    except OSError as exc:
        path.unlink(missing_ok=True)
        if full_disk_ok and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return
        raise BenchError(f"run folder {path.parent}: could not write {OWNER} "
                         f"({os_reason(exc)}); nothing was changed") from None


def check_free(folder: Path, *, other_hosts_ok: bool = True) -> None:
    """One line if another live process holds ``folder``, a process its run records still
    runs (``refuse_live``) or it holds a link (a preflight: takes nothing)."""
    path = Path(folder) / OWNER
    owner = read_owner(path) if path.exists() else None
    if owner is not None and owner.gone() is None and owner.pid != os.getpid():
        raise BenchError(f"run folder {folder} is in use by {owner.describe()}: wait for it "
                         "to end or stop it first (SIGTERM)")
    refuse_live(folder, other_hosts_ok=other_hosts_ok)
    RunFolder(folder).refuse_links()


def take(folder: Path, *, say=None, other_hosts_ok: bool = True, force: bool = False,
         full_disk_ok: bool = False) -> Owner:
    """Take ``folder`` for writing into it: its lock (``acquire``), then the checks of
    ``check_free``; given up again where refused.

    Args:
        folder: the run folder (made if missing).
        say: gets the line about a stale owner taken over.
        other_hosts_ok: processes on hosts that cannot be checked from here do not hold the
            folder (a requeued job's; ``bench recover`` asks for ``--force`` instead).
        force: the user says the run's processes are gone: an owner on another host is taken
            over and the run's processes are not checked.
        full_disk_ok: a disk too full for the owner file does not stop it (``acquire``).

    Raises:
        BenchError: another process holds it, one of its run's processes still runs, or it
            holds a link.
    """
    owner = acquire(folder, say=say, force=force, full_disk_ok=full_disk_ok)
    try:
        if not force:
            refuse_live(folder, other_hosts_ok=other_hosts_ok)
        RunFolder(folder).refuse_links()
    except BaseException:
        release(folder)
        raise
    return owner


def live_processes(summary: dict) -> tuple[list[int], list[str]]:
    """(pids of the run's processes that may still run on this host, other hosts whose
    processes cannot be checked from here): its launcher and its ranks as the summary
    records them, by identity (``suite.processes.may_still_run``)."""
    here = socket.gethostname()
    launcher = summary.get(schema.LAUNCHER)
    entries = []
    if isinstance(launcher, dict):
        started = launcher.get(schema.LAUNCHER_STARTED)
        entries.append([launcher.get(schema.LAUNCHER_HOST), launcher.get(schema.LAUNCHER_PID),
                        *([started] if started is not None else [])])
    processes = summary.get(schema.PROCESSES)
    entries += processes if isinstance(processes, list) else []
    alive, elsewhere = set(), set()
    for entry in entries:
        recorded = recorded_pid(entry)
        if recorded is None:
            continue
        if recorded[0] != here:
            elsewhere.add(recorded[0])
        elif may_still_run(entry):
            alive.add(recorded[1])
    return sorted(alive), sorted(elsewhere)


def refuse_live(folder: Path, *, other_hosts_ok: bool = True) -> None:
    """Refuse a folder whose run's processes may still be writing it: alive here, or on
    other hosts that cannot be checked from here (unless ``other_hosts_ok``).

    Raises:
        BenchError: naming the live pids, or the hosts that cannot be checked.
    """
    alive, elsewhere = live_processes(RunFolder(folder).liveness())
    if alive:
        raise BenchError(
            f"{folder} is still running (pids {', '.join(map(str, alive[:8]))} of its run); "
            "stop them first (SIGTERM lets a run stop cleanly)")
    if elsewhere and not other_hosts_ok:
        raise BenchError(
            f"{folder} has processes on {', '.join(elsewhere[:8])}, which cannot be checked "
            "from here; --force once they are gone")


def release(folder: Path) -> None:
    """Give ``folder`` up, if this process holds it."""
    path = Path(folder) / OWNER
    owner = read_owner(path)
    if owner is not None and (owner.host, owner.pid) == (socket.gethostname(), os.getpid()):
        try:
            path.unlink()
        except FileNotFoundError:
            pass
