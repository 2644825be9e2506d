"""One owner per run folder: the process that runs (or resumes) a run holds ``owner.json`` in
its folder from before its ranks start until it has said how the run ended.

The file is made with ``O_CREAT | O_EXCL``, so of two ``bench run`` of one run id, or a
``--resume`` of a run that is still going, exactly one gets it; the other is refused in one
line naming the owner (host, pid, since when, the command). An owner that is gone leaves a
stale file, which the next start takes over, saying so: on the same host the owner is gone
when its pid no longer runs or runs another process (its start time differs); on another host
it is gone when it was this SLURM job's earlier start (a requeue); otherwise it cannot be
checked from here and the refusal says how to take the folder over by hand.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from suite.errors import BenchError
from suite.processes import start_time

OWNER = "owner.json"


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
        data = json.loads(path.read_text())
        return Owner(**{k: data[k] for k in Owner.__dataclass_fields__})
    except (OSError, ValueError, KeyError, TypeError):
        return None


def acquire(folder: Path, *, say=None) -> Owner:
    """Take ``folder`` for this process (it is made if missing); ``say`` gets the line about a
    stale owner taken over.

    Raises:
        BenchError: another process holds it.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
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
        with os.fdopen(fd, "w") as out:
            out.write(json.dumps(asdict(me)) + "\n")
        return me
    raise BenchError(f"run folder {folder}: could not take it over (another start raced for it)")


def check_free(folder: Path) -> None:
    """One line if another live process holds ``folder`` (a preflight: takes nothing)."""
    path = Path(folder) / OWNER
    owner = read_owner(path) if path.exists() else None
    if owner is not None and owner.gone() is None and owner.pid != os.getpid():
        raise BenchError(f"run folder {folder} is in use by {owner.describe()}: wait for it "
                         "to end or stop it first (SIGTERM)")


def release(folder: Path) -> None:
    """Give ``folder`` up, if this process holds it."""
    path = Path(folder) / OWNER
    owner = read_owner(path)
    if owner is not None and (owner.host, owner.pid) == (socket.gethostname(), os.getpid()):
        try:
            path.unlink()
        except FileNotFoundError:
            pass
