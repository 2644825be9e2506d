"""``bench inspect``: whether the structured path works on a model and what its keeps reach,
in seconds on the CPU and before any training (``suite.structured.inspection`` runs it).

A model is named as a workload (``cnn-fmnist``, ``timm:cspresnet50``,
``torchvision:resnet18``) and built for a dataset's images (``--dataset``, the workload's by
default), as a run would build it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, replace

import torch
from torch import nn

from suite.config import flag_of
from suite.data.datasets import dataset_spec
from suite.data.input_size import FOUND, InputSize, input_size
from suite.data.workload import DatasetSpec, Workload, example_input
from suite.errors import BenchError
from suite.plugins.registry import WORKLOADS
from suite.processes import single_threaded
from suite.structured.inspection import TRACE_SECONDS, Inspection, inspect_model, timed
from suite.structured.masks import DEFAULT_CHANNEL_KEEP

#: the keep flags, as ``bench run`` names them
KEEPS = ("filter_keep", "channel_keep", "shape_keep", "head_keep", "mlp_keep")


@single_threaded  # a batch of four small images: a second thread only waits for a core
def inspect_workload(workload: str, dataset: str | None, keeps: dict,
                     trace_seconds: float = TRACE_SECONDS,
                     image_size: int | None = None) -> Inspection:
    """Build ``workload``'s model for ``dataset`` (its own by default) at the side it takes
    (``image_size`` where given, else the dataset's, else the smallest it takes:
    ``suite.data.input_size``, as ``bench run`` decides it) and inspect it at ``keeps``
    (none given: ``--channel-keep 0.5``, as a run's default)."""
    for name, value in keeps.items():
        if value is not None and not 0 < value <= 1:
            raise BenchError(f"{flag_of(name)} must be in (0, 1], got {value}")
    if all(value is None for value in keeps.values()):
        keeps = {**keeps, "channel_keep": DEFAULT_CHANNEL_KEEP}
    phases: dict[str, float] = {}
    with timed(phases, "factory"):
        built = WORKLOADS.build(workload)
    spec = dataset_spec(dataset or built.dataset)
    with timed(phases, "size"):
        size = input_size(built, spec, image_size)
    spec = replace(spec, image_size=size.model_side)
    with timed(phases, "build"):
        torch.manual_seed(0)
        model = build_for(built, spec)
    found = inspect_model(workload, model, example_input(spec), keeps,
                          trace_seconds=trace_seconds, phases=phases)
    found.input_size = asdict(size)
    return found


def build_for(built: Workload, spec: DatasetSpec) -> nn.Module:
    """``built``'s model for ``spec``'s images; one line for a model that cannot be made."""
    try:
        return built.build_model(spec)
    except BenchError:
        raise
    except Exception as exc:  # a model that cannot be made for these images
        raise BenchError(f"{built.name}: cannot build it for {spec.name} ({spec.in_chans}x"
                         f"{spec.image_size}x{spec.image_size}): {type(exc).__name__}: "
                         f"{str(exc).splitlines()[0][:160] if str(exc) else ''}") from None


def size_words(found: Inspection) -> str:
    """``, on 32x32 images (the smallest size timm:fasternet_t0 takes; the dataset's are
    28x28)`` where the model was not inspected at the dataset's side; else empty."""
    size = InputSize(**found.input_size) if found.input_size else None
    if size is None or not size.resized:
        return ""
    side, stored = size.model_side, size.dataset_side
    why = (f"the smallest size {found.model} takes" if size.chosen == FOUND
           else "--image-size")
    return f", on {side}x{side} images ({why}; the dataset's are {stored}x{stored})"


def keeps_words(keeps: dict) -> str:
    return ", ".join(f"{name.replace('_', ' ')} {value:g}" for name, value in keeps.items())


def print_inspection(found: Inspection, *, echo: Callable, as_json: bool) -> int:
    """The table (or JSON) of one inspection; 0 when the path works, 2 when refused."""
    if as_json:
        echo(json.dumps(found.to_json(), indent=2))
        return 0 if found.status == "ok" else 2
    if found.status != "ok":
        raise BenchError(f"{found.model}: refused: {found.reason}")
    dense = found.dense_parameters
    lines = [
        f"{found.model} at {keeps_words(found.keeps)}{size_words(found)}: the structured "
        "path works "
        f"(groups, liveness, packing, export checked in float64; {found.seconds:.1f} s)",
        f"{'':<34}{'parameters':>14}{'share':>9}",
        f"{'dense':<34}{dense:>14,}{1:>9.1%}",
        f"{'live (packed per frozen round)':<34}{found.live_parameters:>14,}"
        f"{found.live_parameters / dense:>9.1%}",
        f"{'exported':<34}{found.exported_parameters:>14,}{found.exported_share:>9.1%}",
        f"inter-node bytes per frozen round: {found.packed_bytes / 1e6:.3g} MB of "
        f"{found.dense_bytes / 1e6:.3g} MB dense ({found.packed_share:.1%}; fp32, parameters "
        "and BN statistics)",
        "weights: " + ", ".join(f"{part} {share:.0%}" for part, share in
                                sorted(found.weights.items(), key=lambda kv: -kv[1])),
    ]
    lines += [f"advice: {line}" for line in found.advice]
    for line in lines:
        echo(line)
    return 0
