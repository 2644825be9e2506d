"""Dense synchronous data parallelism: torch's DistributedDataParallel over the world group.

The gradient all-reduce goes through a DDP communication hook that routes each bucket through
the suite's communicator, so its bytes and time are recorded like every other method's.
DDP overlaps bucket all-reduces with the backward pass, so ``t_allreduce`` (launch to
completion of the buckets) overlaps ``t_local_compute``; ``t_iteration`` is the true step time.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from suite.method import RunContext, average_buffers_for_eval
from suite.registry import METHODS


def instrumented_allreduce_hook(comm, group):
    """A comm hook equal to DDP's default (mean of gradients), but recorded."""

    def hook(_state, bucket):
        buffer = bucket.buffer()
        buffer.div_(group.size)
        return comm.all_reduce_async(buffer, group, phase="allreduce")

    return hook


class DDPMethod:
    steps_per_iteration = 1

    def __init__(self, ctx: RunContext):
        self.ctx = ctx
        device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        bucket_cap_mb = ctx.option("bucket_cap_mb", None)
        kwargs = {"bucket_cap_mb": bucket_cap_mb} if bucket_cap_mb else {}
        self.model = DistributedDataParallel(
            ctx.model,
            device_ids=device_ids,
            process_group=ctx.topology.world.pg,
            forward_sync_buffers=False,  # BN statistics stay local; averaged only to evaluate
            **kwargs,
        )
        self.model.register_comm_hook(
            None, instrumented_allreduce_hook(ctx.comm, ctx.topology.world)
        )
        recipe = ctx.recipe
        self.optimizer = torch.optim.SGD(
            self.model.parameters(),
            lr=recipe.lr,
            momentum=recipe.momentum,
            weight_decay=recipe.weight_decay,
        )
        self.batches = iter(ctx.loader)
        self.loss_fn = nn.CrossEntropyLoss()

    def step(self, iteration: int) -> dict:
        x, y = next(self.batches)
        x, y = x.to(self.ctx.device, non_blocking=True), y.to(self.ctx.device, non_blocking=True)
        with self.ctx.recorder.phase("local_compute"):
            self.optimizer.zero_grad(set_to_none=True)
            loss = self.loss_fn(self.model(x), y)
            loss.backward()
            self.optimizer.step()
        return {"loss": loss.item(), "samples": len(y)}

    def eval_model(self) -> nn.Module:
        return average_buffers_for_eval(self.model.module)

    def state_dict(self) -> dict:
        return {"model": self.model.module.state_dict(), "optimizer": self.optimizer.state_dict()}

    def artifacts(self) -> dict:
        return {}


@METHODS.register(
    "ddp",
    "Dense baseline: PyTorch DDP, ring all-reduce of full fp32 gradients every step "
    "(paper sec. 5.1.4); --bucket-cap-mb",
)
def make_ddp(ctx: RunContext) -> DDPMethod:
    return DDPMethod(ctx)
