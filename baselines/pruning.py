"""Pruning baselines that ask whether PruneX needs ADMM: the same structure, the same bytes.

Both train like ``localsgd-hier`` at PruneX's round (H local steps; the node averages its
models every ``--intra-average-period`` steps) and end each round the way PruneX does:

  intra_allreduce  node mean of the parameters and BN statistics
  projection       keep the largest-norm filter/channel/shape groups of the node mean
                   (PruneX's own projection) at this round's keep
  mask_sync        leaders OR the group bitmaps (MAX on uint8), broadcast in the node
  pack             leaders: the kept slices of every conv (only the live ones with the
                   default ``--pack live``), into buckets: PruneX's structured round
                   (StructuredRound), so equal masks give equal bytes
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

from suite.api import (
    FRACTION,
    METHODS,
    Check,
    Look,
    NodeAveragingSettings,
    PackingSettings,
    RoundSettings,
    RunContext,
    SGDBaseline,
    StepResult,
    StructuredKeepSettings,
    StructuredRound,
    broadcast_initial_state,
    option,
    phases,
    prunes_across_nodes,
)

UNIT = Check(lambda v: 0 <= v <= 1, "in [0, 1]")


@dataclass
class PruningSettings(
    RoundSettings, NodeAveragingSettings, StructuredKeepSettings, PackingSettings
):
    """PruneX's round and structure, with magnitude masks instead of ADMM."""


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
        self.targets = settings.keeps
        self.params = dict(self.module.named_parameters())
        self.buffers = dict((n, b) for n, b in self.module.named_buffers() if b.is_floating_point())
        self.structure = StructuredRound(ctx, self.module, settings, keeps=settings.keeps)
        self.applied = 0.0  # pruned fraction of the masks in use
        self.frozen = False
        if settings.masks_from is not None:
            self.structure.use_masks(self.structure.load(settings.masks_from))
            self.frozen, self.applied = True, 1.0
            self.restrict_to_support()

    @property
    def masks(self):
        """The agreed masks, by conv weight name."""
        return self.structure.masks

    @property
    def shapes(self):
        """The constrained conv weights' shapes, by name."""
        return self.structure.shapes

    # ------------------------------------------------------------------ one round
    def step(self, iteration: int) -> StepResult:
        total, samples = 0.0, 0
        steps = self.ctx.round_steps()
        for k in range(1, steps + 1):
            loss, n = self.forward_backward()
            self.apply_update()
            if self.ctx.settings.averages_after(k, steps):
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
            prunable_density=self.structure.prunable_density,
            mask_drift=drift,
            frozen=self.frozen,
            packed_bytes=self.structure.packed_bytes,
        )
        return StepResult(total / samples, samples)

    def constrain(self) -> None:
        self.structure.keep(self.params)  # part of the local step, as in PruneX

    def node_average(self) -> None:
        """Mean of the parameters and BN statistics over the node (in place)."""
        topo = self.ctx.topology
        if topo.gpus_per_node == 1:
            return
        tensors = [p.data for p in self.params.values()] + list(self.buffers.values())
        with torch.no_grad():
            self.ctx.comm.all_reduce_into(
                tensors, topo.intra, phase=phases.INTRA_ALLREDUCE, divide_before=topo.gpus_per_node
            )

    @torch.no_grad()
    def prune(self, fraction: float) -> int:
        """Masks of the node mean at this round's keeps, OR-agreed by the leaders (eq. 14 of
        PruneX); returns the number of group bits that changed."""
        keeps = keeps_at(self.targets, fraction)
        with self.ctx.recorder.phase(phases.PROJECTION):
            local = self.structure.select({n: p.data for n, p in self.params.items()}, keeps)
        self.applied = fraction
        drift = self.structure.agree(local)
        if drift:
            with self.ctx.recorder.phase(phases.PROJECTION):
                self.restrict_to_support()
        return drift

    def restrict_to_support(self) -> None:
        """Zero theta and its momentum off the masks (and off the dead slices with ``--pack
        live``); keep them there from now on."""
        self.structure.restrict(self.params, self.optimizer)

    @torch.no_grad()
    def exchange_between_nodes(self) -> None:
        """PruneX's inter-node step on the node means: pack, leaders average, broadcast,
        unpack (zero off the kept slices)."""
        params = {n: p.data for n, p in self.params.items()}
        full_params, full_buffers = self.structure.exchange(
            params, self.buffers, reuse_buffers=self.frozen
        )
        with self.ctx.recorder.phase(phases.UNPACK):  # the consensus into the model
            for name, value in full_params.items():
                params[name].copy_(value)
            for name, value in full_buffers.items():
                self.buffers[name].copy_(value)

    # ------------------------------------------------------------------ interface
    def density(self) -> float:
        return self.structure.density()

    def exchange_every(self) -> dict[str, int]:
        return self.ctx.settings.exchange_every(self.steps_per_iteration)

    def eval_model(self):
        return self.module  # every round ends with the same model on every rank

    def state_dict(self) -> dict:
        return {
            **super().state_dict(),
            "shared_world": {"masks": self.structure.mask_state()},
            "applied": self.applied,
            "frozen": self.frozen,
        }

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.structure.load_mask_state(state["shared_world"]["masks"])
        self.applied, self.frozen = float(state["applied"]), bool(state["frozen"])
        if self.applied > 0:
            self.restrict_to_support()  # theta and momentum are already zero off it

    def artifacts(self) -> dict:
        return self.structure.artifacts()


#: why a magnitude-pruning baseline cannot be simulated
MAGNITUDE_MASKS_NOT_SIMULABLE = ("its masks come from the trained weights' magnitudes, which a "
                                 "replay on stand-in batches does not have")


@METHODS.register(
    "gmp-hier",
    "Gradual magnitude pruning (Zhu & Gupta 2017, cubic schedule to the keep target by "
    "--prune-end) of PruneX's structured groups on hierarchical local SGD at PruneX's round; "
    "node masks OR-agreed and the inter-node exchange packed exactly like PruneX's",
    settings=GMPSettings,
    not_simulable=MAGNITUDE_MASKS_NOT_SIMULABLE,
    look=Look("GMP (hier.)", "#332288", "d"),  # Tol's indigo: apart from PruneX's vermillion
    activity=prunes_across_nodes,
    nightly=True,
)
def make_gmp_hier(ctx: RunContext) -> StructuredLocalSGD:
    end = ctx.settings.prune_end
    return StructuredLocalSGD(ctx, lambda progress: cubic_fraction(progress, end))


@METHODS.register(
    "prune-retrain",
    "Dense hierarchical local SGD for --prune-at of the run, one structured magnitude prune to "
    "the keep target, then training on the fixed support, packed like PruneX's",
    settings=PruneRetrainSettings,
    not_simulable=MAGNITUDE_MASKS_NOT_SIMULABLE,
    look=Look("Prune-retrain", "#882255", "p"),
    activity=prunes_across_nodes,
    nightly=True,
)
def make_prune_retrain(ctx: RunContext) -> StructuredLocalSGD:
    at = ctx.settings.prune_at
    return StructuredLocalSGD(ctx, lambda progress: one_shot_fraction(progress, at))
