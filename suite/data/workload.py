"""The workload contract: a model builder, a data source and a training recipe.

Model and data are independent: a workload names its default dataset, and ``--dataset``
swaps it (e.g. ``synthetic`` for communication studies) without touching the model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn import functional as F


@dataclass
class Recipe:
    """Per-rank training recipe; defaults are the paper's (section 5.1.5). Every field is
    overridden by the ``bench run`` flag of its name.

    Attributes:
        batch_size: per rank.
        lr: the peak learning rate.
        momentum: SGD momentum.
        weight_decay: SGD weight decay (PruneX's lambda).
        epochs: data epochs of a run without ``--epochs`` or ``--iterations``.
        lr_schedule: ``constant``, ``cosine`` (to 0) or ``step``, over the run's samples.
        warmup_epochs: linear warmup to ``lr``, in epochs of a rank's shard.

    Examples:
        ```python
        Recipe(batch_size=32, lr=0.05)
        ```
    """

    batch_size: int = 128
    lr: float = 1e-3
    momentum: float = 0.9
    weight_decay: float = 1e-4
    epochs: float = 1.0
    # constant | cosine | step, over the run's samples (suite.data.schedule)
    lr_schedule: str = "cosine"
    warmup_epochs: float = 0.1  # linear warmup to lr, in epochs of a rank's shard


@dataclass
class TensorData:
    """A whole split held in memory: images already normalized float32 (N, C, H, W).

    Attributes:
        images: (N, C, H, W) float32.
        labels: (N,) int64.
        augment: random crop (pad 4) and horizontal flip, per batch (CIFAR-10's train split).
        resize_to: the side a batch is resized to where it is handed to the model (bilinear),
            for a model that does not take the stored size (``suite.data.input_size``); None:
            as stored. Per batch, so the split stays in memory at its own size.

    Examples:
        ```python
        TensorData(torch.randn(64, 1, 16, 16), torch.randint(0, 4, (64,)))
        ```
    """

    images: torch.Tensor
    labels: torch.Tensor
    augment: bool = False  # random crop (pad 4) + horizontal flip, applied per batch
    resize_to: int | None = None  # the model's side, where it is not the stored one

    def __len__(self) -> int:
        return len(self.labels)

    def for_model(self, images: torch.Tensor) -> torch.Tensor:
        """``images`` (a batch of this split, on any device) at the side the model takes."""
        if self.resize_to is None or images.shape[-2:] == (self.resize_to, self.resize_to):
            return images
        return F.interpolate(images, size=(self.resize_to, self.resize_to), mode="bilinear",
                             align_corners=False)


@dataclass
class DatasetSpec:
    """A dataset's shape and classes: what a workload's model is built for.

    Attributes:
        name: the dataset's name.
        in_chans: image channels.
        image_size: image height and width.
        num_classes: classes.

    Examples:
        ```python
        DatasetSpec("fmnist", in_chans=1, image_size=28, num_classes=10)
        ```
    """

    name: str
    in_chans: int
    image_size: int
    num_classes: int


def example_input(spec: DatasetSpec, device: torch.device | str = "cpu") -> torch.Tensor:
    """One zero input image of ``spec``'s shape (a batch of one): what a model's graph is
    traced with."""
    return torch.zeros(1, spec.in_chans, spec.image_size, spec.image_size, device=device)


@dataclass
class Workload:
    """A model builder, a default dataset and a recipe: what a workload factory returns.

    Attributes:
        name: the ``--workload`` name.
        description: one line for ``bench list``.
        model_name: what the model is (the manifest's ``model``).
        dataset: the default ``--dataset`` (built in or registered by a plugin).
        build_model: ``spec -> model`` for any dataset's ``DatasetSpec``.
        recipe: the per-rank recipe.
        native_size: the image side the model is made for (timm's ``pretrained_cfg`` input
            size): where a search for a size it takes, when it does not take the dataset's,
            ends (``suite.data.input_size``; None: 224).
        min_size: the smallest image side its makers state it takes (timm's
            ``min_input_size``, torchvision's weights' ``min_size``): a size that search
            tries; None: none stated.

    Examples:
        ```python
        @WORKLOADS.register("mlp-fmnist", "an MLP on Fashion-MNIST")
        def mlp_fmnist() -> Workload:
            return Workload("mlp-fmnist", "MLP", "mlp", "fmnist", build_mlp, Recipe(lr=0.05))
        ```
    """

    name: str
    description: str
    model_name: str
    dataset: str  # default data source, overridable with --dataset
    build_model: Callable[[DatasetSpec], nn.Module]
    recipe: Recipe = field(default_factory=Recipe)
    native_size: int | None = None
    min_size: int | None = None
