"""Built-in workloads: the paper's models with their default datasets.

Importing this module registers them (pyproject.toml names it as a ``prunex_bench.workloads``
entry point, as a third-party workload package would be).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import replace

from torch import nn

from suite.api import WORKLOADS, BenchError, DatasetSpec, Recipe, Workload
from workloads import models

SMALL_STEM = "stem adapted for small inputs: 3x3 stride-1 conv1, no max-pool"

# The paper's recipe (batch 128/rank, lr 1e-3) is tuned for ResNets on CIFAR-10 over 64 GPUs
# and hundreds of local epochs. On 4 CPU ranks one Fashion-MNIST epoch at 4 x 128 is only 117
# steps and reaches 57% (benchmarks/recipe_check.py); 4 x 32 at lr 0.05 reaches 84%.
CPU_DEMO_RECIPE = Recipe(batch_size=32, lr=0.05)
PAPER = "paper recipe: batch 128/rank, lr 1e-3"
# SGD with momentum at the CNNs' 0.05 diverges on the ViT; 0.01 trains it
VIT_RECIPE = Recipe(batch_size=32, lr=0.01)
VIT = "CPU recipe: batch 32/rank, lr 0.01"
CPU_DEMO = "CPU recipe: batch 32/rank, lr 0.05"

# name: (model name, default dataset, builder, recipe, description)
BUILTINS: dict[str, tuple[str, str, Callable[[DatasetSpec], nn.Module], Recipe, str]] = {
    "cnn-fmnist": (
        "small_cnn",
        "fmnist",
        models.small_cnn,
        CPU_DEMO_RECIPE,
        f"4-conv BatchNorm CNN (~0.24M params) on Fashion-MNIST; cheap for CPU runs; {CPU_DEMO}",
    ),
    "resnet18-fmnist": (
        "resnet18",
        "fmnist",
        models.resnet18,
        CPU_DEMO_RECIPE,
        f"timm ResNet-18 (~11.2M params; {SMALL_STEM}) on Fashion-MNIST; {CPU_DEMO}",
    ),
    "resnet18-cifar10": (
        "resnet18",
        "cifar10",
        models.resnet18,
        Recipe(),
        f"timm ResNet-18 (~11.2M params; {SMALL_STEM}) on CIFAR-10; {PAPER}",
    ),
    "resnet152-cifar10": (
        "resnet152",
        "cifar10",
        models.resnet152,
        Recipe(),
        f"timm ResNet-152 (~58.2M params; {SMALL_STEM}) on CIFAR-10; {PAPER}",
    ),
    "vit-fmnist": (
        "vit_small_images",
        "fmnist",
        models.vit_small_images,
        VIT_RECIPE,
        f"timm ViT for small images (patch 4, 6 blocks of width 128, 4 heads, ~1.2M params) "
        f"on Fashion-MNIST; {VIT}",
    ),
    "vit-cifar10": (
        "vit_small_images",
        "cifar10",
        models.vit_small_images,
        Recipe(),
        f"timm ViT for small images (patch 4, 6 blocks of width 128, 4 heads, ~1.2M params) "
        f"on CIFAR-10; {PAPER}",
    ),
    "mobilenet-fmnist": (
        "mobilenetv3_small_050",
        "fmnist",
        models.mobilenetv3_small,
        CPU_DEMO_RECIPE,
        "timm MobileNetV3-Small 0.5 (~0.58M params; depthwise convs, squeeze-excitation) on "
        f"Fashion-MNIST; {CPU_DEMO}",
    ),
    "mobilenet-cifar10": (
        "mobilenetv3_small_050",
        "cifar10",
        models.mobilenetv3_small,
        Recipe(),
        "timm MobileNetV3-Small 0.5 (~0.58M params; depthwise convs, squeeze-excitation) on "
        f"CIFAR-10; {PAPER}",
    ),
    "wrn50_2-cifar10": (
        "wide_resnet50_2",
        "cifar10",
        models.wide_resnet50_2,
        Recipe(),
        f"timm Wide ResNet-50-2 (~66.8M params; {SMALL_STEM}) on CIFAR-10; {PAPER}",
    ),
    # CNN families PruneX was not tuned on (benchmarks/families.py), as a user would try them
    "resnet10t-fmnist": (
        "resnet10t", "fmnist", models.timm_family("resnet10t"), CPU_DEMO_RECIPE,
        f"timm ResNet-10-T (~4.9M params; deep 3-conv stem, ImageNet strides) on Fashion-MNIST; "
        f"{CPU_DEMO}",
    ),
    "regnetx-fmnist": (
        "regnetx_002", "fmnist", models.timm_family("regnetx_002"), CPU_DEMO_RECIPE,
        f"timm RegNetX-200MF (~2.3M params; grouped 3x3 convs) on Fashion-MNIST; {CPU_DEMO}",
    ),
    "efficientnet-fmnist": (
        "efficientnet_b0", "fmnist", models.timm_family("efficientnet_b0"), CPU_DEMO_RECIPE,
        f"timm EfficientNet-B0 (~4.0M params; MBConv: depthwise convs, squeeze-excitation, "
        f"SiLU) on Fashion-MNIST; {CPU_DEMO}",
    ),
    "ghostnet-fmnist": (
        "ghostnet_050", "fmnist", models.timm_family("ghostnet_050"), CPU_DEMO_RECIPE,
        f"timm GhostNet 0.5 (~1.3M params; Ghost modules: depthwise features concatenated) on "
        f"Fashion-MNIST; {CPU_DEMO}",
    ),
    "convmixer-fmnist": (
        "convmixer_64_4", "fmnist", models.convmixer_64_4, CPU_DEMO_RECIPE,
        f"timm ConvMixer-64/4 (~25K params; residual depthwise blocks, 2x2 patches) on "
        f"Fashion-MNIST; {CPU_DEMO}",
    ),
    "convnext-fmnist": (
        "convnext_small_images", "fmnist", models.convnext_small_images, CPU_DEMO_RECIPE,
        f"timm ConvNeXt at widths 16-128 (~0.27M params; depthwise 7x7, LayerNorm, inverted "
        f"MLP; 2x2 patch stem) on Fashion-MNIST; {CPU_DEMO}",
    ),
}


def _register(name: str) -> None:
    model_name, dataset, build, recipe, description = BUILTINS[name]

    @WORKLOADS.register(name, description)
    def factory() -> Workload:
        return Workload(name, description, model_name, dataset, build, replace(recipe))


for _name in BUILTINS:
    _register(_name)


BY_NAME = ("randomly initialized, on Fashion-MNIST by default (--dataset swaps it: channels, "
           f"image size and classes follow); {CPU_DEMO}")


def timm_names(pattern: str) -> list[str]:
    """timm's model names matching ``pattern`` (``timm.list_models``'s own filter)."""
    import timm  # lazy: ~1.6 s to import; only browsing timm's names needs it

    return timm.list_models(pattern)


def torchvision_names(pattern: str) -> list[str]:
    """torchvision's classifiers matching ``pattern`` (its ``list_models(include=...)``)."""
    import torchvision  # lazy: only browsing torchvision's names needs it

    return torchvision.models.list_models(module=torchvision.models, include=pattern)


@WORKLOADS.register_family("timm", f"any timm model by name, timm:NAME; {BY_NAME}",
                           names=timm_names)
def timm_model(name: str) -> Workload:
    """``timm:NAME``: timm's model NAME as a workload (a one-line error for a name timm does
    not know, with the closest ones)."""
    import timm  # lazy: ~1.6 s to import; only a timm: workload needs it

    if not timm.is_model(name):
        close = difflib.get_close_matches(name, timm.list_models(), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else " (timm.list_models())"
        raise BenchError(f"timm has no model {name!r}{hint}")
    native, smallest = models.timm_sizes(name)
    return Workload(f"timm:{name}", f"timm {name}; {BY_NAME}", f"timm:{name}", "fmnist",
                    models.timm_by_name(name), replace(CPU_DEMO_RECIPE), native_size=native,
                    min_size=smallest)


@WORKLOADS.register_family("torchvision",
                           f"any torchvision classifier by name, torchvision:NAME; {BY_NAME}",
                           names=torchvision_names)
def torchvision_model(name: str) -> Workload:
    """``torchvision:NAME``: torchvision's classifier NAME as a workload."""
    import torchvision  # lazy: only a torchvision: workload needs it

    known = torchvision.models.list_models(module=torchvision.models)
    if name not in known:
        close = difflib.get_close_matches(name, known, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise BenchError(f"torchvision has no classifier {name!r}{hint} (its detection, "
                         "segmentation and video models are not classifiers of images)")
    native, smallest = models.torchvision_sizes(name)
    return Workload(f"torchvision:{name}", f"torchvision {name}; {BY_NAME}",
                    f"torchvision:{name}", "fmnist", models.torchvision_by_name(name),
                    replace(CPU_DEMO_RECIPE), native_size=native, min_size=smallest)
