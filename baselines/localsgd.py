"""Local SGD with hierarchical model averaging, by torch's ``HierarchicalModelAverager``.

Every rank runs plain local SGD (no gradient exchange). Torch's averager (hierarchical SGD,
Zhou et al., arXiv:2010.12998) averages the parameters inside each node every
``--intra-average-period`` steps (default 4) and over the world every ``--local-steps`` H
steps, with PruneX's default H = min(one local epoch, 32) and ``--local-epochs`` read the same
way, so the global averages fall where PruneX's rounds end. When both levels are due, the
world average alone runs, as in torch.

One iteration is one round of H local steps (``steps_per_iteration = H``, as for PruneX): every
iteration ends with a world average, so all ranks then hold the same model, per-iteration
bytes compare with PruneX's per-round bytes. As for PruneX, a run's last round is cut to the
sample budget that every method shares. The loss is the round's sample-weighted mean.

Traffic: the averager all-reduces one flat copy of the parameters that have gradients over
groups it creates itself (``new_subgroups`` in blocks of ``gpus_per_node`` contiguous ranks:
exactly the nodes); each average is accounted by the ring model on the group torch picks,
its ranks read back from the process group, and timed as ``intra_allreduce`` when the group
lies in one node, else ``allreduce``. The world level is torch's flat ring over every rank,
not a leaders-only exchange.

BN running statistics: torch's averager takes parameters only, so the float buffers are
averaged over the same group at the same points through the communicator (a second
all-reduce, recorded in the same phase); like PruneX's consensus, the whole model agrees at
each round's end. Momentum buffers stay local, as in torch's post-local SGD.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.model_averaging.hierarchical_model_averager import (
    HierarchicalModelAverager,
)
from torch.distributed.algorithms.model_averaging.utils import get_params_to_average

from suite.api import (
    METHODS,
    CommGroup,
    Look,
    NodeAveragingSettings,
    RoundSettings,
    RunContext,
    SGDBaseline,
    StepResult,
    broadcast_initial_state,
    crosses_nodes_every_round,
    nbytes,
    phases,
)


@dataclass
class LocalSGDSettings(RoundSettings, NodeAveragingSettings):
    """H local steps per round, node averages every ``--intra-average-period`` of them."""


class HierarchicalLocalSGD(SGDBaseline):
    def __init__(self, ctx: RunContext):
        super().__init__(ctx, ctx.model)
        broadcast_initial_state(self.module)
        topo = ctx.topology
        self.steps_per_iteration = ctx.local_steps_per_round()
        period = ctx.settings.intra_average_period
        levels = OrderedDict()  # averaging period -> group size, lowest level first
        if 0 < period < self.steps_per_iteration and topo.gpus_per_node > 1:
            levels[period] = topo.gpus_per_node
        levels[self.steps_per_iteration] = topo.world_size
        self.averager = HierarchicalModelAverager(levels, process_group=topo.world.pg)
        # torch tests ``step % period`` before counting the step; starting from 1, averages
        # follow local steps period, 2 period, ... and a world average ends every round.
        self.averager.step = 1
        self.groups = [
            self._recorded_group(pg) for pg in self.averager.period_process_group_dict.values()
        ]
        self.buffers = [b for b in self.module.buffers() if b.is_floating_point()]

    def _recorded_group(self, pg) -> tuple[CommGroup, str]:
        """The averager's process group as a CommGroup, with the phase its time goes to."""
        ranks = tuple(dist.get_process_group_ranks(pg))
        within_node = len({self.ctx.topology.node_of(r) for r in ranks}) == 1
        if within_node:
            return CommGroup("intra", ranks, pg), phases.INTRA_ALLREDUCE
        return CommGroup("world", ranks, pg), phases.ALLREDUCE

    def process_groups(self) -> list:
        return [group.pg for group, _ in self.groups]

    def step(self, iteration: int) -> StepResult:
        total, samples = 0.0, 0
        steps = self.ctx.round_steps()
        for k in range(steps):
            loss, n = self.forward_backward()
            self.apply_update()
            if k == steps - 1 and steps < self.steps_per_iteration:
                # the run's last round is cut to the budget: it still ends with the world
                # average, which torch's averager takes at its step counts divisible by H
                h = self.steps_per_iteration
                self.averager.step = -(-self.averager.step // h) * h
            self.average()
            total += loss * n
            samples += n
        return StepResult(total / samples, samples)

    def average(self) -> None:
        """Torch's averaging for this step, if one is due, recorded on the group torch picks."""
        params = get_params_to_average(self.module.parameters())
        pg = self.averager._find_process_group()  # torch's own choice of level for this step
        if pg is None:
            self.averager.average_parameters(params)  # nothing due: only counts the step
            return
        group, phase = next((g, p) for g, p in self.groups if g.pg is pg)
        comm = self.ctx.comm
        comm.account("all_reduce", group, sum(nbytes(p) for p in params))
        with self.ctx.recorder.phase(phase):
            self.averager.average_parameters(params)
        if self.buffers:
            with torch.no_grad():
                comm.all_reduce_into(self.buffers, group, phase=phase, divide_before=group.size)

    def exchange_every(self) -> dict[str, int]:
        return self.ctx.settings.exchange_every(self.steps_per_iteration)

    def eval_model(self) -> nn.Module:
        return self.module  # every iteration ends with a world average of parameters and BN

    def state_dict(self) -> dict:
        return {**super().state_dict(), "averager_step": self.averager.step}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.averager.step = int(state["averager_step"])


@METHODS.register(
    "localsgd-hier",
    "Local SGD, torch's HierarchicalModelAverager: parameters and BN statistics averaged in "
    "the node every --intra-average-period (4) steps, over the world every --local-steps "
    "(PruneX's round; one iteration = one round)",
    settings=LocalSGDSettings,
    not_simulable="torch's model averager builds its own subgroups, which a one-process "
    "replay cannot stand in for",
    look=Look("Local SGD (hier.)", "#009E73", "*"),
    activity=crosses_nodes_every_round,
    nightly=True,
)
def make_localsgd_hier(ctx: RunContext) -> HierarchicalLocalSGD:
    return HierarchicalLocalSGD(ctx)
