"""How ranks come up: the elastic launch config of local ranks, and each rank's device and
process group. Shared by training runs and ``bench calibrate`` so both place ranks alike."""

from __future__ import annotations

import os
import socket
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

from suite.cluster.recorder import synchronize
from suite.cluster.watchdog import backend_timeout, watched
from suite.errors import BenchError

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
    spawned. After a rank dies the agents restart all ranks up to ``max_restarts`` times; when
    an agent stops its ranks it gives them ``shutdown_seconds`` to finish their iteration,
    flush and checkpoint before SIGKILL. Its logs go to ``log_dir``, which the caller removes."""
    # lazy: ~0.1 s to import; only this path needs it
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.launcher.api import LaunchConfig

    return LaunchConfig(
        min_nodes=nodes,
        max_nodes=nodes,
        nproc_per_node=nproc,
        run_id=run_id,
        rdzv_backend="c10d",
        rdzv_endpoint=rendezvous,
        max_restarts=max_restarts,
        monitor_interval=0.1,
        start_method="spawn",
        logs_specs=DefaultLogsSpecs(log_dir=log_dir),
        shutdown_timeout=shutdown_seconds,
    )


def pick_device(preference: str) -> torch.device:
    """``auto`` | ``cpu`` | ``cuda``: this rank's device (CUDA: the local rank's GPU)."""
    if preference == "cuda" or (preference == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise BenchError("--device cuda was asked for but no CUDA device is visible")
        local = int(os.environ.get("LOCAL_RANK", "0"))
        return torch.device("cuda", local % torch.cuda.device_count())
    return torch.device("cpu")


def ranks_on_cuda(device: str, gpus: int) -> bool:
    """Whether the local launcher places ``gpus`` ranks asking for ``device`` (auto, cpu,
    cuda) on CUDA devices: ``auto`` does when there is a GPU per rank."""
    if device != "auto":
        return device == "cuda"
    return torch.cuda.device_count() >= gpus


def ranks_per_gpu(local_ranks: int, gpus: int) -> int:
    """How many of a machine's ranks share one GPU when they are placed round-robin (rank
    ``r`` on GPU ``r % gpus``): 1 means every rank has its own."""
    return -(-local_ranks // max(gpus, 1))


def backend_for(device: torch.device, local_ranks: int, gpus: int) -> str:
    """NCCL when every rank has a GPU of its own; gloo on CPU ranks and on shared GPUs (NCCL
    refuses two ranks on one device; gloo moves CUDA tensors through the host)."""
    if device.type == "cuda" and ranks_per_gpu(local_ranks, gpus) == 1:
        return "nccl"
    return "gloo"


def gpu_sharing(device: torch.device, backend: str) -> dict | None:
    """For the manifest: how ranks share GPUs, when they do. Shared GPUs and collectives on
    gloo make timings unrepresentative of a real cluster; the record says so."""
    if device.type != "cuda":
        return None
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    gpus = torch.cuda.device_count()
    shared = ranks_per_gpu(local, gpus) > 1
    return {"local_ranks": local, "gpus": gpus, "ranks_per_gpu": ranks_per_gpu(local, gpus),
            "backend": backend, "timings_representative": not shared}


def join_process_group(
    preference: str, timeout_seconds: float | None = None, *, shared_gpus_ok: bool = True
) -> torch.device:
    """Pick the device, then join the job's default process group on it: NCCL on CUDA,
    gloo on CPU ranks, which get ``OMP_NUM_THREADS`` threads (1 unless set), and on GPUs
    shared round-robin by more ranks than there are GPUs (the local launcher's choice; in a
    cluster job, ``shared_gpus_ok`` False, ranks sharing a GPU are refused in one line before
    NCCL would abort on them). Collectives of every group, gloo and NCCL alike, time out a
    margin after ``timeout_seconds`` (the rank's watchdog reports the stall first; default 10
    minutes)."""
    global _timeout
    if timeout_seconds is not None:
        _timeout = backend_timeout(timeout_seconds)
    device = pick_device(preference)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    gpus = torch.cuda.device_count() if device.type == "cuda" else 0
    if device.type == "cuda" and not shared_gpus_ok:
        refuse_shared_gpus(device, local_ranks, gpus)
    backend = backend_for(device, local_ranks, gpus)
    # Groups torch creates for us without a timeout argument (HierarchicalModelAverager's
    # subgroups) take the module's default, gloo's 30 minutes: make it ours.

    distributed_c10d.default_pg_timeout = _timeout
    if isinstance(distributed_c10d.default_pg_nccl_timeout, timedelta):  # NCCL builds only
        distributed_c10d.default_pg_nccl_timeout = _timeout
    # NCCL: a timed-out or failed collective aborts its communicator and ends the process
    # (torch's documented mode 1), after the watchdog has written the rank's record
    os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1"
    # NCCL with device_id forms the world's communicator now and splits subgroups from it;
    # every path (algorithm, protocol) is connected then too, not at its first message
    bound = {"device_id": device} if backend == "nccl" else {}
    if backend == "nccl":
        os.environ.setdefault("NCCL_RUNTIME_CONNECT", "0")
    dist.init_process_group(backend, timeout=_timeout, **bound, **attempt_store())
    return device


def refuse_shared_gpus(device: torch.device, local_ranks: int, gpus: int) -> None:
    """In a cluster job every rank needs a GPU of its own (NCCL aborts on two ranks of one
    GPU with its duplicate-GPU error): more ranks on this host than visible GPUs, or two
    ranks of this host on one device (by UUID, published to the job's store before the
    process group forms, where a torch elastic agent holds one), is one line here."""
    host = socket.gethostname()
    if local_ranks > gpus:
        raise BenchError(
            f"{local_ranks} ranks run on {host} but it has {gpus} visible GPU(s): ranks would "
            "share a GPU, which NCCL refuses; start one task per GPU (srun --ntasks-per-node, "
            "--gpus-per-node) or use --device cpu"
        )
    others = peer_devices(f"{host} {torch.cuda.get_device_properties(device).uuid}")
    if not others:
        return
    mine = others[int(os.environ["RANK"])]
    twins = sorted(rank for rank, seen in others.items() if seen == mine)
    if len(twins) > 1:
        raise BenchError(
            f"ranks {', '.join(map(str, twins))} share GPU {mine.split()[1]} on {host} (the "
            "job binds them to one device); give each task its own GPU"
        )


def peer_devices(mine: str) -> dict[int, str]:
    """Rank -> "host uuid" of every rank, exchanged through the elastic agent's store
    before the process group forms; {} where the job has no agent store (plain srun)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != str(True):
        return {}
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    store = dist.PrefixStore(
        f"prunex-devices-{restart}/",
        dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                      is_master=False, timeout=_timeout),
    )
    store.set(str(rank), mine)
    keys = [str(r) for r in range(world)]
    store.wait(keys)
    return {r: store.get(str(r)).decode() for r in range(world)}


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


def attempt_store() -> dict:
    """After torch elastic restarts the ranks, the rendezvous store still holds the dead
    attempt's keys (gloo's peer addresses among them: the new ranks would dial dead ports),
    so a restarted attempt joins under a prefix of its own. The first attempt joins as
    usual."""
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if not restart:
        return {}
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    agent_hosts = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True)
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world,
        is_master=rank == 0 and not agent_hosts,
        timeout=_timeout,
    )
    return {"store": dist.PrefixStore(f"prunex-attempt-{restart}", store), "rank": rank,
            "world_size": world}
