"""Top-K gradient sparsification with error feedback (Lin et al. 2017 / the paper's 5.1.4).

Each rank adds its residual to the fresh gradient, keeps the k = ceil(ratio * numel) largest
entries by magnitude per layer, carries the rest to the next step (residual accumulation, as
in DGC and GRACE), and exchanges values (fp32) plus int32 indices by all-gather; the sum of
everyone's sparse vectors divided by the number of contributors is the averaged gradient.
1-D tensors (BN weights and biases, conv/FC biases) are small and go dense by all-reduce.

Values and indices travel in one all-gather: the int32 indices ride behind the values as
float32 bit patterns (all-gather and broadcast copy bytes, they never add them), so one
collective, not two, carries the k values and k indices of every rank.

``topk`` gathers over the world group. ``topk-hier`` all-reduces every gradient (matrices
and 1-D) densely inside each node; the node leaders sparsify the node mean (so the residual
lives on leaders), all-gather it over the inter-node group and all-reduce the 1-D part there,
then one broadcast inside the node carries the gathered pairs and the 1-D mean to the
followers. Only leaders' collectives cross nodes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from suite.api import (
    FRACTION,
    METHODS,
    BenchError,
    Look,
    RunContext,
    RunView,
    SGDBaseline,
    StepResult,
    broadcast_initial_state,
    flatten,
    option,
    phases,
    schema,
    sends_fraction_of_dense,
    unflatten_into,
)


@dataclass
class TopKSettings:
    topk_ratio: float = option(
        0.01, "fraction of each layer's gradient entries sent (values + int32 indices)",
        check=FRACTION,
    )


def pack(values: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """fp32 values and int32 indices as one fp32 piece: values, then the indices' bits."""
    return torch.cat([values, indices.view(torch.float32)], dim=-1)


def unpack(pieces: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of ``pack``, also on a stack of gathered pieces."""
    k = pieces.shape[-1] // 2
    return pieces[..., :k], pieces[..., k:].contiguous().view(torch.int32)


class ErrorFeedbackTopK:
    """Per-layer top-k selection over one flat fp32 gradient vector, with residual memory."""

    def __init__(self, numels: list[int], ratio: float):
        self.numels = numels
        self.offsets = [0]
        for n in numels:
            self.offsets.append(self.offsets[-1] + n)
        if self.offsets[-1] >= 2**31:
            raise BenchError(f"{self.offsets[-1]} gradient entries overflow int32 indices")
        self.ks = [max(1, math.ceil(ratio * n)) for n in numels]
        self.k = sum(self.ks)
        self.residual: torch.Tensor | None = None  # allocated by the ranks that compress

    def compress(self, flat_grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (values, int32 global indices); what is not sent stays in the residual."""
        if self.residual is None:
            self.residual = torch.zeros_like(flat_grad, dtype=torch.float32)
        acc = self.residual.add_(flat_grad)
        indices = []
        for start, n, k in zip(self.offsets, self.numels, self.ks):
            _, idx = acc[start : start + n].abs().topk(k, sorted=False)
            indices.append(idx + start)
        idx = torch.cat(indices)
        values = acc[idx]  # advanced indexing copies, so zeroing below keeps them
        acc[idx] = 0.0
        return values, idx.to(torch.int32)

    def decompress(self, values: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        """Mean of the contributors' sparse vectors (one per row), as one dense flat vector.

        One ``index_add_`` per contributor, in row order: a row's indices are distinct (top-k
        of distinct positions), so no add has repeated indices, which torch documents as
        non-deterministic on CUDA. Every rank and every run sums in the same order and gets
        the same bytes (on CPU, the bytes of one index_add_ over all rows)."""
        dense = torch.zeros(self.offsets[-1], dtype=values.dtype, device=values.device)
        for row_values, row_indices in zip(values, indices):
            dense.index_add_(0, row_indices.long(), row_values)
        return dense.div_(values.shape[0])


class TopK(SGDBaseline):
    def __init__(self, ctx: RunContext, *, hierarchical: bool):
        super().__init__(ctx, ctx.model)
        broadcast_initial_state(self.module)
        self.hierarchical = hierarchical
        params = [p for p in self.module.parameters() if p.requires_grad]
        self.sparse = [p for p in params if p.dim() > 1]
        self.dense = [p for p in params if p.dim() <= 1]
        self.compressor = ErrorFeedbackTopK(
            [p.numel() for p in self.sparse], ctx.settings.topk_ratio
        )

    def step(self, iteration: int) -> StepResult:
        loss, samples = self.forward_backward()
        with torch.no_grad():
            if self.hierarchical:
                self.exchange_hierarchical()
            else:
                self.exchange_flat()
        self.apply_update()
        return StepResult(loss, samples)

    def _compress(self, flat_sparse: torch.Tensor) -> torch.Tensor:
        with self.ctx.recorder.phase(phases.COMPRESS):
            return pack(*self.compressor.compress(flat_sparse))

    def exchange_flat(self) -> None:
        world, comm, rec = self.ctx.topology.world, self.ctx.comm, self.ctx.recorder
        sparse = [p.grad for p in self.sparse]
        with rec.phase(phases.COMPRESS):  # the copy the selection reads counts with it
            flat_sparse = flatten(sparse)
        pieces = comm.all_gather(self._compress(flat_sparse), world, phase=phases.ALLGATHER)
        with rec.phase(phases.DECOMPRESS):
            unflatten_into(sparse, self.compressor.decompress(*unpack(pieces)))
        if self.dense:
            dense = [p.grad for p in self.dense]
            comm.all_reduce_into(dense, world, phase=phases.ALLREDUCE, divide_after=world.size)

    def exchange_hierarchical(self) -> None:
        topo, comm, rec = self.ctx.topology, self.ctx.comm, self.ctx.recorder
        grads = [p.grad for p in [*self.sparse, *self.dense]]
        with rec.phase(phases.INTRA_ALLREDUCE):  # the copy into the buffer counts with it
            node_mean = flatten(grads)
        comm.all_reduce(node_mean, topo.intra, phase=phases.INTRA_ALLREDUCE)
        with rec.phase(phases.INTRA_ALLREDUCE):
            node_mean.div_(topo.gpus_per_node)
        split = self.compressor.offsets[-1]  # sparse entries first, then the 1-D ones
        gathered = topo.num_nodes * 2 * self.compressor.k
        if topo.inter is not None:  # node leader
            pieces = comm.all_gather(
                self._compress(node_mean[:split]), topo.inter, phase=phases.ALLGATHER
            )
            dense = node_mean[split:]
            if dense.numel():
                comm.all_reduce(dense, topo.inter, phase=phases.INTER_ALLREDUCE)
                dense.div_(topo.num_nodes)
            payload = torch.cat([pieces.reshape(-1), dense])
        else:
            payload = torch.empty(gathered + node_mean.numel() - split, device=node_mean.device)
        comm.broadcast(payload, topo.intra, src=topo.intra.ranks[0], phase=phases.BROADCAST)
        with rec.phase(phases.DECOMPRESS):
            pieces = payload[:gathered].view(topo.num_nodes, -1)
            sparse_mean = self.compressor.decompress(*unpack(pieces))
            unflatten_into(grads, torch.cat([sparse_mean, payload[gathered:]]))

    def state_dict(self) -> dict:
        return {**super().state_dict(), "residual": self.compressor.residual}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        residual = state["residual"]
        self.compressor.residual = None if residual is None else residual.to(self.ctx.device)


@METHODS.register(
    "topk",
    "Top-K 1% (--topk-ratio) per layer with error feedback; values + int32 indices all-gathered "
    "over the world; 1-D tensors (BN, biases) dense all-reduce",
    settings=TopKSettings,
    look=Look("Top-K", "#0072B2", "P"),
    activity=lambda run: sends_about_its_ratio(run),
    nightly=True,
)
def make_topk(ctx: RunContext) -> TopK:
    return TopK(ctx, hierarchical=False)


@METHODS.register(
    "topk-hier",
    "Hierarchical Top-K: dense intra-node all-reduce, leaders all-gather the top-k of the node "
    "mean between nodes (1-D tensors: leaders' all-reduce), then broadcast it in the node",
    settings=TopKSettings,
    look=Look("Top-K (hier.)", "#0072B2", "X"),
    activity=lambda run: sends_about_its_ratio(run),
    nightly=True,
)
def make_topk_hier(ctx: RunContext) -> TopK:
    return TopK(ctx, hierarchical=True)


def sends_about_its_ratio(run: RunView) -> list[str]:
    """About --topk-ratio of DDP's bytes, times what the all-gather costs over a ring
    all-reduce: values and int32 indices (2x), each rank's piece to every other (about world
    size / 2 x more; leaders only in the hierarchical one), the dense 1-D tensors: between
    0.5 x the ratio and 4 x the ratio times the ranks."""
    ratio = float(run.settings.get("topk_ratio", 0.01))
    ranks = int(run.summary.get(schema.GPUS) or 1)
    return sends_fraction_of_dense(run, 0.5 * ratio, 4 * ratio * ranks, f"Top-K at {ratio:g}")
