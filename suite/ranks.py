"""How ranks come up: the elastic launch config of local ranks, and each rank's device and
process group. Shared by training runs and ``bench calibrate`` so both place ranks alike."""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

from suite.errors import BenchError

PROCESS_GROUP_TIMEOUT = timedelta(minutes=10)


def local_launch_config(nproc: int, run_id: str):
    """torch elastic's config for ``nproc`` ranks on this machine (c10d rendezvous on a free
    port, no restarts, spawned processes)."""
    from torch.distributed.launcher.api import LaunchConfig

    return LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=run_id,
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
        monitor_interval=0.1,
        start_method="spawn",
    )


def pick_device(preference: str) -> torch.device:
    """``auto`` | ``cpu`` | ``cuda``: this rank's device (CUDA: the local rank's GPU)."""
    if preference == "cuda" or (preference == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise BenchError("--device cuda was asked for but no CUDA device is visible")
        local = int(os.environ.get("LOCAL_RANK", "0"))
        return torch.device("cuda", local % torch.cuda.device_count())
    return torch.device("cpu")


def join_process_group(preference: str) -> torch.device:
    """Pick the device, then join the job's default process group on it: NCCL on CUDA,
    gloo on CPU ranks, which get ``OMP_NUM_THREADS`` threads (1 unless set)."""
    device = pick_device(preference)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, timeout=PROCESS_GROUP_TIMEOUT)
    return device
