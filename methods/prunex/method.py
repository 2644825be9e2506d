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
"""

from __future__ import annotations

import copy
import math
import sys

import torch
from torch import nn

from methods.prunex import hsadmm
from methods.prunex.blocks import admm_blocks, averaged_buffers
from methods.prunex.penalties import initial_penalties
from suite.api import (
    WIRE_DTYPES,
    Communicator,
    Method,
    RunContext,
    StepResult,
    StructuredMask,
    StructuredRound,
    declare_phase,
    phases,
    recalibrate_batchnorm,
    unflatten,
)

#: batches of each rank's shard on which the consensus's BatchNorm statistics are estimated
CONSENSUS_BN_BATCHES = 8
#: samples of each rank's shard on which the freeze decision compares its two candidates
#: (whole batches, at least one): a fixed count, so the decision costs the same few forward
#: passes whatever the run's length (two per sample: one per candidate)
FREEZE_CALIBRATION_SAMPLES = 64
#: the freeze, timed apart from every round's phases: the masks fixed, theta, u and momentum
#: onto the support, and the choice of where the sgd rounds start; once per run, so its
#: iteration is one-off (StepResult.one_off) and steady means leave it out
FREEZE = declare_phase("freeze", "#EE7733", communication=False)
#: drift (fraction of the structured bits) and rounds in a row that count as oscillation
OSCILLATION_DRIFT = 0.5
OSCILLATION_ROUNDS = 3


def proximal_weight(lr: float, rho: float) -> float:
    """theta <- (theta + lr rho a) / (1 + lr rho) is lerp(theta, a, lr rho / (1 + lr rho))."""
    return lr * rho / (1.0 + lr * rho)


class PruneX(Method):
    def __init__(self, ctx: RunContext, *, hierarchical: bool):
        self.ctx = ctx
        topo = ctx.topology
        self.hierarchical = hierarchical
        settings = ctx.settings
        self.keeps = settings.keeps
        self.rho_max = settings.rho_max
        self.eps_abs = settings.eps_abs  # None: no early stop, run every round
        self.eps_rel = settings.eps_rel
        self.adaptive = settings.adaptive_rho
        self.freeze_round = settings.freeze_round
        # The paper freezes "once topological stability is detected" (sec. 4.5; drift reaches
        # zero within 5-15 rounds): by default, after 3 consecutive unchanged rounds.
        self.freeze_patience = settings.freeze_patience
        self.freeze_epoch = settings.freeze_epoch
        self.freeze_share = settings.freeze_share
        self.after_freeze = settings.after_freeze
        self.freeze_start = settings.freeze_start
        self.frozen_at: dict | None = None  # round and samples per rank at the freeze
        self.lam = ctx.recipe.weight_decay

        self.steps_per_iteration = ctx.local_steps_per_round()
        # theta averaged in the node every K local steps and at the round's end, so the node
        # enters the consensus as one ADMM worker (see average_in_node); K >= H: never
        period = settings.intra_average_period
        self.node_averaging = 0 < period < self.steps_per_iteration and topo.gpus_per_node > 1

        if hierarchical:
            self.num_nodes, self.procs = topo.num_nodes, topo.gpus_per_node
            self.group = topo.intra
        else:
            self.num_nodes, self.procs = 1, topo.world_size
            self.group = topo.world

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
        rho1, rho2 = initial_penalties(
            settings,
            lr=ctx.recipe.lr,
            local_steps=self.steps_per_iteration,
            hierarchical=hierarchical,
        )
        self.initial_penalties = {"rho1": rho1, "rho2": rho2} if hierarchical else {"rho1": rho1}
        self.rho1 = [rho1] * len(self.blocks)
        self.rho2 = [rho2] * len(self.blocks)
        # masks keyed by conv weight name, their live slices, the support and the packed
        # exchange: the structured round PruneX shares with the pruning baselines
        self.structure = StructuredRound(
            ctx,
            self.model,
            settings if hierarchical else None,
            keeps=self.keeps,
            hierarchical=hierarchical,
            wire_dtype=WIRE_DTYPES[settings.wire_dtype] if hierarchical else torch.float32,
            sharded=hierarchical and settings.leader_mode == "sharded",
        )
        self.constrained = bool(self.masks)  # conv weights, heads or neurons to prune
        self.frozen = False
        self.stable_rounds = 0
        self.structured_bits = self.structure.structured_bits()  # of the sets with a keep
        self.oscillating_rounds = 0  # consecutive rounds with drift above OSCILLATION_DRIFT
        self.warnings: list[str] = []  # for summary.json

        self.consensus = copy.deepcopy(self.model)  # the model evaluated: z and its BN stats
        # z's own BN statistics (--consensus-bn estimated) are estimated when it is evaluated,
        # once per new z: the averaged ones describe the ranks' models, not z
        self.estimate_bn = settings.consensus_bn == "estimated" and any(
            isinstance(m, nn.modules.batchnorm._BatchNorm) for m in self.model.modules()
        )
        self.consensus_bn_current = False
        self.optimizer = torch.optim.SGD(
            self.params, lr=ctx.recipe.lr, momentum=ctx.recipe.momentum, weight_decay=0.0
        )
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

    def named(self, tensors: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        """Per-block tensors (theta, u, z_i, ...) by parameter name."""
        return {block.name: t for block, t in zip(self.blocks, tensors)}

    # ------------------------------------------------------------------ round phases
    @property
    def admm_round(self) -> bool:
        """Whether this round is Algorithm 1's (always before the freeze; after it with
        ``--after-freeze admm``)."""
        return not self.frozen or self.after_freeze == "admm"

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
                self.ctx.settings.averages_after(step, steps) or (average_at_end and step == steps)
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
                theta_u_sum[i],
                self.z[i],
                self.v[i],
                rho1=self.rho1[i],
                rho2=self.rho2[i],
                lam=self.lam,
                num_nodes=self.num_nodes,
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
            self.stable_rounds = self.stable_rounds + 1 if drift == 0 and iteration > 0 else 0
            self.watch_oscillation(drift)
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
        if not self.frozen and self.constrained and self.freeze_due(iteration):
            with rec.phase(FREEZE):  # theta, momentum and u onto the support; where to start
                self.freeze(rounds_done=iteration + 1)
        rec.set(
            density=self.density(),
            prunable_density=self.structure.prunable_density,
            mask_drift=drift,
            mask_drift_fraction=drift / self.structured_bits if self.structured_bits else 0.0,
            frozen=was_frozen,
            packed_bytes=self.structure.packed_bytes,
            rho1_mean=sum(self.rho1) / len(self.rho1),
            rho2_mean=sum(self.rho2) / len(self.rho2),
        )
        return StepResult(loss, samples, converged, one_off=self.frozen and not was_frozen)

    def freeze_due(self, iteration: int) -> bool:
        """After ``--freeze-round`` rounds, at the end of the round that reaches
        ``--freeze-epoch`` epochs of the shard or ``--freeze-share`` of the run's local
        steps, or after ``--freeze-patience`` unchanged rounds, whichever comes first."""
        loader = self.ctx.loader
        by_round = self.freeze_round is not None and iteration + 1 >= self.freeze_round
        by_epoch = (
            self.freeze_epoch is not None
            and loader.step >= self.freeze_epoch * loader.steps_per_epoch
        )
        share_steps = self.freeze_share * (self.ctx.budget_steps or math.inf)
        by_share = self.freeze_share < 1 and loader.step >= share_steps
        by_patience = self.stable_rounds >= self.freeze_patience
        return by_round or by_epoch or by_share or by_patience

    def freeze(self, *, rounds_done: int) -> None:
        """Fix the masks (sec. 4.5). With ``--after-freeze sgd`` the ranks continue on the
        support from where ``--freeze-start`` says (see ``start_after_freeze``) and train with
        the recipe's weight decay from here on."""
        self.frozen = True
        loader = self.ctx.loader
        self.frozen_at = {
            "round": rounds_done,
            "samples_per_rank": loader.step * loader.batch_size,
            "epoch": loader.step / loader.steps_per_epoch,
        }
        self.restrict_to_support()
        if self.after_freeze == "sgd":
            if rounds_done > 0:  # before the first round theta is z on every rank
                self.frozen_at.update(self.start_after_freeze())
            for group in self.optimizer.param_groups:
                group["weight_decay"] = self.lam

    def start_after_freeze(self) -> dict:
        """Where the sgd rounds start: the consensus z (theta := z) or the ranks' own theta on
        the support (each its node's mean with node averaging; the first sgd round's packed
        exchange makes the world agree). Why not always z: before the freeze z is the
        projection of a weighted mean of the ranks' theta + u, and while the ranks are far
        apart (early rounds, a large lr) that mean can classify at chance while each rank's
        model does not; restarting every rank from it throws their training away. ``better``
        compares the two on the same calibration samples (``FREEZE_CALIBRATION_SAMPLES`` per
        rank), world-averaged, and keeps z on a tie.

        The comparison is bounded by design: one forward pass per candidate and sample, no
        copy of a model, no pass that only estimates BatchNorm statistics. Each candidate's
        BN layers normalize with the statistics of the batch in front of them, which is what
        statistics re-estimated on those batches would give (z's own, rather than the ranks'
        averaged ones that describe other models) without the pass that estimates them."""
        choice = self.freeze_start
        found = {}
        if choice == "better":
            losses = torch.stack([self.calibration_loss(self.consensus),
                                  self.calibration_loss(self.model)])
            self.ctx.comm.all_reduce(losses, self.ctx.topology.world, phase=FREEZE)
            consensus, ranks = (losses / self.ctx.topology.world_size).tolist()
            choice = "consensus" if consensus <= ranks else "ranks"
            found = {"consensus_loss": consensus, "ranks_loss": ranks}
        if choice == "consensus":
            with torch.no_grad():
                torch._foreach_copy_(self.params, self.z)  # z is zero off the support
        return {"start": choice, **found}

    @torch.no_grad()
    def calibration_loss(self, model: nn.Module) -> torch.Tensor:
        """Mean cross-entropy of ``model`` on this rank's first ``FREEZE_CALIBRATION_SAMPLES``
        calibration samples, in eval mode but for its BatchNorm layers, which normalize with
        each batch's own statistics; their running statistics are left as they were."""
        loader, device = self.ctx.loader, self.ctx.device
        count = max(1, FREEZE_CALIBRATION_SAMPLES // loader.batch_size)
        batches, labels = loader.calibration_batches(count), loader.calibration_labels(count)
        norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        kept = [{k: v.clone() for k, v in m.state_dict().items()} for m in norms]
        was_training = model.training
        model.eval()
        for norm in norms:
            norm.train()
        total = torch.zeros((), dtype=torch.float64, device=device)
        for x, y in zip(batches, labels):
            total += self.loss_fn(model(x.to(device)), y.to(device)).double()
        model.train(was_training)
        for norm, state in zip(norms, kept):
            norm.load_state_dict(state)
        return total / max(1, len(batches))

    def sgd_round(self) -> StepResult:
        """``--after-freeze sgd``: local SGD on the support, the node mean of theta, the same
        packed exchange between nodes, and theta := z on every rank. No proximal term, duals,
        residuals or penalties: standard distributed training on a fixed sparse manifold."""
        rec = self.ctx.recorder
        with rec.phase(phases.LOCAL_COMPUTE):
            loss, samples = self.local_compute()
        self.average_models()
        rec.set(
            density=self.density(),
            prunable_density=self.structure.prunable_density,
            mask_drift=0,
            mask_drift_fraction=0.0,
            frozen=True,
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

    def watch_oscillation(self, drift: int) -> None:
        """Warn once when the masks keep swapping: drift above half the structured bits for
        OSCILLATION_ROUNDS rounds in a row means the penalties cannot hold theta near its
        anchor over a round (see methods/prunex/penalties.py)."""
        high = self.structured_bits and drift > OSCILLATION_DRIFT * self.structured_bits
        self.oscillating_rounds = self.oscillating_rounds + 1 if high else 0
        if self.oscillating_rounds == OSCILLATION_ROUNDS and not self.warnings:
            message = (
                f"masks oscillate: penalties too weak for lr*H (mask drift above "
                f"{OSCILLATION_DRIFT:.0%} of the {self.structured_bits} structured bits for "
                f"{OSCILLATION_ROUNDS} rounds; mean rho1 {sum(self.rho1) / len(self.rho1):.3g});"
                " raise --round-pull or --rho1"
            )
            self.warnings.append(message)
            if self.ctx.topology.rank == 0:
                print(f"warning: {message}", file=sys.stderr, flush=True)

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
        """Eqs. (12)-(13) and the local pieces of the residual norms (summed over the world):
        a (blocks, 9) float64 table of squared norms, each column from one batched reduction
        over every block (``_foreach_norm``, a multi-tensor kernel on CUDA), then one stack.
        The penalties' rho^2 factors are applied on the host after the world sum (rho is the
        same on every rank), so the round holds no host-to-device copy.

        Columns: 0 ||theta - z_i||^2, 1 ||z_i - z_i^old||^2, 5 ||z_i - z||^2 and
        6 ||z - z^old||^2 (the residuals, for rho balancing and the layer rows), and only
        where a stopping test is asked (``--eps-abs``) its tolerances' 2 ||theta||^2,
        3 ||z_i||^2, 4 ||u||^2, 7 ||z||^2, 8 ||v||^2. Columns 5-8 are the leaders'
        (hierarchical); a piece a rank does not hold is zero."""
        leader = self.ctx.topology.is_leader or not self.hierarchical
        stopping = self.eps_abs is not None
        theta = [p.detach() for p in self.params]
        stats = torch.zeros(len(self.blocks), 9, dtype=torch.float64, device=self.ctx.device)

        def squared_norms(column: int, tensors) -> None:
            stats[:, column] = torch.stack(torch._foreach_norm(tensors)).double().square()

        r_intra = torch._foreach_sub(theta, z_node)
        squared_norms(0, r_intra)
        torch._foreach_add_(self.u, r_intra)  # eq. (12)
        del r_intra
        # ||z_i - z_i^old|| as ||z_i^old - z_i||, in the old tensors: no longer needed
        torch._foreach_sub_(self.z_node, z_node)
        squared_norms(1, self.z_node)
        if stopping:
            squared_norms(2, theta)
            squared_norms(3, z_node)
            squared_norms(4, self.u)
        if self.hierarchical:
            r_inter = torch._foreach_sub(z_node, z)
            torch._foreach_add_(self.v, r_inter)  # eq. (13)
            if leader:
                squared_norms(5, r_inter)
            del r_inter
            if leader:
                torch._foreach_sub_(self.z, z)  # likewise
                squared_norms(6, self.z)
                if stopping:
                    squared_norms(7, z)
                    squared_norms(8, self.v)
        self.z_node = z_node  # the old tensors held differences: replaced, not reused
        self.z = [t.clone() for t in z] if not self.hierarchical else z
        return stats

    def balance_and_check(self, iteration: int, stats: torch.Tensor) -> bool:
        """Boyd's stopping test per layer and level (with ``--eps-abs``), and residual
        balancing of rho1, rho2."""
        stopping = self.eps_abs is not None
        rows, converged = [], stopping
        host = stats.tolist()  # one transfer for every block's residual pieces
        for i, block in enumerate(self.blocks):
            s = host[i]
            for column, rho in ((1, self.rho1[i]), (4, self.rho1[i]), (6, self.rho2[i]),
                                (8, self.rho2[i])):
                s[column] *= rho**2  # the dual residuals and y = rho u, rho v
            r_intra, s_intra = math.sqrt(s[0]), math.sqrt(s[1])
            r_inter = s_inter = math.nan
            if self.hierarchical:
                r_inter, s_inter = math.sqrt(s[5]), math.sqrt(s[6])
            if stopping:
                converged = converged and self.within_tolerance(block, s)
            rows.append(
                {
                    "iteration": iteration,
                    "layer": block.name,
                    "constrained": block.constrained,
                    "r_intra": r_intra,
                    "s_intra": s_intra,
                    "r_inter": r_inter,
                    "s_inter": s_inter,
                    "rho1": self.rho1[i],
                    "rho2": self.rho2[i],
                    "density": self.structure.densities.get(block.name, 1.0),
                }
            )
            if self.adaptive:
                self.rebalance(i, r_intra, s_intra, r_inter, s_inter)
        if self.ctx.topology.rank == 0:
            self.ctx.recorder.add_layer_rows(rows)
        return converged

    def within_tolerance(self, block, s: list[float]) -> bool:
        """Boyd's eps_pri and eps_dual test of one block at both levels, from its row of
        ``dual_update``'s world-summed table."""
        n = math.prod(block.shape)
        world = self.ctx.topology.world_size
        tol = {"eps_abs": self.eps_abs, "eps_rel": self.eps_rel}
        ok = math.sqrt(s[0]) <= hsadmm.primal_tolerance(
            world * n, math.sqrt(s[2]), math.sqrt(s[3]), **tol
        ) and math.sqrt(s[1]) <= hsadmm.dual_tolerance(world * n, math.sqrt(s[4]), **tol)
        if not self.hierarchical:
            return ok
        z_node_norm = math.sqrt(s[3] / self.procs)
        return (
            ok
            and math.sqrt(s[5])
            <= hsadmm.primal_tolerance(self.num_nodes * n, z_node_norm, math.sqrt(s[7]), **tol)
            and math.sqrt(s[6]) <= hsadmm.dual_tolerance(self.num_nodes * n, math.sqrt(s[8]), **tol)
        )

    def rebalance(self, i: int, r_intra, s_intra, r_inter, s_inter) -> None:
        """Residual balancing; scaled duals are rescaled by rho_old / rho_new (Boyd 3.4.1)."""
        new = hsadmm.balance_penalty(self.rho1[i], r_intra, s_intra, rho_max=self.rho_max)
        if new != self.rho1[i]:
            self.u[i].mul_(self.rho1[i] / new)
            self.rho1[i] = new
        if self.hierarchical:
            new = hsadmm.balance_penalty(self.rho2[i], r_inter, s_inter, rho_max=self.rho_max)
            if new != self.rho2[i]:
                self.v[i].mul_(self.rho2[i] / new)
                self.rho2[i] = new

    # ------------------------------------------------------------------ interface
    def density(self) -> float:
        return self.structure.density()

    def resolved_settings(self) -> dict:
        return self.initial_penalties

    def exchange_every(self) -> dict[str, int]:
        schedule = self.ctx.settings.exchange_every(self.steps_per_iteration)
        if not self.node_averaging:  # one node, or a period of a round or more
            schedule["intra_node"] = self.steps_per_iteration
        return schedule

    def summary_facts(self) -> dict:
        """The freeze point; and, at the end of the run, a warning when the evaluated
        consensus prunes something but never trained on its support (see warn_untrained)."""
        self.warn_untrained_support()
        return {"masks_frozen_at": self.frozen_at} if self.frozen_at is not None else {}

    def warn_untrained_support(self) -> None:
        """Before the freeze the evaluated z is the projection of the ranks' dense models,
        never trained masked: on a fragile model (MobileNetV3, 34 BN layers) that is near
        chance whatever the ranks' loss, so a run that ends there says so."""
        if not self.constrained or self.density() >= 1.0 or self.ctx.simulated:
            return  # a simulation trains and evaluates nothing
        loader = self.ctx.loader
        after = 0 if self.frozen_at is None else (
            loader.step * loader.batch_size - self.frozen_at["samples_per_rank"])
        if after > 0:
            return
        when = "never froze" if self.frozen_at is None else "froze in the last round"
        message = (f"the masks {when}: the evaluated consensus was never trained on its "
                   "support; lower --freeze-share or give --freeze-round/--freeze-epoch")
        if message not in self.warnings:
            self.warnings.append(message)
            if self.ctx.topology.rank == 0:
                print(f"warning: {message}", file=sys.stderr, flush=True)

    def process_groups(self) -> list:
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
            "shared_world": {
                "z": self.z,
                "consensus": self.consensus.state_dict(),
                "masks": self.structure.mask_state(),
            },
            "rho1": self.rho1,
            "rho2": self.rho2,
            "frozen": self.frozen,
            "frozen_at": self.frozen_at,
            "stable_rounds": self.stable_rounds,
            "oscillating_rounds": self.oscillating_rounds,
            "warnings": self.warnings,
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
        self.frozen = bool(state["frozen"])
        self.frozen_at = state.get("frozen_at")
        self.stable_rounds = int(state["stable_rounds"])
        self.oscillating_rounds = int(state["oscillating_rounds"])
        self.warnings = list(state["warnings"])
        if self.frozen:
            self.restrict_to_support()  # theta, u and momentum are already zero off it

    def artifacts(self) -> dict:
        return self.structure.artifacts()
