"""A third-party method in one file: the whole of what a plugin writes to add a method with
an option of its own (the test gives it a dist-info with a ``prunex_bench.methods`` entry
point). It is DDP whose gradients are scaled by ``--grad-scale`` before the update."""

from dataclasses import dataclass

import torch

from baselines.ddp import DDPMethod, DDPSettings
from suite.options import POSITIVE, option
from suite.registry import METHODS


@dataclass
class ScaledDDPSettings(DDPSettings):
    grad_scale: float = option(1.0, "factor applied to the averaged gradients", check=POSITIVE)


class ScaledDDP(DDPMethod):
    def apply_update(self) -> None:
        with torch.no_grad():
            for p in self.module.parameters():
                if p.grad is not None:
                    p.grad.mul_(self.ctx.settings.grad_scale)
        super().apply_update()


@METHODS.register("scaled-ddp", "DDP with scaled gradients (a plugin)", settings=ScaledDDPSettings)
def make_scaled_ddp(ctx):
    return ScaledDDP(ctx)
