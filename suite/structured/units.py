"""Structured groups of transformers: attention heads and MLP hidden neurons.

A head of an attention block is its q, k and v rows of the fused ``qkv`` projection (and
their biases) and the output projection's columns that read it; a hidden neuron of an MLP is
``fc1``'s row and bias and ``fc2``'s column. Removing a head or a neuron is removing all of
its slices together, so the model stays a smaller model of the same kind. The groups are
derived from the model's graph with Torch-Pruning, as the CNN channel groups are
(``groups``): its dependency graph couples a Linear's outputs to the Linear that reads
them; a pair whose reader takes a third of the writer's outputs and whose module says
``num_heads`` (timm's ``Attention``) is cut into heads, a one-to-one pair into neurons.

The projection of a group onto "at most k units nonzero" keeps the k units of largest
Frobenius norm (over all of a unit's slices) and zeroes the rest: the units partition the
group's coordinates, so this is the exact Euclidean projection (``project_units``; checked
against a brute-force minimization in the tests). Masks are one bit per unit
(``UnitMask``), OR-agreed between nodes like the conv masks, and they give each member
tensor its kept rows or columns, which the live packing sends and the exporter keeps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from suite.errors import BenchError
from suite.structured.groups import dependency_graph
from suite.structured.masks import read_masks_file, top_groups

#: the kinds of unit, and the keep option that prunes each
KINDS = {"head": "head_keep", "neuron": "mlp_keep"}


@dataclass(frozen=True, eq=False)
class UnitSlice:
    """One member tensor's share of a group: along ``dim`` (0: rows, 1: columns), unit ``u``
    owns the positions ``index[u]``."""

    param: str
    dim: int
    index: torch.Tensor  # (units, positions per unit), long


@dataclass(frozen=True, eq=False)
class UnitGroup:
    """The heads of one attention block, or the hidden neurons of one MLP."""

    name: str  # the block's module name: "blocks.0.attn", "blocks.0.mlp"
    kind: str  # "head" | "neuron"
    units: int
    slices: tuple[UnitSlice, ...]

    @property
    def key(self) -> str:
        """The group's key among the masks (never a parameter name)."""
        return f"{self.name}#{self.kind}s"

    @property
    def keep_option(self) -> str:
        return KINDS[self.kind]

    def numel(self, shapes: dict[str, torch.Size]) -> int:
        """Elements of the member tensors that belong to a unit."""
        total = 0
        for part in self.slices:
            shape = shapes[part.param]
            total += part.index.numel() * math.prod(s for d, s in enumerate(shape) if d != part.dim)
        return total


@dataclass(frozen=True, eq=False)
class UnitMask:
    """Which units of a group are kept (one bit each)."""

    kept: torch.Tensor  # (units,) bool

    def to_bits(self) -> torch.Tensor:
        return self.kept.to(torch.uint8)

    @classmethod
    def from_bits(cls, bits: torch.Tensor, units: int) -> UnitMask:
        if bits.dim() != 1 or bits.numel() != units:
            raise ValueError(f"a mask of {units} units has {units} bits, got {tuple(bits.shape)}")
        return cls(bits != 0)

    def like_bits(self, bits: torch.Tensor) -> UnitMask:
        """A mask of the same group from ``bits`` (what the mask sync sends)."""
        return UnitMask.from_bits(bits, self.kept.numel())

    @classmethod
    def full(cls, units: int, device=None) -> UnitMask:
        return cls(torch.ones(units, dtype=torch.bool, device=device))

    def union(self, other: UnitMask) -> UnitMask:
        return UnitMask(self.kept | other.kept)

    def density(self) -> float:
        return self.kept.float().mean().item()

    def changed_groups(self, other: UnitMask) -> int:
        return int((self.kept != other.kept).sum().item())

    def set_sizes(self) -> tuple[int]:
        return (self.kept.numel(),)

    def state(self) -> dict[str, torch.Tensor]:
        return {"units": self.kept}

    @classmethod
    def from_state(cls, state: dict, device=None) -> UnitMask:
        units = state["units"].bool().to(device)
        if units.dim() != 1:
            raise ValueError(f"a unit mask is one bit per unit, not {tuple(units.shape)}")
        return cls(units)

    def _check_same_shape(self, other: UnitMask) -> None:
        if self.kept.shape != other.kept.shape:
            raise ValueError(f"masks of {self.kept.numel()} and {other.kept.numel()} units")


def trace_unit_groups(model: nn.Module, example_input: torch.Tensor) -> list[UnitGroup]:
    """The model's attention heads and MLP neurons, from Torch-Pruning's graph of a CPU copy
    in eval mode (the model itself is not touched); [] for a model that has none (a CNN)."""
    traced, graph, tp_groups = dependency_graph(
        model, example_input, (nn.Linear,), "the heads and neurons"
    )
    names = {module: name for name, module in traced.named_modules()}
    modules = dict(traced.named_modules())
    found = []
    for tp_group in tp_groups:
        pair = linear_pair(tp_group, graph)
        if pair is None:
            continue
        writer, reader = (names[m] for m in pair)
        group = unit_group(writer, reader, modules)
        if group is not None:
            found.append(group)
    return sorted(found, key=lambda g: list(names.values()).index(g.name))


def linear_pair(tp_group, graph) -> tuple[nn.Linear, nn.Linear] | None:
    """(writer, reader) when a Torch-Pruning group couples exactly one Linear's outputs to
    exactly one Linear's inputs and nothing else with parameters (a residual stream, which
    norms and many layers share, is no unit group)."""
    writers, readers = [], []
    for dep, _ in tp_group:
        module = dep.target.module
        if not isinstance(module, nn.Module) or not any(True for _ in module.parameters()):
            continue
        if not isinstance(module, nn.Linear):
            return None
        (writers if graph.is_out_channel_pruning_fn(dep.handler) else readers).append(module)
    if len(writers) == 1 and len(readers) == 1 and writers[0] is not readers[0]:
        return writers[0], readers[0]
    return None


def unit_group(writer: str, reader: str, modules: dict[str, nn.Module]) -> UnitGroup | None:
    """Heads when ``writer`` is an attention block's fused qkv projection (its module says
    ``num_heads``) read by its output projection; neurons when the pair is one-to-one."""
    w, r = modules[writer], modules[reader]
    parent = writer.rpartition(".")[0]
    owner = modules.get(parent)
    if w.out_features == 3 * r.in_features and getattr(owner, "num_heads", None):
        heads = int(owner.num_heads)
        width = r.in_features // heads
        if width * heads != r.in_features or getattr(owner, "qkv", None) is not w:
            return None
        per_head = torch.arange(width)
        rows = torch.stack([torch.cat([part * r.in_features + h * width + per_head
                                       for part in range(3)]) for h in range(heads)])
        cols = torch.stack([h * width + per_head for h in range(heads)])
        slices = [UnitSlice(f"{writer}.weight", 0, rows)]
        if w.bias is not None:
            slices.append(UnitSlice(f"{writer}.bias", 0, rows))
        slices.append(UnitSlice(f"{reader}.weight", 1, cols))
        return UnitGroup(parent, "head", heads, tuple(slices))
    if w.out_features == r.in_features:
        index = torch.arange(w.out_features)[:, None]
        slices = [UnitSlice(f"{writer}.weight", 0, index)]
        if w.bias is not None:
            slices.append(UnitSlice(f"{writer}.bias", 0, index))
        slices.append(UnitSlice(f"{reader}.weight", 1, index))
        return UnitGroup(common_parent(writer, reader), "neuron", w.out_features, tuple(slices))
    return None


def common_parent(a: str, b: str) -> str:
    parts = []
    for x, y in zip(a.split("."), b.split(".")):
        if x != y:
            break
        parts.append(x)
    return ".".join(parts) or a


def unit_norms(group: UnitGroup, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    """Squared Frobenius norm of each unit over all of its slices."""
    total = None
    for part in group.slices:
        tensor = tensors[part.param]
        picked = tensor.index_select(part.dim, part.index.reshape(-1).to(tensor.device))
        picked = picked.movedim(part.dim, 0).reshape(group.units, -1)
        sq = picked.square().sum(1)
        total = sq if total is None else total + sq
    return total


def project_units(
    group: UnitGroup, tensors: dict[str, torch.Tensor], keep: float | None
) -> UnitMask:
    """The exact Euclidean projection of the group's slices of ``tensors`` onto "at most
    keep_count(units, keep) units nonzero", in place: the units of largest norm stay (ties
    to lower indices, the same on every rank), the others are zeroed. ``keep`` None: kept."""
    device = tensors[group.slices[0].param].device
    if keep is None:
        return UnitMask.full(group.units, device)
    mask = UnitMask(top_groups(unit_norms(group, tensors), keep))
    apply_units(group, mask, tensors)
    return mask


def apply_units(group: UnitGroup, mask: UnitMask, tensors: dict[str, torch.Tensor]) -> None:
    """Zero the pruned units' slices of ``tensors`` in place."""
    if bool(mask.kept.all()):
        return
    for part in group.slices:
        tensor = tensors[part.param]
        pruned = part.index[~mask.kept.cpu()].reshape(-1).to(tensor.device)
        tensor.index_fill_(part.dim, pruned, 0)


def kept_positions(group: UnitGroup, mask: UnitMask) -> dict[str, tuple[int, torch.Tensor]]:
    """Member tensor -> (dim, its kept positions along it, sorted)."""
    kept = mask.kept.cpu()
    return {part.param: (part.dim, part.index[kept].reshape(-1).sort().values)
            for part in group.slices}


def element_mask(group: UnitGroup, mask: UnitMask, param: str, shape, device) -> torch.Tensor:
    """Bool mask of ``param``'s elements that the kept units (or no unit) own."""
    dim, positions = kept_positions(group, mask)[param]
    along = torch.zeros(shape[dim], dtype=torch.bool)
    along[positions] = True
    owned = torch.zeros(shape[dim], dtype=torch.bool)
    for part in group.slices:
        if part.param == param:
            owned[part.index.reshape(-1)] = True
    along |= ~owned  # positions no unit owns stay
    view = [1] * len(shape)
    view[dim] = -1
    return along.view(view).expand(shape).to(device).contiguous()


def load_unit_masks(path: str, groups: list[UnitGroup], device) -> dict[str, UnitMask]:
    """The head and neuron masks a run saved, one per group (its unit count checked)."""
    file, saved = read_masks_file(path, device)
    masks = {}
    for group in groups:
        try:
            mask = UnitMask.from_state(saved[group.key], device)
        except (TypeError, KeyError, AttributeError, IndexError, ValueError):
            raise BenchError(f"--masks-from {file} has no {group.kind} mask for {group.name}"
                             ) from None
        if mask.kept.numel() != group.units:
            raise BenchError(f"--masks-from {file}: {group.name} has {mask.kept.numel()} "
                             f"{group.kind}s, this model's has {group.units}")
        masks[group.key] = mask
    return masks
