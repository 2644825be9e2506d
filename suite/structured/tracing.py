"""The one adapter of Torch-Pruning: every import of ``torch_pruning`` in the suite and every
change the suite makes to it are here, with what of it the suite relies on.

Torch-Pruning traces a model's channel couplings (``DependencyGraph``); the suite reads its
groups (``suite.structured.groups``, ``units``) and removes dead channels with its pruner
functions (``export``). Four process-wide patches make its tracing fit the suite
(``patch_torch_pruning``): a group's "is this item in already" check becomes a set lookup,
an op whose index mapping raises is left unmapped instead of ending the trace, the mappings
run once per graph instead of at every grouping, and what they carry is bounded so a runaway
grouping ends at once (``RunawayMapping``). A failed trace is located by the graph node
Torch-Pruning's mapping was at (a local of its frames: ``failing_op``).

All of this names Torch-Pruning's internals, which a release may rename: one that renamed
an index mapping would leave it unpatched and change the channel groups, and so the bytes
every run sends, without an import error. So the suite supports the range ``pyproject.toml``
declares (1.6), ``REQUIRED`` lists every symbol the adapter patches or reads, and a
release that lacks one is refused in one line naming it (``require_torch_pruning``), before
any graph is traced; tests/structured/test_tracing.py holds the installed release to it.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import warnings

import torch
from torch import nn

from suite.errors import BenchError

#: Torch-Pruning's per-op index mappings (``dependency.index_mapping``), run at every grouping
INDEX_MAPPINGS = ("update_concat_index_mapping", "update_split_index_mapping",
                  "update_reshape_index_mapping", "update_unbind_index_mapping",
                  "update_expand_index_mapping", "update_slice_index_mapping")
#: its index mapping classes, whose calls are bounded (``_bound_mapping_work``)
MAPPING_CLASSES = ("_FlattenIndexMapping", "_ConcatIndexMapping", "_GQAIndexMapping",
                   "_SliceIndexMapping", "_SplitIndexMapping")
#: the op types the suite reads of a graph's nodes
OP_TYPES = ("SPLIT", "UNBIND", "SLICE", "OUTPUT")
#: every symbol of Torch-Pruning the adapter patches or reads: module -> names (a dotted
#: name is an attribute of an attribute)
REQUIRED = {
    "torch_pruning": ("DependencyGraph", "DependencyGraph.build_dependency",
                      "DependencyGraph.get_all_groups", "DependencyGraph.get_pruning_group",
                      "DependencyGraph.get_pruner_of_module",
                      "DependencyGraph.is_out_channel_pruning_fn", "prune_conv_out_channels",
                      *(f"ops.OPTYPE.{name}" for name in OP_TYPES)),
    "torch_pruning.dependency.group": ("Group.add_dep", "Group.has_pruning_op"),
    "torch_pruning.dependency.index_mapping": ("update_index_mapping", *INDEX_MAPPINGS,
                                               *(f"{name}.__call__" for name in
                                                 MAPPING_CLASSES)),
}
#: keyword arguments the adapter passes: the function -> their names
KEYWORDS = {
    "torch_pruning.DependencyGraph.build_dependency": ("example_inputs", "verbose"),
    "torch_pruning.DependencyGraph.get_all_groups": ("root_module_types",),
}
#: the local variable of Torch-Pruning's ``update_index_mapping`` that holds the node being
#: mapped (``failing_op`` reads it out of a failed trace's frames)
NODE_LOCAL = ("torch_pruning.dependency.index_mapping.update_index_mapping", "node")


def _resolve(module: str, dotted: str):
    """The object ``module.dotted`` names (patched ones unwrapped), or None."""
    try:
        value = importlib.import_module(module)
    except ImportError:
        return None
    for part in dotted.split("."):
        value = getattr(value, part, None)
        if value is None:
            return None
    return inspect.unwrap(value)


def missing_symbols() -> list[str]:
    """What the adapter needs that the installed Torch-Pruning lacks, each named (a symbol,
    ``f(keyword=)`` for a keyword it no longer takes, ``f: local node`` for the local a
    failed trace is located by); empty for a supported release."""
    missing = [f"{module}.{name}" for module, names in REQUIRED.items() for name in names
               if _resolve(module, name) is None]
    for function, keywords in KEYWORDS.items():
        module, _, name = function.partition(".")
        found = _resolve(module, name)
        parameters = inspect.signature(found).parameters if found is not None else {}
        if any(p.kind == inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
            continue  # takes any keyword
        missing += [f"{function}({keyword}=)" for keyword in keywords
                    if found is not None and keyword not in parameters]
    function, local = NODE_LOCAL
    module, _, name = function.rpartition(".")
    found = _resolve(module, name)
    if found is not None and local not in found.__code__.co_varnames:
        missing.append(f"{function}: local {local}")
    return missing


def require_torch_pruning() -> None:
    """Refuse a Torch-Pruning release that lacks what the adapter patches or reads.

    Raises:
        BenchError: one line naming the first missing symbol and the supported range.
    """
    missing = missing_symbols()
    if missing:
        version = getattr(importlib.import_module("torch_pruning"), "__version__", "?")
        raise BenchError(f"Torch-Pruning {version} lacks {missing[0]}, which the suite's "
                         "channel tracing patches or reads (suite/structured/tracing.py); "
                         f"install {supported_range()}")


def supported_range() -> str:
    """The Torch-Pruning releases the suite supports, as its installed metadata declares them
    (``torch-pruning<1.7,>=1.6.0``; pyproject.toml's where the suite is not installed)."""
    try:
        required = importlib.metadata.requires("prunex-bench") or []
    except importlib.metadata.PackageNotFoundError:
        required = []
    declared = [r for r in required if r.replace("_", "-").startswith("torch-pruning")
                and any(sign in r for sign in "<>=~")]
    return declared[0] if declared else "the torch-pruning range pyproject.toml declares"


class RunawayMapping(RuntimeError):
    """A Torch-Pruning index mapping carried more indices than its graph's budget allows."""


class Ungroupable(BenchError):
    """Torch-Pruning traced the model's forward but could not group its channels."""


#: the bounds of the graph being built and what its mappings carried so far (one graph is
#: grouped at a time: ``build_graph`` sets them): indices a mapping, indices a graph, spent
_budget = {"per_mapping": 0, "per_graph": 0, "spent": 0}


def build_graph(model: nn.Module, example_input: torch.Tensor, per_mapping: int,
                per_graph: int):
    """Torch-Pruning's dependency graph of ``model`` (traced in place, as it is), where an op
    Torch-Pruning cannot map its channels through is left unmapped instead of ending the
    trace: ``graph.unmapped`` holds such nodes. Its index mappings may carry ``per_mapping``
    indices a call and ``per_graph`` in all before ``RunawayMapping`` ends them.

    Raises:
        BenchError: the installed Torch-Pruning lacks what the adapter needs.
    """
    # lazy: torch_pruning costs ~1.8 s to import; only this path needs it
    import torch_pruning as tp

    require_torch_pruning()
    patch_torch_pruning()
    _budget.update(per_mapping=per_mapping, per_graph=per_graph, spent=0)
    graph = tp.DependencyGraph()
    graph.unmapped = set()
    with warnings.catch_warnings():  # its deep-recursion warnings would break a one-line refusal
        warnings.simplefilter("ignore", UserWarning)
        return graph.build_dependency(model, example_inputs=example_input, verbose=False)


def remapped(graph) -> None:
    """After a pruning changed shapes, the graph's index mappings are made again at its next
    grouping (``patch_torch_pruning`` makes them once per graph otherwise)."""
    graph.mapped = False


def patch_torch_pruning() -> None:
    """Patch Torch-Pruning for the suite's tracing (idempotent; they run again at every
    grouping): an op whose index mapping raises is recorded on its graph (``unmapped``) and
    left as it is instead of ending the trace (ShuffleNetV2's channel shuffle: a view into
    five dims, a division by zero in the reshape rule; its chunk of the shuffled channels: an
    index error in the split rule); only an op whose mapping raises is affected. A group's
    membership check is a set lookup. The mappings are made once per graph, not at every
    grouping (they follow the graph's shapes, which only a pruning changes: ``remapped``;
    RexNet's hundreds of groups took minutes). And what the mappings carry is bounded
    (``build_graph``'s budget): a grouping that runs away (Swin, MaxViT, ECA-ResNet, ReXNet:
    minutes to hours) ends at once, the same way on every rank, and the model is grouped as
    one Torch-Pruning cannot group (``Ungroupable``)."""
    from torch_pruning.dependency import index_mapping  # lazy: as build_graph's import

    _tolerate_mapping_errors(index_mapping)
    _index_group_items()
    _map_once_per_graph(index_mapping)
    _bound_mapping_work(index_mapping)


def _index_group_items() -> None:
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
    add_dep.__wrapped__ = add
    Group.add_dep, Group.has_pruning_op = add_dep, has_pruning_op


def _tolerate_mapping_errors(index_mapping) -> None:
    """Wrap each of ``INDEX_MAPPINGS`` so that an op whose mapping raises is recorded on its
    graph (``unmapped``) and left as it is, instead of ending the trace; idempotent.

    Args:
        index_mapping: Torch-Pruning's ``dependency.index_mapping`` module, patched in place.
    """
    for name in INDEX_MAPPINGS:
        mapping = getattr(index_mapping, name)
        if getattr(mapping, "tolerant", False):
            continue

        def tolerant(graph, node, *args, _mapping=mapping):
            try:
                return _mapping(graph, node, *args)
            except Exception:  # an op this Torch-Pruning cannot map: its groups stay whole
                graph.__dict__.setdefault("unmapped", set()).add(node)
                return None

        tolerant.tolerant = True
        tolerant.__wrapped__ = mapping
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
        once.__wrapped__ = update
        index_mapping.update_index_mapping = once


def _bound_mapping_work(index_mapping) -> None:
    """Make every ``*IndexMapping`` class count the indices it carries and raise
    ``RunawayMapping`` past the graph's budget (``build_graph``), a call's or the graph's,
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
            _budget["spent"] += made
            if made > _budget["per_mapping"]:
                raise RunawayMapping(f"a channel mapping ran away ({made:,} indices)")
            if _budget["spent"] > _budget["per_graph"]:
                raise RunawayMapping(f"the channel mappings ran away (over "
                                     f"{_budget['per_graph']:,} indices)")
            return _call(self, idxs, *args)

        bounded.bounded = True
        bounded.__wrapped__ = kind.__call__
        kind.__call__ = bounded


def made_per_index(mapping) -> int:
    """The indices one index becomes through ``mapping``: a flatten's stride (C x H x W
    from C: EfficientFormerV2's attention reshapes make 12 million from 290 thousand,
    40 s counted as 290 thousand), else one."""
    return 1 if getattr(mapping, "reverse", True) else getattr(mapping, "_stride", 1)


def traced_groups(model: nn.Module, example_input: torch.Tensor, roots: tuple, what: str,
                  budget: tuple[int, int]):
    """(Torch-Pruning's dependency graph of ``model`` from one traced forward pass, its
    groups rooted at modules of the types ``roots``), the model traced as it is (a CPU copy
    in eval mode, the caller's); ``budget``: ``build_graph``'s (per mapping, per graph).

    Raises:
        Ungroupable: the model's forward runs but Torch-Pruning could not group it (one
            line, naming ``what`` was traced and where it failed).
        BenchError: the model cannot be traced at all (the same line), or the installed
            Torch-Pruning lacks what the adapter needs.
    """
    try:
        graph = build_graph(model, example_input.detach().cpu()[:1], *budget)
        groups = list(graph.get_all_groups(root_module_types=list(roots)))
    except BenchError:
        raise  # a time limit that ran out while tracing, or an unsupported release
    except Exception as exc:  # tracing raises anything the model's forward or TP raises
        why = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        where = failing_op(exc, {m: n for n, m in model.named_modules()})
        line = f"cannot trace {what} of {type(model).__name__} with Torch-Pruning{where} ({why})"
        raise (Ungroupable if forward_runs(model, example_input) else BenchError)(
            line) from None
    return graph, groups


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
    it was mapping when it raised (its frames keep it as ``node``: ``NODE_LOCAL``), named by
    its module, or by the modules that feed an op of no module (a channel shuffle's view and
    transpose); empty where no node is known."""
    node, trace = None, exc.__traceback__
    while trace is not None:
        candidate = trace.tb_frame.f_locals.get(NODE_LOCAL[1])
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


def channel_count(graph, module: nn.Module, writes: bool) -> int | None:
    """The module's channels along the dim a group item prunes (out for a writer, in for a
    reader), as Torch-Pruning's pruner of it counts them; None where it has no pruner."""
    pruner = graph.get_pruner_of_module(module)
    if pruner is None:
        return None
    count = pruner.get_out_channels(module) if writes else pruner.get_in_channels(module)
    return int(count) if count is not None else None


def out_channel_pruning(graph, module: nn.Module, idxs: list[int]):
    """Torch-Pruning's group that removes the output channels ``idxs`` of the conv
    ``module`` and everything coupled to them (``.prune()`` removes them)."""
    # lazy: torch_pruning costs ~1.8 s to import; only this path needs it
    import torch_pruning as tp

    return graph.get_pruning_group(module, tp.prune_conv_out_channels, idxs)


def op_type(name: str):
    """Torch-Pruning's op type ``name`` (one of ``OP_TYPES``)."""
    # lazy: torch_pruning costs ~1.8 s to import; only this path needs it
    import torch_pruning as tp

    return getattr(tp.ops.OPTYPE, name)


def cutting_ops() -> set:
    """Torch-Pruning's op types that cut a feature map into parts (a split, a chunk, an
    unbind, a slice)."""
    return {op_type("SPLIT"), op_type("UNBIND"), op_type("SLICE")}
