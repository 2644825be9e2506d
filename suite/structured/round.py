"""The structured part of a round, written once for PruneX and the pruning baselines.

Both end a round the same way: the nodes' masks are OR-agreed (PruneX eq. 14), their live
slices traced, theta kept on the support, and the node models packed into dense buckets that
the leaders average between nodes (eqs. 11, 15). Because this is one object, "the same masks
send the same bytes" holds by construction. Masks are keyed by parameter name everywhere;
the packing keys stay inside ``suite.structured.packing``.

The method decides *what* goes in (PruneX: z_i + v_i; the baselines: the node mean) and
*when* masks change (PruneX: projection each round until the freeze; GMP: a schedule).

The structured sets are each conv weight's filters, input channels and kernel positions
(``masks``), and, with ``--head-keep``/``--mlp-keep``, each attention block's heads and
each MLP's hidden neurons (``units``). One dict holds both kinds of mask: a conv's under
its weight's name, a group's under its key (``blocks.0.attn#heads``).
"""

from __future__ import annotations

import functools
import math

import torch
from torch import nn

from suite.cluster import phases
from suite.plugins.method import RunContext
from suite.structured.groups import trace_channel_groups
from suite.structured.liveness import LiveSlices, live_slices
from suite.structured.masks import (
    CONV_KEEPS,
    StructuredMask,
    conv_shapes,
    keep_count,
    load_masks,
    mask_artifact,
    mask_drift,
    or_across_nodes,
    project,
)
from suite.structured.packing import PackingSettings, PackLayout, model_entries
from suite.structured.units import (
    KINDS,
    UnitGroup,
    UnitMask,
    apply_units,
    element_mask,
    kept_positions,
    load_unit_masks,
    project_units,
    trace_unit_groups,
)

__all__ = ["StructuredRound", "WIRE_DTYPES"]

#: ``--wire-dtype`` names
WIRE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
"""``--wire-dtype`` name -> the dtype the packed inter-node buffers are sent in."""


class StructuredRound:
    """Masks, live slices, support and packed exchange of one method's ``model``.

    Args:
        ctx: the method's run context.
        model: the model whose tensors are masked and exchanged.
        packing: the packing settings; None: no inter-node exchange (PruneX's flat ablation),
            masks and support only.
        keeps: the structured sets' keep fractions (``StructuredKeepSettings.keeps``); the
            model's heads and neurons are traced only when their keep is given.
        hierarchical: leaders OR the masks between nodes (else every rank projected the same
            tensor).
        wire_dtype: dtype of the inter-node buffers (fp32 math on both ends).
        sharded: every local rank all-reduces 1/P of each bucket with its peers
            (Horovod-style) instead of one leader per node.

    Examples:
        ```python
        structure = StructuredRound(ctx, ctx.model, ctx.settings, keeps=ctx.settings.keeps)
        masks = structure.select(node_mean, keeps)      # magnitude masks of the node mean
        structure.agree(masks)                          # eq. (14): OR between nodes
        z, buffers = structure.exchange(node_mean, bn_buffers)  # packed AVG between nodes
        ```
    """

    def __init__(
        self,
        ctx: RunContext,
        model: nn.Module,
        packing: PackingSettings | None,
        *,
        keeps: dict[str, float | None] | None = None,
        hierarchical: bool = True,
        wire_dtype: torch.dtype = torch.float32,
        sharded: bool = False,
    ):
        self.ctx = ctx
        self.model = model
        self.keeps = dict(keeps or {})
        self.hierarchical = hierarchical
        self.wire_dtype = wire_dtype
        self.sharded = sharded
        self.bucket_bytes = int(packing.bucket_mb * 2**20) if packing is not None else None
        self.shapes = conv_shapes(model)  # the constrained conv weights, in parameter order
        self.param_shapes = {n: p.shape for n, p in model.named_parameters() if p.requires_grad}
        self.unit_groups: list[UnitGroup] = (
            [g for g in trace_unit_groups(model, ctx.example_input())
             if self.keeps.get(g.keep_option) is not None]
            if any(self.keeps.get(option) is not None for option in KINDS.values())
            else []
        )
        self.channel_groups = (
            trace_channel_groups(model, ctx.example_input())
            if packing is not None and packing.pack == "live"
            else None
        )
        # the peers' groups are made now, by every rank (creating a group is collective)
        self.peers = ctx.topology.peers if sharded else None
        self.support: dict[str, torch.Tensor] = {}  # dense masks theta is kept on
        self.use_masks({
            **{n: StructuredMask.full(s, device=ctx.device) for n, s in self.shapes.items()},
            **{g.key: UnitMask.full(g.units, device=ctx.device) for g in self.unit_groups},
        })

    def process_groups(self) -> list:
        """The groups this round made beside the topology's (the sharded leaders' peers)."""
        return [self.peers.pg] if self.peers is not None else []

    # ------------------------------------------------------------------ masks
    def use_masks(self, masks: dict) -> None:
        """New agreed masks: their live slices (``--pack live``) and the per-tensor element
        masks of the dead slices; the pack layout and its buffers are rebuilt on next use."""
        self.masks = masks
        # read once per mask change (a host sync each), not every round
        self.densities = {n: m.density() for n, m in masks.items()}
        self.overall_density = self._density()
        self.prunable_density = self._prunable_density()
        self.layout: PackLayout | None = None
        self.fixed_buffers: list[torch.Tensor] | None = None
        self.live: LiveSlices | None = None
        self.live_elements: dict[str, torch.Tensor] = {}
        if self.channel_groups is not None:
            self.live = live_slices(self.model, self.channel_groups, masks)
            for group in self.unit_groups:  # a pruned head's or neuron's slices are dead
                self.live = self.live.restricted(kept_positions(group, masks[group.key]))
            self.live_elements = self.live.partial_masks(self.param_shapes, device=self.ctx.device)

    def _density(self) -> float:
        """Fraction of the pruned tensors' elements the masks keep (1.0 without masks): the
        conv weights when a conv set has a keep, the members of heads and neurons."""
        conv_pruned = any(self.keeps.get(k) is not None for k in CONV_KEEPS) or not self.keeps
        total = kept = 0.0
        for name, mask in self.masks.items():
            if isinstance(mask, StructuredMask):
                if not conv_pruned:
                    continue
                n = math.prod(mask.weight_shape)
            else:
                n = self.group(name).numel(self.param_shapes)
            total += n
            kept += self.densities[name] * n
        return kept / total if total else 1.0

    @functools.cached_property
    def prunable(self) -> dict[str, bool]:
        """Per mask, whether this run's keeps can remove one of its groups (their sizes never
        change). A 1-channel stem's channel set, a depthwise conv's (one input channel per
        filter) or a keep that rounds to every group cannot: those stay dense whatever the
        method does."""
        found = {}
        for name, mask in self.masks.items():
            if isinstance(mask, StructuredMask):
                sets = zip(mask.set_sizes(), (self.keeps.get(k) for k in CONV_KEEPS))
            else:
                sets = [(mask.set_sizes()[0], self.keeps.get(self.group(name).keep_option))]
            found[name] = any(keep is not None and keep_count(n, keep) < n for n, keep in sets)
        return found

    def can_prune(self) -> bool:
        """Whether the keeps remove anything at all (keep 1.0 removes nothing)."""
        return any(self.prunable.values())

    def _prunable_density(self) -> float:
        """Fraction of the elements kept in the tensors the keeps can prune (``prunable``):
        what a keep is judged against (``reaches_keep``); 1.0 where none can be pruned."""
        total = kept = 0.0
        for name, prunable in self.prunable.items():
            if prunable:
                mask = self.masks[name]
                n = (math.prod(mask.weight_shape) if isinstance(mask, StructuredMask)
                     else self.group(name).numel(self.param_shapes))
                total += n
                kept += self.densities[name] * n
        return kept / total if total else 1.0

    def group(self, key: str) -> UnitGroup:
        """The head or neuron group whose mask is under ``key`` (``blocks.0.attn#heads``);
        raises StopIteration for a key of none (a conv weight's name)."""
        return next(g for g in self.unit_groups if g.key == key)

    def structured_bits(self) -> int:
        """Group bits of the sets that have a keep (what the mask drift is counted against)."""
        bits = 0
        for mask in self.masks.values():
            if isinstance(mask, StructuredMask):
                bits += sum(n for n, k in zip(mask.set_sizes(), CONV_KEEPS)
                            if self.keeps.get(k) is not None)
            else:
                bits += mask.set_sizes()[0]
        return bits

    # ------------------------------------------------------------------ projection
    def project(
        self, tensors: dict[str, torch.Tensor], keeps: dict[str, float | None] | None = None
    ) -> dict:
        """Pi_S of eq. (10) over every structured set, in place: each conv weight onto its
        filter/channel/shape sets, each group onto its kept heads or neurons (``keeps``:
        default this round's). Returns the masks chosen."""
        keeps = self.keeps if keeps is None else keeps
        conv = {k: keeps.get(k) for k in CONV_KEEPS}
        masks = {}
        for name in self.shapes:
            _, masks[name] = project(tensors[name], **conv, in_place=True)
        for group in self.unit_groups:
            masks[group.key] = project_units(group, tensors, keeps.get(group.keep_option))
        return masks

    def select(
        self, tensors: dict[str, torch.Tensor], keeps: dict[str, float | None] | None = None
    ) -> dict:
        """The masks ``project`` would choose, ``tensors`` untouched."""
        names = [*self.shapes, *(s.param for g in self.unit_groups for s in g.slices)]
        return self.project({n: tensors[n].clone() for n in dict.fromkeys(names)}, keeps)

    @torch.no_grad()
    def apply(self, tensors: dict[str, torch.Tensor]) -> None:
        """Zero what the agreed masks prune, in place (the frozen masks of Alg. 1 line 11)."""
        for name, mask in self.masks.items():
            if isinstance(mask, StructuredMask):
                tensors[name].masked_fill_(~mask.dense(), 0)
            else:
                apply_units(self.group(name), mask, tensors)

    def agree(self, local: dict) -> int:
        """Eq. (14): the leaders OR their nodes' masks and broadcast the union in the node
        (one node: every rank projected the same tensor). Adopts the result; returns how
        many group bits changed."""
        agreed = (
            or_across_nodes(local, self.ctx.comm, self.ctx.topology) if self.hierarchical else local
        )
        with self.ctx.recorder.phase(phases.PROJECTION):  # local: the new masks' live slices
            drift = mask_drift(self.masks, agreed)
            if drift:
                self.use_masks(agreed)
        return drift

    def load(self, path: str) -> dict:
        """A run's saved masks (``--masks-from``), checked against this model."""
        return {**load_masks(path, self.shapes, self.ctx.device),
                **load_unit_masks(path, self.unit_groups, self.ctx.device)}

    def density(self) -> float:
        """Fraction of the pruned tensors' elements the agreed masks keep (1.0 without
        masks), as read at the last mask change: a method records it every round at no host
        sync."""
        return self.overall_density

    def mask_state(self) -> dict:
        """The agreed masks' group bitmaps (name -> tensors), for a method's checkpoint;
        ``load_mask_state`` takes it back."""
        return {n: m.state() for n, m in self.masks.items()}

    def load_mask_state(self, state: dict) -> None:
        """Masks from a checkpoint; the support is restricted again by the caller if the
        run had restricted it."""
        kinds = {g.key: UnitMask for g in self.unit_groups}
        self.use_masks({n: kinds.get(n, StructuredMask).from_state(m, self.ctx.device)
                        for n, m in state.items()})
        self.support = {}

    def artifacts(self) -> dict:
        """``masks.pt`` for the run folder (a method's ``artifacts`` returns it): the agreed
        masks, which ``bench export``, the mask figures and ``--masks-from`` read."""
        return {"masks.pt": mask_artifact(self.masks)}

    # ------------------------------------------------------------------ support
    @torch.no_grad()
    def zero_dead(self, tensors: dict[str, torch.Tensor]) -> None:
        """Zero the dead slices of ``tensors`` (parameter name -> tensor) in place."""
        for name, keep in self.live_elements.items():
            tensors[name].mul_(keep)

    @torch.no_grad()
    def restrict(
        self,
        params: dict[str, torch.Tensor],
        optimizer: torch.optim.Optimizer,
        *also: dict[str, torch.Tensor],
    ) -> None:
        """Training from here on is on the support: the masks, less the dead slices. Zeroes
        theta, its momentum and the tensors of ``also`` (PruneX's u) off it; ``keep`` holds
        theta there after every local step."""
        support = {name: mask.dense() for name, mask in self.masks.items()
                   if isinstance(mask, StructuredMask)}
        for group in self.unit_groups:
            mask = self.masks[group.key]
            for part in group.slices:
                keep = element_mask(group, mask, part.param, self.param_shapes[part.param],
                                    self.ctx.device)
                support[part.param] = keep & support[part.param] if part.param in support else keep
        for name, keep in self.live_elements.items():
            support[name] = keep & support[name] if name in support else keep
        self.support = {}
        for name, dense in support.items():
            dense = dense.to(params[name].dtype)
            self.support[name] = dense
            params[name].mul_(dense)
            for tensors in also:
                tensors[name].mul_(dense)
            momentum = optimizer.state.get(params[name], {}).get("momentum_buffer")
            if momentum is not None:
                momentum.mul_(dense)

    @torch.no_grad()
    def keep(self, params: dict[str, torch.Tensor]) -> None:
        """theta back onto the support after a local step: one foreach multiply."""
        if self.support:
            names = list(self.support)
            torch._foreach_mul_([params[n] for n in names], [self.support[n] for n in names])

    def unit_keeps(self) -> dict[str, tuple[torch.Tensor | None, torch.Tensor | None]]:
        """Member tensor -> its kept (rows, cols) under the unit masks (``--pack
        dense-masks``: a pruned head's or neuron's slices are not sent either)."""
        keeps: dict[str, list] = {}
        for group in self.unit_groups:
            for param, (dim, positions) in kept_positions(group, self.masks[group.key]).items():
                keeps.setdefault(param, [None, None])[dim] = positions
        return {param: (rows, cols) for param, (rows, cols) in keeps.items()}

    # ------------------------------------------------------------------ exchange
    @property
    def packed_bytes(self) -> float:
        """Bytes of the current layout's buckets (what one leader all-reduces); NaN before
        the first exchange."""
        return float(self.layout.nbytes) if self.layout is not None else math.nan

    @torch.no_grad()
    def exchange(
        self,
        params: dict[str, torch.Tensor],
        buffers: dict[str, torch.Tensor],
        *,
        plus: dict[str, torch.Tensor] | None = None,
        reuse_buffers: bool = False,
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Pack the live slices of this node's ``params`` (plus ``plus``, where given: PruneX's
        c_i = z_i + v_i of eq. 15, formed only by the ranks that pack) and float ``buffers``,
        average them between nodes (eq. 11), spread them in the node, unpack: full-shape
        copies, zero off the packed slices. ``reuse_buffers``: the masks are frozen, so the
        buckets are allocated once and reused (sec. 4.5).

        Single leader: the leader packs, all-reduces over the leaders' group and broadcasts
        the packed buckets to its followers. Sharded: every rank packs (its node's tensors
        are replicated), all-reduces its 1/P shard of each bucket with its peers on the other
        nodes, and the node all-gathers the shards: the same inter-node bytes in total,
        spread over P links.
        """
        topo, rec = self.ctx.topology, self.ctx.recorder
        packs = topo.is_leader or self.sharded
        with rec.phase(phases.PACK):  # a new layout when the masks changed, its buckets
            if self.layout is None:
                self.layout = PackLayout(
                    model_entries(self.model, self.masks, live=self.live,
                                  unit_keeps=self.unit_keeps()),
                    bucket_bytes=self.bucket_bytes,
                    device=self.ctx.device,
                )
            if reuse_buffers:
                if self.fixed_buffers is None:
                    self.fixed_buffers = self.layout.allocate()
                out = self.fixed_buffers
            else:
                out = None if packs else self.layout.allocate()
            if packs:
                if plus is not None:
                    names = list(params)
                    summed = torch._foreach_add(
                        [params[n] for n in names], [plus[n] for n in names]
                    )
                    params = dict(zip(names, summed))
                packed = self.layout.pack_model(params, buffers, out=out)
            else:
                packed = out
        for bucket in packed:
            if self.sharded:
                self._sharded_average(bucket)
            else:
                if topo.is_leader and topo.inter is not None:
                    self._average_between_nodes(bucket, topo.inter)
                self.ctx.comm.broadcast(
                    bucket, topo.intra, src=topo.intra.ranks[0], phase=phases.BROADCAST
                )
        with rec.phase(phases.UNPACK):
            return self.layout.unpack_model(packed)

    def _average_between_nodes(self, tensor: torch.Tensor, group) -> None:
        """In-place AVG over ``group`` (one rank per node), sent in the wire dtype; the casts
        count as packing and unpacking, the result is fp32."""
        rec, comm = self.ctx.recorder, self.ctx.comm
        if self.wire_dtype == torch.float32:
            comm.all_reduce(tensor, group, phase=phases.INTER_ALLREDUCE)
        else:
            with rec.phase(phases.PACK):
                wire = tensor.to(self.wire_dtype)
            comm.all_reduce(wire, group, phase=phases.INTER_ALLREDUCE)
            with rec.phase(phases.UNPACK):
                tensor.copy_(wire)
        tensor.div_(self.ctx.topology.num_nodes)

    def _sharded_average(self, bucket: torch.Tensor) -> None:
        topo = self.ctx.topology
        procs, n = topo.gpus_per_node, bucket.numel()
        chunk = -(-n // procs)
        padded = torch.zeros(chunk * procs, dtype=bucket.dtype, device=bucket.device)
        padded[:n] = bucket
        shard = padded[topo.local_rank * chunk : (topo.local_rank + 1) * chunk]
        self._average_between_nodes(shard, self.peers)
        gathered = self.ctx.comm.all_gather(shard, topo.intra, phase=phases.INTRA_ALLGATHER)
        bucket.copy_(gathered.reshape(-1)[:n])
