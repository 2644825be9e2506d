"""One rank's process: join the process group, open the run folder, train, and on any failure
keep what was recorded and say why (``errors/rank*.txt``, the summary).

``python -m suite.run.entry PLAN_JSON_FILE RUN_DIR`` is one rank of a run whose ranks were
started by torchrun agents (the emulated-network launcher runs one agent per namespace);
``rank_main`` is also the target of the local elastic launch. Every rank receives the run's
plan as JSON (``RunPlan.to_json``) and resolves it again, checked against its launcher's.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from pathlib import Path

import torch.distributed as dist

from suite.cluster.ranks import collective_timeout, detach_from_fork_server, join_process_group
from suite.cluster.recorder import Recorder
from suite.cluster.watchdog import POSITION, Watchdog
from suite.errors import BenchError, one_line
from suite.plugins.registry import quiet_plugin_warnings
from suite.results.ending import Ending
from suite.results.folder import RunFolder, identity_summary
from suite.results.lock import release, take
from suite.results.schema import Status
from suite.run.checkpoint import latest_checkpoint
from suite.run.determinism import make_kernels_deterministic
from suite.run.loop import AGREED_STOPS, AgreedInterruption, train
from suite.run.plan import RunPlan
from suite.run.setup import restart_count
from suite.run.stopping import StopRequest


def rank_main(plan_json: str, run_dir: str | None = None) -> None:
    """Entry point of one rank (also used by elastic_launch). ``run_dir`` is None where the
    rank is its own launcher (``--launcher torchrun``): the ranks then agree on rank 0's
    run id."""
    stop = StopRequest().install()  # first: a rank forked by the server ignores SIGINT
    detach_from_fork_server()
    if run_dir is not None:  # its launcher said which plugins it skipped, once
        quiet_plugin_warnings()
    plan, device = join_group(plan_json, run_dir)
    run_rank(plan, device, run_dir, stop)
    dist.destroy_process_group()


def join_group(plan_json: str, run_dir: str | None):
    """Before the group formed: the plan resolved again, the kernels made deterministic
    (before the rank touches CUDA) and the process group joined. A refusal here is this
    rank's own to say (``errors/rank*.txt``): no collective can gather it yet.

    Returns:
        (the plan, the rank's device).
    """
    try:
        plan = RunPlan.from_json(plan_json)
        config = plan.config
        if config.deterministic:
            make_kernels_deterministic()
        device = join_process_group(config.device, config.collective_timeout,
                                    shared_gpus_ok=config.launcher == "local")
    except BenchError as exc:
        if run_dir is not None:
            RunFolder(run_dir).write_rank_error(int(os.environ.get("RANK", "0")), f"{exc}\n")
        raise
    return plan, device


def resolved_folder(plan: RunPlan, run_dir: str | None) -> tuple[RunPlan, RunFolder]:
    """The run's folder: the launcher's, or in a standalone job (no ``run_dir``) rank 0's
    run id, which every rank takes."""
    if run_dir is not None:
        return plan, RunFolder(run_dir)
    ident = [plan.run_id]
    dist.broadcast_object_list(ident, src=0)
    plan = plan.restarted(run_id=ident[0])
    return plan, RunFolder(Path(plan.config.results_dir) / ident[0])


def prepare_folder(plan: RunPlan, folder: RunFolder, rank: int, standalone: bool) -> None:
    """Rank 0 creates the folder (a standalone job's rank 0 takes it and opens the attempt,
    no launcher does) and prepares the attempt; every rank then takes the attempt's token,
    which its rows carry (a rank of an earlier attempt still writing is refused at merge)."""
    config = plan.config
    attempt = [None]
    if rank == 0:
        if standalone:  # no launcher holds the folder for this job's ranks
            take(folder.path, say=lambda line: print(f"note: {line}", file=sys.stderr))
        if standalone and config.overwrite and restart_count() == 0:
            folder.empty()
        folder.create()
        if standalone:
            folder.open_attempt(identity_summary(config),
                                keep=config.resume or restart_count() > 0)
        attempt = folder.attempts()[-1:] or [None]
        prepare_attempt(folder, config.resume)
    dist.broadcast_object_list(attempt, src=0)  # and every rank waits for rank 0
    folder.attempt = attempt[0]


def run_rank(plan: RunPlan, device, run_dir: str | None, stop: StopRequest) -> None:
    """After the group formed: the folder, the recorder and the watchdog, then training; on
    any failure what was recorded is kept and the reason said (``on_failure``)."""
    rank = dist.get_rank()
    standalone = run_dir is None  # no parent launcher to mark the folder on failure
    folder = recorder = watchdog = None
    try:
        plan, folder = resolved_folder(plan, run_dir)
        prepare_folder(plan, folder, rank, standalone)
        recorder = Recorder(rank, device)
        report = stall_reporter(folder, recorder, rank, stop)
        watchdog = Watchdog(rank, dist.get_world_size(), POSITION, plan.config.collective_timeout,
                            on_stall=report).start()
        train(plan, device, folder, recorder, stop)
    except BaseException as exc:
        on_failure(exc, watchdog, folder, recorder, rank, stop, standalone)
        raise  # without destroying the process group: that waits on peers that may be gone
    finally:
        if watchdog is not None:
            watchdog.stop()
        if standalone and rank == 0 and folder is not None:
            release(folder.path)


def on_failure(exc: BaseException, watchdog: Watchdog | None, folder: RunFolder | None,
               recorder: Recorder | None, rank: int, stop: StopRequest,
               standalone: bool) -> None:
    """A failed rank's last words: its watchdog stopped (one writer of its rows and errors
    file), the hosts lost with every rank on them named where the error may be a peer's
    death, the failure recorded, and a moment for a dead peer to be reported first."""
    lost = None
    if watchdog is not None:
        watchdog.stop(failed=True)
        if may_be_knock_on(exc):
            lost = lost_hosts_of(watchdog)
    if folder is not None:
        record_failure(folder, recorder, rank, exc, stop, standalone=standalone, lost=lost)
    if may_be_knock_on(exc):
        let_a_dead_peer_be_reported_first()


#: how long a rank that failed, perhaps because a peer died, waits before it exits
KNOCK_ON_GRACE_SECONDS = 1.0


def may_be_knock_on(exc: BaseException) -> bool:
    """An error that is not ours (a BenchError) nor a stop: typically a collective whose
    peer vanished, i.e. the knock-on effect of another rank's death."""
    return isinstance(exc, Exception) and not isinstance(exc, (BenchError, *AGREED_STOPS))


def lost_hosts_of(watchdog: Watchdog) -> str | None:
    """The hosts lost with every rank on them (``Watchdog.lost_hosts``); never raises."""
    try:
        return watchdog.lost_hosts()
    except BaseException:  # a second signal, or the store in a state of its own: no name
        return None


def let_a_dead_peer_be_reported_first() -> None:
    """The launcher names the first rank it sees fail. A rank killed by a signal is seen
    through the fork server, which reports its exit a moment after the death, while its
    peers' collectives fail at once: without this pause the launcher could name a
    survivor's "connection closed" instead of "rank 1 was killed by SIGKILL"."""
    try:
        time.sleep(KNOCK_ON_GRACE_SECONDS)
    except BaseException:  # a stop signal during the pause: exit now, the reason is kept
        pass


def stall_reporter(folder: RunFolder, recorder: Recorder, rank: int, stop: StopRequest):
    """What the watchdog does before it ends a stalled rank: the rank's rows to disk, its
    errors file (the line, then where the main thread waits), and on rank 0 the run marked
    failed at once (the launcher may take its shutdown timeout to notice)."""

    def report(line: str) -> None:
        main = sys._current_frames().get(threading.main_thread().ident)
        where = "".join(traceback.format_stack(main)) if main is not None else ""
        with stop.held():
            folder.write_rank_error(rank, f"{line}\n\n{where}")
            folder.flush_rows(recorder)
            if rank == 0:
                folder.record_ending(Ending(Status.FAILED, line))

    return report


def prepare_attempt(folder: RunFolder, resume: bool) -> None:
    """Rank 0, before any rank trains: a resumed or restarted run keeps the rows up to its
    latest checkpoint (all of them are written again after it) and files the previous
    attempt's errors under ``attempts/``."""
    if not (resume or restart_count()):
        return
    found = latest_checkpoint(folder.path)
    if resume and found is None and not restart_count():
        raise BenchError(f"--resume {folder.path}: its checkpoint vanished after the preflight "
                         "found it (did another run finish it?); nothing was changed")
    folder.file_errors()
    folder.truncate(found[0] if found else 0)


def record_failure(
    folder, recorder, rank: int, exc: BaseException, stop: StopRequest, *, standalone: bool,
    lost: str | None = None,
) -> None:
    """Keep what this rank recorded and say why it stopped; never raise from here.

    After an agreed stop every rank is healthy, so they wait for each other's last rows and
    a standalone run's rank 0 marks the folder; after any other failure a peer may be gone,
    so nobody waits (the parent launcher, or ``bench recover``, merges what was written).
    A collective timeout is marked at once by rank 0 even under a launcher: the stalled peer
    may take the launcher another 30 s to kill."""
    message = failure_message(exc, rank, stop)
    timed_out = message.startswith("a collective timed out")
    if lost:  # what an operator must look at first: the host, not this rank's closed socket
        message = f"{lost}: {message}"
    try:
        with stop.held():
            folder.write_rank_error(rank, message + "\n\n" + traceback.format_exc())
            if recorder is not None:
                folder.flush_rows(recorder)
        if isinstance(exc, AGREED_STOPS):
            dist.barrier()
        if (standalone or timed_out) and rank == 0:
            stopped = isinstance(exc, (AgreedInterruption, KeyboardInterrupt))
            with stop.held():
                folder.record_ending(
                    Ending(Status.INTERRUPTED if stopped else Status.FAILED, message))
    except Exception:
        pass


def failure_message(exc: BaseException, rank: int, stop: StopRequest) -> str:
    """One line: our own errors as they are; a peer's death or a timeout named as such."""
    if isinstance(exc, BenchError):  # its first line, bounded: it may quote any value
        return one_line((str(exc).splitlines() or [type(exc).__name__])[0])
    if isinstance(exc, KeyboardInterrupt):
        return f"interrupted by {stop.name if stop.requested else 'SIGINT'} (second signal)"
    message = one_line(f"{type(exc).__name__}: {exc}".splitlines()[0])
    if "timed out" in message.lower() or "timing out" in message.lower():  # gloo, NCCL
        seconds = collective_timeout().total_seconds()
        return (
            f"a collective timed out on rank {rank} after {seconds:g} s (--collective-timeout "
            "and its margin):"
            f" a peer stalled or died ({message[:160]})"
        )
    return f"rank {rank}: {message}"


if __name__ == "__main__":
    rank_main(Path(sys.argv[1]).read_text(), sys.argv[2])
