"""What every baseline shares: the workload's SGD recipe on this rank's shard, and flat buffers.

The baselines differ only in how ranks agree (a DDP comm hook, a sparse all-gather, periodic
model averaging); the mini-batch loop, optimizer, evaluation and checkpoint are the same, so
they live here once and every method's local compute is timed the same way.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from suite.api import Method, RunContext, average_buffers_for_eval, phases


class SGDBaseline(Method):
    """The recipe's momentum SGD over ``model`` (a DDP wrapper or the plain module).

    Subclasses add the exchange between ``forward_backward`` and ``apply_update`` (or, for
    DDP, inside backward through a comm hook).
    """

    def __init__(self, ctx: RunContext, model: nn.Module):
        self.ctx = ctx
        self.model = model
        self.module = model.module if isinstance(model, DistributedDataParallel) else model
        recipe = ctx.recipe
        self.optimizer = torch.optim.SGD(
            self.model.parameters(),
            lr=recipe.lr,
            momentum=recipe.momentum,
            weight_decay=recipe.weight_decay,
        )
        self.batches = iter(ctx.loader)
        self.loss_fn = nn.CrossEntropyLoss()

    def forward_backward(self) -> tuple[torch.Tensor, int]:
        """Gradients of the next local mini-batch; returns (loss, samples). Taking the batch
        counts as local compute, as in PruneX's round. The loss stays on the device (as a
        float64 scalar, so sums of it are the Python sums they replace): the loop reads it
        once per iteration."""
        device = self.ctx.device
        with self.ctx.recorder.phase(phases.LOCAL_COMPUTE):
            x, y = next(self.batches)
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            self.optimizer.zero_grad(set_to_none=True)
            loss = self.loss_fn(self.model(x), y)
            loss.backward()
        return loss.detach().double(), len(y)

    def apply_update(self) -> None:
        with self.ctx.recorder.phase(phases.LOCAL_COMPUTE):
            self.ctx.apply_lr(self.optimizer)
            self.optimizer.step()
            self.constrain()

    def constrain(self) -> None:
        """Hold the parameters where the method allows them after each update (the pruning
        baselines: on their support); nothing by default."""

    def eval_model(self) -> nn.Module:
        return average_buffers_for_eval(self.module)

    def state_dict(self) -> dict:
        return {"model": self.module.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
