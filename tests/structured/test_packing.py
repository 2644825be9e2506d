"""Physical shrinkage (sec. 4.4): exact pack/unpack round trips, sizes, buckets, reuse."""

import math

import pytest
import torch

from suite.structured.masks import StructuredMask, apply_mask, project
from suite.structured.packing import PackLayout, packed_numel

CONV = (6, 5, 3, 3)


def bits_equal(a, b):
    """Bit-for-bit equality (distinguishes -0.0 from 0.0, unlike ==)."""
    return a.dtype == b.dtype and torch.equal(a.view(torch.int32), b.view(torch.int32))


def random_masks(seed, count):
    """Masks from the projection and from random bitmaps (whose shape bits can kill channels)."""
    g = torch.Generator().manual_seed(seed)
    masks = []
    for _ in range(count):
        w = torch.randn(CONV, generator=g)
        masks.append(project(w, filter_keep=0.5, channel_keep=0.6)[1])
        masks.append(project(w, channel_keep=0.4, shape_keep=0.3)[1])
        bits = torch.rand(sum(CONV[:2]) + math.prod(CONV[1:]), generator=g) < 0.3
        masks.append(StructuredMask.from_bits(bits.to(torch.uint8), CONV))
    return masks


def index_sets(mask):
    dense = mask.dense()
    k_out = dense.any(dim=(1, 2, 3)).nonzero().flatten()
    return k_out, dense.any(dim=(0, 2, 3)).nonzero().flatten()


def bucket_runs(sizes, bucket_numels):
    """Split the (positive) tensor sizes into the consecutive runs that fill each bucket."""
    runs, start = [], 0
    for n in bucket_numels:
        end = start
        while sum(sizes[start:end]) < n:
            end += 1
        assert sum(sizes[start:end]) == n  # buckets hold whole tensors, in entry order
        runs.append(sizes[start:end])
        start = end
    assert start == len(sizes)
    return runs


def test_masked_round_trip_is_exact():
    g = torch.Generator().manual_seed(0)
    for mask in random_masks(1, 10):
        w = apply_mask(torch.randn(CONV, generator=g), mask)
        layout = PackLayout([("w", CONV, mask)])
        restored = layout.unpack(layout.pack({"w": w}))["w"]
        assert bits_equal(restored, w)


def test_unpack_zero_fills_outside_the_kept_slices():
    """Any tensor: the K_out x K_in slice comes back, everything else is exactly +0."""
    g = torch.Generator().manual_seed(2)
    for mask in random_masks(3, 10):
        w = torch.randn(CONV, generator=g)
        layout = PackLayout([("w", CONV, mask)])
        restored = layout.unpack(layout.pack({"w": w}))["w"]
        k_out, k_in = index_sets(mask)
        keep = torch.zeros(CONV, dtype=torch.bool)
        keep[k_out[:, None], k_in[None, :]] = True
        assert bits_equal(restored, torch.where(keep, w, torch.zeros(())))


def test_packed_size_matches_the_index_sets():
    masks = random_masks(4, 5)
    entries = [(f"w{i}", CONV, m) for i, m in enumerate(masks)] + [("fc", (10, 7), None)]
    layout = PackLayout(entries)
    expected = [len(index_sets(m)[0]) * len(index_sets(m)[1]) * 9 for m in masks]
    assert [packed_numel(CONV, m) for m in masks] == expected
    assert packed_numel((10, 7), None) == 70
    assert layout.numel == sum(expected) + 70
    assert layout.nbytes == 4 * layout.numel
    assert PackLayout(entries, dtype=torch.float64).nbytes == 8 * layout.numel
    assert packed_numel(CONV, StructuredMask.full(CONV)) == math.prod(CONV)


def test_buckets_respect_the_byte_limit_and_keep_order():
    sizes = [10, 20, 5, 40, 3, 3, 100, 1]
    entries = [(f"t{i}", (n,), None) for i, n in enumerate(sizes)]
    layout = PackLayout(entries, bucket_bytes=4 * 32)  # 32 float32 per bucket
    # greedy in order; a new bucket only when the next tensor would overflow; 40 and 100 alone
    assert layout.bucket_numels == [30, 5, 40, 6, 100, 1]
    assert bucket_runs(sizes, layout.bucket_numels) == [[10, 20], [5], [40], [3, 3], [100], [1]]
    g = torch.Generator().manual_seed(5)
    tensors = {name: torch.randn(shape, generator=g) for name, shape, _ in entries}
    buffers = layout.pack(tensors)
    assert [b.numel() for b in buffers] == layout.bucket_numels
    assert all(b.dim() == 1 and b.is_contiguous() for b in buffers)
    assert torch.equal(torch.cat(buffers), torch.cat(list(tensors.values())))
    one = PackLayout(entries)  # default 32 MiB: everything in one bucket
    assert one.bucket_numels == [sum(sizes)]


def test_buckets_with_masked_entries():
    g = torch.Generator().manual_seed(6)
    masks = [
        project(torch.randn(CONV, generator=g), channel_keep=keep)[1]
        for keep in (0.2, 0.4, 0.6, 0.8, 1.0, 0.4)
    ]
    sizes = [packed_numel(CONV, m) for m in masks]
    cap = 4 * 150
    layout = PackLayout([(f"w{i}", CONV, m) for i, m in enumerate(masks)], bucket_bytes=cap)
    runs = bucket_runs(sizes, layout.bucket_numels)
    assert all(4 * sum(run) <= cap or len(run) == 1 for run in runs)
    # greedy: a bucket is closed only when the next tensor would overflow it
    assert all(4 * (sum(a) + b[0]) > cap for a, b in zip(runs, runs[1:], strict=False))
    assert len(runs) > 2


def test_preallocated_out_matches_fresh_and_is_reused():
    masks = random_masks(7, 2)
    entries = [(f"w{i}", CONV, m) for i, m in enumerate(masks)] + [("bn", (5,), None)]
    layout = PackLayout(entries, bucket_bytes=4 * 200)
    out = layout.allocate()
    assert [b.numel() for b in out] == layout.bucket_numels
    assert all(not b.any() and b.dtype == torch.float32 for b in out)
    g = torch.Generator().manual_seed(8)
    for _ in range(2):  # the second round overwrites the first in the same buffers
        tensors = {name: torch.randn(shape, generator=g) for name, shape, _ in entries}
        packed = layout.pack(tensors, out=out)
        assert all(p is o for p, o in zip(packed, out, strict=True))
        fresh = layout.pack(tensors)
        assert all(bits_equal(p, f) for p, f in zip(packed, fresh, strict=True))
    wrong = [torch.zeros(n + 1) for n in layout.bucket_numels]
    with pytest.raises(ValueError):
        layout.pack(tensors, out=wrong)


def test_dense_entries_round_trip_whole():
    g = torch.Generator().manual_seed(9)
    tensors = {
        "conv_full": torch.randn(CONV, generator=g),
        "bn.weight": torch.randn(5, generator=g),
        "fc.weight": torch.randn(10, 7, generator=g),
        "bias": torch.randn(1, generator=g),
    }
    entries = [(name, t.shape, None) for name, t in tensors.items()]
    layout = PackLayout(entries, bucket_bytes=4 * 64)
    restored = layout.unpack(layout.pack(tensors))
    assert list(restored) == list(tensors)
    assert all(bits_equal(restored[k], tensors[k]) for k in tensors)


def test_unpack_returns_copies():
    """Fixed buffers are packed again next round; the restored z must not alias them."""
    mask = random_masks(10, 1)[0]
    layout = PackLayout([("w", CONV, mask), ("b", (4,), None)])
    tensors = {"w": apply_mask(torch.randn(CONV), mask), "b": torch.randn(4)}
    buffers = layout.pack(tensors)
    restored = layout.unpack(buffers)
    for b in buffers:
        b.fill_(7.0)
    assert all(bits_equal(restored[k], tensors[k]) for k in tensors)


def test_empty_mask_packs_nothing():
    empty = StructuredMask.from_bits(torch.zeros(sum(CONV[:2]) + 45, dtype=torch.uint8), CONV)
    layout = PackLayout([("w", CONV, empty), ("b", (3,), None)])
    assert layout.numel == 3
    restored = layout.unpack(layout.pack({"w": torch.randn(CONV), "b": torch.ones(3)}))
    assert not restored["w"].any() and restored["b"].tolist() == [1.0, 1.0, 1.0]


def test_bad_inputs_raise():
    mask = StructuredMask.full(CONV)
    with pytest.raises(ValueError):
        PackLayout([("w", (6, 5, 1, 1), mask)])
    with pytest.raises(ValueError):
        PackLayout([("w", CONV, mask)], bucket_bytes=0)
    layout = PackLayout([("w", CONV, mask)])
    with pytest.raises(ValueError):
        layout.pack({"w": torch.zeros(6, 5, 3, 2)})
    with pytest.raises(ValueError):
        layout.pack({"w": torch.zeros(CONV, dtype=torch.float64)})


def test_index_sets_pack_rows_and_columns_of_any_tensor():
    """Live packing: a BN vector keeps some entries, a linear weight some input columns, a
    conv some filters and channels; unpack is exactly zero elsewhere."""
    g = torch.Generator().manual_seed(0)
    tensors = {"bn": torch.randn(6, generator=g), "fc": torch.randn(4, 6, generator=g),
               "conv": torch.randn(5, 6, 3, 3, generator=g)}
    rows, cols = torch.tensor([0, 2, 5]), torch.tensor([1, 4])
    entries = [("bn", (6,), (rows, None)), ("fc", (4, 6), (None, cols)),
               ("conv", (5, 6, 3, 3), (torch.tensor([1, 3]), cols))]
    layout = PackLayout(entries)
    assert layout.numel == 3 + 4 * 2 + 2 * 2 * 9
    assert [packed_numel(shape, keep) for _, shape, keep in entries] == [3, 8, 36]
    full = layout.unpack(layout.pack(tensors))
    for name, t in tensors.items():
        kept = full[name] != 0
        assert torch.equal(full[name][kept], t[kept])
    assert kept.sum() == 36 and torch.equal(full["bn"].nonzero().flatten(), rows)
    assert torch.equal(full["fc"].abs().sum(0).nonzero().flatten(), cols)
