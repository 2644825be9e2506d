"""Built-in workloads: the paper's models with their default datasets.

Importing this package registers them in ``suite.registry.WORKLOADS``.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from suite.registry import WORKLOADS
from workloads import models
from workloads.base import DatasetSpec, Recipe, Workload
from workloads.datasets import dataset_spec

__all__ = ["dataset_spec"]

SMALL_STEM = "stem adapted for small inputs: 3x3 stride-1 conv1, no max-pool"

# name: (model name, default dataset, builder, description)
BUILTINS: dict[str, tuple[str, str, Callable[[DatasetSpec], nn.Module], str]] = {
    "cnn-fmnist": (
        "small_cnn", "fmnist", models.small_cnn,
        "4-conv BatchNorm CNN (~0.24M params) on Fashion-MNIST; cheap enough for CPU runs",
    ),
    "resnet18-fmnist": (
        "resnet18", "fmnist", models.resnet18,
        f"timm ResNet-18 (~11.2M params; {SMALL_STEM}) on Fashion-MNIST",
    ),
    "resnet18-cifar10": (
        "resnet18", "cifar10", models.resnet18,
        f"timm ResNet-18 (~11.2M params; {SMALL_STEM}) on CIFAR-10",
    ),
    "resnet152-cifar10": (
        "resnet152", "cifar10", models.resnet152,
        f"timm ResNet-152 (~58.2M params; {SMALL_STEM}) on CIFAR-10",
    ),
    "wrn50_2-cifar10": (
        "wide_resnet50_2", "cifar10", models.wide_resnet50_2,
        f"timm Wide ResNet-50-2 (~66.8M params; {SMALL_STEM}) on CIFAR-10",
    ),
}


def _register(name: str) -> None:
    model_name, dataset, build, description = BUILTINS[name]

    @WORKLOADS.register(name, description)
    def factory() -> Workload:
        return Workload(name, description, model_name, dataset, build, Recipe())


for _name in BUILTINS:
    _register(_name)
