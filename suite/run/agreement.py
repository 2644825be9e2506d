"""What the ranks agree on while they train, batched: mean losses, NaN, stop requests, timed
checkpoints, each iteration's traffic over all ranks and what went past the communicator
(suite.cluster.audit), in one small world all-reduce every few iterations, so every rank stops
or saves after the same iteration and nothing recorded is lost. A bookkeeping collective of
the runner, not method traffic."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from suite.cluster.audit import HiddenBytes
from suite.cluster.watchdog import watched
from suite.environment import number
from suite.errors import BenchError
from suite.results import schema


class NonFiniteLoss(BenchError):
    """Every rank stops after the same iteration (agreed in ``Agreement.settle``)."""


#: the ranks agree at most this often, in seconds of training (``PRUNEX_AGREE_SECONDS``
#: overrides), and always before an evaluation, a checkpoint and the last iteration: each
#: agreement is a synchronization point, which on a GPU costs tens of microseconds but on
#: oversubscribed CPU ranks a scheduler time slice (6-8 ms per iteration, measured on
#: cnn-fmnist with 4 ranks on 2 cores, when the ranks agreed every iteration)
#: the most iterations between two agreements; the interval at most doubles from one to the next
MAX_AGREE_INTERVAL = 64


@dataclass
class SettledIteration:
    row: dict  # this rank's row
    mean_loss: float  # over all ranks
    inter_bytes: float  # summed over all ranks
    intra_bytes: float
    hidden: HiddenBytes = HiddenBytes()  # issued past ctx.comm, summed over all ranks


@dataclass
class Settled:
    iterations: list[SettledIteration]
    stop: bool  # a rank was asked to stop
    checkpoint_due: bool  # rank 0's clock says a timed checkpoint is due


class Agreement:
    """What the ranks must agree on, batched: mean losses, NaN, stop requests, timed
    checkpoints and each iteration's traffic over all ranks, in one small world all-reduce
    every ``interval`` iterations (so every rank stops or saves after the same iteration and
    nothing recorded is lost).

    The interval follows rank 0's seconds per iteration, carried in the all-reduce (the other
    ranks add zeros, so every rank reads the same bits and picks the same next interval)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.pending: list[tuple[dict, float, HiddenBytes]] = []  # (row, loss, hidden) each
        self.interval = 1
        self.since = time.perf_counter()
        self.agree_seconds = number("PRUNEX_AGREE_SECONDS")

    def add(self, row: dict, loss: float, hidden: HiddenBytes | None = None) -> None:
        self.pending.append((row, loss, hidden or HiddenBytes()))

    @property
    def due(self) -> bool:
        return len(self.pending) >= self.interval

    def settle(self, *, stop: bool, checkpoint_due: bool) -> Settled:
        pending, self.pending = self.pending, []
        seconds = (time.perf_counter() - self.since) / len(pending)
        head = [seconds if dist.get_rank() == 0 else 0.0, float(stop), float(checkpoint_due)]
        for row, loss, hidden in pending:
            finite = math.isfinite(loss)
            head += [loss if finite else 0.0, 0.0 if finite else 1.0, row[schema.BYTES_INTER],
                     row[schema.BYTES_INTRA], hidden.crossing, hidden.local,
                     hidden.declared_crossing]
        stats = torch.tensor(head, dtype=torch.float64, device=self.device)
        with watched("all_reduce", "world (the ranks' agreement)", phase="iteration end"):
            dist.all_reduce(stats)
            values = stats.tolist()  # waits for it (NCCL too)
        rank0_seconds, stops, dues = values[:3]
        per_iteration = [values[3 + 7 * i : 10 + 7 * i] for i in range(len(pending))]
        for (row, _, _), (_, nonfinite, *_) in zip(pending, per_iteration, strict=True):
            if nonfinite:
                where = f"iteration {row[schema.ITERATION]} on {int(nonfinite)} rank(s)"
                raise NonFiniteLoss(f"non-finite loss at {where}; lower --lr or check the data")
        wanted = (int(self.agree_seconds / rank0_seconds) if rank0_seconds > 0
                  else MAX_AGREE_INTERVAL)
        self.interval = max(1, min(wanted, 2 * self.interval, MAX_AGREE_INTERVAL))
        self.since = time.perf_counter()
        world = dist.get_world_size()
        return Settled(
            [SettledIteration(row, loss_sum / world, inter, intra,
                              HiddenBytes(crossing, local, declared, hidden.groups))
             for (row, _, hidden), (loss_sum, _, inter, intra, crossing, local, declared)
             in zip(pending, per_iteration)],
            stops > 0,
            dues > 0,
        )
