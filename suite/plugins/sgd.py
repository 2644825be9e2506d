"""The building block of data-parallel SGD methods (``suite.api.SGDBaseline``): the
workload's SGD recipe on this rank's shard.

Methods such as the baselines differ only in how ranks agree (a DDP comm hook, a sparse
all-gather, periodic model averaging); the mini-batch loop, optimizer, evaluation and
checkpoint are the same, so they live here once, every method's local compute is timed the
same way, and a plugin writes only its exchange.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from suite.cluster import phases
from suite.plugins.method import Method, RunContext, average_buffers_for_eval


class SGDBaseline(Method):
    """The recipe's momentum SGD over ``model`` (a DDP wrapper or the plain module).

    Subclasses add the exchange between ``forward_backward`` and ``apply_update`` (or, for
    DDP, inside backward through a comm hook); evaluation (BN statistics averaged over the
    world), checkpoint state and the lr schedule are done.

    Args:
        ctx: the run context the method's factory is given.
        model: ``ctx.model``, or a wrapper of it (``DistributedDataParallel``).

    Examples:
        ```python
        class SignSGD(SGDBaseline):
            def __init__(self, ctx):
                super().__init__(ctx, ctx.model)
                broadcast_initial_state(ctx.model)

            def step(self, iteration):
                loss, samples = self.forward_backward()
                grads = [p.grad for p in self.module.parameters()]
                flat = self.ctx.comm.all_reduce(flatten(grads).sign_(), self.ctx.topology.world,
                                                phase=phases.ALLREDUCE)
                unflatten_into(grads, flat.div_(self.ctx.topology.world_size))
                self.apply_update()
                return StepResult(loss, samples)
        ```
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
        """One optimizer step on the gradients as they are now (after the method's exchange),
        timed as local compute. It applies the run's lr schedule first (``ctx.apply_lr``:
        warmup and cosine or step decay over the run's samples, the lr recorded in the row),
        so a subclass never sets the lr itself; then ``constrain`` holds the parameters where
        the method allows them."""
        with self.ctx.recorder.phase(phases.LOCAL_COMPUTE):
            self.ctx.apply_lr(self.optimizer)
            self.optimizer.step()
            self.constrain()

    def constrain(self) -> None:
        """Hold the parameters where the method allows them after each update (the pruning
        baselines: on their support); nothing by default."""

    def eval_model(self) -> nn.Module:
        """The unwrapped module, its float buffers (BN statistics) averaged over the world
        first: gradient averaging keeps the parameters equal but each rank's statistics its
        own. Collective, as ``Method.eval_model``."""
        return average_buffers_for_eval(self.module)

    def state_dict(self) -> dict:
        """The unwrapped module's and the optimizer's state (its momentum buffers): a
        subclass adds its own under further keys (``{**super().state_dict(), ...}``)."""
        return {"model": self.module.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore what ``state_dict`` saved into the module and the optimizer in place (a
        subclass calls it, then restores its own keys)."""
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
