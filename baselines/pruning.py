"""Pruning baselines that ask whether PruneX needs ADMM: the same structure, the same bytes.

Both train like ``localsgd-hier`` at PruneX's round (H local steps; the node averages its
models every ``--intra-average-period`` steps) and end each round the way PruneX does:

  intra_allreduce  node mean of the parameters and BN statistics
  projection       keep the largest-norm filter/channel/shape groups of the node mean
                   (suite.structured.project, PruneX's own projection) at this round's keep
  mask_sync        leaders OR the group bitmaps (MAX on uint8), broadcast in the node
  pack             leaders: the kept slices of every conv (only the live ones with the
                   default ``--pack live``), into buckets (suite.packing: PruneX's layout,
                   so equal masks give equal bytes)
  inter_allreduce  leaders: AVG of the packed buckets;  broadcast: to the node;  unpack

A pruned group stays zero: theta and its momentum are masked after every local step, so
its norm is zero and it is never chosen again; masks only ever lose groups.

``gmp-hier``: gradual magnitude pruning (Zhu & Gupta, 2017). The keep fraction of every
structured set falls from 1 to its target over the first ``--prune-end`` of the run's
samples along the cubic schedule keep(p) = target + (1 - target) (1 - p / prune_end)^3.

``prune-retrain``: dense until ``--prune-at`` of the samples, one structured magnitude prune
to the target, then training on that fixed support. ``--prune-at 1`` never prunes (the
all-ones control), ``--masks-from RUN`` trains on a PruneX run's final masks from round 0
(the capacity control of benchmarks/capacity_control.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from baselines.common import SGDBaseline, broadcast_initial_state
from suite.comm import flatten, unflatten_into
from suite.dependency import trace_channel_groups
from suite.liveness import LiveSlices, live_slices
from suite.method import RoundSettings, RunContext
from suite.options import AT_LEAST_1, FRACTION, Check, option
from suite.packing import PackingSettings, PackLayout, model_entries
from suite.registry import METHODS
from suite.structured import (
    StructuredKeepSettings,
    StructuredMask,
    conv_shapes,
    density_of,
    load_masks,
    mask_artifact,
    or_across_nodes,
    project,
)

UNIT = Check(lambda v: 0 <= v <= 1, "in [0, 1]")


@dataclass
class PruningSettings(RoundSettings, StructuredKeepSettings, PackingSettings):
    intra_average_period: int = option(
        4, "average inside each node every N local steps", check=AT_LEAST_1
    )


@dataclass
class GMPSettings(PruningSettings):
    prune_end: float = option(
        0.5, "fraction of the run's samples by which the keep reaches its target", check=FRACTION
    )


@dataclass
class PruneRetrainSettings(PruningSettings):
    prune_at: float = option(
        0.5, "fraction of the run's samples trained dense before the one-shot prune", check=UNIT
    )


def cubic_fraction(progress: float, end: float) -> float:
    """Zhu & Gupta's cubic schedule: how far from dense (0) to the target (1) the keep is at
    ``progress`` of the run, reaching the target at ``end``."""
    return 1.0 - (1.0 - min(progress / end, 1.0)) ** 3


def one_shot_fraction(progress: float, at: float) -> float:
    """Dense before ``at``, the target from ``at`` on; ``at`` = 1 never prunes."""
    return 1.0 if at < 1.0 and progress >= at else 0.0


def keeps_at(targets: dict[str, float | None], fraction: float) -> dict[str, float | None]:
    """Each structured set's keep at ``fraction`` of the way from 1 to its target."""
    return {k: None if t is None else 1.0 - fraction * (1.0 - t) for k, t in targets.items()}


class StructuredLocalSGD(SGDBaseline):
    """Hierarchical local SGD whose round ends with magnitude masks and packed exchange;
    ``pruned_fraction(progress)`` says how far from dense (0) to the target keeps (1)."""

    def __init__(self, ctx: RunContext, pruned_fraction):
        super().__init__(ctx, ctx.model)
        broadcast_initial_state(self.module)
        settings = ctx.settings
        self.pruned_fraction = pruned_fraction
        self.steps_per_iteration = ctx.local_steps_per_round()
        self.period = settings.intra_average_period
        self.bucket_bytes = int(settings.bucket_mb * 2**20)
        self.targets = settings.keeps
        self.params = dict(self.module.named_parameters())
        self.buffers = dict((n, b) for n, b in self.module.named_buffers() if b.is_floating_point())
        self.shapes = conv_shapes(self.module)
        self.support: dict[str, torch.Tensor] = {}  # dense masks of the pruned weights
        self.applied = 0.0  # pruned fraction of the masks in use
        self.frozen = False
        self.channel_groups = (  # --pack live: traced once, like PruneX's
            trace_channel_groups(self.module, ctx.example_input())
            if settings.pack == "live"
            else None
        )
        self.use_masks(
            {n: StructuredMask.full(s, device=ctx.device) for n, s in self.shapes.items()}
        )
        if settings.masks_from is not None:
            self.use_masks(load_masks(settings.masks_from, self.shapes, ctx.device))
            self.frozen, self.applied = True, 1.0
            self.restrict_to_support()

    # ------------------------------------------------------------------ one round
    def step(self, iteration: int) -> dict:
        total, samples = 0.0, 0
        steps = self.ctx.round_steps()
        for k in range(1, steps + 1):
            loss, n = self.forward_backward()
            self.apply_update()
            self.keep_support()
            if k % self.period == 0 and k < steps:
                self.node_average()
            total += loss * n
            samples += n
        self.node_average()
        drift = 0
        if not self.frozen:
            progress = self.ctx.loader.step / self.ctx.budget_steps
            fraction = self.pruned_fraction(progress)
            if fraction > self.applied:
                drift = self.prune(fraction)
            self.frozen = fraction >= 1.0
        self.exchange_between_nodes()
        self.ctx.recorder.set(
            density=self.density(),
            mask_drift=drift,
            frozen=self.frozen,
            packed_bytes=float(self.layout.nbytes),
        )
        return {"loss": total / samples, "samples": samples}

    def keep_support(self) -> None:
        with torch.no_grad():
            for name, mask in self.support.items():
                self.params[name].mul_(mask)

    def node_average(self) -> None:
        """Mean of the parameters and BN statistics over the node (in place)."""
        topo = self.ctx.topology
        if topo.gpus_per_node == 1:
            return
        tensors = [p.data for p in self.params.values()] + list(self.buffers.values())
        with torch.no_grad():
            flat = flatten(tensors).div_(topo.gpus_per_node)
            self.ctx.comm.all_reduce(flat, topo.intra, phase="intra_allreduce")
            unflatten_into(tensors, flat)

    @torch.no_grad()
    def prune(self, fraction: float) -> int:
        """Masks of the node mean at this round's keeps, OR-agreed by the leaders (eq. 14 of
        PruneX); returns the number of group bits that changed."""
        keeps = keeps_at(self.targets, fraction)
        with self.ctx.recorder.phase("projection"):
            local = {n: project(self.params[n].data, **keeps)[1] for n in self.shapes}
        agreed = or_across_nodes(local, self.ctx.comm, self.ctx.topology)
        self.applied = fraction
        drift = sum(self.masks[n].changed_groups(agreed[n]) for n in self.shapes)
        if drift:
            self.use_masks(agreed)
            self.restrict_to_support()
        return drift

    def use_masks(self, masks: dict[str, StructuredMask]) -> None:
        """New masks: their live slices (``--pack live``), and a pack layout to rebuild."""
        self.masks = masks
        self.layout: PackLayout | None = None
        self.live: LiveSlices | None = None
        if self.channel_groups is not None:
            self.live = live_slices(self.module, self.channel_groups, masks)

    @torch.no_grad()
    def restrict_to_support(self) -> None:
        """Zero theta and its momentum off the masks (and off the dead slices with ``--pack
        live``); keep them there from now on."""
        support = {name: mask.dense() for name, mask in self.masks.items()}
        if self.live is not None:
            shapes = {name: p.shape for name, p in self.params.items()}
            for name, keep in self.live.partial_masks(shapes, device=self.ctx.device).items():
                support[name] = keep & support[name] if name in support else keep
        for name, dense in support.items():
            dense = dense.to(self.params[name].dtype)
            self.support[name] = dense
            self.params[name].mul_(dense)
            momentum = self.optimizer.state.get(self.params[name], {}).get("momentum_buffer")
            if momentum is not None:
                momentum.mul_(dense)

    @torch.no_grad()
    def exchange_between_nodes(self) -> None:
        """PruneX's inter-node step on the node means: pack, leaders average, broadcast,
        unpack (zero off the kept slices)."""
        topo, rec, comm = self.ctx.topology, self.ctx.recorder, self.ctx.comm
        if self.layout is None:
            entries = model_entries(self.module, self.masks, live=self.live)
            self.layout = PackLayout(
                entries, bucket_bytes=self.bucket_bytes, device=self.ctx.device
            )
        values = {f"p:{n}": p.data for n, p in self.params.items()}
        values.update({f"b:{n}": b for n, b in self.buffers.items()})
        if topo.is_leader:
            with rec.phase("pack"):
                packed = self.layout.pack(values)
        else:
            packed = self.layout.allocate()
        for bucket in packed:
            if topo.is_leader and topo.inter is not None:
                comm.all_reduce(bucket, topo.inter, phase="inter_allreduce")
                bucket.div_(topo.num_nodes)
            comm.broadcast(bucket, topo.intra, src=topo.intra.ranks[0], phase="broadcast")
        with rec.phase("unpack"):
            full = self.layout.unpack(packed)
        for name, value in values.items():
            value.copy_(full[name])

    # ------------------------------------------------------------------ interface
    def density(self) -> float:
        return density_of(self.masks)

    def eval_model(self):
        return self.module  # every round ends with the same model on every rank

    def state_dict(self) -> dict:
        return {
            **super().state_dict(),
            "shared_world": {"masks": {n: m.state() for n, m in self.masks.items()}},
            "applied": self.applied,
            "frozen": self.frozen,
        }

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        device = self.ctx.device
        saved = state["shared_world"]["masks"]
        self.use_masks({n: StructuredMask.from_state(m, device) for n, m in saved.items()})
        self.applied, self.frozen = float(state["applied"]), bool(state["frozen"])
        self.support = {}
        if self.applied > 0:
            self.restrict_to_support()  # theta and momentum are already zero off it

    def artifacts(self) -> dict:
        return {"masks.pt": mask_artifact(self.masks)}


@METHODS.register(
    "gmp-hier",
    "Gradual magnitude pruning (Zhu & Gupta 2017, cubic schedule to the keep target by "
    "--prune-end) of PruneX's structured groups on hierarchical local SGD at PruneX's round; "
    "node masks OR-agreed and the inter-node exchange packed exactly like PruneX's",
    settings=GMPSettings,
    not_simulable="its masks come from the trained weights' magnitudes, which a replay on "
    "stand-in batches does not have",
)
def make_gmp_hier(ctx: RunContext) -> StructuredLocalSGD:
    end = ctx.settings.prune_end
    return StructuredLocalSGD(ctx, lambda progress: cubic_fraction(progress, end))


@METHODS.register(
    "prune-retrain",
    "Dense hierarchical local SGD for --prune-at of the run, one structured magnitude prune to "
    "the keep target, then training on the fixed support, packed like PruneX's",
    settings=PruneRetrainSettings,
    not_simulable="its masks come from the trained weights' magnitudes, which a replay on "
    "stand-in batches does not have",
)
def make_prune_retrain(ctx: RunContext) -> StructuredLocalSGD:
    at = ctx.settings.prune_at
    return StructuredLocalSGD(ctx, lambda progress: one_shot_fraction(progress, at))
