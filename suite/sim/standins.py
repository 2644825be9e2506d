"""What the simulator's one process stands in with: a loader with the real shard's steps
per epoch but tiny batches (only the shapes of parameters and gradients matter to the
schedule), the topology rank r would build with every group backed by one process group, and
that one-process group."""

from __future__ import annotations

import torch
import torch.distributed as dist

from suite.cluster.topology import Topology, lay_out
from suite.errors import BenchError

STAND_IN_SIZE = 4  # spatial size of the stand-in images: every model here pools globally
STAND_IN_BATCH = 2  # BatchNorm in training mode needs more than one value per channel


class SimLoader:
    """The real shard's ``steps_per_epoch`` and ``batch_size``; stand-in batches."""

    def __init__(self, spec, train_samples: int, world_size: int, batch_size: int, seed: int):
        shard = train_samples // world_size
        if shard == 0:
            raise BenchError(f"{train_samples} training samples cannot fill {world_size} shards")
        self.batch_size = min(batch_size, shard)
        self.steps_per_epoch = shard // self.batch_size
        self.step = 0
        generator = torch.Generator().manual_seed(seed)
        shape = (STAND_IN_BATCH, spec.in_chans, STAND_IN_SIZE, STAND_IN_SIZE)
        self.images = torch.randn(shape, generator=generator)
        self.labels = torch.randint(spec.num_classes, (STAND_IN_BATCH,), generator=generator)

    def __iter__(self) -> SimLoader:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        self.step += 1
        return self.images, self.labels

    def calibration_batches(self, count: int) -> list[torch.Tensor]:
        return [self.images] * min(count, self.steps_per_epoch)

    def calibration_labels(self, count: int) -> list[torch.Tensor]:
        return [self.labels] * min(count, self.steps_per_epoch)


def sim_topology(world_size: int, gpus_per_node: int, rank: int, pg=None) -> Topology:
    """The topology rank ``rank`` would build, with every group backed by ``pg``."""
    return lay_out(
        rank, world_size, gpus_per_node,
        world_pg=pg, new_group=lambda _ranks: pg, emulated=True,
        hostnames=["simulated"] * world_size,
    )


def ensure_single_process_group() -> None:
    """A one-rank gloo world for torch code under the methods (DDP, comm hooks)."""
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
