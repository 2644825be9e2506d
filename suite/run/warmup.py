"""The untimed warm-up before iteration 0, so the first timed iteration is a steady one.

A device's first steps pay for what later steps reuse: cuDNN/cuBLAS handles and algorithm
choices, lazily loaded kernels, the caching allocator's growth, oneDNN's primitives on CPU,
and NCCL's connections, which it makes at first use per algorithm and protocol (4-byte probes
connect a communicator but not the paths large messages take). Without a warm-up all of it
lands in iteration 0, and the means and the nightly's time ratios (47 DDP iterations against
12 PruneX rounds) would compare warm-ups.

So before iteration 0 each rank runs, untimed: a forward, backward and SGD step of a copy of
its model on the first batch of its own shard (the model, the loader and every RNG are left as
they were, so results stay bit-identical), and on CUDA, on every process group it uses, the
kinds of collective the methods issue (all-reduce, broadcast, all-gather) at a small and a
model-sized message (NCCL connects the paths those sizes take at their first use, here). The
seconds go to the summary as ``warmup_seconds``; the attempt's first iteration keeps its own
time in the table and as ``first_iteration_seconds``.

What this warm-up does not reach is the method itself: DDP's reducer and comm hook (its
bucket rebuild in its second iteration), PowerSGD's first compressed step. Rather than step
the method on a snapshot it restores (every method would have to restore all of its state
bit for bit, DDP's rebuilt buckets included, and a PruneX round costs H local steps), those
iterations are marked ``one_off`` in the table and the summary's means start where the
one-off costs end (``Method.one_off_iterations``, ``suite.results.summary``).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn

from suite.cluster.recorder import synchronize
from suite.cluster.watchdog import watched
from suite.compat import all_gather_single
from suite.data.sharding import ShardedLoader
from suite.data.workload import Recipe, TensorData

#: the largest message of the collective warm-up (a model-sized one, capped)
MAX_WARMUP_BYTES = 64 * 2**20


def warm_up(
    model: nn.Module,
    train: TensorData,
    loader: ShardedLoader,
    recipe: Recipe,
    groups: dict[str, object],
    device: torch.device,
) -> float:
    """Warm the device and the collectives up (see the module docstring); returns seconds."""
    started = time.perf_counter()
    with preserved_rng(device):
        compute_warm_up(model, first_batch(train, loader, device), recipe)
    if device.type == "cuda":
        model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        collectives_warm_up(groups, device, min(model_bytes, MAX_WARMUP_BYTES))
    synchronize(device)
    return time.perf_counter() - started


@contextmanager
def preserved_rng(device: torch.device) -> Iterator[None]:
    """The global RNG streams (CPU, and the device's on CUDA) as they were, afterwards."""
    cpu = torch.get_rng_state()
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    try:
        yield
    finally:
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state(cuda, device)


def first_batch(
    train: TensorData, loader: ShardedLoader, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """The first batch of this rank's shard, unaugmented, at the model's side; the loader
    does not move."""
    take = loader.shard_indices()[: loader.batch_size]
    return train.for_model(train.images[take].to(device)), train.labels[take].to(device)


def compute_warm_up(
    model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor], recipe: Recipe
) -> None:
    """A forward, backward and SGD step (the recipe's momentum) of a copy of ``model``."""
    copied = copy.deepcopy(model).train()
    optimizer = torch.optim.SGD(copied.parameters(), lr=recipe.lr, momentum=recipe.momentum,
                                weight_decay=recipe.weight_decay)
    images, labels = batch
    loss = nn.functional.cross_entropy(copied(images), labels)
    loss.backward()
    optimizer.step()


def collectives_warm_up(groups: dict[str, object], device: torch.device, size: int) -> None:
    """All-reduce, broadcast and all-gather at 4 bytes and ``size`` bytes on every group this
    rank belongs to (``groups``: name -> process group, in the same order on every rank)."""
    for name, pg in groups.items():
        ranks = dist.get_process_group_ranks(pg)
        n = len(ranks)
        if n < 2:
            continue
        with watched("warm-up collectives", f"{name} (warm-up)", tuple(ranks)):
            for numel in (1, max(1, size // 4)):
                buffer = torch.zeros(numel, device=device)
                dist.all_reduce(buffer, group=pg)
                dist.broadcast(buffer, src=ranks[0], group=pg)
                gathered = torch.empty(n * min(numel, max(1, size // 4 // n)), device=device)
                # the all-gather the methods issue (Communicator), through its compat path
                all_gather_single(gathered, buffer[: gathered.numel() // n], group=pg)
            synchronize(device)
