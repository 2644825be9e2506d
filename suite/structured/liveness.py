"""Which slices of a structurally masked model still change its output (the live weights).

The structured masks of PruneX and the pruning baselines prune each conv's own filters and
input channels, but a channel that no conv reads any more makes the filters writing it, and
their BN entries, dead; a channel that no filter writes any more makes the input channels
reading it dead. Dead slices are neither sent between nodes (``packing``) nor exported
(``export``). The rule, on the channel groups of ``groups``, to a fixed point:

  * a conv filter is live if its mask keeps it and it has a live input channel; its BN
    entries and its bias go with it (a filter without weights would otherwise still send
    BN's constant beta onward, which a physically smaller model cannot keep);
  * a conv input channel is live if its mask keeps it and the conv has a live filter;
  * a channel of a group is live if something writes it (a live filter, or the model input,
    a linear layer, an unmasked op) and something reads it (a live input channel, a linear
    layer, the model output); a dead channel kills every filter, BN entry and input channel
    of its group at that index. Residual streams end in the classifier, so they stay whole
    unless every writer prunes a channel;
  * a depthwise conv (one filter per channel) passes its group's channel through: its filter
    and bias live and die with the channel, as a BN entry does (ConvMixer's and MobileNet's
    depthwise blocks);
  * every channel of a ``whole`` group is live (a LayerNorm or GroupNorm over the channels,
    or channels that Torch-Pruning ties to one another through a concatenation): removing
    one would change the others.

The projection is unchanged (the paper's eq. 10); zeroing the dead slices afterwards changes
no output of the masked model, except for the BN entries of filters that the mask prunes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from suite.structured.groups import ChannelGroup
from suite.structured.masks import StructuredMask


@dataclass(frozen=True)
class LiveSlices:
    """Per parameter or buffer name: the kept index sets of dim 0 and dim 1 (``None``: all).

    Conv weights have (live filters, live input channels); conv biases and BN tensors (live
    entries, None); linear weights (None, live input columns); everything else is whole.
    """

    rows: dict[str, torch.Tensor]
    cols: dict[str, torch.Tensor]
    channels: list[torch.Tensor]  # per channel group (.groups): its live channels

    def of(self, name: str) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        return self.rows.get(name), self.cols.get(name)

    def restricted(self, kept: dict[str, tuple[int, torch.Tensor]]) -> LiveSlices:
        """These slices, less what ``kept`` does not keep (tensor -> (dim, kept positions):
        a head's or neuron's mask, suite.structured.units)."""
        rows, cols = dict(self.rows), dict(self.cols)
        for name, (dim, positions) in kept.items():
            table = rows if dim == 0 else cols
            now = table.get(name)
            table[name] = positions if now is None else now[torch.isin(now, positions)]
        return LiveSlices(rows, cols, self.channels)

    def element_mask(self, name: str, shape: torch.Size, device=None) -> torch.Tensor | None:
        """Bool mask of ``name``'s live elements (``None``: the whole tensor is live)."""
        rows, cols = self.of(name)
        if rows is None and cols is None:
            return None
        trailing = (1,) * (len(shape) - 1)
        keep = _kept_at(rows, shape[0], device).view(-1, *trailing)
        if cols is not None:
            keep = keep & _kept_at(cols, shape[1], device).view(1, -1, *trailing[1:])
        return keep.expand(shape).contiguous()

    def partial_masks(self, shapes: dict[str, torch.Size], device=None) -> dict[str, torch.Tensor]:
        """Live-element masks of those tensors in ``shapes`` (name -> shape) that have a dead
        element: what a method multiplies into z_i or theta to keep the dead slices zero."""
        masks = {}
        for name, shape in shapes.items():
            keep = self.element_mask(name, shape, device=device)
            if keep is not None and not keep.all():
                masks[name] = keep
        return masks


def live_slices(
    model: nn.Module, groups: list[ChannelGroup], masks: dict[str, StructuredMask]
) -> LiveSlices:
    """The live slices of ``model`` under ``masks`` (conv weight name -> its mask); convs
    without a mask keep everything of their own."""
    modules = dict(model.named_modules())
    filters, inputs = _masked_bits(modules, masks)
    channels = _settle(groups, filters, inputs)
    rows, cols = _conv_slices(filters, inputs, modules)
    covered = _group_slices(groups, channels, filters, modules, rows, cols)
    for name, seen in covered.items():  # entries no group maps (Torch-Pruning skipped a
        # root, or mapped a part wrongly) are live: nothing says they are not read
        tensors = NORM_TENSORS if isinstance(modules[name], nn.modules.batchnorm._BatchNorm) \
            else DEPTHWISE_TENSORS
        _rows_of(rows, name, tensors, ~seen, modules)
    return LiveSlices(rows, cols, channels)


def _masked_bits(
    modules: dict[str, nn.Module], masks: dict[str, StructuredMask]
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The starting point of ``_settle``: per plain conv, the filters and input channels its
    mask keeps (bool; all of them without a mask), as (filters, inputs) by module name."""
    filters: dict[str, torch.Tensor] = {}  # conv module -> live filters (bool)
    inputs: dict[str, torch.Tensor] = {}  # conv module -> live input channels (bool)
    for name, module in modules.items():
        if isinstance(module, nn.Conv2d) and module.groups == 1:
            mask = masks.get(f"{name}.weight" if name else "weight")
            if mask is None:
                filters[name] = torch.ones(module.out_channels, dtype=torch.bool)
                inputs[name] = torch.ones(module.in_channels, dtype=torch.bool)
            else:
                filters[name] = _kept_at(mask.kept_filters(), module.out_channels)
                inputs[name] = _kept_at(mask.kept_channels(), module.in_channels)
    return filters, inputs


def _conv_slices(
    filters: dict[str, torch.Tensor], inputs: dict[str, torch.Tensor], modules: dict
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The settled plain convs' (rows, cols): live filters and input channels of each weight,
    and the live filters again for its bias; the tables the group members then extend."""
    rows: dict[str, torch.Tensor] = {}
    cols: dict[str, torch.Tensor] = {}
    for conv, live in filters.items():
        prefix = f"{conv}." if conv else ""
        rows[f"{prefix}weight"] = live.nonzero().flatten()
        cols[f"{prefix}weight"] = inputs[conv].nonzero().flatten()
        if modules[conv].bias is not None:
            rows[f"{prefix}bias"] = rows[f"{prefix}weight"]
    return rows, cols


def _group_slices(groups: list[ChannelGroup], channels: list[torch.Tensor],
                  filters: dict[str, torch.Tensor], modules: dict,
                  rows: dict[str, torch.Tensor], cols: dict[str, torch.Tensor],
                  ) -> dict[str, torch.Tensor]:
    """Add the slices the settled groups decide to ``rows`` and ``cols`` (in place): BN
    entries follow their conv's filters or the group's channels, depthwise filters the
    channels, linear input columns the channels.

    Args:
        groups: the model's channel groups.
        channels: per group, its live channels (``_settle``).
        filters: per plain conv, its settled live filters (bool).
        modules: module name -> module.
        rows: parameter name -> live dim-0 indices, extended in place.
        cols: parameter name -> live dim-1 indices, extended in place.

    Returns:
        Per BN or depthwise module, the entries some group maps (bool); the rest are left
        for ``live_slices`` to keep.
    """
    covered: dict[str, torch.Tensor] = {}  # BN or depthwise module -> entries a group maps
    for group, live in zip(groups, channels):
        for producer in group.producers:
            for norm in group.followers.get(producer.module, []):
                _entries_of(norm, modules[norm.module].num_features,
                            filters[producer.module][producer.index], NORM_TENSORS,
                            rows=rows, covered=covered, modules=modules)
        for norm in group.shared_followers:
            _entries_of(norm, modules[norm.module].num_features, live, NORM_TENSORS,
                        rows=rows, covered=covered, modules=modules)
        for conv in group.depthwise:
            _entries_of(conv, modules[conv.module].out_channels, live, DEPTHWISE_TENSORS,
                        rows=rows, covered=covered, modules=modules)
        for linear in group.linear_readers:  # a linear after a concat reads several groups
            _linear_columns(linear, live, cols, modules)
    return covered


def _entries_of(member, size: int, values: torch.Tensor, tensors: tuple[str, ...], *,
                rows: dict, covered: dict[str, torch.Tensor], modules: dict) -> None:
    """Set a BN or depthwise member's live entries to ``values`` at its index (``_rows_of``,
    united with other groups' parts) and mark those entries as mapped in ``covered``.

    Args:
        member: the group member (its module name and index).
        size: the module's entry count along dim 0.
        values: per group channel, whether the entry there is live (bool).
        tensors: the module's tensors the entries index (``NORM_TENSORS``, ...).
        rows: parameter name -> live dim-0 indices, updated in place.
        covered: module name -> entries some group maps (bool), updated in place.
        modules: module name -> module.
    """
    entries = torch.zeros(size, dtype=torch.bool)
    entries[member.index] = values
    _rows_of(rows, member.module, tensors, entries, modules)
    seen = covered.setdefault(member.module, torch.zeros(size, dtype=torch.bool))
    seen[member.index] = True


def _linear_columns(linear, live: torch.Tensor, cols: dict, modules: dict) -> None:
    """Set a linear reader's input columns at its index to the group's ``live`` channels,
    keeping what other groups (a concat before it) already set, in ``cols`` (in place)."""
    key = f"{linear.module}.weight"
    read = torch.ones(modules[linear.module].in_features, dtype=torch.bool)
    if key in cols:
        read[:] = False
        read[cols[key]] = True
    read[linear.index] = live
    cols[key] = read.nonzero().flatten()


def _settle(
    groups: list[ChannelGroup], filters: dict[str, torch.Tensor], inputs: dict[str, torch.Tensor]
) -> list[torch.Tensor]:
    """Apply the module docstring's rules until nothing changes (each pass only removes, so it
    ends); updates ``filters`` and ``inputs`` in place and returns each group's live channels."""
    while True:
        changed = _tie_filters_to_inputs(filters, inputs)
        channels = []
        for group in groups:
            live = _group_channels(group, filters, inputs)
            if _cut_dead(group.producers, filters, live):
                changed = True
            if _cut_dead(group.consumers, inputs, live):
                changed = True
            channels.append(live)
        if not changed:
            return channels


def _tie_filters_to_inputs(filters: dict[str, torch.Tensor],
                           inputs: dict[str, torch.Tensor]) -> bool:
    """The conv rules of one ``_settle`` pass: a conv without a live input channel loses its
    filters, and one without a live filter its input channels (in place); whether any did."""
    changed = False
    for conv in filters:
        if not inputs[conv].any() and filters[conv].any():
            filters[conv][:] = False
            changed = True
        if not filters[conv].any() and inputs[conv].any():
            inputs[conv][:] = False
            changed = True
    return changed


def _group_channels(group: ChannelGroup, filters: dict[str, torch.Tensor],
                    inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The group's live channels now (bool): written (open, whole, or a producer's live
    filter) and read (open, whole, or a consumer's live input channel)."""
    written = torch.full((group.size,), group.open_write or group.whole)
    read = torch.full((group.size,), group.open_read or group.whole)
    for p in group.producers:
        written |= filters[p.module][p.index]
    for c in group.consumers:
        read |= inputs[c.module][c.index]
    return written & read


def _cut_dead(members, bits: dict[str, torch.Tensor], live: torch.Tensor) -> bool:
    """Clear, in place, each member's bits (filters or input channels) at the group's dead
    channels; whether any was still set."""
    changed = False
    for m in members:
        before = bits[m.module][m.index]
        if (before & ~live).any():
            bits[m.module][m.index] = before & live
            changed = True
    return changed


def _rows_of(rows: dict, module: str, tensors: tuple[str, ...], entries: torch.Tensor,
             modules: dict) -> None:
    """The live entries of a BN layer (weight, bias, running statistics) or a depthwise
    conv (weight, bias) along dim 0; several groups may set disjoint parts: keep the union."""
    index = entries.nonzero().flatten()
    for tensor in tensors:
        if getattr(modules[module], tensor, None) is None:
            continue
        key = f"{module}.{tensor}" if module else tensor
        rows[key] = index if key not in rows else torch.unique(torch.cat([rows[key], index]))


NORM_TENSORS = ("weight", "bias", "running_mean", "running_var")
DEPTHWISE_TENSORS = ("weight", "bias")


def _kept_at(index: torch.Tensor | None, n: int, device="cpu") -> torch.Tensor:
    """Bool (n,) on ``device``, true at ``index`` (``None``: every entry)."""
    if index is None:
        return torch.ones(n, dtype=torch.bool, device=device)
    keep = torch.zeros(n, dtype=torch.bool, device=device)
    keep[index.to(device)] = True
    return keep


def zero_dead(tensors: dict[str, torch.Tensor], live: LiveSlices) -> None:
    """Zero, in place, every dead element of ``tensors`` (name -> tensor, on one device)."""
    if not tensors:
        return
    device = next(iter(tensors.values())).device
    shapes = {name: t.shape for name, t in tensors.items()}
    for name, keep in live.partial_masks(shapes, device=device).items():
        tensors[name].masked_fill_(~keep, 0)
