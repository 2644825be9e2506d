"""PruneX (Algorithm 1) and its flat-consensus ablation, on the suite's communicator.

Hierarchical (``prunex``), one round k:
  local_compute    H steps of SGD with the proximal term rho1 (theta - z_i + u)      eq. (8)
  intra_allreduce  SUM of theta + u over the node (plus BN statistics)               eq. (9) input
  projection       z~_i (corrected eq. 9), z_i = Pi_S(z~_i), or z~_i * m after freeze eq. (10)
  mask_sync        leaders OR their filter/channel/shape bitmaps (MAX on uint8)      eq. (14)
                   and broadcast the global bitmaps to followers
  pack             leaders: c_i = z_i + v_i, kept [K_out, K_in] slices into buckets  eq. (15)
                   (``--pack live``, the default: only the live slices; the dead ones
                   are zeroed in z_i first, so z is zero there too)
  inter_allreduce  leaders: AVG of the packed buckets                                eq. (11)
  broadcast        leaders -> followers: the packed buckets
  unpack           zero-filled scatter back to full shapes: global z
  dual_update      v_i += z_i - z (eq. 13), u += theta - z_i (eq. 12), residuals, rho balancing

After the freeze (``--after-freeze``): ``admm`` keeps Algorithm 1's round (lines 10-11 and 27:
z_i = z~_i * m, the proximal pull, duals and rho balancing); ``sgd`` reads sec. 4.5's prose,
"standard distributed training on a fixed sparse manifold":
  local_compute    H steps of SGD on the support, no proximal term, the recipe's weight decay
  intra_allreduce  node mean of theta (plus BN statistics)
  pack .. unpack   the same packed exchange of the live slices (the same bytes): global z
  (every rank)     theta := z, so the next round starts from the consensus; no duals

Flat (``prunex-flat``, the paper's "PruneX (AR)"): the same math with one "node" spanning the
world (M=1, P=N, rho2=0): a dense world all-reduce of theta + u, projection after it, no
hierarchy and no shrinkage.

Choices where the paper is silent (see methods/prunex/hsadmm.py for the equation fixes):
  * weight decay is the lambda of eq. (6), applied in the z step; local SGD has none;
  * every parameter tensor is its own block with its own rho1, rho2;
  * BN running statistics are averaged each round alongside (intra SUM/P, then inter AVG):
    the ranks train with them; the evaluated z gets statistics estimated on z itself
    (``--consensus-bn estimated``, the default), since the averaged ones describe the ranks'
    models, not z, and compound across many BN layers when the ranks drift apart;
  * v_i lives on every rank of node i: followers repeat the leader's eq. (13) update from the
    broadcast z, so z_i and v_i stay replicated without extra traffic;
  * the inter-node dual residual is Boyd's rho2 (z^{k+1} - z^k), not the printed
    rho2 (z_i^{k+1} - z^k).

This module holds the round; when the masks freeze and from where the ranks go on is
``FreezePolicy``'s (methods/prunex/freeze.py), the residual math (duals, norms, stopping test,
rho balancing) hsadmm's pure functions.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn

from methods.prunex import hsadmm
from methods.prunex.blocks import admm_blocks, averaged_buffers
from methods.prunex.freeze import FREEZE, FreezePolicy
from methods.prunex.penalties import initial_penalties
from suite.api import (
    WIRE_DTYPES,
    Communicator,
    Method,
    RunContext,
    StepResult,
    StructuredMask,
    StructuredRound,
    phases,
    recalibrate_batchnorm,
    schema,
    unflatten,
)

#: batches of each rank's shard on which the consensus's BatchNorm statistics are estimated
CONSENSUS_BN_BATCHES = 8


def proximal_weight(lr: float, rho: float) -> float:
    """theta <- (theta + lr rho a) / (1 + lr rho) is lerp(theta, a, lr rho / (1 + lr rho))."""
    return lr * rho / (1.0 + lr * rho)


class PruneX(Method):
    """Algorithm 1 on the suite's communicator; ``hierarchical=False`` is the flat ablation.

    Args:
        ctx: the run's context; ``ctx.settings`` (PruneXSettings or PruneXFlatSettings) is
            read where it is used, not copied.
        hierarchical: two levels (nodes of ``gpus_per_node`` ranks, leaders across nodes), or
            one consensus over the world.
    """

    def __init__(self, ctx: RunContext, *, hierarchical: bool):
        self.ctx = ctx
        topo = ctx.topology
        self.hierarchical = hierarchical
        self.settings = settings = ctx.settings

        self.steps_per_iteration = ctx.local_steps_per_round()
        # theta averaged in the node every K local steps and at the round's end, so the node
        # enters the consensus as one ADMM worker (see average_in_node); K >= H: never
        period = settings.intra_average_period
        self.node_averaging = 0 < period < self.steps_per_iteration and topo.gpus_per_node > 1

        if hierarchical:
            self.num_nodes, self.procs, self.group = topo.num_nodes, topo.gpus_per_node, topo.intra
        else:  # one "node" spanning the world (M=1, P=N)
            self.num_nodes, self.procs, self.group = 1, topo.world_size, topo.world

        self.model = ctx.model
        named = dict(self.model.named_parameters())
        self.blocks = admm_blocks(self.model)
        self.params = [named[b.name] for b in self.blocks]
        self.named_params = self.named(self.params)
        self.buffer_names = averaged_buffers(self.model)
        buffers = dict(self.model.named_buffers())
        self.buffers = [buffers[n] for n in self.buffer_names]

        with torch.no_grad():
            self.z_node = [p.detach().clone() for p in self.params]  # z_i
            self.z = [p.detach().clone() for p in self.params]  # global z
            self.u = [torch.zeros_like(p) for p in self.params]
            self.v = [torch.zeros_like(p) for p in self.params]
        rho1, rho2 = initial_penalties(settings, lr=ctx.recipe.lr, hierarchical=hierarchical,
                                       local_steps=self.steps_per_iteration)
        self.initial_penalties = {"rho1": rho1, "rho2": rho2} if hierarchical else {"rho1": rho1}
        self.rho1, self.rho2 = [rho1] * len(self.blocks), [rho2] * len(self.blocks)
        # masks keyed by conv weight name, their live slices, the support and the packed
        # exchange: the structured round PruneX shares with the pruning baselines
        self.structure = StructuredRound(
            ctx, self.model, settings if hierarchical else None, keeps=settings.keeps,
            hierarchical=hierarchical,
            wire_dtype=WIRE_DTYPES[settings.wire_dtype] if hierarchical else torch.float32,
            sharded=hierarchical and settings.leader_mode == "sharded",
        )
        self.constrained = bool(self.masks)  # conv weights, heads or neurons to prune
        self.structured_bits = self.structure.structured_bits()  # of the sets with a keep
        self.freeze_policy = FreezePolicy(ctx, structured_bits=self.structured_bits)

        self.consensus = copy.deepcopy(self.model)  # the model evaluated: z and its BN stats
        # z's own BN statistics (--consensus-bn estimated) are estimated when it is evaluated,
        # once per new z: the averaged ones describe the ranks' models, not z
        self.estimate_bn = settings.consensus_bn == "estimated" and any(
            isinstance(m, nn.modules.batchnorm._BatchNorm) for m in self.model.modules()
        )
        self.consensus_bn_current = False
        self.optimizer = torch.optim.SGD(self.params, lr=ctx.recipe.lr,
                                         momentum=ctx.recipe.momentum, weight_decay=0.0)
        self.batches = iter(ctx.loader)
        self.loss_fn = nn.CrossEntropyLoss()
        if settings.masks_from is not None:  # retrain a known structure: frozen from round 0
            self.structure.use_masks(self.structure.load(settings.masks_from))
            self.freeze(rounds_done=0)
        elif self.constrained and not self.structure.can_prune():
            self.freeze(rounds_done=0)  # keeps that remove nothing: no structure to discover

    @property
    def masks(self) -> dict[str, StructuredMask]:
        """The agreed masks, by conv weight name."""
        return self.structure.masks

    @property
    def frozen(self) -> bool:
        """Whether the masks are fixed (sec. 4.5); the freeze policy's to say."""
        return self.freeze_policy.frozen

    @property
    def warnings(self) -> list[str]:
        """What went wrong without stopping the run, for summary.json (the freeze policy's)."""
        return self.freeze_policy.warnings

    def named(self, tensors: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        """Per-block tensors (theta, u, z_i, ...) by parameter name."""
        return {block.name: t for block, t in zip(self.blocks, tensors)}

    # ------------------------------------------------------------------ round phases
    @property
    def admm_round(self) -> bool:
        """Whether this round is Algorithm 1's (always before the freeze; after it with
        ``--after-freeze admm``)."""
        return not self.frozen or self.settings.after_freeze == "admm"

    def local_compute(self) -> tuple[float, int]:
        """Eq. (8) by proximal SGD: the optimizer's step on f_ij, then the exact proximal step
        of rho1/2 ||theta - (z_i - u)||^2 (see methods/prunex/penalties.py for why the
        penalty does not go through the momentum). The proximal step uses the recipe's peak
        lr: the schedule anneals the gradient noise of f, while the exact step of the
        deterministic penalty is stable at any size, so a round pulls the same all run."""
        device = self.ctx.device
        proximal = self.admm_round
        if proximal:
            with torch.no_grad():
                anchors = torch._foreach_sub(self.z_node, self.u)  # z_i - u, fixed for the round
            weights = [proximal_weight(self.ctx.recipe.lr, rho) for rho in self.rho1]
        # the loss stays on the device (float64, as a Python sum would be) and is read once
        total, samples = torch.zeros((), dtype=torch.float64, device=device), 0
        steps = self.ctx.round_steps()
        # flat ADMM rounds average at the round's end too (hierarchical ones derive that
        # average from the intra-node sum that follows, see node_mean_from_sum)
        average_at_end = self.node_averaging and proximal and not self.hierarchical
        for step in range(1, steps + 1):
            x, y = next(self.batches)
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            self.optimizer.zero_grad(set_to_none=True)
            loss = self.loss_fn(self.model(x), y)
            loss.backward()
            self.ctx.apply_lr(self.optimizer)
            self.optimizer.step()
            if proximal:
                with torch.no_grad():
                    torch._foreach_lerp_(self.params, anchors, weights)
            self.structure.keep(self.named_params)
            total += loss.detach().double() * len(y)
            samples += len(y)
            if self.node_averaging and (
                self.settings.averages_after(step, steps) or (average_at_end and step == steps)
            ):
                self.average_in_node()
        return total / samples, samples

    def average_in_node(self) -> None:
        """theta and the BN statistics := their node mean (intra-node bytes only).

        What it means for H-SADMM (eq. 6): averaging the P ranks' proximal SGD iterates every
        K steps is local SGD on the node's joint subproblem min_theta sum_j f_ij(theta) +
        P rho1/2 ||theta - z_i + u_i||^2, i.e. eq. (7) with the intra-node constraint
        theta_ij = theta_i held exactly instead of through rho1. With theta equal in the node
        at every round's end and u = 0 at the start, eq. (12) keeps u_ij = u_i replicated, so
        the node is one ADMM worker with penalty P rho1: eq. (9)'s sum over j is
        P (theta_i + u_i), the intra-node primal residual theta_i - z_i is the node model's
        distance to its projection (no longer the ranks' disagreement), and the residual
        norms summed over the world count each node P times."""
        topo = self.ctx.topology
        with torch.no_grad():
            self.ctx.comm.all_reduce_into(
                [p.detach() for p in self.params] + self.buffers,
                topo.intra,
                phase=phases.INTRA_ALLREDUCE,
                divide_before=topo.gpus_per_node,
            )

    @torch.no_grad()
    def node_mean_from_sum(self, theta_u_sum: list[torch.Tensor]) -> None:
        """theta := sum_j (theta_ij + u_ij) / P - u_i, the node mean of theta at no cost, as
        u is replicated in the node (see average_in_node); the same bits on every rank of
        the node, since the sum is."""
        mean = torch._foreach_div(theta_u_sum, self.procs)
        torch._foreach_sub_(mean, self.u)
        torch._foreach_copy_(self.params, mean)

    def consensus_sum(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """SUM over the consensus group of theta + u (of theta alone in an ``sgd`` round),
        and the group mean of BN statistics: views into one fresh buffer of this round, which
        the caller may overwrite (eq. 9 and the projection work in place in it)."""
        phase = phases.INTRA_ALLREDUCE if self.hierarchical else phases.ALLREDUCE
        with torch.no_grad(), self.ctx.recorder.phase(phase):  # written into one flat buffer
            theta = [p.detach() for p in self.params]
            like = theta + self.buffers
            flat = torch.empty(sum(t.numel() for t in like), dtype=theta[0].dtype,
                               device=theta[0].device)
            parts = unflatten(flat, like)
            params, buffers = parts[: len(theta)], parts[len(theta) :]
            torch._foreach_copy_(params, theta)
            if self.admm_round:
                torch._foreach_add_(params, self.u)
            for part, buffer in zip(buffers, self.buffers):
                torch.div(buffer, self.procs, out=part)
        self.ctx.comm.all_reduce(flat, self.group, phase=phase)
        return params, buffers

    def node_update(self, theta_u_sum) -> tuple[list[torch.Tensor], dict]:
        """Corrected eq. (9), then eq. (10) over every structured set (conv weights, and
        heads or neurons), or masking once frozen (Algorithm 1 line 11)."""
        z_node = [
            hsadmm.node_candidate(
                theta_u_sum[i], self.z[i], self.v[i], rho1=self.rho1[i], rho2=self.rho2[i],
                lam=self.ctx.recipe.weight_decay, num_nodes=self.num_nodes,
                procs_per_node=self.procs,
                in_place=True,  # the sum is this round's own buffer
            )
            for i in range(len(self.blocks))
        ]
        local_masks = {}
        if self.constrained:
            if self.frozen:
                self.structure.apply(self.named(z_node))
            else:
                local_masks = self.structure.project(self.named(z_node))
        return z_node, local_masks

    def global_consensus(self, z_node, buffer_mean) -> tuple[list, list]:
        """Pack z_i + v_i (z_i alone in an ``sgd`` round) and the BN means, average between
        nodes (eq. 11), spread in the node, unpack: the global z. Once frozen the buckets are
        allocated once (sec. 4.5). Flat (one node): z_i is the global z."""
        if not self.hierarchical:
            return z_node, list(buffer_mean)
        z, buffers = self.structure.exchange(
            self.named(z_node),
            dict(zip(self.buffer_names, buffer_mean)),
            plus=self.named(self.v) if self.admm_round else None,
            reuse_buffers=self.frozen,
        )
        return [z[b.name] for b in self.blocks], [buffers[n] for n in self.buffer_names]

    # ------------------------------------------------------------------ one round
    def step(self, iteration: int) -> StepResult:
        """One round of Algorithm 1 (the module docstring's phases), or an ``sgd`` round
        after the freeze; the masks' agreement feeds the freeze policy, which may freeze them
        at the round's end (its iteration is then one-off)."""
        if not self.admm_round:
            return self.sgd_round()
        rec = self.ctx.recorder
        with rec.phase(phases.LOCAL_COMPUTE):
            loss, samples = self.local_compute()
        theta_u_sum, buffer_mean = self.consensus_sum()
        if self.node_averaging and self.hierarchical:
            with rec.phase(phases.INTRA_ALLREDUCE):
                self.node_mean_from_sum(theta_u_sum)
        with rec.phase(phases.PROJECTION), torch.no_grad():
            z_node, local_masks = self.node_update(theta_u_sum)

        drift = 0
        if not self.frozen and self.constrained:
            drift = self.structure.agree(local_masks)  # a new layout when the masks changed
            self.freeze_policy.observe(iteration, drift, self.rho1)
        with rec.phase(phases.PROJECTION):
            self.structure.zero_dead(self.named(z_node))  # dead slices are zero in z_i
        z, buffers = self.global_consensus(z_node, buffer_mean)

        with rec.phase(phases.DUAL_UPDATE), torch.no_grad():
            stats = self.dual_update(z_node, z)
        self.ctx.comm.all_reduce(stats, self.ctx.topology.world, phase=phases.DUAL_UPDATE)
        with rec.phase(phases.DUAL_UPDATE), torch.no_grad():
            converged = self.balance_and_check(iteration, stats)
            self.adopt_consensus(z, buffers)

        was_frozen = self.frozen
        if not self.frozen and self.constrained and self.freeze_policy.due(iteration):
            with rec.phase(FREEZE):  # theta, momentum and u onto the support; where to start
                self.freeze(rounds_done=iteration + 1)
        rec.set(
            density=self.density(), prunable_density=self.structure.prunable_density,
            mask_drift=drift,
            mask_drift_fraction=drift / self.structured_bits if self.structured_bits else 0.0,
            frozen=was_frozen, packed_bytes=self.structure.packed_bytes,
            rho1_mean=sum(self.rho1) / len(self.rho1), rho2_mean=sum(self.rho2) / len(self.rho2),
        )
        return StepResult(loss, samples, converged, one_off=self.frozen and not was_frozen)

    def freeze(self, *, rounds_done: int) -> None:
        """Fix the masks (sec. 4.5): theta, u and the momentum onto the support. With
        ``--after-freeze sgd`` the ranks continue on the support from where the freeze
        policy chooses (``FreezePolicy.choose_start``) and train with the recipe's weight
        decay from here on."""
        self.freeze_policy.fix(rounds_done)
        self.restrict_to_support()
        if self.settings.after_freeze == "sgd":
            if rounds_done > 0:  # before the first round theta is z on every rank
                start = self.freeze_policy.choose_start(self.consensus, self.model)
                if start == "consensus":
                    with torch.no_grad():
                        torch._foreach_copy_(self.params, self.z)  # z is zero off the support
            for group in self.optimizer.param_groups:
                group["weight_decay"] = self.ctx.recipe.weight_decay

    def sgd_round(self) -> StepResult:
        """``--after-freeze sgd``: local SGD on the support, the node mean of theta, the same
        packed exchange between nodes, and theta := z on every rank. No proximal term, duals,
        residuals or penalties: standard distributed training on a fixed sparse manifold."""
        rec = self.ctx.recorder
        with rec.phase(phases.LOCAL_COMPUTE):
            loss, samples = self.local_compute()
        self.average_models()
        rec.set(
            density=self.density(), prunable_density=self.structure.prunable_density,
            mask_drift=0, mask_drift_fraction=0.0, frozen=True,
            packed_bytes=self.structure.packed_bytes,
        )
        return StepResult(loss, samples, False)

    def average_models(self) -> None:
        """The ``sgd`` round's exchange: node mean of theta, the packed average between
        nodes, and theta := z on every rank."""
        theta_sum, buffer_mean = self.consensus_sum()
        with torch.no_grad(), self.ctx.recorder.phase(phases.PROJECTION):
            z_node = [t.div_(self.procs) for t in theta_sum]  # the node's mean model
            self.structure.zero_dead(self.named(z_node))
        z, buffers = self.global_consensus(z_node, buffer_mean)
        with torch.no_grad(), self.ctx.recorder.phase(phases.UNPACK):  # z into every model
            for param, value in zip(self.params, z):
                param.copy_(value)
            self.z_node, self.z = z_node, z  # fresh tensors: no copy needed
            self.adopt_consensus(z, buffers)

    @torch.no_grad()
    def adopt_consensus(self, z, buffers) -> None:
        """The averaged BN statistics into the model, and z with them into the evaluated
        consensus model."""
        for target, value in zip(self.buffers, buffers):
            target.copy_(value)
        consensus_params = dict(self.consensus.named_parameters())
        for block, value in zip(self.blocks, z):
            consensus_params[block.name].data.copy_(value)
        consensus_buffers = dict(self.consensus.named_buffers())
        for name, value in zip(self.buffer_names, buffers):
            consensus_buffers[name].copy_(value)
        self.consensus_bn_current = False  # a new z: its statistics are the ranks' again

    def restrict_to_support(self) -> None:
        """Retraining on the fixed support (sec. 4.5, Algorithm 1 line 11 onwards).

        Once the masks freeze, the problem is "standard distributed training on a fixed
        sparse manifold": theta, its momentum and u are zeroed off the global mask (and off
        the dead slices with ``--pack live``) and theta is kept there after every local step,
        so local training trains the pruned network itself (as in StructADMM's masked
        retraining, ref. [45]) and BN statistics come from the network that is evaluated.
        """
        self.structure.restrict(self.named_params, self.optimizer, self.named(self.u))

    def dual_update(self, z_node, z) -> torch.Tensor:
        """Eqs. (12)-(13) on this rank's duals and the local pieces of the residual norms
        (``hsadmm.dual_update``'s table, summed over the world by the caller); the new z_i
        and z then replace the old ones, whose memory held the differences."""
        stats = hsadmm.dual_update(
            [p.detach() for p in self.params], z_node, z, u=self.u, v=self.v,
            z_node_old=self.z_node, z_old=self.z, hierarchical=self.hierarchical,
            leader=self.ctx.topology.is_leader or not self.hierarchical,
            stopping=self.settings.eps_abs is not None,
        )
        self.z_node = z_node
        self.z = [t.clone() for t in z] if not self.hierarchical else z
        return stats

    def balance_and_check(self, iteration: int, stats: torch.Tensor) -> bool:
        """Per block, from the world-summed residual table: the layer rows, Boyd's stopping
        test (with ``--eps-abs``; None runs every round) and residual balancing of rho1, rho2
        (``--adaptive-rho``). Returns whether every block passed the test."""
        settings, topo = self.settings, self.ctx.topology
        stopping = settings.eps_abs is not None
        rows, converged = [], stopping
        host = stats.tolist()  # one transfer for every block's residual pieces
        for i, block in enumerate(self.blocks):
            row = hsadmm.scale_duals(host[i], self.rho1[i], self.rho2[i])
            r_intra, s_intra, r_inter, s_inter = hsadmm.residual_norms(
                row, hierarchical=self.hierarchical
            )
            if stopping:
                converged = converged and hsadmm.within_tolerance(
                    row, math.prod(block.shape), world_size=topo.world_size,
                    num_nodes=self.num_nodes, procs_per_node=self.procs,
                    hierarchical=self.hierarchical, eps_abs=settings.eps_abs,
                    eps_rel=settings.eps_rel,
                )
            rows.append({
                schema.ITERATION: iteration, schema.LAYER: block.name,
                schema.CONSTRAINED: block.constrained, schema.R_INTRA: r_intra,
                schema.S_INTRA: s_intra, schema.R_INTER: r_inter, schema.S_INTER: s_inter,
                schema.RHO1: self.rho1[i], schema.RHO2: self.rho2[i],
                schema.DENSITY: self.structure.densities.get(block.name, 1.0),
            })
            if settings.adaptive_rho:  # scaled duals rescaled with their penalty
                rho_max = settings.rho_max
                self.rho1[i] = hsadmm.rebalance(self.rho1[i], self.u[i], r_intra, s_intra,
                                                rho_max=rho_max)
                if self.hierarchical:
                    self.rho2[i] = hsadmm.rebalance(self.rho2[i], self.v[i], r_inter, s_inter,
                                                    rho_max=rho_max)
        if topo.rank == 0:
            self.ctx.recorder.add_layer_rows(rows)
        return converged

    # ------------------------------------------------------------------ interface
    def density(self) -> float:
        """Fraction of the pruned tensors' elements the agreed masks keep."""
        return self.structure.density()

    def resolved_settings(self) -> dict:
        """The initial penalties, derived from the round pull unless given."""
        return self.initial_penalties

    def exchange_every(self) -> dict[str, int]:
        """Node averaging every ``--intra-average-period`` steps where it runs inside a
        round, else one intra- and one inter-node exchange per round."""
        schedule = self.settings.exchange_every(self.steps_per_iteration)
        if not self.node_averaging:  # one node, or a period of a round or more
            schedule[schema.EXCHANGE_INTRA] = self.steps_per_iteration
        return schedule

    def summary_facts(self) -> dict:
        """The freeze point; and, at the end of the run, a warning when the evaluated
        consensus prunes something but never trained on its support
        (``FreezePolicy.warn_untrained_support``)."""
        prunes = self.constrained and self.density() < 1.0
        self.freeze_policy.warn_untrained_support(prunes)
        return self.freeze_policy.facts()

    def process_groups(self) -> list:
        """The structured round's own groups (the sharded leaders'), connected early."""
        return self.structure.process_groups()

    def eval_model(self, comm: Communicator | None = None) -> nn.Module:
        """The consensus z, with BatchNorm statistics of z itself unless ``--consensus-bn
        averaged`` (collective: every rank calls it, at the same point). ``comm``: inside a
        step (the freeze's choice) the statistics' all-reduce is the method's traffic and is
        recorded through it; evaluations leave it unrecorded bookkeeping."""
        if self.estimate_bn and not self.consensus_bn_current:
            batches = self.ctx.loader.calibration_batches(CONSENSUS_BN_BATCHES)
            recalibrate_batchnorm(self.consensus, batches, self.ctx.topology.world,
                                  self.ctx.device, comm=comm, phase=phases.PROJECTION)
            self.consensus_bn_current = True
        return self.consensus

    def state_dict(self) -> dict:
        """theta, u and the momentum are the rank's own; z_i and v_i are replicated in the node
        and z, the consensus model, the penalties and the masks in the world (the checkpoint
        stores shared state once per node or world)."""
        return {
            "theta": self.model.state_dict(),
            "u": self.u,
            "optimizer": self.optimizer.state_dict(),
            "shared_node": {"z_node": self.z_node, "v": self.v},
            "shared_world": {"z": self.z, "consensus": self.consensus.state_dict(),
                             "masks": self.structure.mask_state()},
            "rho1": self.rho1,
            "rho2": self.rho2,
            **self.freeze_policy.state_dict(),  # frozen, frozen_at, ..., warnings
        }

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        """The pack layout and its buffers are rebuilt from the masks on the next round;
        they hold no state of their own."""
        device = self.ctx.device
        node, world = state["shared_node"], state["shared_world"]
        self.model.load_state_dict(state["theta"])
        self.consensus.load_state_dict(world["consensus"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.u = [t.to(device) for t in state["u"]]
        self.z_node = [t.to(device) for t in node["z_node"]]
        self.v = [t.to(device) for t in node["v"]]
        self.z = [t.to(device) for t in world["z"]]
        self.rho1, self.rho2 = list(state["rho1"]), list(state["rho2"])
        self.structure.load_mask_state(world["masks"])  # the pack layout is rebuilt on use
        self.consensus_bn_current = False  # estimated again, from z and the same batches
        self.freeze_policy.load_state_dict(state)
        if self.frozen:
            self.restrict_to_support()  # theta, u and momentum are already zero off it

    def artifacts(self) -> dict:
        """The agreed masks (masks.pt), to retrain or export the pruned network."""
        return self.structure.artifacts()
