"""What a method is, seen from the runner, and what it is given."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from suite.comm import Communicator
from suite.config import RunConfig
from suite.dependency import example_input
from suite.errors import BenchError
from suite.options import AT_LEAST_1, POSITIVE, option
from suite.recorder import Recorder
from suite.schedule import LRSchedule
from suite.topology import Topology
from workloads.base import DatasetSpec, Recipe, Workload
from workloads.sharding import ShardedLoader

DEFAULT_MAX_LOCAL_STEPS = 32


@dataclass
class RoundSettings:
    """Options of every method that trains in rounds of local steps (PruneX, local SGD), so
    that their rounds, and so their iterations, line up."""

    local_steps: int | None = option(
        None,
        "local SGD steps per round H",
        check=AT_LEAST_1,
        shown_default=f"one local epoch, at most {DEFAULT_MAX_LOCAL_STEPS}",
    )
    local_epochs: float | None = option(
        None, "local epochs per round E, instead of H (paper: 5-10)", check=POSITIVE
    )

    def steps_per_round(self, steps_per_epoch: int) -> int:
        """Local SGD steps H of one round: ``--local-steps``, else ``--local-epochs`` worth
        of steps, else one local epoch capped at 32 steps (the paper's 5 local epochs of a
        64-GPU CIFAR-10 shard are ~30 steps)."""
        if self.local_steps is not None:
            h = self.local_steps
        elif self.local_epochs is not None:
            h = round(self.local_epochs * steps_per_epoch)
        else:
            h = min(steps_per_epoch, DEFAULT_MAX_LOCAL_STEPS)
        if h < 1:
            raise BenchError(f"--local-steps/--local-epochs give {h} local steps; need at least 1")
        return h


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
    settings: Any = None  # the method's settings dataclass, resolved from config.options
    schedule: LRSchedule | None = None  # None: the recipe's constant lr
    budget_steps: int | None = None  # local steps every rank takes in the whole run
    spec: DatasetSpec | None = None  # the dataset's input shape, for tracing the model's graph

    def example_input(self) -> torch.Tensor:
        """One zero input of the dataset's shape (channel dependencies are traced with it)."""
        if self.spec is None:
            raise BenchError("this run context has no dataset spec to trace the model with")
        return example_input(self.spec, self.device)

    def option(self, name: str, default):
        """A setting by name (kept for plugins written before settings classes existed)."""
        value = getattr(self.settings, name, None)
        return default if value is None else value

    def local_steps_per_round(self) -> int:
        """H for a method with :class:`RoundSettings`, on this rank's shard."""
        return self.settings.steps_per_round(self.loader.steps_per_epoch)

    def round_steps(self) -> int:
        """Local steps of the round about to run: H, or what is left of the budget, so a
        round-based method consumes the same samples as a step-based one (the last round
        of a run may be short)."""
        h = self.local_steps_per_round()
        if self.budget_steps is None:
            return h
        return max(1, min(h, self.budget_steps - self.loader.step))

    def apply_lr(self, optimizer: torch.optim.Optimizer) -> float:
        """Set the scheduled lr for the step whose batch was just taken, and record it."""
        if self.schedule is None:
            return optimizer.param_groups[0]["lr"]
        batch = self.loader.batch_size
        lr = self.schedule.lr((self.loader.step - 1) * batch, batch)
        for group in optimizer.param_groups:
            group["lr"] = lr
        self.recorder.set(lr=lr)
        return lr


class Method(Protocol):
    #: local mini-batch steps one iteration consumes (DDP: 1; PruneX: H per round)
    steps_per_iteration: int
    #: phases that run during ``local_compute`` rather than after it (DDP's bucket
    #: all-reduces overlap backward); reports draw them overlapped, not stacked
    overlapped_phases: tuple[str, ...]

    def step(self, iteration: int) -> dict:
        """Run one iteration; return at least {"loss": float, "samples": int}."""

    def eval_model(self) -> nn.Module:
        """The model to evaluate (PruneX: the global consensus z).

        Collective: every rank calls it at the same point (it may synchronize BN statistics).
        """

    def state_dict(self) -> dict:
        """The method's whole state (model, optimizer, duals, memories, ...) as nested dicts,
        lists and tuples of tensors and plain values, for checkpoints."""

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state_dict()``'s value exactly: the next ``step`` must do what it
        would have done in the run that saved it."""

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
