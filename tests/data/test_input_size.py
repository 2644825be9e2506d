"""The side a model is handed its images at: the dataset's where the model takes them, else the
smallest it takes (``suite.data.input_size``), and batches resized where they reach the model
(``TensorData.for_model``) while the data stays at its own size."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from suite.data.datasets import dataset_spec
from suite.data.input_size import (
    DATASET,
    FOUND,
    GIVEN,
    InputSize,
    candidate_sizes,
    failure,
    input_size,
)
from suite.data.sharding import ShardedLoader
from suite.data.workload import DatasetSpec, Recipe, TensorData, Workload
from suite.errors import BenchError
from suite.plugins.registry import WORKLOADS

FMNIST = dataset_spec("fmnist")


class NeedsForty(nn.Module):
    """A CNN whose 5x5 pool leaves an image under 40 px smaller than its next 8x8 kernel: it
    refuses 28x28 and 32x32 as an ImageNet stem does, with the error torch's conv raises."""

    def __init__(self, in_chans: int = 1, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(in_chans, 8, 3, padding=1), nn.MaxPool2d(5),
                                      nn.Conv2d(8, 8, 8), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(8, num_classes)

    def forward(self, x):
        return self.fc(self.features(x))


def needs_forty(native: int | None = None) -> Workload:
    return Workload("needs-forty", "a CNN that takes 40 px and more", "needs_forty", "fmnist",
                    lambda spec: NeedsForty(spec.in_chans, spec.num_classes), Recipe(),
                    native_size=native)


def test_a_timm_model_that_refuses_28_px_is_handed_the_smallest_size_it_takes():
    """FasterNet-T0's patch-merging convs leave a 1x1 map of Fashion-MNIST's 28x28 images,
    which its next 2x2 conv cannot take; 32 px is the smallest size on the grid it runs on."""
    fasternet = WORKLOADS.build("timm:fasternet_t0")
    assert fasternet.native_size == 224  # its pretrained_cfg's input size
    assert "Kernel size can't be greater" in failure(fasternet, FMNIST, 28, "cpu")
    size = input_size(fasternet, FMNIST)
    assert size == InputSize(28, 32, FOUND) and size.resized
    assert failure(fasternet, FMNIST, 32, "cpu") is None  # a real forward, not only the meta one
    assert size.describe("timm:fasternet_t0") == (
        "images resized from 28x28 to 32x32 (the smallest size timm:fasternet_t0 takes)")


def test_a_model_that_takes_the_datasets_images_keeps_them():
    assert input_size(WORKLOADS.build("cnn-fmnist"), FMNIST) == InputSize(28, 28, DATASET)


def test_the_search_walks_a_16_px_grid_up_to_the_models_own_size():
    assert candidate_sizes(28, 224) == [32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208,
                                        224]
    assert candidate_sizes(28, 224, smallest=75) == [32, 48, 64, 75, 80, 96, 112, 128, 144, 160,
                                                     176, 192, 208, 224]
    assert len(candidate_sizes(28, 600)) <= 16 and candidate_sizes(28, 600)[-1] == 600
    assert candidate_sizes(32, 28) == []
    assert input_size(needs_forty(), FMNIST) == InputSize(28, 48, FOUND)


def test_no_size_up_to_the_models_own_is_one_line():
    with pytest.raises(BenchError) as refused:
        input_size(needs_forty(native=32), FMNIST)
    line = str(refused.value)
    assert "\n" not in line and line.startswith(
        "needs-forty runs on no image size from 28x28 up to its own 32x32 (at 32: "
        "RuntimeError: ") and line.endswith("; give one it takes (--image-size)")


def test_a_given_size_is_taken_as_given():
    """--image-size is the way out where the search cannot decide (a model that runs only on a
    GPU); a size the model does not take is bench inspect's one-line refusal."""
    assert input_size(needs_forty(), FMNIST, given=64) == InputSize(28, 64, GIVEN)
    assert input_size(needs_forty(), FMNIST, given=36) == InputSize(28, 36, GIVEN)


def test_the_search_leaves_the_random_state_as_it_was():
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    input_size(needs_forty(), DatasetSpec("other", 1, 30, 10))  # real CPU builds confirm it
    assert torch.equal(torch.rand(3), expected)


def test_a_batch_is_resized_where_it_is_handed_to_the_model():
    images = torch.randn(64, 1, 28, 28)
    data = TensorData(images, torch.randint(0, 10, (64,)), resize_to=48)
    loader = ShardedLoader(data, rank=0, world_size=2, batch_size=8, seed=0)
    batch, labels = next(loader)
    assert batch.shape == (8, 1, 48, 48) and labels.shape == (8,)
    assert [b.shape for b in loader.calibration_batches(2)] == [(8, 1, 48, 48)] * 2
    assert data.images.shape == (64, 1, 28, 28)  # held at its own size
    first = loader.shard_indices()[0]
    resized = torch.nn.functional.interpolate(images[first:first + 1], size=(48, 48),
                                              mode="bilinear", align_corners=False)
    assert torch.equal(loader.calibration_batches(1)[0][:1], resized)
    assert TensorData(images, data.labels).for_model(images) is images  # none asked: as stored
