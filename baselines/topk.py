"""Top-K gradient sparsification with error feedback (Lin et al. 2017 / the paper's 5.1.4).

Each rank adds its residual to the fresh gradient, keeps the k = ceil(ratio * numel) largest
entries by magnitude per layer, carries the rest to the next step, and exchanges values
(fp32) plus int32 indices by all-gather; the sum of everyone's sparse vectors divided by the
number of contributors is the averaged gradient. 1-D tensors (BN weights and biases, conv/FC
biases) are small and go dense through an all-reduce.

``topk`` gathers over the world group. ``topk-hier`` first sums gradients densely inside each
node, then only the node leaders sparsify the node mean and all-gather between nodes, and
broadcast the gathered values and indices to their followers.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from suite.errors import BenchError
from suite.method import RunContext, average_buffers_for_eval
from suite.registry import METHODS
from suite.topology import CommGroup


class ErrorFeedbackTopK:
    """Per-layer top-k selection over one flat gradient vector, with residual memory."""

    def __init__(self, numels: list[int], ratio: float, device: torch.device):
        if not 0 < ratio <= 1:
            raise BenchError(f"--topk-ratio must be in (0, 1], got {ratio}")
        self.numels = numels
        self.offsets = [0, *torch.tensor(numels).cumsum(0).tolist()]
        self.ks = [max(1, math.ceil(ratio * n)) for n in numels]
        self.k = sum(self.ks)
        self.residual = torch.zeros(self.offsets[-1], device=device)

    def compress(self, flat_grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (values, int32 global indices); what is not sent stays in the residual."""
        acc = self.residual.add_(flat_grad)
        indices = []
        for start, n, k in zip(self.offsets, self.numels, self.ks):
            _, idx = acc[start : start + n].abs().topk(k, sorted=False)
            indices.append(idx + start)
        idx = torch.cat(indices)
        values = acc[idx].clone()
        acc[idx] = 0.0
        return values, idx.to(torch.int32)

    def decompress(self, values: torch.Tensor, indices: torch.Tensor, count: int) -> torch.Tensor:
        """Mean of ``count`` contributors' sparse vectors, as one dense flat vector."""
        dense = torch.zeros_like(self.residual)
        dense.index_add_(0, indices.reshape(-1).long(), values.reshape(-1))
        return dense.div_(count)


class TopK:
    steps_per_iteration = 1

    def __init__(self, ctx: RunContext, *, hierarchical: bool):
        self.ctx = ctx
        self.hierarchical = hierarchical
        self.model = ctx.model
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.sparse = [p for p in params if p.dim() > 1]
        self.dense = [p for p in params if p.dim() <= 1]
        ratio = float(ctx.option("topk_ratio", 0.01))
        self.compressor = ErrorFeedbackTopK([p.numel() for p in self.sparse], ratio, ctx.device)
        self.optimizer = torch.optim.SGD(
            params,
            lr=ctx.recipe.lr,
            momentum=ctx.recipe.momentum,
            weight_decay=ctx.recipe.weight_decay,
        )
        self._broadcast_parameters()
        self.batches = iter(ctx.loader)
        self.loss_fn = nn.CrossEntropyLoss()

    def _broadcast_parameters(self) -> None:
        """Same start everywhere (setup, like DDP's constructor; not recorded traffic)."""
        for t in [*self.model.parameters(), *self.model.buffers()]:
            torch.distributed.broadcast(t.data, src=0)

    def step(self, iteration: int) -> dict:
        x, y = next(self.batches)
        x, y = x.to(self.ctx.device, non_blocking=True), y.to(self.ctx.device, non_blocking=True)
        with self.ctx.recorder.phase("local_compute"):
            self.optimizer.zero_grad(set_to_none=False)
            loss = self.loss_fn(self.model(x), y)
            loss.backward()
        with torch.no_grad():
            if self.hierarchical:
                self.exchange_hierarchical()
            else:
                self.exchange_flat()
        with self.ctx.recorder.phase("local_compute"):
            self.optimizer.step()
        return {"loss": loss.item(), "samples": len(y)}

    def _flat(self, tensors):
        return torch.cat([t.grad.reshape(-1) for t in tensors])

    def _assign(self, tensors, flat):
        offset = 0
        for t in tensors:
            n = t.numel()
            t.grad.copy_(flat[offset : offset + n].view_as(t))
            offset += n

    def _allreduce_dense(self, group: CommGroup, phase: str, count: int) -> None:
        if self.dense:
            flat = self._flat(self.dense)
            self.ctx.comm.all_reduce(flat, group, phase=phase)
            self._assign(self.dense, flat.div_(count))

    def _gather_sparse(self, flat_grad, group: CommGroup):
        rec, comm = self.ctx.recorder, self.ctx.comm
        with rec.phase("compress"):
            values, indices = self.compressor.compress(flat_grad)
        return (
            comm.all_gather(values, group, phase="allgather"),
            comm.all_gather(indices, group, phase="allgather"),
        )

    def exchange_flat(self) -> None:
        world = self.ctx.topology.world
        values, indices = self._gather_sparse(self._flat(self.sparse), world)
        with self.ctx.recorder.phase("decompress"):
            self._assign(self.sparse, self.compressor.decompress(values, indices, world.size))
        self._allreduce_dense(world, "allreduce", world.size)

    def exchange_hierarchical(self) -> None:
        topo, comm, rec = self.ctx.topology, self.ctx.comm, self.ctx.recorder
        grads = self._flat(self.sparse)
        comm.all_reduce(grads, topo.intra, phase="intra_allreduce")
        grads.div_(topo.gpus_per_node)
        nodes = topo.num_nodes
        shape = (nodes, self.compressor.k)
        if topo.is_leader:
            values, indices = self._gather_sparse(grads, topo.inter)
        else:
            values = torch.empty(shape, device=grads.device)
            indices = torch.empty(shape, dtype=torch.int32, device=grads.device)
        leader = topo.intra.ranks[0]
        comm.broadcast(values, topo.intra, src=leader, phase="broadcast")
        comm.broadcast(indices, topo.intra, src=leader, phase="broadcast")
        with rec.phase("decompress"):
            self._assign(self.sparse, self.compressor.decompress(values, indices, nodes))
        self._allreduce_dense(topo.world, "allreduce", topo.world_size)

    def eval_model(self) -> nn.Module:
        return average_buffers_for_eval(self.model)

    def state_dict(self) -> dict:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "residual": self.compressor.residual,
        }

    def artifacts(self) -> dict:
        return {}


@METHODS.register(
    "topk",
    "Top-K 1% (--topk-ratio) per layer with error feedback; values + int32 indices all-gathered "
    "over the world; 1-D tensors (BN, biases) dense all-reduce",
)
def make_topk(ctx: RunContext) -> TopK:
    return TopK(ctx, hierarchical=False)


@METHODS.register(
    "topk-hier",
    "Hierarchical Top-K: dense intra-node all-reduce, leaders all-gather the top-k of the node "
    "mean between nodes, then broadcast it in the node; 1-D tensors dense",
)
def make_topk_hier(ctx: RunContext) -> TopK:
    return TopK(ctx, hierarchical=True)
