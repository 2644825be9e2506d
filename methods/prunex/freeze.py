"""When PruneX's masks freeze, and from where its ranks go on (paper sec. 4.5).

The paper fixes the masks "once topological stability is detected" and then trains "on a
fixed sparse manifold". ``FreezePolicy`` holds that decision apart from the round: which rule
makes the freeze due, the point it happened at, where the ``--after-freeze sgd`` rounds start,
and what went wrong without stopping the run (masks that keep swapping; a consensus evaluated
before it ever trained on its support). It holds no tensor: the method fixes the masks and
moves theta, u and the momentum onto the support itself.
"""

from __future__ import annotations

import math
import sys

import torch
from torch import nn

from suite.api import RunContext, declare_phase, schema

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


class FreezePolicy:
    """The freeze of one PruneX run: when, at what point, from where, and its warnings.

    Args:
        ctx: the run's context (its settings, loader, communicator and topology).
        structured_bits: group bits of the structured sets that have a keep, against which
            the mask drift counts as oscillation.
    """

    def __init__(self, ctx: RunContext, *, structured_bits: int):
        self.ctx = ctx
        self.structured_bits = structured_bits
        self.frozen = False
        self.frozen_at: dict | None = None  # round and samples per rank at the freeze
        self.stable_rounds = 0  # consecutive rounds whose agreed masks did not change
        self.oscillating_rounds = 0  # consecutive rounds with drift above OSCILLATION_DRIFT
        self.warnings: list[str] = []  # for summary.json
        self.loss_fn = nn.CrossEntropyLoss()

    def observe(self, iteration: int, drift: int, rho1: list[float]) -> None:
        """Count a round's agreed mask change: the paper freezes once the topology is stable
        (sec. 4.5, drift zero within 5-15 rounds), ``--freeze-patience`` unchanged rounds
        here; and a drift that stays high means the masks oscillate (``rho1``: the round's
        penalties, for the warning)."""
        self.stable_rounds = self.stable_rounds + 1 if drift == 0 and iteration > 0 else 0
        self.watch_oscillation(drift, rho1)

    def due(self, iteration: int) -> bool:
        """After ``--freeze-round`` rounds, at the end of the round that reaches
        ``--freeze-epoch`` epochs of the shard or ``--freeze-share`` of the run's local
        steps, or after ``--freeze-patience`` unchanged rounds, whichever comes first."""
        settings, loader = self.ctx.settings, self.ctx.loader
        by_round = settings.freeze_round is not None and iteration + 1 >= settings.freeze_round
        by_epoch = (
            settings.freeze_epoch is not None
            and loader.step >= settings.freeze_epoch * loader.steps_per_epoch
        )
        share_steps = settings.freeze_share * (self.ctx.budget_steps or math.inf)
        by_share = settings.freeze_share < 1 and loader.step >= share_steps
        by_patience = self.stable_rounds >= settings.freeze_patience
        return by_round or by_epoch or by_share or by_patience

    def fix(self, rounds_done: int) -> None:
        """Mark the masks frozen, and where: after ``rounds_done`` rounds, at the samples each
        rank has read (the summary's ``masks_frozen_at``)."""
        loader = self.ctx.loader
        self.frozen = True
        self.frozen_at = {
            "round": rounds_done,
            schema.SAMPLES_PER_RANK: loader.step * loader.batch_size,
            schema.EPOCH: loader.step / loader.steps_per_epoch,
        }

    def choose_start(self, consensus: nn.Module, ranks: nn.Module) -> str:
        """Where the sgd rounds start (``--freeze-start``): ``consensus`` (theta := z) or
        ``ranks`` (each rank's own theta on the support, its node's mean with node averaging;
        the first sgd round's packed exchange makes the world agree). Recorded in
        ``frozen_at``.

        Why not always z: before the freeze z is the projection of a weighted mean of the
        ranks' theta + u, and while the ranks are far apart (early rounds, a large lr) that
        mean can classify at chance while each rank's model does not; restarting every rank
        from it throws their training away. ``better`` compares the two on the same
        calibration samples (``FREEZE_CALIBRATION_SAMPLES`` per rank), world-averaged, and
        keeps z on a tie (collective: every rank decides the same).
        """
        choice = self.ctx.settings.freeze_start
        found = {}
        if choice == "better":
            topo = self.ctx.topology
            losses = torch.stack([self.calibration_loss(consensus),
                                  self.calibration_loss(ranks)])
            self.ctx.comm.all_reduce(losses, topo.world, phase=FREEZE)
            consensus_loss, ranks_loss = (losses / topo.world_size).tolist()
            choice = "consensus" if consensus_loss <= ranks_loss else "ranks"
            found = {"consensus_loss": consensus_loss, "ranks_loss": ranks_loss}
        self.frozen_at.update({"start": choice, **found})
        return choice

    @torch.no_grad()
    def calibration_loss(self, model: nn.Module) -> torch.Tensor:
        """Mean cross-entropy of ``model`` on this rank's first ``FREEZE_CALIBRATION_SAMPLES``
        calibration samples, in eval mode but for its BatchNorm layers, which normalize with
        each batch's own statistics; their running statistics are left as they were.

        Why bounded so: one forward pass per candidate and sample, no copy of a model, no pass
        that only estimates BatchNorm statistics. Batch statistics are what statistics
        re-estimated on those batches would give (z's own, rather than the ranks' averaged
        ones that describe other models), without the pass that estimates them."""
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

    def watch_oscillation(self, drift: int, rho1: list[float]) -> None:
        """Warn once when the masks keep swapping: drift above half the structured bits for
        OSCILLATION_ROUNDS rounds in a row means the penalties cannot hold theta near its
        anchor over a round (see methods/prunex/penalties.py)."""
        high = self.structured_bits and drift > OSCILLATION_DRIFT * self.structured_bits
        self.oscillating_rounds = self.oscillating_rounds + 1 if high else 0
        if self.oscillating_rounds == OSCILLATION_ROUNDS and not self.warnings:
            self.warn(
                f"masks oscillate: penalties too weak for lr*H (mask drift above "
                f"{OSCILLATION_DRIFT:.0%} of the {self.structured_bits} structured bits for "
                f"{OSCILLATION_ROUNDS} rounds; mean rho1 {sum(rho1) / len(rho1):.3g});"
                " raise --round-pull or --rho1"
            )

    def warn_untrained_support(self, prunes: bool) -> None:
        """At the end of a run whose consensus ``prunes`` something: warn when it never trained
        masked. Before the freeze the evaluated z is the projection of the ranks' dense
        models; on a fragile model (MobileNetV3, 34 BN layers) that is near chance whatever
        the ranks' loss, so a run that ends there says so."""
        if not prunes or self.ctx.simulated:
            return  # a simulation trains and evaluates nothing
        loader = self.ctx.loader
        after = 0 if self.frozen_at is None else (
            loader.step * loader.batch_size - self.frozen_at[schema.SAMPLES_PER_RANK])
        if after > 0:
            return
        when = "never froze" if self.frozen_at is None else "froze in the last round"
        message = (f"the masks {when}: the evaluated consensus was never trained on its "
                   "support; lower --freeze-share or give --freeze-round/--freeze-epoch")
        if message not in self.warnings:
            self.warn(message)

    def warn(self, message: str) -> None:
        """Keep ``message`` for summary.json and print it once for the run (rank 0)."""
        self.warnings.append(message)
        if self.ctx.topology.rank == 0:
            print(f"warning: {message}", file=sys.stderr, flush=True)

    def facts(self) -> dict:
        """The summary's ``masks_frozen_at``, once the masks froze."""
        return {schema.MASKS_FROZEN_AT: self.frozen_at} if self.frozen_at is not None else {}

    def state_dict(self) -> dict:
        """The policy's part of PruneX's checkpoint (top-level keys of its state)."""
        return {
            "frozen": self.frozen,
            "frozen_at": self.frozen_at,
            "stable_rounds": self.stable_rounds,
            "oscillating_rounds": self.oscillating_rounds,
            "warnings": self.warnings,
        }

    def load_state_dict(self, state: dict) -> None:
        """Take ``state_dict()``'s keys back (checkpoints before ``frozen_at`` lack it)."""
        self.frozen = bool(state["frozen"])
        self.frozen_at = state.get("frozen_at")
        self.stable_rounds = int(state["stable_rounds"])
        self.oscillating_rounds = int(state["oscillating_rounds"])
        self.warnings = list(state["warnings"])
