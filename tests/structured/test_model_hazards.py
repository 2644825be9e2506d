"""Each hazard the model zoos showed (benchmarks/measured/model_zoo.md), on a tiny model that has
it: the structured path either works exactly (the export reproduces the masked model in
float64, and the slices called dead do not move the output) or refuses in one line, never a
crash or a hang."""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from suite.structured.inspection import inspect_model

KEEP = {"channel_keep": 0.5}
EXAMPLE = torch.zeros(1, 3, 16, 16)


def conv_bn(cin: int, cout: int, k: int = 3, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, k, padding=k // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU())


class Head(nn.Module):
    def __init__(self, cin: int):
        super().__init__()
        self.fc = nn.Linear(cin, 10)

    def forward(self, x):
        return self.fc(x.mean((2, 3)))


class CrossStage(nn.Module):
    """CSPNet's block: a conv, its output split in two at a size it stores, one half through
    convs, the halves concatenated (Torch-Pruning maps the parts back without offsets)."""

    def __init__(self):
        super().__init__()
        self.stem = conv_bn(3, 8)
        self.expand = conv_bn(8, 16, 1)
        self.half = 8
        self.blocks = nn.Sequential(conv_bn(8, 8), conv_bn(8, 8))
        self.transition_b = conv_bn(8, 8, 1)
        self.transition = conv_bn(16, 16, 1)
        self.head = Head(16)

    def forward(self, x):
        xs, xb = self.expand(self.stem(x)).split(self.half, dim=1)
        xb = self.transition_b(self.blocks(xb))
        return self.head(self.transition(torch.cat([xs, xb], dim=1)))


class Chunked(CrossStage):
    """The same with ``chunk``."""

    def forward(self, x):
        xs, xb = self.expand(self.stem(x)).chunk(2, dim=1)
        xb = self.transition_b(self.blocks(xb))
        return self.head(self.transition(torch.cat([xs, xb], dim=1)))


class Mixed(nn.Module):
    """MixNet's mixed conv: the channels split at sizes stored on the module, each part with
    its own kernel, concatenated."""

    def __init__(self):
        super().__init__()
        self.stem = conv_bn(3, 12)
        self.splits = [4, 8]
        self.parts = nn.ModuleList([nn.Conv2d(4, 4, 3, padding=1), nn.Conv2d(8, 8, 5, padding=2)])
        self.after = conv_bn(12, 12, 1)
        self.head = Head(12)

    def forward(self, x):
        parts = torch.split(self.stem(x), self.splits, dim=1)
        x = torch.cat([conv(p) for conv, p in zip(self.parts, parts)], dim=1)
        return self.head(self.after(x))


class Transposed(nn.Module):
    """A token-mixing MLP (MLP-Mixer): channels and positions transposed around a Linear."""

    def __init__(self):
        super().__init__()
        self.stem = conv_bn(3, 8, 4)
        self.mix = nn.Linear(16 * 16, 16 * 16)
        self.after = conv_bn(8, 8, 1)
        self.head = Head(8)

    def forward(self, x):
        x = self.stem(x)
        b, c, h, w = x.shape
        x = self.mix(x.flatten(2)).reshape(b, c, h, w)
        return self.head(self.after(x))


class SqueezeExcite(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.reduce, self.expand = nn.Conv2d(c, c // 4, 1), nn.Conv2d(c // 4, c, 1)

    def forward(self, x):
        return x * torch.sigmoid(self.expand(F.relu(self.reduce(x.mean((2, 3), keepdim=True)))))


class GroupedSE(nn.Module):
    """RegNetY's block: a plain conv, a grouped 3x3 conv, squeeze-excitation, a plain conv."""

    def __init__(self):
        super().__init__()
        self.stem = conv_bn(3, 8)
        self.conv1 = conv_bn(8, 16, 1)
        self.conv2 = conv_bn(16, 16, 3, groups=4)
        self.se = SqueezeExcite(16)
        self.conv3 = conv_bn(16, 8, 1)
        self.head = Head(8)

    def forward(self, x):
        x = self.stem(x)
        return self.head(self.conv3(self.se(self.conv2(self.conv1(x)))) + x)


class StdConv2d(nn.Conv2d):
    """timm's weight-standardized conv: each filter standardized over its inputs, so a zeroed
    input slice becomes ``-mean / std`` and the channel is still read."""

    def forward(self, x):
        w = self.weight
        w = (w - w.mean((1, 2, 3), keepdim=True)) / (w.std((1, 2, 3), keepdim=True) + 1e-5)
        return F.conv2d(x, w, self.bias, self.stride, self.padding)


class Standardized(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = conv_bn(3, 8)
        self.conv = StdConv2d(8, 8, 3, padding=1)
        self.head = Head(8)

    def forward(self, x):
        return self.head(self.conv(self.stem(x)))


class BlurPool(nn.Module):
    """TResNet's anti-aliasing: a fixed depthwise filter held as a buffer, no parameter."""

    def __init__(self, c: int):
        super().__init__()
        self.register_buffer("filt", torch.ones(c, 1, 3, 3) / 9)

    def forward(self, x):
        return F.conv2d(x, self.filt, padding=1, groups=x.shape[1])


class Blurred(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = conv_bn(3, 8)
        self.blur = BlurPool(8)
        self.after = conv_bn(8, 8)
        self.head = Head(8)

    def forward(self, x):
        return self.head(self.after(self.blur(self.stem(x))))


class Shuffled(nn.Module):
    """ShuffleNetV2's unit: half the channels through convs, the halves concatenated, then
    shuffled (a view into five dims and a transpose) and chunked again: Torch-Pruning cannot
    map channels through the shuffle."""

    def __init__(self):
        super().__init__()
        self.stem = conv_bn(3, 8)
        self.branch = nn.Sequential(conv_bn(4, 4, 1), conv_bn(4, 4, 3, groups=4), conv_bn(4, 4, 1))
        self.branch2 = nn.Sequential(conv_bn(4, 4, 1), conv_bn(4, 4, 1))
        self.after = conv_bn(8, 8, 1)
        self.head = Head(8)

    @staticmethod
    def shuffle(x):
        b, c, h, w = x.shape
        return x.view(b, 2, c // 2, h, w).transpose(1, 2).contiguous().view(b, c, h, w)

    def forward(self, x):
        a, b = self.stem(x).chunk(2, dim=1)
        x = self.shuffle(torch.cat([a, self.branch(b)], dim=1))
        a, b = x.chunk(2, dim=1)
        x = self.shuffle(torch.cat([a, self.branch2(b)], dim=1))
        return self.head(self.after(x))


HAZARDS = {
    "split-at-stored-size": CrossStage,
    "chunk": Chunked,
    "stored-split-sizes": Mixed,
    "transpose": Transposed,
    "grouped-conv-in-se": GroupedSE,
    "standardized-conv": Standardized,
    "buffer-only-depthwise-filter": Blurred,
    "channel-shuffle": Shuffled,
}


@pytest.mark.parametrize("hazard", sorted(HAZARDS))
def test_each_hazard_ends_exact_or_refused_in_one_line(hazard):
    torch.manual_seed(0)
    found = inspect_model(hazard, HAZARDS[hazard](), EXAMPLE, KEEP, trace_seconds=60)
    if found.status == "refused":
        assert found.reason and "\n" not in found.reason
        return
    assert found.status == "ok", found.reason
    assert 0 < found.live_parameters <= found.dense_parameters
    assert 0 < found.exported_parameters <= found.dense_parameters
    assert found.packed_bytes <= found.dense_bytes


def test_the_hazards_that_can_be_pruned_are_ok():
    """Not refused where the model can be handled exactly: the splits and the grouped conv
    keep some groups whole, the standardized conv reads its zeroed inputs, the buffer filter
    keeps its channels; every other channel is pruned and packed."""
    for hazard in ("split-at-stored-size", "chunk", "stored-split-sizes", "grouped-conv-in-se",
                   "standardized-conv", "buffer-only-depthwise-filter"):
        torch.manual_seed(0)
        found = inspect_model(hazard, HAZARDS[hazard](), EXAMPLE, KEEP, trace_seconds=60)
        assert found.status == "ok", (hazard, found.reason)
        assert found.packed_share < 1.0, hazard


def test_a_trace_that_never_ends_is_refused_within_its_limit(monkeypatch):
    """Torch-Pruning's grouping stuck (Swin, RexNet and ECA-ResNet took minutes): refused
    after the limit, saying so, and nothing of it keeps running."""
    import torch_pruning as tp

    def forever(self, *args, **kwargs):
        while True:
            time.sleep(0.05)
            yield from ()

    monkeypatch.setattr(tp.DependencyGraph, "get_all_groups", forever)
    started = time.perf_counter()
    found = inspect_model("stuck", CrossStage(), EXAMPLE, KEEP, trace_seconds=1)
    assert time.perf_counter() - started < 20
    assert found.status == "refused" and "took longer than 1 s" in found.reason


def test_a_model_torch_pruning_cannot_group_packs_its_masks_blocks():
    """torchvision's ShuffleNetV2 (a chunk of shuffled channels, which Torch-Pruning's split
    rule cannot map): not refused; the masks' blocks are what is live (exact), no channel is
    exported away, and the inspection says why."""
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.get_model("shufflenet_v2_x0_5", num_classes=10)
    found = inspect_model("shufflenet_v2_x0_5", model, torch.zeros(1, 3, 32, 32), KEEP,
                          trace_seconds=60)
    assert found.status == "ok", found.reason
    assert found.untraced and "Torch-Pruning" in found.untraced and "\n" not in found.untraced
    assert found.advice[0].startswith(found.untraced)
    assert found.packed_share < 1.0 and found.exported_parameters == found.dense_parameters


def test_a_grouping_that_runs_away_ends_at_its_budget_the_same_every_time(monkeypatch):
    """A grouping whose index mappings carry more than the budget (ReXNet, Swin) ends at once
    as one Torch-Pruning cannot group: decided by the work done, not the clock, so every rank
    decides alike."""
    from suite.structured import groups

    monkeypatch.setattr(groups, "MAX_MAPPING_WORK", 4)  # CrossStage's split maps more
    found = [inspect_model("runaway", CrossStage(), EXAMPLE, KEEP, trace_seconds=60)
             for _ in range(2)]
    assert [f.status for f in found] == ["ok", "ok"], found[0].reason
    assert found[0].untraced == found[1].untraced
    assert "ran away (over 4 indices)" in found[0].untraced


def test_a_flatten_counts_the_indices_it_makes_against_the_budget(monkeypatch):
    """A flatten makes stride indices of each it reads (EfficientFormerV2's attention
    reshapes: 12 million made of 290 thousand read, 40 s of a trace): the budget
    counts what a mapping makes, in Torch-Pruning's own mapping as the trace calls it."""
    from torch_pruning import _helpers
    from torch_pruning.dependency import index_mapping

    from suite.structured import tracing

    tracing.patch_torch_pruning()  # as a trace starts: the mappings bounded
    monkeypatch.setattr(tracing, "_budget", {"per_mapping": 100, "per_graph": 10**9,
                                             "spent": 0})
    read = [_helpers._HybridIndex(idx=i, root_idx=i) for i in range(4)]
    flatten = index_mapping._FlattenIndexMapping(stride=64)  # 4 read, 256 made
    with pytest.raises(tracing.RunawayMapping, match=r"\(256 indices\)"):
        flatten(read)
    assert len(index_mapping._FlattenIndexMapping(stride=16)(read)) == 64  # within it: as TP's
