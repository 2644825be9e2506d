"""What a model offers to structured pruning, checked before any rank starts.

A method with structured keeps (PruneX, the pruning baselines) traces the model's groups in
every rank; a model Torch-Pruning cannot trace, or a keep that prunes nothing in this model
(``--channel-keep`` on a ViT whose only conv reads one channel, ``--head-keep`` on a CNN),
would otherwise be found after the ranks started, or never: the run would end ``ok`` with
nothing pruned. Here the launcher builds the model once on the CPU, traces what the method
will trace, and refuses such a run in one line that says what the model has and which
options apply to it.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch import nn

from suite.config import flag_of
from suite.errors import BenchError
from suite.structured.groups import trace_channel_groups
from suite.structured.masks import CONV_KEEPS, conv_shapes, keep_count
from suite.structured.tracing import Ungroupable
from suite.structured.units import UnitGroup, trace_unit_groups

#: conv keep -> the dim of a (C_out, C_in, KH, KW) weight whose groups it prunes
CONV_SETS = {"filter_keep": "output filters", "channel_keep": "input channels",
             "shape_keep": "kernel positions"}


def conv_set_size(keep: str, shape: torch.Size) -> int:
    c_out, c_in, kh, kw = shape
    return {"filter_keep": c_out, "channel_keep": c_in, "shape_keep": c_in * kh * kw}[keep]


def check_structure(settings, model: nn.Module, example: torch.Tensor, workload: str) -> None:
    """One-line errors for an untraceable model and for a keep that prunes nothing in it.
    ``settings``: the method's StructuredKeepSettings (with ``pack`` when it packs)."""
    keeps = {k: v for k, v in settings.keeps.items() if v is not None and v < 1.0}
    if getattr(settings, "pack", None) == "live":
        trace_channel_groups(model, example)  # what every rank traces for live packing
    shapes = conv_shapes(model)
    wants_units = any(k in keeps for k in ("head_keep", "mlp_keep"))
    units = trace_unit_groups(model, example) if wants_units else None
    for keep, value in keeps.items():
        if keep in CONV_KEEPS:
            sizes = [conv_set_size(keep, shape) for shape in shapes.values()]
            if any(keep_count(n, value) < n for n in sizes):
                continue
        else:
            kind = "head" if keep == "head_keep" else "neuron"
            if any(g.kind == kind and keep_count(g.units, value) < g.units for g in units):
                continue
        if units is None:
            units = describable_units(model, example)
        flag = flag_of(keep)
        raise BenchError(
            f"{flag} {value:g} prunes nothing in {workload}: {describe(shapes, units, keep)}"
        )


def describable_units(model: nn.Module, example: torch.Tensor) -> list[UnitGroup]:
    """The head and neuron groups, to describe the model in a refusal; none where
    Torch-Pruning cannot group them (Swin's windows): the refusal is about the keep."""
    try:
        return trace_unit_groups(model, example)
    except Ungroupable:
        return []


def describe(shapes: dict[str, torch.Size], units: list[UnitGroup], keep: str) -> str:
    """What the model offers, and the options that apply to it."""
    found, options = [], []
    if shapes:
        if keep in CONV_KEEPS:
            sizes = sorted({conv_set_size(keep, s) for s in shapes.values()})
            what = CONV_SETS[keep]
            if len(shapes) == 1:
                name = next(iter(shapes))
                what = what[:-1] if sizes[0] == 1 else what
                found.append(f"its only conv ({name.rpartition('.')[0] or name}) has "
                             f"{sizes[0]} {what}")
            else:
                found.append(f"its {len(shapes)} convs have {', '.join(map(str, sizes[:6]))} "
                             f"{what}")
        else:
            found.append(f"it has {len(shapes)} conv(s)")
        options += ["--filter-keep", "--channel-keep", "--shape-keep"]
    counts = Counter(g.kind for g in units)
    for kind, option in (("head", "--head-keep"), ("neuron", "--mlp-keep")):
        groups = [g for g in units if g.kind == kind]
        if groups:
            sizes = sorted({g.units for g in groups})
            block = "attention blocks" if kind == "head" else "MLPs"
            found.append(f"{counts[kind]} {block} of {'/'.join(map(str, sizes))} {kind}s")
            options.append(option)
        elif keep == f"{'head' if kind == 'head' else 'mlp'}_keep":
            found.append(f"no {'attention heads' if kind == 'head' else 'MLP neurons'}")
    applicable = [o for o in options if o != flag_of(keep)]
    use = f"; use {', '.join(applicable)}" if applicable else ""
    return "; ".join(found) + use
