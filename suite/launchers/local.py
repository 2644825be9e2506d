"""The ranks of a run on this machine, or as they already are inside a job.

``local`` starts N ranks on this machine through torch's elastic launcher (CUDA devices when
there are at least N, else CPU ranks on gloo with one thread each), forked from a fork
server that imported the ranks' libraries once (``suite.cluster.ranks.rank_start_method``).
``torchrun`` means the ranks already exist (RANK/WORLD_SIZE set by torchrun, or SLURM
variables by srun) and this process is one of them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from suite import startup_signals
from suite.cluster.netemu import (
    check_privileges,
    emulated_cluster,
    parse_rate,
    run_module_in_cluster,
)
from suite.cluster.ranks import elastic_launch_config
from suite.config import RunConfig
from suite.environment import env_int
from suite.errors import BenchError, RunFailed, RunInterrupted, os_reason
from suite.processes import runs_as_recorded, signal_recorded
from suite.results import schema
from suite.results.ending import Ending
from suite.results.folder import RunFolder, atomic_write_bytes, identity_summary
from suite.results.lock import release, take
from suite.results.machine import ranks_on_cuda
from suite.run.entry import rank_main
from suite.run.plan import RunPlan

LOCAL_GPUS_PER_NODE = 4  # the paper's nodes


def in_distributed_job() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def adopt_slurm_environment() -> bool:
    """Map srun's per-task variables onto torch's, so one srun task per GPU just works.
    ``bench run`` in a multi-node allocation but outside srun and torchrun (it would use the
    first node only) is refused in one line."""
    if in_distributed_job():
        return True
    nodes = env_int("SLURM_JOB_NUM_NODES", 1, minimum=1)
    if "SLURM_JOB_ID" in os.environ and "SLURM_STEP_ID" not in os.environ and nodes > 1:
        raise BenchError(
            f"inside a SLURM allocation of {nodes} nodes but not in a job step: run it under "
            "srun (one task per GPU) or torchrun, or submit it with --launcher slurm; "
            "--launcher local uses this node only"
        )
    if "SLURM_PROCID" not in os.environ:
        return False
    if env_int("SLURM_NTASKS", 1, minimum=1) < 2:
        return False
    check_even_step()
    os.environ["RANK"] = os.environ["SLURM_PROCID"]
    os.environ["WORLD_SIZE"] = os.environ["SLURM_NTASKS"]
    os.environ["LOCAL_RANK"] = os.environ.get("SLURM_LOCALID", "0")
    os.environ["LOCAL_WORLD_SIZE"] = str(slurm_tasks_on_this_node())
    if "MASTER_ADDR" not in os.environ:
        raise BenchError(
            "inside a SLURM allocation without MASTER_ADDR; export MASTER_ADDR=<first node> "
            "and MASTER_PORT before srun, or use the script from --launcher slurm"
        )
    os.environ.setdefault("MASTER_PORT", "29500")
    return True


def slurm_tasks_per_node() -> list[int]:
    """srun's tasks on each node of the step, from ``SLURM_STEP_TASKS_PER_NODE`` (else
    ``SLURM_TASKS_PER_NODE``): ``"4(x2),3"`` is 4 on each of the first two nodes, 3 on the
    third; [] when neither says (or in a form not known)."""
    spec = os.environ.get("SLURM_STEP_TASKS_PER_NODE") or os.environ.get("SLURM_TASKS_PER_NODE")
    counts: list[int] = []
    for part in (spec or "").split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if match is None:
            return []
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def slurm_tasks_on_this_node() -> int:
    """srun's tasks on this node: ``SLURM_NTASKS_PER_NODE``, else this node's entry of
    ``slurm_tasks_per_node``, else 1."""
    if os.environ.get("SLURM_NTASKS_PER_NODE"):
        return env_int("SLURM_NTASKS_PER_NODE", 1, minimum=1)
    counts = slurm_tasks_per_node()
    if not counts:
        return 1
    node = env_int("SLURM_NODEID", 0, minimum=0)
    return counts[node] if node < len(counts) else counts[-1]


def check_even_step() -> None:
    """An srun step with unequal tasks per node (``2,1``) is refused before any rank starts:
    a node is a block of equal size, the topology and every hierarchical method need it."""
    counts = slurm_tasks_per_node()
    if len(set(counts)) > 1:
        raise BenchError(
            f"srun placed {'+'.join(map(str, counts))} tasks on its {len(counts)} nodes; every "
            "node needs the same number of ranks (srun --ntasks-per-node=N, or -n a multiple "
            "of -N)")


def default_local_gpus_per_node(gpus: int) -> int:
    """Emulated node size: the paper's 4, or gpus/2 below 8 ranks so there are two nodes."""
    if gpus >= 2 * LOCAL_GPUS_PER_NODE:
        return LOCAL_GPUS_PER_NODE
    return max(1, gpus // 2)


def local_config(config: RunConfig) -> RunConfig:
    """``config`` as the local launcher runs it: emulated nodes of the default size unless
    ``--gpus-per-node`` says otherwise, and the ranks' device (CUDA when there is a GPU per
    rank and ``--device`` allows it; CPU ranks on gloo over emulated links)."""
    if config.device == "cuda" and torch.cuda.device_count() == 0:
        raise BenchError("--device cuda was asked for but no CUDA device is visible")
    if config.network == "emulated":
        device = "cpu"  # gloo over the emulated links
    else:
        device = "cuda" if ranks_on_cuda(config.device, config.gpus) else "cpu"
    return replace(
        config, launcher="local", device=device,
        gpus_per_node=(config.gpus_per_node if config.gpus_per_node is not None
                       else default_local_gpus_per_node(config.gpus)),
    )


def job_config(config: RunConfig) -> RunConfig:
    """``config`` as one rank of an existing torchrun/SLURM job runs it: the job's world
    size (outside a job, for a dry run, ``--gpus``); the node size, where not given,
    discovered by the ranks."""
    gpus = env_int("WORLD_SIZE", 1, minimum=1) if adopt_slurm_environment() else config.gpus
    return replace(config, launcher="torchrun", gpus=gpus)


def open_run_folder(plan: RunPlan) -> RunFolder:
    """The run's folder, taken for this process (``suite.results.lock.take``: a live run of
    the same folder, a rank of an earlier attempt still running, a folder holding links are
    refused in one line), emptied first with --overwrite, opened for a new attempt with the
    run's identity in its summary before any rank starts (a run killed at any point is still
    listed as itself; a resume keeps what the interrupted run said, flipped back to running).

    Raises:
        BenchError: the folder is refused, or cannot be written (a full disk): nothing was
            started and no owner file is left.
    """
    config = plan.config
    folder = RunFolder(Path(config.results_dir) / plan.run_id)
    take(folder.path, say=lambda line: print(f"note: {line}", file=sys.stderr, flush=True))
    try:
        if config.overwrite:
            folder.empty()
        folder.create()
        folder.open_attempt(identity_summary(config), keep=config.resume)
    except OSError as exc:
        release(folder.path)
        raise BenchError(f"run folder {folder.path} could not be written ({os_reason(exc)}); "
                         "nothing was started") from None
    except BaseException:
        release(folder.path)
        raise
    return folder


def launch_local(plan: RunPlan) -> Path:
    """Spawn the plan's ranks here and wait for them; returns the run folder."""
    if plan.config.device != "cuda":
        os.environ["OMP_NUM_THREADS"] = "1"
    return run_agent(plan, shutdown_seconds=shutdown_seconds(plan.config))


def run_agent(
    plan: RunPlan,
    *,
    shutdown_seconds: int,
    nodes: int = 1,
    node: int = 0,
    rendezvous: str = "localhost:0",
    job_id: str | None = None,
) -> Path:
    """This machine's torch elastic agent for its ranks of the run (one of ``nodes``, meeting
    at ``rendezvous``); returns the run folder. Node 0 opens the folder before any rank starts
    and, when the ranks fail or are stopped, marks it with the first reason."""
    config = plan.config
    # lazy: ~0.1 s to import; only this path needs it
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    if node == 0:
        folder = open_run_folder(plan)
        startup_signals.run_started(str(folder.path))
    else:
        folder = RunFolder(Path(config.results_dir) / plan.run_id)
    logs = tempfile.mkdtemp(prefix="prunex-launch-")
    signals = None
    try:  # from here a signal is the run's: its folder records it
        quiet_launcher_logs()
        launch = elastic_launch_config(
            config.gpus // nodes, job_id or config.run_id, log_dir=logs, nodes=nodes,
            rendezvous=rendezvous, max_restarts=config.max_restarts,
            shutdown_seconds=shutdown_seconds,
        )
        # the launcher's own signal handling holds until the folder says how the run ended
        signals = LauncherSignals(folder, SignalException)
        with signals.installed(launch):
            elastic_launch(launch, rank_main)(plan.to_json(), str(folder.path))
    except ChildFailedError as exc:
        if node:
            raise RunFailed(f"node {node}: {dead_rank(exc) or 'a rank failed'}") from None
        # the agent lost sight of its ranks (the fork server they were forked from died):
        # they may still be stopping on their own, checkpointing and flushing rows
        wait_for_ranks(folder, shutdown_seconds + 10)
        fail_run(folder, config, signal_name=None, failure=dead_rank(exc))
    except (SignalException, KeyboardInterrupt) as exc:
        name = (signals.first() if isinstance(exc, SignalException)
                else getattr(exc, "name", "SIGINT"))  # startup_signals.Interrupted: SIGTERM too
        if node:
            raise RunInterrupted(f"node {node}: interrupted by {name}") from None
        fail_run(folder, config, signal_name=name)
    finally:
        shutil.rmtree(logs, ignore_errors=True)
        if node == 0:
            release(folder.path)
    return folder.path


class LauncherSignals:
    """SIGTERM and SIGINT of the launcher while its agent runs. The first stops the run as
    torch elastic's own handler does (``SignalException``: the agent sends the ranks the same
    signal and waits for them to stop, flush and checkpoint). A later one is passed on to the
    ranks, which stop at once but never in the middle of a write (suite.run.stopping), while
    the launcher keeps waiting for them: it never dies of a signal (exit 143) leaving ranks
    behind and the folder saying ``running``; the run ends ``interrupted`` with exit 1."""

    HANDLED = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, folder: RunFolder, exception: type):
        self.folder, self.exception, self.received = folder, exception, []

    #: the signals torch elastic's agent keeps handling itself
    TORCH_HANDLES = "SIGHUP,SIGQUIT"

    def first(self) -> str:
        """The first signal's name (``SIGINT`` for a Ctrl-C; the ranks are sent SIGTERM)."""
        return signal.Signals(self.received[0]).name if self.received else "SIGTERM"

    @contextlib.contextmanager
    def installed(self, launch):
        """Ours for the agent's lifetime: torch elastic installs its handlers for the signals
        named by ``launch.signals_to_handle`` (which it copies into
        TORCHELASTIC_SIGNALS_TO_HANDLE; the variable itself where a release has no field)."""
        if hasattr(launch, "signals_to_handle"):
            launch.signals_to_handle = self.TORCH_HANDLES
        own = os.environ.get("TORCHELASTIC_SIGNALS_TO_HANDLE")
        os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = self.TORCH_HANDLES
        previous = {sig: signal.signal(sig, self.handle) for sig in self.HANDLED}
        try:
            yield self
        finally:  # once stopped by a signal the process is ending: a later one is moot
            for sig, handler in previous.items():
                signal.signal(sig, signal.SIG_IGN if self.received else handler)
            if own is None:
                os.environ.pop("TORCHELASTIC_SIGNALS_TO_HANDLE", None)
            else:
                os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = own

    def handle(self, signum, _frame) -> None:
        self.received.append(signum)
        if len(self.received) == 1:  # the agent passes SIGTERM on to the ranks: a rank still
            # starting ignores SIGINT (the fork server's, suite.cluster.ranks) but not SIGTERM
            name = signal.Signals(signum).name
            raise self.exception(f"Process {os.getpid()} got signal: {name}",
                                 sigval=signal.SIGTERM)
        # the ranks decide how soon they can stop; only this attempt's, by identity
        signal_recorded(rank_processes(self.folder), signum)


def rank_processes(folder: RunFolder) -> list:
    """The run's rank processes as this attempt's rank 0 recorded them (``[host, pid, start
    time]`` each; none until it has: opening the folder cleared an earlier attempt's)."""
    processes = folder.liveness().get(schema.PROCESSES)
    return processes if isinstance(processes, list) else []


def wait_for_ranks(folder: RunFolder, seconds: float) -> None:
    """Wait until the run's rank processes on this host have ended (their own ending
    recorded: rows flushed, a checkpoint, their reason), at most ``seconds``; those still
    running as themselves then are killed, so none outlives its launcher and no other
    process is. Nothing to wait for where the agent ended them itself."""
    ranks = [entry for entry in rank_processes(folder) if runs_as_recorded(entry)]
    deadline = time.monotonic() + seconds
    while any(runs_as_recorded(rank) for rank in ranks) and time.monotonic() < deadline:
        time.sleep(0.2)
    signal_recorded(ranks, signal.SIGKILL)


def shutdown_seconds(config: RunConfig) -> int:
    """How long a stopped run's ranks get to finish their iteration, flush and checkpoint
    before SIGKILL: 30 s, or less when collectives time out sooner (a stalled peer would
    hold the others that long)."""
    return int(max(5, min(30, config.collective_timeout)))


def dead_rank(exc) -> str | None:
    """'rank 3 was killed by SIGKILL' when a rank died of a signal it could not handle (the
    others' errors are then knock-on effects), else None. Of several (NCCL aborts every rank
    of a broken communicator), the first to die."""
    for rank, failure in sorted(exc.failures.items(), key=lambda kv: (kv[1].timestamp, kv[0])):
        if failure.exitcode is not None and failure.exitcode < 0:
            try:
                name = failure.signal_name()
            except ValueError:
                name = f"signal {-failure.exitcode}"
            return f"rank {rank} was killed by {name} (exit code {failure.exitcode})"
    return None


def launch_emulated(plan: RunPlan) -> Path:
    """Spawn the ranks in emulated nodes (network namespaces) whose links are rate-limited;
    the namespaces exist only for the run's duration (see suite.cluster.netemu)."""

    config = plan.config
    rate = parse_rate(config.inter_bw)
    check_privileges()
    folder = open_run_folder(plan)
    nodes = config.gpus // config.gpus_per_node
    code = 0
    received: list[str] = []

    def stop(signum, _frame):  # SIGTERM as Ctrl-C: the agents get it on the way out
        received.append(signal.Signals(signum).name)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:  # the folder is given up once it says how the run ended
        try:
            code = run_emulated(plan, folder, nodes, rate)
        except KeyboardInterrupt:
            fail_run(folder, config, signal_name=(received or ["SIGINT"])[0])
        finally:
            signal.signal(signal.SIGTERM, previous)
        if code:
            fail_run(folder, config, signal_name=None)
    finally:
        release(folder.path)
    return folder.path


def run_emulated(plan: RunPlan, folder: RunFolder, nodes: int, rate) -> int:
    """The ranks in their namespaces until they end; their agents' exit code."""
    config = plan.config
    with emulated_cluster(nodes, rate, config.run_id) as cluster:
        atomic_write_bytes(folder.path / "network.json", json.dumps(cluster.describe()).encode())
        config_file = folder.path / "plan.json"  # what every rank receives
        atomic_write_bytes(config_file, plan.to_json().encode())
        return run_module_in_cluster(
            cluster,
            config.gpus_per_node,
            "suite.run.entry",
            [str(config_file), str(folder.path)],
            folder.path / "launcher",
            shutdown_seconds=shutdown_seconds(config),
        )


def fail_run(
    folder: RunFolder, config: RunConfig, *, signal_name: str | None, failure: str | None = None
) -> None:
    """Mark the run failed or interrupted with the first reason (keeping every flushed row),
    raise ``RunFailed`` / ``RunInterrupted``. Signals to this process wait until
    the folder says so."""
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    unwritten = []
    try:
        ending = launcher_ending(folder, signal_name, failure)
        known = {k: v for k, v in identity_summary(config).items()
                 if k not in (schema.STATUS, schema.ERROR)}
        try:
            unwritten = folder.record_ending(ending, **known)
        except OSError as exc:
            unwritten = [f"nothing could be written ({os_reason(exc)}): free space, then "
                         f"`bench recover {folder.path}`"]
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    error = RunInterrupted if ending.interrupted else RunFailed
    said = f"; {'; '.join(unwritten)}" if unwritten else ""
    raise error(f"run {config.run_id} {'stopped' if ending.interrupted else 'failed'}: "
                f"{ending.reason} (see {folder.path}){said}") from None


def launcher_ending(folder: RunFolder, signal_name: str | None, failure: str | None) -> Ending:
    """How the launcher says a run ended that its ranks did not finish: a rank's own words
    (a BenchError, an interruption) before the launcher's ``failure`` (the rank it saw die)
    before a knock-on ``rank N: ...``; a full disk where no rank could say so; interrupted
    when the launcher got ``signal_name`` or the reason says so."""
    own = folder.first_rank_error()
    reason = own if own and not own.startswith("rank ") else failure or own
    full = disk_full(folder.path)
    if full and (reason is None or "space" not in reason.lower()):
        reason = full  # the ranks could not even write why
    if reason is None:
        reason = (f"interrupted by {signal_name}" if signal_name is not None
                  else "a rank exited abnormally")
    return Ending.of(reason, interrupted=signal_name is not None)


#: free bytes below which a folder's disk counts as full (a flush of rows does not fit)
FULL_DISK_BYTES = 256 * 1024


def disk_full(path: Path) -> str | None:
    """``no space left on device (8 KiB free on /results)`` when ``path``'s file system has
    no room left, else None: a rank that hit ENOSPC may have written nothing, not even why."""
    try:
        free = shutil.disk_usage(path).free
    except OSError:
        return None
    if free >= FULL_DISK_BYTES:
        return None
    return f"no space left on device ({free // 1024} KiB free on the file system of {path})"


def quiet_launcher_logs() -> None:
    """The elastic agent logs every child failure with a traceback; we report it in one line
    (and keep the traceback in the run folder's errors/), so silence its loggers."""
    for name in list(logging.root.manager.loggerDict):
        if name.startswith(("torch.distributed.elastic", "torch.multiprocessing")):
            logging.getLogger(name).setLevel(logging.CRITICAL)


def launch_in_job(plan: RunPlan) -> None:
    """This process is one rank of an existing torchrun/SLURM job (``job_config``)."""
    if not in_distributed_job():
        raise BenchError(
            "--launcher torchrun needs RANK and WORLD_SIZE (run under torchrun or srun); "
            "use --launcher local to spawn ranks here"
        )
    try:
        rank_main(plan.to_json(), None)
    except RunFailed:
        raise
    except BenchError as exc:  # the ranks had started: a failed run, not bad input
        raise RunFailed(str(exc)) from None
