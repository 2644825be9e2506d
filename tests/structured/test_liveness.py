"""Channel groups (Torch-Pruning's dependency graph) and the live-slice rule, against
hand-checked expectations on cnn-fmnist and timm's ResNet-18; export of the smaller model."""

import copy

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


def convmixer(dim: int = 64, depth: int = 4) -> nn.Module:
    """timm's ConvMixer on 1x28x28 images: a patch stem, then residual depthwise blocks
    (depthwise conv, GELU, BN, + input) each followed by a pointwise conv, GELU, BN."""
    from timm.models.convmixer import ConvMixer

    return ConvMixer(dim, depth, kernel_size=5, patch_size=2, in_chans=1, num_classes=10)


def test_residual_depthwise_blocks_pack_exactly_what_export_keeps():
    """A channel no pointwise conv reads any more is dead through the depthwise conv that
    passes it on: the packed live slices (parameters and BN statistics) equal the exported
    model's tensors, not 31 % more (the depthwise filters used to be sent whole)."""
    torch.manual_seed(0)
    model = convmixer().eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2)
    masks = random_structured_masks(model, torch.Generator().manual_seed(0), channel_keep=0.5)
    live, exported, diff = export_check(model, torch.zeros(1, 1, 28, 28), masks)
    assert diff <= 1e-5
    packed = {n: packed_numel(t.shape, live.of(n)) for n, t in
              [*model.named_parameters(), *model.named_buffers()] if t.is_floating_point()}
    kept = {n: t.numel() for n, t in [*exported.named_parameters(), *exported.named_buffers()]
            if t.is_floating_point()}
    assert packed == kept
    depthwise = "blocks.0.0.fn.0.weight"  # 64 filters of one 5x5 channel each
    assert live.of(depthwise)[0].numel() == kept[depthwise] // 25 < 64


def ghostnet() -> nn.Module:
    """timm's GhostNet 0.5: Ghost modules concatenate a conv's features with their cheap
    depthwise copies and slice the result, so one filter feeds two channels."""
    import timm

    return timm.create_model("ghostnet_050", pretrained=False, in_chans=1, num_classes=10)


def convnext() -> nn.Module:
    """A small timm ConvNeXt: LayerNorm over the channels after the stem, in every block and
    before every downsampling conv."""
    from timm.models.convnext import ConvNeXt

    return ConvNeXt(in_chans=1, num_classes=10, depths=(1, 1, 1, 1), dims=(8, 16, 16, 16),
                    patch_size=2, output_stride=16)


def realistic_norms(model: nn.Module) -> nn.Module:
    """BN statistics, scales and shifts as after training (and conv biases), in place."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
            elif isinstance(m, nn.Conv2d) and m.bias is not None:
                m.bias.uniform_(-0.2, 0.2)
    return model.eval()


@pytest.mark.parametrize("build", [  # ghostnet's export takes minutes: nox -s integration
    convmixer, pytest.param(ghostnet, marks=pytest.mark.integration), convnext])
def test_dead_slices_change_no_output_and_export_is_exact(build):
    """What liveness calls dead (and the mask keeps) can be anything without changing an
    output, and removing the dead channels changes none either (float64: fp32 rounding
    differs once channels leave a sum). LayerNorm groups and GhostNet's concatenated
    features keep every channel: removing one would change the others."""
    torch.manual_seed(0)
    model = realistic_norms(build())
    g = torch.Generator().manual_seed(1)
    masks = random_structured_masks(model, g, channel_keep=0.5)
    x = torch.randn(4, 1, 28, 28, generator=g, dtype=torch.float64)
    groups = trace_channel_groups(model, x[:1].float())
    live = live_slices(model, groups, masks)
    masked = masked_dense_model(model, masks, live).double()
    with torch.no_grad():
        want = masked(x)
        shapes = {n: p.shape for n, p in masked.named_parameters()}
        for name, keep in live.partial_masks(shapes).items():
            dead = ~keep & (masks[name].dense() if name in masks else True)
            if dead.any():
                noised = copy.deepcopy(masked)
                dict(noised.named_parameters())[name][dead] = 1.0
                assert (noised(x) - want).abs().max() <= 1e-9, name
    exported = remove_dead_channels(masked.float(), groups, live, x[:1].float()).double()
    with torch.no_grad():
        assert (exported(x) - want).abs().max() <= 1e-9
    if build is not convmixer:  # LayerNorm or concatenated features: such groups stay whole
        assert any(group.whole for group in groups)
    assert all(alive.all() for group, alive in zip(groups, live.channels) if group.whole)


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


def test_norms_that_mix_channels_keep_their_channels_and_export_exactly():
    """Leaving a dead channel out is exact through per-channel norms only: a GroupNorm or a
    LocalResponseNorm moves the other channels' statistics, so their groups stay whole
    (nothing leaves them, --pack live sends them whole) and the export equals the masked
    model; through BatchNorm and InstanceNorm the unread channels leave."""
    from suite.structured.export import export_model

    example = torch.randn(8, 3, 16, 16)
    for norm, removed in ((nn.BatchNorm2d, True),
                          (lambda c: nn.InstanceNorm2d(c, affine=True), True),
                          (lambda c: nn.GroupNorm(4, c), False),
                          (lambda c: nn.LocalResponseNorm(3), False)):
        model = gn_net(norm)
        masks = full_masks(model)
        masks["3.weight"] = without_channels(masks["3.weight"], [2, 7])
        groups = trace_channel_groups(model, example[:1])
        live = live_slices(model, groups, masks)
        assert (live.of("0.weight")[0] is not None
                and live.of("0.weight")[0].numel() == 14) is removed
        masked, exported, count = export_model(model, masks, example)  # raises if not exact
        assert count_parameters(exported) < count_parameters(model) if removed else True
