"""Whether the structured path works on a model, and what its keeps reach, without training:
what ``bench inspect`` reports and what ``benchmarks/model_zoo.py`` runs over the model zoos.

It runs the path a run and its export take, in their order, on the CPU: the preflight's
structure check (``structures.check_structure``), the channel groups (``groups``) and the
head and neuron groups (``units``), magnitude masks at the keeps (``masks.project``,
``units.project_units``: the projection PruneX and the pruning baselines make), the live
slices a frozen round packs (``liveness``), and the physically smaller model checked against
the masked dense one in float64 (``export.export_model``). The model is first given
realistic BatchNorm statistics and affine terms and nonzero biases, so a channel whose
weights are gone still moves the output through its shift, as in a trained model, and the
export check sees it. The channel groups are traced once (the export reuses the preflight's),
and each step's seconds are kept (``Inspection.phases``): what a user waits for is said.

A model Torch-Pruning cannot group within ``TRACE_SECONDS`` is refused saying so; a model
whose structure cannot be pruned exactly is refused in one line naming the module.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from dataclasses import asdict, dataclass, field
from types import SimpleNamespace

import torch
from torch import nn

from suite.errors import BenchError
from suite.structured.export import (
    TOLERANCE,
    count_parameters,
    export_model,
    masked_dense_model,
)
from suite.structured.groups import ChannelGroups, trace_channel_groups
from suite.structured.liveness import live_slices
from suite.structured.masks import (
    CONV_KEEPS,
    project,
    structured_weights,
)
from suite.structured.structures import check_structure
from suite.structured.units import KINDS, project_units, trace_unit_groups

#: seconds Torch-Pruning may take to group a model before it is refused
TRACE_SECONDS = 60.0
#: images of the random batch the export is checked on
BATCH = 4
#: a weight share above which a part of the model that a keep could reach is worth naming
WORTH_NAMING = 0.25


@dataclass
class Inspection:
    """What the structured path did with one model at one set of keeps.

    Attributes:
        model: what was inspected (``timm:cspresnet50``, a workload's model name).
        status: ``ok`` or ``refused``.
        reason: why it was refused (one line), else None.
        keeps: the keeps asked for.
        dense_parameters: the model's parameters.
        live_parameters: the parameters a frozen round packs (live slices).
        exported_parameters: the physically smaller model's parameters.
        dense_bytes: one fp32 copy of every parameter and float buffer (a dense exchange).
        packed_bytes: what a frozen round packs and sends, leader to leader (fp32).
        weights: where the parameters are: part (conv, grouped conv, linear, attention,
            norm, other) -> share of all parameters.
        advice: what to change when the keeps reach little.
        untraced: why Torch-Pruning could not group the model's channels (then only the
            masks' blocks are packed and nothing is exported smaller), else None.
        seconds: how long the inspection took (its phases together).
        phases: where the time went, in seconds: ``factory`` (the workload's factory:
            timm's import for ``timm:NAME``), ``size`` (deciding the image side), ``build``,
            ``prepare`` (realistic statistics, the plain forward), ``trace`` (the structure
            check and Torch-Pruning's groups), ``masks``, ``export`` (the smaller model and
            its float64 check), ``liveness`` (its float64 check); the process's start and
            imports are not in them.
        input_size: the side of the images the model was inspected at and how it was chosen
            (``suite.data.input_size.InputSize`` as a dict), else None.
    """

    model: str
    status: str
    reason: str | None = None
    keeps: dict = field(default_factory=dict)
    dense_parameters: int = 0
    live_parameters: int = 0
    exported_parameters: int = 0
    dense_bytes: int = 0
    packed_bytes: int = 0
    weights: dict[str, float] = field(default_factory=dict)
    advice: list[str] = field(default_factory=list)
    untraced: str | None = None
    seconds: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)
    input_size: dict | None = None

    @property
    def packed_share(self) -> float:
        return self.packed_bytes / self.dense_bytes if self.dense_bytes else float("nan")

    @property
    def exported_share(self) -> float:
        return (self.exported_parameters / self.dense_parameters if self.dense_parameters
                else float("nan"))

    def to_json(self) -> dict:
        return {**asdict(self), "packed_share": self.packed_share,
                "exported_share": self.exported_share}


@contextlib.contextmanager
def timed(phases: dict[str, float], name: str):
    """Add the block's wall seconds to ``phases[name]`` (also when it raises)."""
    started = time.perf_counter()
    try:
        yield
    finally:
        phases[name] = phases.get(name, 0.0) + time.perf_counter() - started


@contextlib.contextmanager
def time_limit(seconds: float | None, what: str):
    """Raise BenchError naming ``what`` if the block runs longer than ``seconds`` (SIGALRM:
    the main thread only, where commands run; elsewhere, and with None, no limit)."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(_signum, _frame):
        raise BenchError(f"{what} took longer than {seconds:g} s; refused")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def realistic(model: nn.Module, seed: int = 0) -> nn.Module:
    """``model`` itself, in eval mode, with BatchNorm statistics and affine terms, and the
    biases, of a trained model's sizes (a fresh model's zero shifts would hide a channel
    that the export drops but the masked model still uses)."""
    model = model.eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                if module.running_mean is not None:
                    module.running_mean.normal_(0.0, 0.1, generator=generator)
                    module.running_var.uniform_(0.5, 1.5, generator=generator)
                if module.weight is not None:
                    module.weight.uniform_(0.5, 1.5, generator=generator)
                    module.bias.normal_(0.0, 0.1, generator=generator)
            elif isinstance(module, (nn.Conv2d, nn.Linear)) and module.bias is not None:
                module.bias.normal_(0.0, 0.05, generator=generator)
    return model


def weight_shares(model: nn.Module) -> dict[str, float]:
    """part -> share of the parameters: plain convs (what the conv keeps prune), grouped and
    depthwise convs, linear layers of MLPs and heads, attention projections, norms, other."""
    counts = dict.fromkeys(("conv", "grouped conv", "linear", "attention", "norm", "other"), 0)
    for module in model.modules():
        own = sum(p.numel() for p in module.parameters(recurse=False))
        if not own:
            continue
        if isinstance(module, nn.Conv2d):
            counts["conv" if module.groups == 1 else "grouped conv"] += own
        elif isinstance(module, nn.Linear):
            counts["linear"] += own
        elif isinstance(module, (nn.modules.batchnorm._BatchNorm, nn.LayerNorm, nn.GroupNorm)):
            counts["norm"] += own
        else:
            counts["other"] += own
    for module in model.modules():  # the projections of attention blocks (num_heads)
        if getattr(module, "num_heads", None):
            for child in module.modules():
                if isinstance(child, nn.Linear):
                    own = sum(p.numel() for p in child.parameters(recurse=False))
                    counts["linear"] -= own
                    counts["attention"] += own
    total = sum(counts.values()) or 1
    return {part: n / total for part, n in counts.items() if n}


def advice_for(shares: dict[str, float], keeps: dict, reached: float) -> list[str]:
    """What to change when the keeps reach little of the model (``reached``: the packed share
    of the dense bytes): the parts that hold the weights and the option that prunes them."""
    advice = []
    options = {"linear": ("mlp_keep", "MLPs and heads hold", "--mlp-keep"),
               "attention": ("head_keep", "attention projections hold", "--head-keep")}
    for part, (keep, words, flag) in options.items():
        if shares.get(part, 0.0) >= WORTH_NAMING and not keeps.get(keep):
            advice.append(f"{words} {shares[part]:.0%} of the weights: {flag}")
    if shares.get("grouped conv", 0.0) >= WORTH_NAMING:
        advice.append(f"grouped and depthwise convs hold {shares['grouped conv']:.0%} of the "
                      "weights; a channel keep reaches them only through the plain convs "
                      "around them")
    if reached >= 0.9 and not advice:
        advice.append("the keeps reach under a tenth of the model: lower them, or add "
                      "--filter-keep to --channel-keep")
    return advice


def preflight_structure(settings, model: nn.Module, example: torch.Tensor, name: str,
                        trace_seconds: float | None = TRACE_SECONDS) -> tuple[list, str | None]:
    """What a run's ranks will do with the model's structure, done once here before any
    starts (``bench run``'s preflight and ``bench inspect`` alike), within ``trace_seconds``:
    the structure check (a keep that prunes nothing, an untraceable model), the head and
    neuron groups, and with ``--pack live`` the channel groups and the live slices at the
    keeps' first masks. Returns the head and neuron groups ([] without their keeps) and why
    the channels could not be grouped, if they could not (``ChannelGroups.untraced``: the
    masks' blocks are then what is packed, and nothing is exported smaller).

    Raises:
        BenchError: one line, naming the model or its module and why.
    """
    units, groups = trace_structure(settings, model, example, name, trace_seconds)
    return units, groups.untraced if groups is not None else None


def trace_structure(settings, model: nn.Module, example: torch.Tensor, name: str,
                    trace_seconds: float | None = TRACE_SECONDS
                    ) -> tuple[list, ChannelGroups | None]:
    """``preflight_structure``'s work: (the head and neuron groups, the channel groups with
    ``--pack live``, else None), each traced once, for a caller that goes on to use them
    (``bench inspect``'s export reads the channel groups instead of tracing them again)."""
    keeps = {k: v for k, v in settings.keeps.items() if v is not None}
    with time_limit(trace_seconds, f"grouping {name} with Torch-Pruning"):
        # the channel groups are traced below, once, where --pack live needs them
        check_structure(SimpleNamespace(keeps=settings.keeps, pack=None), model, example, name)
        wants_units = any(k in keeps for k in KINDS.values())
        units = trace_unit_groups(model, example) if wants_units else []
        groups = None
        if getattr(settings, "pack", None) == "live":
            groups = trace_channel_groups(model, example)
            live_slices(model, groups, masks_at(model, keeps, units))
    return units, groups


def runs_on(name: str, model: nn.Module, example: torch.Tensor) -> None:
    """One line unless the model's plain forward takes ``example`` (a model built for one
    image size: LeViT, EfficientFormer at other sizes than 224)."""
    try:
        with torch.no_grad():
            model(example)
    except Exception as exc:  # the model's own forward raises anything
        shape = "x".join(map(str, example.shape[1:]))
        why = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ""
        raise BenchError(f"{name} does not run on {shape} images ({type(exc).__name__}: "
                         f"{why}); give images it takes (--image-size)") from None


def check_liveness(model: nn.Module, masked: nn.Module, masks: dict, units: list,
                   batch: torch.Tensor) -> None:
    """One line unless zeroing the slices the liveness calls dead (``masked``: what a frozen
    round packs) leaves the masked model's outputs as they were: a dead slice that still
    moves the output would be dropped from every exchange (a conv that reads a zeroed input
    channel, a module outside Torch-Pruning's graph). Both are compared in float64, ``masked``
    converted in place (the inspection's own; no copy of a model of thousands of modules)."""
    plain = masked_dense_model(model, masks, units=units).to(torch.float64)  # its own copy
    batch = batch.to(torch.float64)
    with torch.inference_mode():
        diff = (plain(batch) - masked.to(torch.float64)(batch)).abs().max().item()
    if not diff <= TOLERANCE:
        raise BenchError(f"slices the liveness calls dead still move the output (by "
                         f"{diff:.3g} in float64): packing them out would not be exact")


def masks_at(model: nn.Module, keeps: dict, units: list) -> dict:
    """The magnitude masks at ``keeps``: every plain conv weight projected onto its conv
    sets, every head and neuron group onto its own (the first projection a run makes)."""
    conv = {k: v for k, v in keeps.items() if k in CONV_KEEPS and v is not None}
    params = {n: p.detach() for n, p in model.named_parameters()}
    masks = {}
    if conv:
        for name in structured_weights(model):
            masks[name] = project(params[name], **conv)[1]
    projected = {k: v.clone() for k, v in params.items()}  # project_units zeroes in place
    for group in units:
        keep = keeps.get(KINDS[group.kind])
        if keep is not None:
            masks[group.key] = project_units(group, projected, keep)
    return masks


def inspect_model(name: str, model: nn.Module, example: torch.Tensor, keeps: dict,
                  *, trace_seconds: float | None = TRACE_SECONDS,
                  phases: dict[str, float] | None = None) -> Inspection:
    """Run the structured path on ``model`` at ``keeps`` (the StructuredKeepSettings
    fields; None: not asked) with ``example`` (one input of the model's shape); an
    ``Inspection`` whose status says whether it worked (refusals are reported, not
    raised). ``model`` itself is given realistic statistics (``realistic``; a copy would
    cost a second for a model of 2,000 modules): pass a copy to keep it as it is.
    ``phases``: seconds the caller spent before (building the model), counted in."""
    keeps = {k: v for k, v in keeps.items() if v is not None}
    found = Inspection(name, "ok", keeps=keeps, phases=dict(phases or {}))
    try:
        _inspect(found, model, example, trace_seconds)
    except BenchError as exc:
        found.status, found.reason = "refused", str(exc).splitlines()[0]
    found.seconds = sum(found.phases.values())
    return found


def _inspect(found: Inspection, model: nn.Module, example: torch.Tensor,
             trace_seconds: float | None) -> None:
    """``inspect_model``'s steps, each timed into ``found.phases``, filling ``found``."""
    keeps, phases = found.keeps, found.phases
    with timed(phases, "prepare"):
        model = realistic(model)
        batch = torch.randn(BATCH, *example.shape[1:],
                            generator=torch.Generator().manual_seed(1))
        found.dense_parameters = count_parameters(model)
        found.weights = weight_shares(model)
        runs_on(found.model, model, example)
    with timed(phases, "trace"):
        settings = SimpleNamespace(keeps=keeps, pack="live")
        units, groups = trace_structure(settings, model, example, found.model, trace_seconds)
    with timed(phases, "masks"):
        masks = masks_at(model, keeps, units)
        units = [group for group in units if group.key in masks]  # those the keeps prune
    with timed(phases, "export"):
        masked, exported, count = export_model(model, masks, batch, units, groups=groups)
    with timed(phases, "liveness"):
        check_liveness(model, masked, masks, units, batch)
    found.live_parameters = count.parameters
    found.packed_bytes = count.fp32_bytes
    found.exported_parameters = count_parameters(exported)
    found.dense_bytes = 4 * (found.dense_parameters + sum(
        b.numel() for b in model.buffers() if b.is_floating_point()))
    found.advice = advice_for(found.weights, keeps, found.packed_share)
    found.untraced = groups.untraced
    if found.untraced:
        found.advice.insert(0, f"{found.untraced}: only the masks' blocks are packed, and no "
                            "channel is removed by bench export")

