"""A third-party workload package in one file, written against the plugin API alone
(``suite.api``): a dataset of its own and two workloads, one of them on it (the tests give it
a dist-info with a ``prunex_bench.workloads`` entry point naming this module).

The dataset, ``stripes``, is generated: 1x16x16 images whose class is the orientation of
their stripes; a real plugin would read files from ``data_dir`` the same way and raise a
one-line ``BenchError`` naming the fix when they are missing.
"""

import torch
from torch import nn

from suite.api import DATASETS, WORKLOADS, BenchError, DatasetSpec, Recipe, TensorData, Workload

STRIPES = DatasetSpec("stripes", in_chans=1, image_size=16, num_classes=4)


@DATASETS.register("stripes", STRIPES, sizes=(2048, 512))
def load_stripes(data_dir, download):
    """(train, test) splits: float32 images (N, 1, 16, 16), normalized; int64 labels."""
    if data_dir is not None and not str(data_dir).startswith(("/", ".")):
        raise BenchError(f"--data-dir {data_dir}: give a path; stripes are generated anyway")

    def split(n: int, seed: int) -> TensorData:
        g = torch.Generator().manual_seed(seed)
        labels = torch.randint(0, 4, (n,), generator=g)
        grid = torch.arange(16.0)
        patterns = torch.stack([
            torch.sin(grid)[None, :].expand(16, 16),  # vertical stripes
            torch.sin(grid)[:, None].expand(16, 16),  # horizontal
            torch.sin(grid[:, None] + grid[None, :]),  # diagonal
            torch.sin(grid[:, None] - grid[None, :]),  # anti-diagonal
        ])
        images = patterns[labels][:, None] + 0.5 * torch.randn(n, 1, 16, 16, generator=g)
        return TensorData(images, labels)

    return split(2048, 0), split(512, 1)


def tiny_mlp(spec: DatasetSpec) -> nn.Module:
    """Any model builder takes the dataset's spec, so ``--dataset`` can swap the data."""
    return nn.Sequential(nn.Flatten(), nn.Linear(spec.in_chans * spec.image_size**2, 64),
                         nn.ReLU(), nn.Linear(64, spec.num_classes))


@WORKLOADS.register("mlp-stripes", "a two-layer MLP on the stripes dataset (a plugin)")
def mlp_stripes() -> Workload:
    return Workload("mlp-stripes", "MLP on stripes", "tiny_mlp", "stripes", tiny_mlp,
                    Recipe(batch_size=32, lr=0.05, epochs=1.0))


@WORKLOADS.register("mlp-fmnist", "the same MLP on Fashion-MNIST (a plugin)")
def mlp_fmnist() -> Workload:
    return Workload("mlp-fmnist", "MLP on Fashion-MNIST", "tiny_mlp", "fmnist", tiny_mlp,
                    Recipe(batch_size=32, lr=0.05))
