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


def run_ranks(fn, world: int, *args) -> list:
    """``fn(rank, *args)`` on ``world`` processes; returns the per-rank results in rank order."""
    with tempfile.TemporaryDirectory() as out_dir:
        mp.spawn(_entry, args=(world, free_port(), fn, args, out_dir), nprocs=world, join=True)
        # what the test's own ranks just wrote into this private folder, objects included
        return [torch.load(Path(out_dir) / f"{r}.pt", weights_only=False) for r in range(world)]
