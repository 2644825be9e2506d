"""What a method is, seen from the runner, and what it is given."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from suite.cluster.comm import Communicator
from suite.cluster.recorder import Recorder
from suite.cluster.topology import Topology
from suite.errors import BenchError
from suite.plugins.options import AT_LEAST_1, POSITIVE, option
from suite.run.config import RunConfig
from suite.run.schedule import LRSchedule
from suite.structured.groups import example_input
from workloads.base import DatasetSpec, Recipe, Workload
from workloads.sharding import ShardedLoader

__all__ = [
    "DEFAULT_MAX_LOCAL_STEPS",
    "LegacyMethod",
    "Method",
    "RoundSettings",
    "RunContext",
    "StepResult",
    "average_buffers_for_eval",
    "broadcast_initial_state",
]

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


@dataclass
class StepResult:
    """What one iteration did: its mean training loss on this rank, the samples it consumed,
    and whether the method's own stopping test passed (PruneX's residual tolerances)."""

    loss: float
    samples: int
    converged: bool = False


class Method:
    """The contract between a method and the framework: every member the runner, the
    simulator, checkpoints and the manifest read, with its default.

    A method records method-specific scalars of an iteration (density, mask drift, ...) with
    ``ctx.recorder.set``, and times its phases under the names of :mod:`suite.cluster.phases`.
    """

    #: local mini-batch steps one iteration consumes (DDP: 1; PruneX: H per round)
    steps_per_iteration: int = 1
    #: phases that run during ``local_compute`` rather than after it (DDP's bucket
    #: all-reduces overlap backward); reports draw them overlapped, not stacked
    overlapped_phases: tuple[str, ...] = ()
    #: what went wrong without stopping the run (e.g. oscillating masks), for summary.json;
    #: a method that warns assigns its own list
    warnings: Sequence[str] = ()

    def step(self, iteration: int) -> StepResult:
        """Run one iteration."""
        raise NotImplementedError

    def eval_model(self) -> nn.Module:
        """The model to evaluate (PruneX: the global consensus z).

        Collective: every rank calls it at the same point (it may synchronize BN statistics).
        """
        raise NotImplementedError

    def state_dict(self) -> dict:
        """The method's whole state (model, optimizer, duals, memories, ...) as nested dicts,
        lists and tuples of tensors and plain values, for checkpoints."""
        raise NotImplementedError

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state_dict()``'s value exactly: the next ``step`` must do what it
        would have done in the run that saved it."""
        raise NotImplementedError

    def artifacts(self) -> dict[str, object]:
        """Extra files for the run folder (file name -> object saved with torch.save)."""
        return {}

    def resolved_settings(self) -> dict:
        """Settings the method derived from the user's (PruneX's penalties from the round
        pull), recorded in the manifest over the given ones."""
        return {}

    def summary_facts(self) -> dict:
        """What the method did that a reader of summary.json needs (PruneX: the round and
        sample count at which its masks froze); added to the summary at the end."""
        return {}

    def process_groups(self) -> list:
        """Process groups the method created itself (beside the topology's), this rank's
        membership only: they are connected before the first timed iteration, so no method's
        iteration 0 pays for building a communicator (NCCL builds them lazily)."""
        return []


class LegacyMethod(Method):
    """A plugin method written before the ``Method`` base (a duck-typed object whose ``step``
    returns a dict), wrapped so the framework reads the contract as stated above: the dict
    becomes a ``StepResult`` and its extra keys the row's columns, as they were. Deprecated:
    subclass ``suite.api.Method``; this goes in the next release."""

    def __init__(self, method: Any, recorder):
        self.inner = method
        self.recorder = recorder
        self.steps_per_iteration = getattr(method, "steps_per_iteration", 1)
        self.overlapped_phases = tuple(getattr(method, "overlapped_phases", ()))

    @property
    def warnings(self) -> Sequence[str]:
        return tuple(getattr(self.inner, "warnings", ()) or ())

    def step(self, iteration: int) -> StepResult:
        done = self.inner.step(iteration)
        if isinstance(done, StepResult):
            return done
        extra = {k: v for k, v in done.items() if k not in ("loss", "samples", "converged")}
        self.recorder.set(**extra)
        return StepResult(float(done["loss"]), int(done["samples"]), bool(done.get("converged")))

    def eval_model(self) -> nn.Module:
        return self.inner.eval_model()

    def state_dict(self) -> dict:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.inner.load_state_dict(state)

    def artifacts(self) -> dict[str, object]:
        return self.inner.artifacts() if hasattr(self.inner, "artifacts") else {}


def broadcast_initial_state(module: nn.Module) -> None:
    """Rank 0's parameters and buffers everywhere, as DDP's constructor does.

    Setup, outside any iteration, so it is not method traffic.
    """
    import torch.distributed as dist

    with torch.no_grad():
        for t in [*module.parameters(), *module.buffers()]:
            dist.broadcast(t, src=0)


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
