"""What a method is, seen from the runner, and what it is given."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from suite.comm import Communicator
from suite.config import RunConfig
from suite.errors import BenchError
from suite.recorder import Recorder
from suite.topology import Topology
from workloads.base import Recipe, Workload
from workloads.sharding import ShardedLoader


@dataclass
class RunContext:
    config: RunConfig
    topology: Topology
    comm: Communicator
    recorder: Recorder
    workload: Workload
    recipe: Recipe
    model: nn.Module  # freshly built, identical on every rank (same seed)
    loader: ShardedLoader
    device: torch.device

    def option(self, name: str, default):
        value = self.config.options.get(name)
        return default if value is None else value

    def local_steps_per_round(self) -> int:
        """Local SGD steps H of one round (PruneX, local SGD), the same for every method that
        has rounds so their iterations line up: ``--local-steps``, else ``--local-epochs``
        worth of steps, else one local epoch capped at 32 steps (the paper's 5 local epochs
        of a 64-GPU CIFAR-10 shard are ~30 steps)."""
        steps, epochs = self.option("local_steps", None), self.option("local_epochs", None)
        if steps is not None:
            h = int(steps)
        elif epochs is not None:
            h = round(float(epochs) * self.loader.steps_per_epoch)
        else:
            h = min(self.loader.steps_per_epoch, DEFAULT_MAX_LOCAL_STEPS)
        if h < 1:
            raise BenchError(f"--local-steps/--local-epochs give {h} local steps; need at least 1")
        return h


DEFAULT_MAX_LOCAL_STEPS = 32


class Method(Protocol):
    #: local mini-batch steps one iteration consumes (DDP: 1; PruneX: H per round)
    steps_per_iteration: int

    def step(self, iteration: int) -> dict:
        """Run one iteration; return at least {"loss": float, "samples": int}."""

    def eval_model(self) -> nn.Module:
        """The model to evaluate (PruneX: the global consensus z).

        Collective: every rank calls it at the same point (it may synchronize BN statistics).
        """

    def state_dict(self) -> dict:
        """Full method state, for checkpointing."""

    def artifacts(self) -> dict[str, object]:
        """Extra files for the run folder (file name -> object saved with torch.save)."""


def average_buffers_for_eval(model: nn.Module) -> nn.Module:
    """Average float buffers (BN running statistics) over the world before evaluating.

    Gradient-averaging methods keep identical parameters but rank-local BN statistics
    (DDP with ``broadcast_buffers=False``); evaluation needs one model. This is evaluation
    bookkeeping, issued outside any iteration, so it is not counted as method traffic.
    """
    import torch.distributed as dist

    world = dist.get_world_size()
    for buffer in model.buffers():
        if buffer.is_floating_point():
            dist.all_reduce(buffer)
            buffer.div_(world)
    return model
