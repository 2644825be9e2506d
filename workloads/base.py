"""The workload contract: a model builder, a data source and a training recipe.

Model and data are independent: a workload names its default dataset, and ``--dataset``
swaps it (e.g. ``synthetic`` for communication studies) without touching the model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass
class Recipe:
    """Per-rank training recipe; defaults are the paper's (section 5.1.5)."""

    batch_size: int = 128
    lr: float = 1e-3
    momentum: float = 0.9
    weight_decay: float = 1e-4
    epochs: float = 1.0
    # constant | cosine | step, over the run's samples (suite.run.schedule)
    lr_schedule: str = "cosine"
    warmup_epochs: float = 0.1  # linear warmup to lr, in epochs of a rank's shard


@dataclass
class TensorData:
    """A whole split held in memory: images already normalized float32 (N, C, H, W)."""

    images: torch.Tensor
    labels: torch.Tensor
    augment: bool = False  # random crop (pad 4) + horizontal flip, applied per batch

    def __len__(self) -> int:
        return len(self.labels)


@dataclass
class DatasetSpec:
    name: str
    in_chans: int
    image_size: int
    num_classes: int


@dataclass
class Workload:
    name: str
    description: str
    model_name: str
    dataset: str  # default data source, overridable with --dataset
    build_model: Callable[[DatasetSpec], nn.Module]
    recipe: Recipe = field(default_factory=Recipe)
