"""Which parameter slices of a model are coupled through its feature-map channels.

A channel of a feature map is written by the filters of the convs that produce it (several
when residual additions tie them), scaled by the BN entries that follow each of those convs,
and read by the input channels of every conv that consumes it. Torch-Pruning's
``DependencyGraph`` traces these couplings from the model's real autograd graph (residual
adds, concatenations, flattens); this module turns each of its groups into the producer /
follower / consumer index sets that the liveness rule (``liveness``) and the exporter
(``export``) need. Framework code: PruneX and the pruning baselines see one graph.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass, field

import torch
from torch import nn

from suite.errors import BenchError


@dataclass(frozen=True)
class Member:
    """One module's slice of a channel group: ``index[k]`` is the module's own position of the
    group's channel k (its filter, BN entry or input channel)."""

    module: str
    index: torch.Tensor


@dataclass
class ChannelGroup:
    """The channels of one feature map (or of several tied by residual additions).

    ``producers``: plain convs whose filters write the channels; ``followers``: per producer
    name, the BN layers applied to that conv's output alone (they die with its filters);
    ``shared_followers``: BN layers applied after the tie (they follow the group);
    ``consumers``: plain convs whose input channels read them. ``open_write`` / ``open_read``:
    something without a structured mask writes / reads them as well (the model input, a linear
    layer, an op Torch-Pruning maps not one-to-one), so a channel is never dead for lack of it.
    ``linear_readers``: linear layers that read the channels one-to-one (their input columns).
    ``depthwise``: convs with one filter per channel (groups = in = out channels), which
    Torch-Pruning couples in and out into the group: channel k passes through filter k, so
    the filter lives and dies with the group's channel, neither writing nor reading it of its
    own (its bias, like a BN shift, would otherwise send a constant onward).
    ``whole``: no channel of the group can be removed exactly, so all of them stay live: a
    norm layer that mixes channels reads them all (LayerNorm, GroupNorm: removing one changes
    the statistics of the rest), a member writes them not one-to-one (GhostNet's
    concatenated features, where removing one channel removes another one with it), the
    feature map is split (Torch-Pruning maps the parts back without their offsets), or a conv
    reads channels whose weights are zero (weight standardization).
    """

    size: int
    producers: list[Member] = field(default_factory=list)
    followers: dict[str, list[Member]] = field(default_factory=dict)
    shared_followers: list[Member] = field(default_factory=list)
    consumers: list[Member] = field(default_factory=list)
    linear_readers: list[Member] = field(default_factory=list)
    depthwise: list[Member] = field(default_factory=list)
    open_write: bool = False
    open_read: bool = False
    whole: bool = False



def _plain_conv(module: nn.Module) -> bool:
    return isinstance(module, nn.Conv2d) and module.groups == 1


#: norm layers whose statistics span the channels (a channel cannot leave them exactly)
CHANNEL_MIXING_NORMS = (nn.LayerNorm, nn.GroupNorm, nn.RMSNorm, nn.LocalResponseNorm,
                        nn.CrossMapLRN2d)


def _depthwise_conv(module: nn.Module) -> bool:
    """One filter per channel, in and out channels alike (no channel multiplier)."""
    return (isinstance(module, nn.Conv2d) and module.groups > 1
            and module.groups == module.in_channels == module.out_channels)


def copy_model(model: nn.Module) -> nn.Module:
    """``copy.deepcopy(model)``, also of a model that keeps tensors its forward computed
    (LeViT's attention-bias cache, filled by an eval forward under autograd): deepcopy
    refuses a tensor that is not a graph leaf, so such a tensor is copied detached."""
    memo: dict[int, object] = {}
    for module in model.modules():
        for name, value in vars(module).items():
            if name not in ("_parameters", "_buffers", "_modules"):
                _memo_detached(value, memo)
    return copy.deepcopy(model, memo)


def _memo_detached(value, memo: dict[int, object]) -> None:
    """Pre-seed deepcopy's ``memo`` with a detached clone of every non-leaf tensor in
    ``value``, so that ``copy_model`` copies it instead of deepcopy refusing it.

    Args:
        value: a module attribute; dicts, lists and tuples are searched through.
        memo: deepcopy's memo (tensor id -> its copy), filled in place.
    """
    if isinstance(value, torch.Tensor):
        if value.grad_fn is not None:
            memo[id(value)] = value.detach().clone()
    elif isinstance(value, dict):
        for item in value.values():
            _memo_detached(item, memo)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _memo_detached(item, memo)


def build_graph(model: nn.Module, example_input: torch.Tensor):
    """Torch-Pruning's dependency graph of ``model`` (traced in place, as it is), where an op
    Torch-Pruning cannot map its channels through is left unmapped instead of ending the trace
    (``tolerate_unmappable_ops``): ``graph.unmapped`` holds such nodes, and a group through
    one keeps every channel (``_channel_group``) and is never removed (``export``)."""
    # lazy: torch_pruning costs ~1.8 s to import; only this path needs it
    import torch_pruning as tp

    tolerate_unmappable_ops()
    _mapping_work[0] = 0
    graph = tp.DependencyGraph()
    graph.unmapped = set()
    with warnings.catch_warnings():  # its deep-recursion warnings would break a one-line refusal
        warnings.simplefilter("ignore", UserWarning)
        return graph.build_dependency(model, example_inputs=example_input, verbose=False)


#: Torch-Pruning's per-op index mappings (``dependency.index_mapping``), run at every grouping
INDEX_MAPPINGS = ("update_concat_index_mapping", "update_split_index_mapping",
                  "update_reshape_index_mapping", "update_unbind_index_mapping",
                  "update_expand_index_mapping", "update_slice_index_mapping")


#: the most channel indices one of Torch-Pruning's index mappings may carry (a flatten before
#: a classifier carries C x H x W: 25,088 for VGG at 224 px); beyond it a mapping has run away
#: (Swin's windows merged into channels: 3 million indices a step, minutes a group)
MAX_MAPPED_INDICES = 2**18
#: the most channel indices all of one graph's mappings may carry together: DPN-68 carries
#: 1.6 million (7 s), ReXNet's padded residual stream over 25 million in a minute and still
#: climbing; beyond it the model is grouped as one Torch-Pruning cannot group (``Ungroupable``)
MAX_MAPPING_WORK = 2**22
#: the channel indices the mappings of the graph being grouped carried so far (one graph is
#: grouped at a time: ``build_graph`` starts the count)
_mapping_work = [0]


def index_group_items() -> None:
    """Make Torch-Pruning's check "is this dependency with these indices in the group
    already" a set lookup instead of a scan of the group (quadratic in a group's size: ReXNet's
    padded residual stream has thousands of items, 25 s for its second group)."""
    from torch_pruning.dependency.group import Group  # lazy: as build_graph's import

    if getattr(Group.add_dep, "indexed", False):
        return
    add = Group.add_dep

    def add_dep(self, dep, idxs):
        add(self, dep, idxs)
        self.__dict__.setdefault("_seen", set()).add((dep.target, dep.handler, tuple(idxs)))

    def has_pruning_op(self, dep, idxs):
        return (dep.target, dep.handler, tuple(idxs)) in self.__dict__.get("_seen", ())

    add_dep.indexed = True
    Group.add_dep, Group.has_pruning_op = add_dep, has_pruning_op


def remapped(graph) -> None:
    """After a pruning changed shapes, the graph's index mappings are made again at its next
    grouping (``tolerate_unmappable_ops`` makes them once per graph otherwise)."""
    graph.mapped = False


class RunawayMapping(RuntimeError):
    """A Torch-Pruning index mapping carried more than ``MAX_MAPPED_INDICES`` indices."""


def tolerate_unmappable_ops() -> None:
    """Wrap Torch-Pruning's per-op index mappings (they run again at every grouping) so that
    an op it cannot map its channels through is recorded on its graph (``unmapped``) and left
    as it is, instead of ending the trace: ShuffleNetV2's channel shuffle (a view into five
    dims: a division by zero in the reshape rule) and its chunk of the shuffled channels (an
    index error in the split rule). Only an op whose mapping raises is affected: every other
    mapping runs as Torch-Pruning's own. Make the mappings once per graph, not at every
    grouping (they follow the graph's shapes, which only a pruning changes: ``remapped``;
    RexNet's hundreds of groups took minutes). And bound what the mappings carry
    (``MAX_MAPPED_INDICES`` a mapping, ``MAX_MAPPING_WORK`` a graph): a grouping that runs
    away (Swin, MaxViT, ECA-ResNet, ReXNet: minutes to hours) ends at once, the same way on
    every rank, and the model is grouped as one Torch-Pruning cannot group
    (``Ungroupable``)."""
    from torch_pruning.dependency import index_mapping  # lazy: as build_graph's import

    _tolerate_mapping_errors(index_mapping)
    index_group_items()
    _map_once_per_graph(index_mapping)
    _bound_mapping_work(index_mapping)


def _tolerate_mapping_errors(index_mapping) -> None:
    """Wrap each of ``INDEX_MAPPINGS`` so that an op whose mapping raises is recorded on its
    graph (``unmapped``) and left as it is, instead of ending the trace; idempotent.

    Args:
        index_mapping: Torch-Pruning's ``dependency.index_mapping`` module, patched in place.
    """
    for name in INDEX_MAPPINGS:
        mapping = getattr(index_mapping, name, None)
        if mapping is None or getattr(mapping, "tolerant", False):
            continue

        def tolerant(graph, node, *args, _mapping=mapping):
            try:
                return _mapping(graph, node, *args)
            except Exception:  # an op this Torch-Pruning cannot map: its groups stay whole
                graph.__dict__.setdefault("unmapped", set()).add(node)
                return None

        tolerant.tolerant = True
        setattr(index_mapping, name, tolerant)


def _map_once_per_graph(index_mapping) -> None:
    """Make Torch-Pruning's index mappings once per graph (until ``remapped``) instead of at
    every grouping, which took minutes on RexNet's hundreds of groups; idempotent.

    Args:
        index_mapping: Torch-Pruning's ``dependency.index_mapping`` module, patched in place.
    """
    update = index_mapping.update_index_mapping
    if not getattr(update, "once", False):  # Torch-Pruning maps again at every grouping

        def once(graph):
            if not getattr(graph, "mapped", False):  # shapes changed: ``remapped``
                with warnings.catch_warnings():  # "Maximum recursive depth": a refusal's line
                    warnings.simplefilter("ignore", UserWarning)
                    update(graph)
                graph.mapped = True

        once.once = True
        index_mapping.update_index_mapping = once


def _bound_mapping_work(index_mapping) -> None:
    """Make every ``*IndexMapping`` class count the indices it carries and raise
    ``RunawayMapping`` past ``MAX_MAPPED_INDICES`` a call or ``MAX_MAPPING_WORK`` a graph,
    so a runaway grouping ends at once, alike on every rank; idempotent.

    Args:
        index_mapping: Torch-Pruning's ``dependency.index_mapping`` module, patched in place.
    """
    for name in dir(index_mapping):  # the mappings' objects: bounded, so a runaway ends
        kind = getattr(index_mapping, name)
        if not (isinstance(kind, type) and name.endswith("IndexMapping")):
            continue
        if getattr(kind.__call__, "bounded", False):
            continue

        def bounded(self, idxs, *args, _call=kind.__call__):
            made = len(idxs) * made_per_index(self)  # what the call creates, not what it reads
            _mapping_work[0] += made
            if made > MAX_MAPPED_INDICES:
                raise RunawayMapping(f"a channel mapping ran away ({made:,} indices)")
            if _mapping_work[0] > MAX_MAPPING_WORK:
                raise RunawayMapping(f"the channel mappings ran away (over "
                                     f"{MAX_MAPPING_WORK:,} indices)")
            return _call(self, idxs, *args)

        bounded.bounded = True
        kind.__call__ = bounded


def made_per_index(mapping) -> int:
    """The indices one index becomes through ``mapping``: a flatten's stride (C x H x W
    from C: EfficientFormerV2's attention reshapes make 12 million from 290 thousand,
    40 s counted as 290 thousand), else one."""
    return 1 if getattr(mapping, "reverse", True) else getattr(mapping, "_stride", 1)


def dependency_graph(model: nn.Module, example_input: torch.Tensor, roots: tuple, what: str):
    """(a CPU copy of ``model`` in eval mode, Torch-Pruning's dependency graph of it from one
    traced forward pass, its groups rooted at modules of the types ``roots``); the model
    itself, its BN statistics and its device are not touched. Raises ``BenchError`` (one
    line, naming ``what`` was traced) when Torch-Pruning cannot trace the model."""
    traced = copy_model(model).cpu().eval()
    # a parameterless norm (LocalResponseNorm) is traced as its elementwise ops, not as
    # itself: remember the autograd node of each channel-mixing norm's output to know it again
    graph_nodes_of_norms = set()
    hooks = [m.register_forward_hook(lambda _m, _i, out: graph_nodes_of_norms.add(out.grad_fn))
             for m in traced.modules() if isinstance(m, CHANNEL_MIXING_NORMS)]
    try:
        graph = build_graph(traced, example_input.detach().cpu()[:1])
        groups = list(graph.get_all_groups(root_module_types=list(roots)))
        graph.channel_mixing_outputs = graph_nodes_of_norms - {None}
    except BenchError:
        raise  # a time limit that ran out while tracing
    except Exception as exc:  # tracing raises anything the model's forward or TP raises
        why = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        where = failing_op(exc, {m: n for n, m in traced.named_modules()})
        line = f"cannot trace {what} of {type(model).__name__} with Torch-Pruning{where} ({why})"
        raise (Ungroupable if forward_runs(traced, example_input) else BenchError)(
            line) from None
    finally:
        for hook in hooks:
            hook.remove()
    return traced, graph, groups


def forward_runs(model: nn.Module, example_input: torch.Tensor) -> bool:
    """Whether the model's own forward takes ``example_input`` (then a failed trace is
    Torch-Pruning's, not the model's)."""
    try:
        with torch.no_grad():
            model(example_input.detach().cpu()[:1])
    except Exception:  # the model's forward raises anything
        return False
    return True


def failing_op(exc: BaseException, names: dict[nn.Module, str]) -> str:
    """``: at the reshape after stage2.0.branch2.7``, where Torch-Pruning failed: the graph node
    it was mapping when it raised (its frames keep it as ``node``), named by its module, or
    by the modules that feed an op of no module (a channel shuffle's view and transpose);
    empty where no node is known."""
    node, trace = None, exc.__traceback__
    while trace is not None:
        candidate = trace.tb_frame.f_locals.get("node")
        if candidate is not None and hasattr(candidate, "inputs"):
            node = candidate
        trace = trace.tb_next
    if node is None:
        return ""
    if node.module in names:
        return f": at {names[node.module]} ({type(node.module).__name__})"
    feeding, frontier, seen = [], list(node.inputs), set()
    while frontier and not feeding:  # the nearest modules upstream of an op of none
        step = []
        for before in frontier:
            if id(before) in seen:
                continue
            seen.add(id(before))
            if before.module in names:
                feeding.append(names[before.module])
            else:
                step += list(before.inputs)
        frontier = step
    kind = str(getattr(node.type, "name", node.type)).lower()
    return f": at the {kind} after {', '.join(feeding[:2])}" if feeding else f": at a {kind}"


class ChannelGroups(list):
    """The channel groups of a model (a list of ``ChannelGroup``), and, where Torch-Pruning
    could not group the model at all, why (``untraced``; the list is then empty: no channel
    is dead beyond what the masks zero, which is exact, and nothing can be removed)."""

    untraced: str | None = None


class Ungroupable(BenchError):
    """Torch-Pruning traced the model's forward but could not group its channels."""


def trace_channel_groups(model: nn.Module, example_input: torch.Tensor) -> ChannelGroups:
    """The model's channel groups, from one traced forward pass of a CPU copy in eval mode
    (the model itself, its BN statistics and its device are not touched). A model whose
    forward Torch-Pruning follows but cannot group (ShuffleNetV2's shuffled channels) gets
    no groups and the reason (``ChannelGroups.untraced``): its masks' blocks are what is live.

    Raises ``BenchError`` (one line) when the model cannot be traced at all.
    """
    try:
        traced, graph, tp_groups = dependency_graph(
            model, example_input, (nn.Conv2d, nn.Linear), "the channel dependencies"
        )
    except Ungroupable as exc:
        found = ChannelGroups()
        found.untraced = str(exc)
        return found
    names = {module: name for name, module in traced.named_modules()}
    groups = ChannelGroups(_channel_group(group, graph, names) for group in tp_groups)
    # a conv in the graph whose filters map onto no group one-to-one (GhostNet's concatenated
    # and sliced features) keeps its mask's own block: it opens the groups it writes
    missing = [n for m, n in names.items() if _plain_conv(m) and m not in graph.module2node]
    if missing:
        raise BenchError(
            f"cannot trace the channel dependencies of {type(model).__name__}: conv "
            f"{missing[0]} is not in the graph Torch-Pruning traced (a forward without "
            "autograd, or an op it does not know)"
        )
    return groups


def member_index(item, size: int, limit: int | None) -> torch.Tensor | None:
    """A Torch-Pruning group item's own positions in the group's channel order (``index[k]``:
    the module's position of the group's channel k), or None where the item does not map
    the group's channels one-to-one onto its own. Its ``idxs`` are the module's own
    positions and its ``root_idxs`` the group channels they stand for: after a split, a
    chunk, a concatenation or a transpose the two orders differ, and a module may hold only
    part of the group or hold a channel twice. ``limit``: the module's own channel count
    along the pruned dim; positions beyond it (Torch-Pruning 1.6 maps a split followed by a
    concatenation, as in CSPNet's blocks, past the end of the splitting conv) are no map."""
    own = [int(i) for i in item.idxs]
    roots = getattr(item, "root_idxs", None)
    if roots is None or len(roots) != len(own) or any(r is None for r in roots):
        return None
    roots = [int(r) for r in roots]
    if len(own) != size or sorted(roots) != list(range(size)) or len(set(own)) != size:
        return None
    if limit is not None and (min(own) < 0 or max(own) >= limit):
        return None
    index = torch.empty(size, dtype=torch.long)
    index[torch.as_tensor(roots, dtype=torch.long)] = torch.as_tensor(own, dtype=torch.long)
    return index


def _channel_group(tp_group, graph, names: dict[nn.Module, str]) -> ChannelGroup:
    """The ``ChannelGroup`` of one Torch-Pruning group: each item sorted into the role its
    module plays for the group's channels, in the group's own item order."""
    _, root_idxs = tp_group[0]
    group = ChannelGroup(size=len(root_idxs))
    for item in tp_group:
        _add_item(group, item, graph, names)
    if not group.producers and not group.open_write:
        group.open_write = True  # written by something Torch-Pruning does not list: keep it
    return group


def _add_item(group: ChannelGroup, item, graph, names: dict[nn.Module, str]) -> None:
    """Record one Torch-Pruning group item on ``group``: whether it forces the group whole,
    and, for a module with parameters, the member it is (or the open end it makes).

    Args:
        group: the group being built, updated in place.
        item: a Torch-Pruning group item (its ``dep`` and its ``idxs`` / ``root_idxs``).
        graph: Torch-Pruning's dependency graph, as ``dependency_graph`` returns it.
        names: module -> its qualified name in the traced model.
    """
    dep = item.dep
    module = dep.target.module
    if _forces_whole(dep, module, graph):
        # a channel-mixing norm, or a split, chunk, unbind or slice of the feature map,
        # which Torch-Pruning 1.6 maps back without the part's offset (CSPNet's
        # split-then-concat: its members would name the wrong channels)
        group.whole = True
    if not isinstance(module, nn.Module) or not any(True for _ in module.parameters()):
        if dep.target.type == _optype("OUTPUT"):
            group.open_read = True
        return  # element-wise ops, reshapes, adds: no parameters of their own
    writes = graph.is_out_channel_pruning_fn(dep.handler)
    index = member_index(item, group.size, channel_count(graph, module, writes))
    one_to_one = index is not None
    if isinstance(module, nn.Conv2d) and not writes and not ignores_zeroed_inputs(module):
        group.whole = True  # it reads a channel whose weights are zero: none is dead
    member = Member(names[module], index if one_to_one else torch.as_tensor(
        [int(i) for i in item.idxs], dtype=torch.long))
    if writes and not one_to_one:
        group.whole = True
    _file_member(group, member, module, writes=writes, one_to_one=one_to_one,
                 graph=graph, names=names)


def _forces_whole(dep, module, graph) -> bool:
    """Whether a dependency keeps every channel of its group: it reaches a channel-mixing
    norm, cuts the feature map into parts, or passes an op Torch-Pruning left unmapped."""
    return bool(isinstance(module, CHANNEL_MIXING_NORMS)
                or getattr(dep.target, "grad_fn", None) in graph.channel_mixing_outputs
                or {dep.source.type, dep.target.type} & _cutting_ops()
                or {dep.source, dep.target} & graph.unmapped)


def _file_member(group: ChannelGroup, member: Member, module: nn.Module, *, writes: bool,
                 one_to_one: bool, graph, names: dict[nn.Module, str]) -> None:
    """Put a parameterized module's member in its role list on ``group``, or, for a module
    the liveness rule cannot follow channel by channel, open the group's write or read end.

    Args:
        group: the group being built, updated in place.
        member: the module's slice of the group's channels.
        module: the member's module.
        writes: whether the item prunes the module's outputs (else its inputs).
        one_to_one: whether ``member.index`` maps the group's channels one-to-one.
        graph: Torch-Pruning's dependency graph (a BN layer's input conv).
        names: module -> its qualified name in the traced model.
    """
    if _plain_conv(module) and one_to_one:
        (group.producers if writes else group.consumers).append(member)
    elif isinstance(module, nn.modules.batchnorm._BatchNorm) and one_to_one:
        owner = _owning_conv(module, graph, names)
        if owner is None:
            group.shared_followers.append(member)
        else:
            group.followers.setdefault(owner, []).append(member)
    elif _depthwise_conv(module) and one_to_one:
        group.depthwise.append(member)
    elif isinstance(module, nn.Linear) and not writes and one_to_one:
        group.linear_readers.append(member)
        group.open_read = True
    elif writes:
        group.open_write = True
    else:
        group.open_read = True


def ignores_zeroed_inputs(conv: nn.Conv2d) -> bool:
    """Whether the conv no longer reads an input channel whose weight slice is zero, as
    ``F.conv2d`` of its weight does; a conv that transforms its weight first does not (timm's
    StdConv2d and ScaledStdConv2d standardize each filter over its inputs, so a zeroed slice
    becomes ``-mean / std``): its input channels are never dead. Checked on the conv itself
    (a copy, one small input), so any subclass is judged by what it computes."""
    if type(conv).forward is nn.Conv2d.forward:
        return True
    probe = copy.deepcopy(conv).float().eval()
    generator = torch.Generator().manual_seed(0)
    size = max(9, *(k * 2 + 1 for k in probe.kernel_size))
    x = torch.randn(1, probe.in_channels, size, size, generator=generator)
    changed = x.clone()
    changed[:, 0] = torch.randn(size, size, generator=generator)
    with torch.no_grad():
        probe.weight[:, 0] = 0
        try:
            return torch.equal(probe(x), probe(changed))
        except Exception:  # a conv that cannot run alone: judged as not ignoring
            return False


def channel_count(graph, module: nn.Module, writes: bool) -> int | None:
    """The module's channels along the dim a group item prunes (out for a writer, in for a
    reader), as Torch-Pruning's pruner of it counts them; None where it has no pruner."""
    pruner = graph.get_pruner_of_module(module)
    if pruner is None:
        return None
    count = pruner.get_out_channels(module) if writes else pruner.get_in_channels(module)
    return int(count) if count is not None else None


def _owning_conv(norm: nn.Module, graph, names: dict[nn.Module, str]) -> str | None:
    """The conv whose output alone the BN layer normalizes, if its input is one plain conv."""
    inputs = graph.module2node[norm].inputs
    if len(inputs) == 1 and _plain_conv(inputs[0].module):
        return names[inputs[0].module]
    return None


def _cutting_ops() -> set:
    """Torch-Pruning's op types that cut a feature map into parts."""
    return {_optype("SPLIT"), _optype("UNBIND"), _optype("SLICE")}


def _optype(name: str):
    # lazy: torch_pruning costs ~1.8 s to import; only this path needs it
    import torch_pruning as tp

    return getattr(tp.ops.OPTYPE, name)
