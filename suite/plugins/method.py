"""What a method is, seen from the runner, and what it is given."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.optim.swa_utils import update_bn

from suite.cluster.comm import Communicator, flatten, unflatten_into
from suite.cluster.recorder import Recorder, synchronize
from suite.cluster.topology import CommGroup, Topology
from suite.cluster.watchdog import watched
from suite.config import RunConfig
from suite.data.schedule import LRSchedule
from suite.data.sharding import ShardedLoader
from suite.data.workload import DatasetSpec, Recipe, Workload, example_input
from suite.errors import BenchError
from suite.plugins.options import AT_LEAST_1, POSITIVE, at_least, option
from suite.results import schema

__all__ = [
    "DEFAULT_MAX_LOCAL_STEPS",
    "Method",
    "NodeAveragingSettings",
    "RoundSettings",
    "RunContext",
    "StepResult",
    "average_buffers_for_eval",
    "broadcast_initial_state",
    "recalibrate_batchnorm",
]

DEFAULT_MAX_LOCAL_STEPS = 32


@dataclass
class RoundSettings:
    """Options of every method that trains in rounds of local steps (PruneX, local SGD), so
    that their rounds, and so their iterations, line up: a settings class inherits them.

    Examples:
        ```python
        @dataclass
        class MySettings(RoundSettings):
            period: int = option(4, "average every N steps", check=AT_LEAST_1)
        ```
    """

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
class NodeAveragingSettings:
    """The option of round-based methods that average their models inside each node during a
    round (hierarchical local SGD, the pruning baselines, PruneX), declared once so that the
    flag means one thing and methods paired at one value run one schedule.

    Examples:
        ```python
        @dataclass
        class MySettings(RoundSettings, NodeAveragingSettings):
            ...

        if settings.averages_after(k, steps):  # after local step k of a round of ``steps``
            ctx.comm.all_reduce_into(tensors, topo.intra, phase=phases.INTRA_ALLREDUCE,
                                     divide_before=topo.gpus_per_node)
        ```
    """

    intra_average_period: int = option(
        4,
        "average the models inside each node after every N local steps of a round (0: only "
        "where the round ends; PruneX's paper reading: the node exchanges once per round)",
        check=at_least(0),
    )

    def exchange_every(self, round_steps: int) -> dict[str, int]:
        """``Method.exchange_every`` of a method that averages the node every
        ``--intra-average-period`` steps and crosses nodes once per round of ``round_steps``."""
        period = self.intra_average_period
        intra = period if 0 < period < round_steps else round_steps
        return {schema.EXCHANGE_INTRA: intra, schema.EXCHANGE_INTER: round_steps}

    def averages_after(self, step: int, round_steps: int) -> bool:
        """Whether the node averages after local step ``step`` (1-based) of a round of
        ``round_steps`` steps; never after the last one, where the round's own exchange
        follows."""
        period = self.intra_average_period
        return period > 0 and step % period == 0 and step < round_steps


@dataclass
class RunContext:
    """What a method's factory is given: the run's configuration and every piece it trains
    with, built the same way for real ranks and for the simulator.

    Attributes:
        config: the resolved run configuration.
        topology: which ranks share a node, and the process groups (world, intra, inter).
        comm: the only door to collectives (recorded bytes and time).
        recorder: per-iteration rows: ``ctx.recorder.phase(...)``, ``ctx.recorder.set(...)``.
        workload: the workload (model builder, dataset, recipe).
        recipe: the per-rank recipe with the run's overrides.
        model: freshly built, identical on every rank (same seed), on ``device``.
        loader: this rank's shard: ``next(iter(ctx.loader))`` is a batch (each one counts as
            a local step of the schedule: ``loader.step``, ``loader.steps_per_epoch``,
            ``loader.batch_size``); ``ctx.loader.calibration_batches(n)`` is a list of the
            shard's first ``n`` batches of images (fewer on a small shard), in a fixed order,
            unaugmented, on the loader's device, taken without moving the training stream
            (for BatchNorm statistics of an averaged model, ``recalibrate_batchnorm``).
        device: where the model and batches live.
        settings: the method's settings dataclass, resolved from the user's options.
        schedule: the lr schedule (``ctx.apply_lr(optimizer)`` after each batch).
        budget_steps: the local steps every rank takes in the whole run.
        spec: the dataset's shape, for tracing the model's graph.

    A method's iterations are sized by its ``steps_per_iteration`` where it declares one,
    else by H of its ``RoundSettings``, else 1; an iteration that takes another number of
    batches fails the run in one line (its budget and lr schedule would be off).
    """

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

    @property
    def simulated(self) -> bool:
        """Whether this is ``bench sim`` replaying the method's steps on stand-in batches:
        nothing is trained or evaluated, so a warning about training (the masks froze too
        late to train the consensus) means nothing here and is not given."""
        return self.config.launcher == "sim"

    def example_input(self) -> torch.Tensor:
        """One zero input of the dataset's shape (channel dependencies are traced with it).

        Returns:
            A (1, C, H, W) tensor on ``device``.
        """
        if self.spec is None:
            raise BenchError("this run context has no dataset spec to trace the model with")
        return example_input(self.spec, self.device)

    def local_steps_per_round(self) -> int:
        """H for a method with ``RoundSettings``, on this rank's shard."""
        return self.settings.steps_per_round(self.loader.steps_per_epoch)

    def round_steps(self) -> int:
        """Local steps of the round about to run: H, or what is left of the budget, so a
        round-based method consumes the same samples as a step-based one (the last round
        of a run may be short).

        Returns:
            The number of batches to take this round.
        """
        h = self.local_steps_per_round()
        if self.budget_steps is None:
            return h
        return max(1, min(h, self.budget_steps - self.loader.step))

    def apply_lr(self, optimizer: torch.optim.Optimizer) -> float:
        """Set the scheduled lr for the step whose batch was just taken, and record it.

        Args:
            optimizer: every param group gets the lr.

        Returns:
            The lr set.
        """
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
    """What one iteration did: what ``Method.step`` returns.

    Attributes:
        loss: the iteration's mean training loss on this rank (a float or a 0-d tensor).
        samples: the samples it consumed on this rank.
        converged: the method's own stopping test passed (PruneX's residual tolerances); the
            same on every rank.
        one_off: this iteration's time holds a cost the method pays once, decided while it
            ran (PruneX's freeze): the loop marks it ``one_off`` like the iterations
            ``Method.one_off_iterations`` names ahead, so steady means leave it out. The
            same on every rank.

    Examples:
        ```python
        return StepResult(loss.item(), len(y))
        ```
    """

    loss: float
    samples: int
    converged: bool = False
    one_off: bool = False


class Method:
    """The contract between a method and the framework: every member the runner, the
    simulator, checkpoints and the manifest read, with its default. A factory registered with
    ``METHODS.register`` returns one.

    A method records method-specific scalars of an iteration (density, mask drift, ...) with
    ``ctx.recorder.set``, and times its phases under the names of ``suite.api.phases`` (or
    one of its own, ``declare_phase``).

    Examples:
        ```python
        class Averaging(Method):
            def __init__(self, ctx):
                self.ctx, self.model = ctx, ctx.model
                broadcast_initial_state(self.model)

            def step(self, iteration):
                ...
                return StepResult(loss, samples)

            def eval_model(self):
                return average_buffers_for_eval(self.model)

            def state_dict(self):
                return {"model": self.model.state_dict()}

            def load_state_dict(self, state):
                self.model.load_state_dict(state["model"])
        ```
    """

    #: local mini-batch steps one iteration consumes (DDP: 1; PruneX: H per round); a method
    #: that sets it (on its class or in ``__init__``) is scheduled by it, one that does not by
    #: its RoundSettings' H, else 1; the runner checks every iteration takes that many
    steps_per_iteration: int = 1
    #: phases that run during ``local_compute`` rather than after it (DDP's bucket
    #: all-reduces overlap backward); reports draw them overlapped, not stacked
    overlapped_phases: tuple[str, ...] = ()
    #: what went wrong without stopping the run (e.g. oscillating masks), for summary.json;
    #: a method that warns assigns its own list
    warnings: Sequence[str] = ()

    def step(self, iteration: int) -> StepResult:
        """Run one iteration (DDP: one step; PruneX: one round of H local steps).

        Args:
            iteration: its index, from 0 (a resumed run continues the count).

        Returns:
            What it did; anything else is a one-line error naming the method.
        """
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

    def exchange_every(self) -> dict[str, int]:
        """Local steps between the method's exchanges inside a node and across nodes (DDP:
        1 and 1; hierarchical local SGD: ``--intra-average-period`` and H), shown next to its
        numbers by reports and ``bench compare``: methods that exchange on different
        schedules are not compared like for like. Default: one of each per iteration.

        Returns:
            ``{"intra_node": n, "inter_node": m}``, in local steps.
        """
        return {schema.EXCHANGE_INTRA: self.steps_per_iteration,
                schema.EXCHANGE_INTER: self.steps_per_iteration}

    def one_off_iterations(self, first: int) -> set[int]:
        """Iterations of an attempt that starts at ``first`` whose time holds a one-off cost of
        the method beyond the untimed warm-up (DDP's bucket rebuild at its second iteration,
        PowerSGD's first compressed step). The loop marks them, with ``first`` itself, in
        the ``one_off`` column; the summary's means leave them out, the table keeps them.

        Args:
            first: the attempt's first iteration (0, or where a resumed run continues).

        Returns:
            Iteration indices (``first`` need not be among them).
        """
        return set()

    def process_groups(self) -> list:
        """Process groups the method created itself (beside the topology's), this rank's
        membership only: they are connected before the first timed iteration, so no method's
        iteration 0 pays for building a communicator (NCCL builds them lazily)."""
        return []


def broadcast_initial_state(module: nn.Module) -> None:
    """Rank 0's parameters and buffers everywhere, as DDP's constructor does: one broadcast
    of each dtype's tensors as a flat buffer, watched by the rank's watchdog. Setup, outside
    any iteration, so it is not method traffic. Collective: every rank calls it.

    Args:
        module: the model; updated in place.
    """
    with torch.no_grad(), watched("broadcast", "world (initial state from rank 0)"):
        for tensors in by_dtype([*module.parameters(), *module.buffers()]).values():
            flat = flatten(tensors)
            dist.broadcast(flat, src=0)
            unflatten_into(tensors, flat)
        synchronize(next(module.parameters()).device)


def average_buffers_for_eval(model: nn.Module) -> nn.Module:
    """Average float buffers (BN running statistics) over the world before evaluating: one
    flat all-reduce per dtype, watched. Collective.

    Gradient-averaging methods keep identical parameters but rank-local BN statistics
    (DDP with ``broadcast_buffers=False``); evaluation needs one model. This is evaluation
    bookkeeping, issued outside any iteration, so it is not counted as method traffic.

    Args:
        model: the model whose buffers are averaged in place.

    Returns:
        ``model`` (so ``eval_model`` can return the call).
    """
    buffers = [b for b in model.buffers() if b.is_floating_point()]
    if not buffers:
        return model
    world = dist.get_world_size()
    with torch.no_grad(), watched("all_reduce", "world (BN statistics for evaluation)"):
        for tensors in by_dtype(buffers).values():
            flat = flatten(tensors)
            dist.all_reduce(flat)
            unflatten_into(tensors, flat.div_(world))
        synchronize(buffers[0].device)
    return model


def by_dtype(tensors: list[torch.Tensor]) -> dict[torch.dtype, list[torch.Tensor]]:
    """``tensors`` grouped by dtype, in order (a flat buffer holds one dtype)."""
    groups: dict[torch.dtype, list[torch.Tensor]] = {}
    for tensor in tensors:
        groups.setdefault(tensor.dtype, []).append(tensor)
    return groups


@torch.no_grad()
def recalibrate_batchnorm(
    model: nn.Module, batches: list[torch.Tensor], world: CommGroup, device: torch.device,
    *, comm: Communicator | None = None, phase: str | None = None,
) -> None:
    """Recompute the BatchNorm running statistics of ``model`` on ``batches`` (torch's
    ``swa_utils.update_bn``: cumulative averages over them), then average them over ``world``
    (a CommGroup): one flat all-reduce, watched. Collective: every rank of ``world`` calls it.

    Why: BN statistics describe the model whose forward passes produced them. An averaged
    model (PruneX's consensus z, a local-SGD average, SWA) is not the model any rank ran, so
    the ranks' statistics, averaged, describe other activations than its own; the deeper the
    stack of BN layers, the further they are off.

    Args:
        model: the model whose statistics are re-estimated in place (its mode is restored).
        batches: input batches on ``device`` (e.g. ``ctx.loader.calibration_batches(8)``).
        world: the group the statistics are averaged over.
        device: where the forward passes run.
        comm: where the statistics are part of the method's work inside a step (PruneX's
            choice at its freeze), its communicator: the all-reduce is then recorded under
            ``phase`` like any other; None (evaluation bookkeeping): issued directly, unrecorded.
        phase: the phase of that all-reduce (with ``comm``).

    Examples:
        ```python
        batches = self.ctx.loader.calibration_batches(8)
        recalibrate_batchnorm(self.average, batches, self.ctx.topology.world, self.ctx.device)
        ```
    """

    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not norms or not batches:
        return
    update_bn(list(batches), model, device=device)
    stats = [t for norm in norms for t in (norm.running_mean, norm.running_var)]
    flat = flatten(stats)
    if comm is not None:  # the method's own traffic: recorded like any of its collectives
        comm.all_reduce(flat, world, phase=phase)
        unflatten_into(stats, flat.div_(world.size))
        return
    with watched("all_reduce", "world (BN recalibration)", world.ranks):
        dist.all_reduce(flat, group=world.pg)
        unflatten_into(stats, flat.div_(world.size))
        synchronize(device)  # NCCL returns once queued: the wait ends at its completion
