"""Building blocks for tests that drive a method directly on real gloo ranks."""

from __future__ import annotations

import torch
from torch import nn

from suite.cluster.comm import Communicator
from suite.cluster.recorder import Recorder
from suite.cluster.topology import build_topology
from suite.config import RunConfig
from suite.data.sharding import ShardedLoader
from suite.data.workload import DatasetSpec, Recipe, TensorData
from suite.plugins.method import RunContext
from suite.plugins.options import resolve_settings
from suite.plugins.registry import METHODS
from workloads.models import small_cnn


def tiny_data(n: int = 256, seed: int = 0) -> TensorData:
    """Learnable 1x8x8 images: the class sets the mean."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 4, (n,), generator=g)
    means = torch.randn(4, 1, 8, 8, generator=g)
    images = means[labels] + 0.5 * torch.randn(n, 1, 8, 8, generator=g)
    return TensorData(images, labels)


class TinyCNN(nn.Module):
    """Two convs and an FC; ``bn`` adds BatchNorm so buffer averaging is exercised."""

    def __init__(self, bn: bool = False):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 3, padding=1, bias=not bn)
        self.bn1 = nn.BatchNorm2d(6) if bn else nn.Identity()
        self.conv2 = nn.Conv2d(6, 8, 3, padding=1, bias=not bn)
        self.bn2 = nn.BatchNorm2d(8) if bn else nn.Identity()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.bn2(self.conv2(x)))
        return self.fc(x.mean((2, 3)))


def cnn_fmnist_model() -> nn.Module:
    """The cnn-fmnist workload's model, sized for ``tiny_data`` (1x8x8 images, 4 classes)."""
    return small_cnn(DatasetSpec("tiny", in_chans=1, image_size=8, num_classes=4))


def make_context(
    rank: int,
    *,
    gpus_per_node: int,
    method: str = "ddp",
    options: dict | None = None,
    batch_size: int = 8,
    lr: float = 0.05,
    bn: bool = False,
    seed: int = 0,
    model_fn=None,
    budget_steps: int | None = None,
    schedule=None,
    device: torch.device | None = None,
) -> RunContext:
    topo = build_topology(gpus_per_node)
    device = device or torch.device("cpu")
    recorder = Recorder(rank, device)
    torch.manual_seed(seed)
    model = (model_fn() if model_fn is not None else TinyCNN(bn=bn)).to(device)
    recipe = Recipe(batch_size=batch_size, lr=lr, momentum=0.9, weight_decay=1e-4)
    resident = device if device.type == "cuda" else None
    loader = ShardedLoader(tiny_data(), rank, topo.world_size, batch_size, seed, device=resident)
    config = RunConfig(method=method, options=dict(options or {}))
    return RunContext(
        config,
        topo,
        Communicator(topo, recorder, device),
        recorder,
        None,
        recipe,
        model,
        loader,
        device,
        resolve_settings(METHODS.get(method).settings, config.options, method),
        schedule,
        budget_steps,
        spec=DatasetSpec("tiny", in_chans=1, image_size=8, num_classes=4),
    )


def run_iterations(method, recorder, n: int) -> list[dict]:
    rows = []
    for it in range(n):
        recorder.begin_iteration(it)
        done = method.step(it)
        rows.append(recorder.end_iteration(loss=done.loss))
    return rows
