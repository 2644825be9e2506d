"""DiLoCo-style rounds of --inner-steps local steps per iteration that never says so
(steps_per_iteration stays 1): it would run inner-steps times its budget."""

from dataclasses import dataclass

import torch

from suite.api import (
    AT_LEAST_1,
    METHODS,
    SGDBaseline,
    StepResult,
    broadcast_initial_state,
    option,
    phases,
)


@dataclass
class InnerSettings:
    inner_steps: int = option(4, "local steps between two averages", check=AT_LEAST_1)


class Undeclared(SGDBaseline):
    def __init__(self, ctx):
        super().__init__(ctx, ctx.model)
        broadcast_initial_state(ctx.model)

    def step(self, iteration):
        losses, samples = [], 0
        for _ in range(self.ctx.settings.inner_steps):
            loss, n = self.forward_backward()
            self.apply_update()
            losses.append(loss)
            samples += n
        params = [p.data for p in self.module.parameters()]
        self.ctx.comm.all_reduce_into(params, self.ctx.topology.world, phase=phases.ALLREDUCE,
                                      divide_after=self.ctx.topology.world_size)
        return StepResult(torch.stack(losses).mean(), samples)


@METHODS.register("diloco-undeclared", "inner steps the schedule does not know of",
                  settings=InnerSettings)
def make(ctx):
    return Undeclared(ctx)
