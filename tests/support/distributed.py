"""Run a function on N real gloo ranks (separate processes) and collect what each returns."""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, world, port, fn, args, out_dir):
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
    )
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        result = fn(rank, *args)
    finally:
        dist.destroy_process_group()
    torch.save(result, Path(out_dir) / f"{rank}.pt")


def start_method() -> str:
    """CPU sessions: ranks forked from a fork server that imported torch and the suite once
    per session, not an interpreter per rank (and, unlike a plain fork, no thread of this
    process can leave a libc lock held in them). GPU sessions: spawned, since CUDA cannot be
    used in a child forked from a process that initialized it."""
    if torch.cuda.is_available():
        return "spawn"
    mp.set_forkserver_preload(["suite.run.entry", "timm", "torchvision", "torch_pruning"])
    return "forkserver"


def run_ranks(fn, world: int, *args) -> list:
    """``fn(rank, *args)`` on ``world`` processes; returns the per-rank results in rank order."""
    with tempfile.TemporaryDirectory() as out_dir:
        mp.start_processes(_entry, args=(world, free_port(), fn, args, out_dir), nprocs=world,
                           join=True, start_method=start_method())
        # what the test's own ranks just wrote into this private folder, objects included
        return [torch.load(Path(out_dir) / f"{r}.pt", weights_only=False) for r in range(world)]


def _each(rank, jobs):
    return {name: fn(rank, *args) for name, (fn, args) in jobs.items()}


def run_each(world: int, jobs: dict) -> dict[str, list]:
    """Several ``name: (fn, args)`` jobs on one set of ``world`` ranks, one after another
    (spawning ranks costs more than most tests' runs); per job, the per-rank results."""
    per_rank = run_ranks(_each, world, jobs)
    return {name: [results[name] for results in per_rank] for name in jobs}
