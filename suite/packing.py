"""Physical shrinkage (paper sec. 4.4): kept conv slices packed into dense, bucketed buffers.

Framework code: PruneX and the pruning baselines pack with the same layout of the same
model (``model_entries``), so at the same masks they send the same bytes.

Leaders send c[K_out][:, K_in] (eq. 15) instead of the full conv tensor, so the inter-node
payload scales with the kept filters x channels and needs no index metadata: every leader
holds the same global mask, hence the same index sets and buffer layout. Buckets coalesce the
slices into few large collectives (~32 MB, as in PyTorch DDP's gradient bucketing).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from suite.structured import StructuredMask

DEFAULT_BUCKET_BYTES = 32 * 2**20


def packed_numel(shape: tuple[int, ...] | torch.Size, mask: StructuredMask | None) -> int:
    """Elements sent for one tensor: |K_out| |K_in| KH KW with a mask, all of them without."""
    if mask is None:
        return math.prod(shape)
    return mask.kept_filters().numel() * mask.kept_channels().numel() * math.prod(shape[2:])


def model_entries(
    model: torch.nn.Module, masks: dict[str, StructuredMask]
) -> list[tuple[str, torch.Size, StructuredMask | None]]:
    """What a method packs of ``model``: every trainable parameter (``p:NAME``; a conv weight
    with its mask in ``masks``), then every float buffer whole (``b:NAME``, BN statistics)."""
    params = [
        (f"p:{name}", p.shape, masks.get(name))
        for name, p in model.named_parameters()
        if p.requires_grad
    ]
    buffers = [(f"b:{n}", b.shape, None) for n, b in model.named_buffers() if b.is_floating_point()]
    return params + buffers


@dataclass(frozen=True, eq=False)
class _Slot:
    name: str
    shape: torch.Size
    bucket: int
    offset: int
    numel: int
    k_out: torch.Tensor | None  # kept filters; None: the tensor is packed whole
    k_in: torch.Tensor | None


class PackLayout:
    """Where each tensor's kept slice lives in the buckets; fixed for a given set of masks.

    ``entries`` is an ordered list of (name, shape, mask or None): conv weights with a
    ``StructuredMask`` contribute their [K_out, K_in] slice, the rest (BN, biases, FC) go whole.
    Tensors fill buckets in order; a bucket holds at most ``bucket_bytes`` unless a single
    tensor is larger, which then gets a bucket of its own. Buffers and index sets live on
    ``device`` (default: the masks' device, CPU when there are none).
    """

    def __init__(
        self,
        entries: list[tuple[str, tuple[int, ...] | torch.Size, StructuredMask | None]],
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ):
        if bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
        if device is None:
            masks = [m for _, _, m in entries if m is not None]
            device = masks[0].filters.device if masks else "cpu"
        self.dtype = dtype
        self.device = torch.device(device)
        self.bucket_bytes = bucket_bytes
        itemsize = torch.empty((), dtype=dtype).element_size()
        self.slots: list[_Slot] = []
        bucket_numels: list[int] = []
        for name, shape, mask in entries:
            shape = torch.Size(shape)
            k_out = k_in = None
            if mask is not None:
                if mask.weight_shape != tuple(shape):
                    raise ValueError(f"{name}: mask of a {mask.weight_shape} weight for {shape}")
                k_out = mask.kept_filters().to(self.device)
                k_in = mask.kept_channels().to(self.device)
            n = packed_numel(shape, mask)
            full = bucket_numels and (bucket_numels[-1] + n) * itemsize > bucket_bytes
            if not bucket_numels or (full and bucket_numels[-1] > 0):
                bucket_numels.append(0)
            bucket = len(bucket_numels) - 1
            self.slots.append(_Slot(name, shape, bucket, bucket_numels[bucket], n, k_out, k_in))
            bucket_numels[bucket] += n
        self.bucket_numels = bucket_numels

    @property
    def numel(self) -> int:
        """Total packed elements over all buckets."""
        return sum(self.bucket_numels)

    @property
    def nbytes(self) -> int:
        """Bytes one leader sends per inter-node all-reduce of the packed buffers."""
        return self.numel * torch.empty((), dtype=self.dtype).element_size()

    def allocate(self) -> list[torch.Tensor]:
        """Zeroed buffers, one per bucket: allocated once after the mask freeze and reused."""
        return [torch.zeros(n, dtype=self.dtype, device=self.device) for n in self.bucket_numels]

    def pack(
        self, tensors: dict[str, torch.Tensor], out: list[torch.Tensor] | None = None
    ) -> list[torch.Tensor]:
        """Gather each tensor's kept slice into the flat buckets (into ``out`` when given)."""
        buffers = self.allocate() if out is None else out
        if [b.numel() for b in buffers] != self.bucket_numels:
            raise ValueError(
                f"out buffers hold {[b.numel() for b in buffers]} elements, "
                f"the layout needs {self.bucket_numels}"
            )
        for slot in self.slots:
            t = tensors[slot.name]
            if t.shape != slot.shape or t.dtype != self.dtype:
                raise ValueError(
                    f"{slot.name}: expected {self.dtype} of shape {tuple(slot.shape)}, "
                    f"got {t.dtype} of shape {tuple(t.shape)}"
                )
            view = buffers[slot.bucket].narrow(0, slot.offset, slot.numel)
            if slot.k_out is None:
                view.copy_(t.reshape(-1))
            else:
                kept = t.index_select(0, slot.k_out)
                dest = view.view(slot.k_out.numel(), slot.k_in.numel(), *slot.shape[2:])
                torch.index_select(kept, 1, slot.k_in, out=dest)
        return buffers

    def unpack(self, buffers: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        """Full-shape copies of the packed tensors, exactly zero outside the kept slices."""
        full = {}
        for slot in self.slots:
            view = buffers[slot.bucket].narrow(0, slot.offset, slot.numel)
            if slot.k_out is None:
                full[slot.name] = view.reshape(slot.shape).clone()
            else:
                block = view.view(slot.k_out.numel(), slot.k_in.numel(), *slot.shape[2:])
                t = torch.zeros(slot.shape, dtype=view.dtype, device=view.device)
                t.index_put_((slot.k_out[:, None], slot.k_in[None, :]), block)
                full[slot.name] = t
        return full
