"""The built-in workload plugin: every workload registered, its model built and run on
any dataset, unknown names listed."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from suite.data.datasets import dataset_spec
from suite.errors import BenchError
from suite.plugins.registry import WORKLOADS


def test_builtin_workloads_are_registered():
    expected = {
        "cnn-fmnist",
        "resnet18-fmnist",
        "resnet18-cifar10",
        "resnet152-cifar10",
        "wrn50_2-cifar10",
    }
    assert expected <= set(WORKLOADS.names())
    for name in expected:
        entry = WORKLOADS.get(name)
        workload = entry.factory()
        assert workload.name == name and workload.description == entry.description
        assert "\n" not in entry.description and "params" in entry.description
        assert workload.dataset == ("fmnist" if name.endswith("fmnist") else "cifar10")


@pytest.mark.parametrize(
    "name,batch",
    [
        ("cnn-fmnist", 2),
        ("resnet18-fmnist", 2),
        ("resnet18-cifar10", 2),
        ("resnet152-cifar10", 1),
        ("wrn50_2-cifar10", 1),
    ],
)
def test_workload_models_build_and_run(name, batch):
    workload = WORKLOADS.get(name).factory()
    spec = dataset_spec(workload.dataset)
    model = workload.build_model(spec).eval()
    x = torch.randn(batch, spec.in_chans, spec.image_size, spec.image_size)
    with torch.no_grad():
        assert model(x).shape == (batch, 10)
    if name != "cnn-fmnist":
        assert "3x3 stride-1 conv1, no max-pool" in workload.description
        conv1 = model.conv1
        assert (conv1.kernel_size, conv1.stride, conv1.padding) == ((3, 3), (1, 1), (1, 1))
        assert conv1.in_channels == spec.in_chans and conv1.bias is None
        assert isinstance(model.maxpool, nn.Identity)


def test_small_cnn_is_small_and_fits_any_dataset():
    workload = WORKLOADS.get("cnn-fmnist").factory()
    model = workload.build_model(dataset_spec("fmnist"))
    assert 100_000 <= sum(p.numel() for p in model.parameters()) <= 1_000_000
    assert any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    other = workload.build_model(dataset_spec("synthetic"))
    assert other(torch.randn(2, 3, 32, 32)).shape == (2, 10)  # train mode: BN sees a batch


def test_unknown_workload_lists_the_known_ones():
    with pytest.raises(BenchError, match="unknown workload 'nope'; known: .*cnn-fmnist"):
        WORKLOADS.get("nope")
