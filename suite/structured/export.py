"""The physically smaller model a structured-pruning run promises (what ``bench export``
writes; ``suite.commands.export`` reads the run folder around it).

The run's evaluated model (``model.pt``: PruneX's consensus z, a pruning baseline's average)
is masked with its ``masks.pt`` and its dead slices are zeroed (``liveness``): that is the
*masked dense model*. Every channel that is dead in its whole channel group is then
removed with Torch-Pruning's pruner functions, on the same dependency graph, so conv, BN and
linear shapes shrink together. A conv input channel that only one consumer of a residual
stream prunes cannot be removed (the stream still carries it to the others): its weights stay,
as zeros. Pruned attention heads and MLP neurons (``units``) are removed by slicing
their members (qkv rows and biases, the output projection's columns, fc1's rows and biases,
fc2's columns; the attention block's head count follows). The exported model must reproduce
the masked dense model's outputs (eval mode) within ``TOLERANCE``, both computed in float64 so
that fp32 rounding (a model with activations in the hundreds differs by ~1e-2 once channels
leave its sums) is not taken for a structural difference; otherwise nothing is written.

What is measured of both: parameters, FLOPs per image (``torch.utils.flop_counter``), CPU
inference latency at batch 1 and 128, and test accuracy.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
from torch import nn

from suite.data.workload import TensorData
from suite.errors import BenchError
from suite.structured.groups import (
    ChannelGroup,
    ChannelGroups,
    copy_model,
    mapping_budget,
    trace_channel_groups,
)
from suite.structured.liveness import LiveSlices, live_slices, zero_dead
from suite.structured.masks import StructuredMask, apply_mask
from suite.structured.packing import packed_numel
from suite.structured.tracing import (
    RunawayMapping,
    build_graph,
    channel_count,
    cutting_ops,
    out_channel_pruning,
    remapped,
)
from suite.structured.units import UnitGroup, apply_units, kept_positions

TOLERANCE = 1e-5  # max |exported - masked dense| over the checked test outputs (float64)
CHECK_SAMPLES = 256  # test images the equality is checked on
LATENCY_BATCHES = (1, 128)


def masked_dense_model(model: nn.Module, masks: dict, live: LiveSlices | None = None,
                       units: list[UnitGroup] = ()) -> nn.Module:
    """A copy of ``model`` with the conv masks applied, the pruned heads and neurons of
    ``units`` zeroed, and every slice ``live`` calls dead zeroed (a pruned head's or neuron's
    slices are dead in ``live``; None: the masks alone, what a run trains)."""
    masked = copy_model(model)
    params = dict(masked.named_parameters())
    tensors = {n: p.data for n, p in params.items()}
    with torch.no_grad():
        for name, mask in masks.items():
            if isinstance(mask, StructuredMask):
                params[name].copy_(apply_mask(params[name], mask))
        for group in units:
            apply_units(group, masks[group.key], tensors)
        if live is not None:
            zero_dead(tensors, live)
    return masked


def remove_units(model: nn.Module, groups: list[UnitGroup], masks: dict) -> nn.Module:
    """``model`` (in place) without the pruned heads and neurons of ``groups``: each member
    Linear keeps its kept rows or columns, an attention block its kept heads."""
    modules = dict(model.named_modules())
    for group in groups:
        kept = kept_positions(group, masks[group.key])
        for param, (dim, positions) in kept.items():
            owner, _, tensor = param.rpartition(".")
            linear = modules[owner]
            value = getattr(linear, tensor).data.index_select(dim, positions)
            setattr(linear, tensor, nn.Parameter(value))
            if tensor == "weight":
                linear.out_features, linear.in_features = linear.weight.shape
        if group.kind == "head":
            attention = modules[group.name]
            heads = int(masks[group.key].kept.sum())
            attention.num_heads = heads
            attention.attn_dim = heads * attention.head_dim
    return model


def remove_dead_channels(
    model: nn.Module, groups: list[ChannelGroup], live: LiveSlices, example: torch.Tensor
) -> nn.Module:
    """A copy of ``model`` without the channels that are dead in their whole group.

    A group whose every channel is dead keeps one (zero) channel: a layer needs at least one.
    A group whose removal the model's forward cannot take keeps its channels, as zeros: one
    crossing a split or a grouped conv (``unshrinkable``), or one whose removal stops the
    forward (a module that keeps a per-channel tensor of its own, TResNet's anti-aliasing
    filter buffer): each group is removed in turn and the forward run on ``example``; the
    first that fails is left out and the removal starts again without it.
    """
    left_out: set[int] = set()
    while True:
        pruned, failed = _remove_groups(model, groups, live, example, left_out)
        if failed is None:
            return pruned
        left_out.add(failed)


def _remove_groups(model, groups, live, example, left_out: set[int]):
    """(the copy with the removable groups removed, None), or (None, the index of the first
    group whose removal stopped the forward)."""
    pruned = copy_model(model).cpu().eval()
    modules = dict(pruned.named_modules())
    graph = build_graph(pruned, example, *mapping_budget())
    for number, (group, alive) in enumerate(zip(groups, live.channels)):
        dead = (~alive).nonzero().flatten()
        if dead.numel() == 0 or not group.producers or number in left_out:
            continue  # nothing to remove, written by an unmasked op, or left out: zeros stay
        if dead.numel() == group.size:
            dead = dead[1:]
        root = group.producers[0]
        idxs = root.index[dead].tolist()
        try:
            pruning = out_channel_pruning(graph, modules[root.module], idxs)
        except RunawayMapping:  # the graph's mapping budget is spent: the rest stay zeros
            break
        if not in_range(pruning, graph) or unshrinkable(pruning, graph):
            continue  # shapes Torch-Pruning cannot change consistently: its zeros stay
        pruning.prune()
        remapped(graph)
        try:
            with torch.inference_mode():
                pruned(example)
        except Exception:  # the forward of a module that kept its old channel count
            return None, number
    return pruned, None


def unshrinkable(pruning, graph) -> bool:
    """Whether removing the group's channels would break a module that keeps sizes of its
    own: a split (``splits``) or a grouped conv (its groups would no longer divide its
    channels, or would regroup them: RegNetY's squeeze-excitation), or would remove other
    channels than the dead ones: a reshape Torch-Pruning could not map (``build_graph``)."""
    for item in pruning:
        if {item.dep.source, item.dep.target} & graph.unmapped:
            return True
        module = item.dep.target.module
        if (isinstance(module, nn.Conv2d) and module.groups > 1
                and not module.groups == module.in_channels == module.out_channels):
            return True
    return splits(pruning)


def splits(pruning) -> bool:
    """Whether a pruning group passes through a split, a chunk, an unbind or a slice of a
    feature map: the forward of the module doing it keeps its sizes as numbers of its own
    (timm's CSP blocks split at ``expand_chs // 2``, MixNet's mixed convs at stored split
    sizes), which no pruner updates, so removing channels there breaks the model."""
    cutting = cutting_ops()
    return any(node.type in cutting for item in pruning
               for node in (item.dep.source, item.dep.target))


def in_range(pruning, graph) -> bool:
    """Whether every module of a Torch-Pruning pruning group is asked to remove positions it
    has (Torch-Pruning 1.6 maps a split followed by a concatenation, CSPNet's blocks, past
    the splitting conv's end, and would remove other channels than the dead ones)."""
    for item in pruning:
        module = item.dep.target.module
        if not isinstance(module, nn.Module):
            continue
        writes = graph.is_out_channel_pruning_fn(item.dep.handler)
        count = channel_count(graph, module, writes)
        own = [int(i) for i in item.idxs]
        if count is not None and own and (min(own) < 0 or max(own) >= count):
            return False
    return True


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def flops_per_image(model: nn.Module, example: torch.Tensor) -> int:
    # lazy: torch.utils.flop_counter costs ~0.2 s to import; only this path needs it
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter, torch.inference_mode():
        model(example[:1])
    return int(counter.get_total_flops())


def latency_ms(
    model: nn.Module, example: torch.Tensor, batch: int, repeats: int, max_seconds: float
) -> float:
    """Median wall time of one forward pass at ``batch`` (after one warm-up), stopping after
    ``repeats`` passes or ``max_seconds``, whichever comes first (at least three passes)."""
    x = example[:1].expand(batch, *example.shape[1:]).contiguous()
    times = []
    with torch.inference_mode():
        model(x)
        start = time.perf_counter()
        while len(times) < repeats and (
            len(times) < 3 or time.perf_counter() - start < max_seconds
        ):
            t0 = time.perf_counter()
            model(x)
            times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def accuracy(model: nn.Module, data: TensorData) -> float:
    """The share of ``data`` that ``model`` classifies right, in batches of 256 at the side
    the model takes (``TensorData.for_model``)."""
    correct = 0
    with torch.inference_mode():
        for start in range(0, len(data), 256):
            logits = model(data.for_model(data.images[start : start + 256]))
            correct += (logits.argmax(1) == data.labels[start : start + 256]).sum().item()
    return correct / len(data)


@dataclass(frozen=True)
class LiveCount:
    """Elements of a masked model that still change its output: what ``--pack live`` sends
    per round and what the exported model keeps (the same liveness, ``liveness``)."""

    parameters: int
    buffers: int  # float buffers: BN running statistics

    @property
    def fp32_bytes(self) -> int:
        """Bytes of one fp32 copy: a frozen round's packed buffer, leader to leader."""
        return 4 * (self.parameters + self.buffers)


def export_model(
    model: nn.Module, masks: dict, example: torch.Tensor, unit_groups: list[UnitGroup] = (),
    *, groups: ChannelGroups | None = None,
) -> tuple[nn.Module, nn.Module, LiveCount]:
    """(the masked dense model, the exported one, the live element counts) of ``model``
    under ``masks`` (conv masks, and the masks of ``unit_groups``); raises BenchError when
    the exported model's outputs on ``example`` differ from the masked dense model's by more
    than ``TOLERANCE``. ``groups``: the model's channel groups where the caller traced them
    already (else traced here)."""
    if groups is None:
        groups = trace_channel_groups(model, example[:1])
    live = live_slices(model, groups, masks)
    for group in unit_groups:
        live = live.restricted(kept_positions(group, masks[group.key]))
    masked = masked_dense_model(model, masks, live)
    exported = remove_dead_channels(masked, groups, live, example[:1])
    exported = remove_units(exported, list(unit_groups), masks)
    diff = max_abs_diff(exported, masked, example, dtype=torch.float64)
    if not diff <= TOLERANCE:
        raise BenchError(
            f"the exported model differs from the masked dense model by {diff:.3g} "
            f"(> {TOLERANCE}); nothing written"
        )
    count = LiveCount(
        parameters=sum(packed_numel(p.shape, live.of(n)) for n, p in model.named_parameters()),
        buffers=sum(packed_numel(b.shape, live.of(n)) for n, b in model.named_buffers()
                    if b.is_floating_point()),
    )
    return masked, exported, count


def max_abs_diff(a: nn.Module, b: nn.Module, images: torch.Tensor,
                 dtype: torch.dtype = torch.float32) -> float:
    """Largest absolute difference of the two models' outputs on ``images``, computed in
    ``dtype`` (on copies of the models, when it is not theirs)."""
    if dtype != torch.float32:
        a, b, images = copy_model(a).to(dtype), copy_model(b).to(dtype), images.to(dtype)
    with torch.inference_mode():
        return (a(images) - b(images)).abs().max().item()
