"""Channel groups (Torch-Pruning's dependency graph) and the live-slice rule, against
hand-checked expectations on cnn-fmnist and timm's ResNet-18; export of the smaller model."""

import pytest
import torch
from torch import nn

from suite.data.workload import DatasetSpec
from suite.errors import BenchError
from suite.structured.export import count_parameters, masked_dense_model, remove_dead_channels
from suite.structured.groups import trace_channel_groups
from suite.structured.liveness import live_slices
from suite.structured.masks import StructuredMask, conv_shapes, project
from suite.structured.packing import packed_numel
from workloads.models import resnet18, small_cnn

FMNIST = DatasetSpec("fmnist", 1, 28, 10)
CIFAR = DatasetSpec("cifar10", 3, 32, 10)


def full_masks(model):
    return {n: StructuredMask.full(s) for n, s in conv_shapes(model).items()}


def without_channels(mask: StructuredMask, channels) -> StructuredMask:
    kept = mask.channels.clone()
    kept[list(channels)] = False
    return StructuredMask(mask.filters, kept, mask.shape)


def without_filters(mask: StructuredMask, filters) -> StructuredMask:
    kept = mask.filters.clone()
    kept[list(filters)] = False
    return StructuredMask(kept, mask.channels, mask.shape)


def indices(n, rows):
    return sorted(set(range(n)) - set(rows.tolist()))


def test_cnn_fmnist_groups_and_dead_filters():
    model = small_cnn(FMNIST)
    groups = trace_channel_groups(model, torch.zeros(1, 1, 28, 28))
    by_producer = {g.producers[0].module: g for g in groups if g.producers}
    assert set(by_producer) == {"features.0", "features.4", "features.8", "features.11"}
    chain = by_producer["features.4"]
    assert [m.module for m in chain.consumers] == ["features.8"]
    assert [m.module for m in chain.followers["features.4"]] == ["features.5"]
    assert not chain.open_read and not chain.open_write
    assert by_producer["features.11"].open_read  # the classifier reads the last convs

    masks = full_masks(model)
    masks["features.8.weight"] = without_channels(masks["features.8.weight"], [3, 40])
    live = live_slices(model, groups, masks)
    # conv features.8 no longer reads channels 3 and 40: the filters of features.4 that
    # write them die, with their BN (features.5) entries and running statistics
    assert indices(64, live.rows["features.4.weight"]) == [3, 40]
    for tensor in ("weight", "bias", "running_mean", "running_var"):
        assert indices(64, live.rows[f"features.5.{tensor}"]) == [3, 40]
    assert indices(64, live.cols["features.8.weight"]) == [3, 40]
    assert indices(32, live.rows["features.0.weight"]) == []  # nothing else changes
    assert indices(128, live.rows["features.11.weight"]) == []

    # a filter that its mask prunes takes its BN entries along, and the next conv stops
    # reading that channel: nothing writes it any more
    masks["features.0.weight"] = without_filters(masks["features.0.weight"], [7])
    live = live_slices(model, groups, masks)
    assert indices(32, live.rows["features.1.weight"]) == [7]
    assert indices(32, live.cols["features.4.weight"]) == [7]


def test_resnet18_residual_channels_stay_whole_unless_every_reader_prunes_them():
    model = resnet18(CIFAR)
    groups = trace_channel_groups(model, torch.zeros(1, 3, 32, 32))
    stream = next(g for g in groups if any(p.module == "conv1" for p in g.producers))
    # layer1's stream: written by the stem and both blocks' conv2, read by their conv1 and
    # by layer2.0's conv1 and downsample conv
    assert {p.module for p in stream.producers} == {"conv1", "layer1.0.conv2", "layer1.1.conv2"}
    readers = {"layer1.0.conv1", "layer1.1.conv1", "layer2.0.conv1", "layer2.0.downsample.0"}
    assert {c.module for c in stream.consumers} == readers

    masks = full_masks(model)
    masks["layer1.0.conv1.weight"] = without_channels(masks["layer1.0.conv1.weight"], [5])
    live = live_slices(model, groups, masks)
    assert indices(64, live.rows["conv1.weight"]) == []  # others still read channel 5
    assert indices(64, live.cols["layer1.0.conv1.weight"]) == [5]  # that conv alone skips it
    # a block's conv2 not reading a channel kills its conv1 filter and bn1 entry only
    masks["layer1.0.conv2.weight"] = without_channels(masks["layer1.0.conv2.weight"], [9])
    live = live_slices(model, groups, masks)
    assert indices(64, live.rows["layer1.0.conv1.weight"]) == [9]
    assert indices(64, live.rows["layer1.0.bn1.weight"]) == [9]
    assert indices(64, live.rows["layer1.1.conv1.weight"]) == []
    # every reader of the stream prunes channel 5: it dies in every writer and its BN
    for reader in readers:
        masks[f"{reader}.weight"] = without_channels(masks[f"{reader}.weight"], [5])
    live = live_slices(model, groups, masks)
    for writer, norm in (("conv1", "bn1"), ("layer1.0.conv2", "layer1.0.bn2")):
        assert indices(64, live.rows[f"{writer}.weight"]) == [5]
        assert indices(64, live.rows[f"{norm}.weight"]) == [5]
    # the last stream ends in the classifier: it stays whole whatever its convs prune
    last = next(g for g in groups if any(p.module == "layer4.1.conv2" for p in g.producers))
    assert last.open_read


def random_structured_masks(model, generator, **keeps):
    masks = {}
    for name, shape in conv_shapes(model).items():
        noise = torch.rand(shape, generator=generator)
        masks[name] = project(noise, **keeps)[1]
    return masks


def export_check(model, example, masks):
    groups = trace_channel_groups(model, example)
    live = live_slices(model, groups, masks)
    masked = masked_dense_model(model, masks, live).eval()
    exported = remove_dead_channels(masked, groups, live, example)
    x = torch.randn(16, *example.shape[1:], generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        diff = (exported(x) - masked(x)).abs().max().item()
    return live, exported, diff


def test_export_equals_masked_model_and_counts_live_parameters():
    torch.manual_seed(0)
    model = small_cnn(FMNIST).eval()
    with torch.no_grad():  # BN statistics that are not the identity, as after training
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
    g = torch.Generator().manual_seed(0)
    masks = random_structured_masks(model, g, filter_keep=0.75, channel_keep=0.5)
    live, exported, diff = export_check(model, torch.zeros(1, 1, 28, 28), masks)
    assert diff <= 1e-5
    # a chain without residuals: every dead slice is removed, so the exported model has
    # exactly the live parameters (the packed count)
    params = dict(model.named_parameters())
    assert count_parameters(exported) == sum(
        packed_numel(p.shape, live.of(n)) for n, p in params.items()
    )
    assert count_parameters(exported) < 0.5 * count_parameters(model)


def test_export_resnet18_random_masks():
    torch.manual_seed(0)
    model = resnet18(CIFAR).eval()
    g = torch.Generator().manual_seed(0)
    masks = random_structured_masks(model, g, channel_keep=0.5)
    live, exported, diff = export_check(model, torch.zeros(1, 3, 32, 32), masks)
    assert diff <= 1e-5
    # inside blocks conv1's dead filters go with conv2's pruned channels, so each block's
    # conv1 and conv2 shrink to half their filters and inputs; layer1's residual stream loses
    # only the channels that all four of its readers prune (random halves: a few)
    modules = dict(exported.named_modules())
    assert modules["layer1.0.conv1"].out_channels == 32
    assert modules["layer1.0.conv2"].in_channels == 32
    readers = ("layer1.0.conv1", "layer1.1.conv1", "layer2.0.conv1", "layer2.0.downsample.0")
    read = torch.stack([masks[f"{r}.weight"].channels for r in readers]).any(0)
    assert 0 < (~read).sum() < 16
    for name in ("conv1", "layer1.0.conv2", "layer1.1.conv2"):  # the stream's writers
        assert modules[name].out_channels == int(read.sum())
    for name in readers:
        assert modules[name].in_channels == int(read.sum())
    assert count_parameters(exported) < 0.6 * count_parameters(model)


class NoAutograd(nn.Module):
    """A forward Torch-Pruning cannot see: nothing is recorded under no_grad."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        with torch.no_grad():
            return self.fc(self.conv(x).mean((2, 3)))


def test_untraceable_model_is_one_line():
    with pytest.raises(BenchError, match="conv conv is not in the graph") as info:
        trace_channel_groups(NoAutograd(), torch.zeros(1, 1, 8, 8))
    assert "\n" not in str(info.value)


def gn_net(norm) -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), norm(16), nn.ReLU(),
                         nn.Conv2d(16, 16, 3, padding=1), norm(16), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10)).eval()


def test_norms_that_mix_channels_refuse_live_packing_and_export():
    """Leaving a dead channel out is exact through per-channel norms only: GroupNorm moves
    the other channels' statistics (the masked model's outputs change by ~0.08 here), so
    --pack live and bench export refuse it in one line; BatchNorm and InstanceNorm export."""
    from suite.structured.export import export_model
    from suite.structured.masks import StructuredKeepSettings
    from suite.structured.structures import check_structure, cross_channel_norms

    example = torch.randn(8, 3, 16, 16)
    for norm in (nn.BatchNorm2d, lambda c: nn.InstanceNorm2d(c, affine=True)):
        model = gn_net(norm)
        assert cross_channel_norms(model, example) == []
        masks = full_masks(model)
        masks["3.weight"] = without_channels(masks["3.weight"], [2, 7])
        export_model(model, masks, example)
    model = gn_net(lambda c: nn.GroupNorm(4, c))
    assert cross_channel_norms(model, example) == ["1 (GroupNorm)", "4 (GroupNorm)"]
    masks = full_masks(model)
    masks["3.weight"] = without_channels(masks["3.weight"], [2, 7])
    with pytest.raises(BenchError, match=r"^cannot remove channels exactly: 1 \(GroupNorm\) "
                       r"normalizes several channels together"):
        export_model(model, masks, example)

    class Live(StructuredKeepSettings):
        pack = "live"

    with pytest.raises(BenchError, match=r"^--pack live is not exact on gn: 1 \(GroupNorm\) "
                       r"normalizes several channels together, so leaving a dead channel out "
                       r"changes the others; use --pack dense-masks"):
        check_structure(Live(channel_keep=0.5), model, example[:1], "gn")
