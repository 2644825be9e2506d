"""How ranks come up: the elastic launch config of local ranks, and each rank's device and
process group. Shared by training runs and ``bench calibrate`` so both place ranks alike."""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import tempfile
import time
from datetime import timedelta
from multiprocessing import forkserver, resource_tracker

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

from suite import compat
from suite.cluster.recorder import synchronize
from suite.cluster.watchdog import backend_timeout, watched
from suite.errors import BenchError
from suite.results import schema
from suite.results.machine import backend_for, ranks_per_gpu

#: how long a collective waits for a stalled or dead peer before it fails (``--collective-
#: timeout``); every group the suite creates gets it, not only the default group
_timeout = timedelta(minutes=10)


def collective_timeout() -> timedelta:
    return _timeout


def elastic_launch_config(
    nproc: int,
    run_id: str,
    *,
    log_dir: str,
    max_restarts: int = 0,
    shutdown_seconds: int = 30,
    nodes: int = 1,
    rendezvous: str = "localhost:0",
):
    """torch elastic's config for ``nproc`` ranks on this machine, one of ``nodes`` machines
    meeting by c10d rendezvous at ``rendezvous`` (default: this machine, a free port), ranks
    forked from a fork server (``rank_start_method``, ``preload_rank_modules``). After a
    rank dies the agents restart all ranks up to ``max_restarts`` times; when an agent stops
    its ranks it gives them ``shutdown_seconds`` to finish their iteration, flush and
    checkpoint before SIGKILL. Its logs go to ``log_dir``, which the caller removes."""
    # lazy: ~0.1 s to import; only this path needs it
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs

    start_method = rank_start_method()
    if start_method == "forkserver":
        preload_rank_modules()
    return compat.elastic_launch_config(
        min_nodes=nodes,
        max_nodes=nodes,
        nproc_per_node=nproc,
        run_id=run_id,
        rdzv_backend="c10d",
        rdzv_endpoint=rendezvous,
        max_restarts=max_restarts,
        monitor_interval=0.1,
        start_method=start_method,
        logs_specs=DefaultLogsSpecs(log_dir=log_dir),
        shutdown_timeout=shutdown_seconds,
    )


#: what every rank imports before its first step (torch, torch._dynamo through DDP and
#: Torch-Pruning, timm's models, the results' parquet, the methods' plot looks); ~4 s of CPU
#: per interpreter
RANK_MODULES = ["torch", "torch.distributed", "torch._dynamo", "torch_pruning", "timm",
                "torchvision", "pandas", "pyarrow.parquet", "matplotlib.colors",
                "matplotlib.markers", "suite.cluster.fork_server_exit"]


#: the longest path of a Unix socket (sun_path, less its NUL)
UNIX_SOCKET_PATH_MAX = 107
#: what multiprocessing adds to the temporary folder for the fork server's socket
#: (``/pymp-XXXXXXXX/listener-XXXXXXXX``)
FORK_SERVER_SOCKET_SUFFIX = 33


def rank_start_method() -> str:
    """``forkserver``, or ``spawn`` where the fork server's socket, which multiprocessing
    puts under the temporary folder, would not fit a Unix socket's path (a long TMPDIR,
    as some clusters set per job): spawned ranks start slower but start."""
    fits = len(tempfile.gettempdir()) + FORK_SERVER_SOCKET_SUFFIX <= UNIX_SOCKET_PATH_MAX
    return "forkserver" if fits else "spawn"


def preload_rank_modules() -> None:
    """Ranks start as forks of one server process that imported ``RANK_MODULES`` once (a
    clean interpreter: it never touches CUDA, so CUDA ranks are safe, unlike plain fork),
    instead of each rank importing them in a fresh interpreter (spawn). The server starts at
    the first launch of this process and serves its later launches and restarts; it inherits
    the environment of that moment (``OMP_NUM_THREADS`` is set before it).

    The server is started with SIGINT blocked (CPython's resource tracker starts itself the
    same way): a terminal's Ctrl-C reaches the whole process group, and during its seconds
    of preloading the server would die of it with a traceback (multiprocessing ignores
    SIGINT there only after the preload, which also drops one kept pending). Only this
    thread's mask is inherited, so the launcher keeps its own handler: a Ctrl-C meanwhile
    reaches it (it was ignored here before, and lost: the run went on to its end). The
    ranks unblock SIGINT once their handlers are in place (``detach_from_fork_server``)."""
    multiprocessing.get_context("forkserver").set_forkserver_preload(RANK_MODULES)
    resource_tracker.ensure_running()  # first: it unblocks SIGINT once it has started
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        forkserver.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a Ctrl-C kept pending arrives now


def detach_from_fork_server() -> None:
    """A forked rank gives up the fork server's keep-alive pipe, which multiprocessing hands
    every child so that it could fork through the server too. Held by the ranks, it kept the
    server alive after its launcher was killed, and with it the ranks: their death signal
    (SIGINT, set by torch's start wrapper) is tied to their parent, the server. Without it the
    server ends with its launcher, and the ranks with the server, as spawned ranks end with
    theirs. A no-op in a rank that was not forked by the server."""
    server = forkserver._forkserver
    alive = getattr(server, "_forkserver_alive_fd", None)  # CPython's name since 3.4
    if forkserver.get_inherited_fds() is not None and alive is not None:
        os.close(alive)
        server._forkserver_alive_fd = None
        # the server started with SIGINT blocked and its forks inherit the mask: a rank
        # without a handler of its own ignores it (the launcher stops it), then unblocks
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def pick_device(preference: str) -> torch.device:
    """``auto`` | ``cpu`` | ``cuda``: this rank's device (CUDA: the local rank's GPU)."""
    if preference == "cuda" or (preference == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise BenchError("--device cuda was asked for but no CUDA device is visible")
        local = int(os.environ.get("LOCAL_RANK", "0"))
        return torch.device("cuda", local % torch.cuda.device_count())
    return torch.device("cpu")


#: how many ranks of this host use this rank's GPU (1: its own), decided when the rank joins
_sharing = 1


def gpu_sharing(device: torch.device, backend: str) -> dict | None:
    """For the manifest: how ranks share GPUs, when they do. Shared GPUs and collectives on
    gloo make timings unrepresentative of a real cluster; the record says so."""
    if device.type != "cuda":
        return None
    return {schema.LOCAL_RANKS: int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
            schema.GPUS: torch.cuda.device_count(), schema.RANKS_PER_GPU: _sharing,
            schema.BACKEND: backend, schema.TIMINGS_REPRESENTATIVE: _sharing == 1}


def rank_threads(device: torch.device, cores: int | None = None) -> int:
    """The intra-op threads of a rank on ``device``: ``OMP_NUM_THREADS`` where set; else one
    on CPU ranks (the suite's runs set it per launcher), and on CUDA ranks this machine's
    cores (``cores``: those this process may use) shared by its ``LOCAL_WORLD_SIZE`` ranks:
    left to torch, each of 4 ranks would take every core (4 x 16 threads on 16 cores), and
    their host-side work would contend for them."""
    given = os.environ.get("OMP_NUM_THREADS")
    if given:
        return max(1, int(given))
    if device.type != "cuda":
        return 1
    if cores is None:
        cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                 else os.cpu_count() or 1)
    return max(1, cores // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def join_process_group(
    preference: str, timeout_seconds: float | None = None, *, shared_gpus_ok: bool = True
) -> torch.device:
    """Pick the device, then join the job's default process group on it: NCCL on CUDA,
    gloo on CPU ranks, which get ``OMP_NUM_THREADS`` threads (1 unless set), and on GPUs
    shared round-robin by more ranks than there are GPUs (the local launcher's choice). In a
    cluster job (``shared_gpus_ok`` False) every rank must own its GPU: ranks of one host on
    one device (by UUID, exchanged through the job's store before the process group forms)
    are refused in one line before NCCL would abort on them; how many devices each rank sees
    does not matter (``srun --gpus-per-task=1`` shows each task one). CUDA ranks share the
    cores (``rank_threads``). Collectives of every group, gloo and NCCL alike, time out a
    margin after ``timeout_seconds`` (the rank's watchdog reports the stall first; default
    10 minutes)."""
    global _timeout, _sharing
    if timeout_seconds is not None:
        _timeout = backend_timeout(timeout_seconds)
    device = pick_device(preference)
    store = None
    _sharing = 1
    if device.type == "cuda":
        torch.cuda.set_device(device)
        if shared_gpus_ok:  # the local launcher placed its ranks round-robin
            local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
            _sharing = ranks_per_gpu(local_ranks, torch.cuda.device_count())
        elif "MASTER_ADDR" in os.environ:
            store = job_store()
            uuid = str(torch.cuda.get_device_properties(device).uuid)
            own_device_or_refuse(store, socket.gethostname(), uuid)
    torch.set_num_threads(rank_threads(device))
    backend = backend_for(device, _sharing)
    # Groups torch creates for us without a timeout argument (HierarchicalModelAverager's
    # subgroups) take the module's default, gloo's 30 minutes: make it ours.

    distributed_c10d.default_pg_timeout = _timeout
    if isinstance(distributed_c10d.default_pg_nccl_timeout, timedelta):  # NCCL builds only
        distributed_c10d.default_pg_nccl_timeout = _timeout
    # NCCL: a timed-out or failed collective aborts its communicator and ends the process
    # (torch's documented mode 1), after the watchdog has written the rank's record
    os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1"
    # NCCL with device_id forms the world's communicator now and splits subgroups from it
    bound = {"device_id": device} if backend == "nccl" else {}
    dist.init_process_group(backend, timeout=_timeout, **bound, **group_store(store))
    return device


def job_store():
    """The store the job's ranks meet at (``MASTER_ADDR:MASTER_PORT``): the elastic agent's
    where one hosts it (torchrun, the SLURM launcher's agents), else rank 0's (plain srun),
    as ``init_process_group``'s env:// rendezvous would make it."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    agent_hosts = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True)
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                         is_master=rank == 0 and not agent_hosts, timeout=_timeout)


def own_device_or_refuse(store, host: str, uuid: str, *, rank: int | None = None) -> None:
    """Every rank publishes "host uuid" to ``store`` and reads every other's: a device that
    two ranks of one host use is one line here (NCCL would abort on it with its duplicate-GPU
    error), naming the ranks. A rank that sees one device it owns runs. ``rank`` defaults to
    ``RANK``."""
    rank = int(os.environ["RANK"]) if rank is None else rank
    world = int(os.environ["WORLD_SIZE"])
    devices = exchange_devices(store, rank, world, f"{host} {uuid}")
    twins = ranks_sharing(devices, rank)
    if len(twins) > 1:
        raise BenchError(
            f"ranks {', '.join(map(str, twins))} share GPU {uuid} on {host} (the job binds them "
            "to one device); give each task its own GPU (srun --gpus-per-task=1, or one task "
            "per visible GPU with LOCAL_RANK choosing it)"
        )


def exchange_devices(store, rank: int, world: int, mine: str) -> dict[int, str]:
    """Rank -> "host uuid" of every rank, through ``store`` (under this attempt's prefix)."""
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    devices = dist.PrefixStore(f"prunex-devices-{restart}/", store)
    devices.set(str(rank), mine)
    devices.wait([str(r) for r in range(world)])
    return {r: devices.get(str(r)).decode() for r in range(world)}


def ranks_sharing(devices: dict[int, str], rank: int) -> list[int]:
    """The ranks (``rank`` among them) whose "host uuid" is ``rank``'s."""
    return sorted(r for r, seen in devices.items() if seen == devices[rank])


def connect_groups(groups: list, device: torch.device) -> float:
    """One tiny all-reduce on each of ``groups`` (process groups this rank belongs to, in the
    same order on every rank), so every communicator exists before the first timed
    iteration; returns the seconds it took. Gloo connects at creation, NCCL at first use."""
    started = time.perf_counter()
    probe = torch.zeros(1, device=device)
    with watched("all_reduce", "every group this rank uses (connecting them)"):
        for pg in groups:
            dist.all_reduce(probe, group=pg)
        synchronize(device)
    return time.perf_counter() - started


def group_store(store=None) -> dict:
    """What ``init_process_group`` meets the other ranks through: env:// (``{}``) on a first
    attempt that made no store of its own; ``store`` (``job_store``) when it did. After torch
    elastic restarts the ranks, the rendezvous store still holds the dead attempt's keys
    (gloo's peer addresses among them: the new ranks would dial dead ports), so a restarted
    attempt joins under a prefix of its own."""
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if not restart and store is None:
        return {}
    store = store if store is not None else job_store()
    if restart:
        store = dist.PrefixStore(f"prunex-attempt-{restart}", store)
    return dict(store=store, rank=int(os.environ["RANK"]),  # init_process_group's keywords
                world_size=int(os.environ["WORLD_SIZE"]))
