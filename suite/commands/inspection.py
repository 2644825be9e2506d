"""``bench inspect``: whether the structured path works on a model and what its keeps reach,
in seconds on the CPU and before any training (``suite.structured.inspection`` runs it).

A model is named as a workload (``cnn-fmnist``, ``timm:cspresnet50``,
``torchvision:resnet18``) and built for a dataset's images (``--dataset``, the workload's by
default), as a run would build it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace

import torch

from suite.config import flag_of
from suite.data.datasets import dataset_spec
from suite.data.workload import example_input
from suite.errors import BenchError
from suite.plugins.registry import WORKLOADS
from suite.structured.inspection import TRACE_SECONDS, Inspection, inspect_model
from suite.structured.masks import DEFAULT_CHANNEL_KEEP

#: the keep flags, as ``bench run`` names them
KEEPS = ("filter_keep", "channel_keep", "shape_keep", "head_keep", "mlp_keep")


def inspect_workload(workload: str, dataset: str | None, keeps: dict,
                     trace_seconds: float = TRACE_SECONDS,
                     image_size: int | None = None) -> Inspection:
    """Build ``workload``'s model for ``dataset`` (its own by default; ``image_size``: its
    images at another size, for a model that needs larger ones) and inspect it at ``keeps``
    (none given: ``--channel-keep 0.5``, as a run's default)."""
    for name, value in keeps.items():
        if value is not None and not 0 < value <= 1:
            raise BenchError(f"{flag_of(name)} must be in (0, 1], got {value}")
    if all(value is None for value in keeps.values()):
        keeps = {**keeps, "channel_keep": DEFAULT_CHANNEL_KEEP}
    built = WORKLOADS.build(workload)
    spec = dataset_spec(dataset or built.dataset)
    if image_size is not None:
        spec = replace(spec, image_size=image_size)
    torch.manual_seed(0)
    try:
        model = built.build_model(spec)
    except BenchError:
        raise
    except Exception as exc:  # a model that cannot be made for these images
        raise BenchError(f"{workload}: cannot build it for {spec.name} ({spec.in_chans}x"
                         f"{spec.image_size}x{spec.image_size}): {type(exc).__name__}: "
                         f"{str(exc).splitlines()[0][:160] if str(exc) else ''}") from None
    return inspect_model(workload, model, example_input(spec), keeps,
                         trace_seconds=trace_seconds)


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
        f"{found.model} at {keeps_words(found.keeps)}: the structured path works "
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
