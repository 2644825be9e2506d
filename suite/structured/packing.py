"""Physical shrinkage (paper sec. 4.4): kept conv slices packed into dense, bucketed buffers.

Framework code: PruneX and the pruning baselines pack with the same layout of the same
model (``model_entries``), so at the same masks they send the same bytes.

Leaders send c[K_out][:, K_in] (eq. 15) instead of the full conv tensor, so the inter-node
payload scales with the kept filters x channels and needs no index metadata: every leader
holds the same global mask, hence the same index sets and buffer layout. Buckets coalesce the
slices into few large collectives (~32 MB, as in PyTorch DDP's gradient bucketing).

Two packings (``--pack``): ``dense-masks`` sends each conv's own [K_out, K_in] block and every
other tensor whole (the paper's sec. 4.4); ``live`` sends only the live slices
(``liveness``): filters no conv reads any more, their BN entries, and input channels
no filter writes are left out too, on both ends, so still no index travels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from suite.plugins.options import POSITIVE, option
from suite.structured.liveness import LiveSlices
from suite.structured.masks import StructuredMask

DEFAULT_BUCKET_BYTES = 32 * 2**20
#: how a model's tensors are named in a layout: parameters and float buffers apart
_PARAM, _BUFFER = "p:", "b:"

#: what of one tensor is sent: None (all of it), a conv's StructuredMask (its [K_out, K_in]
#: block), or explicit (rows, cols) index sets of dims 0 and 1 (None: the whole dim)
Keep = StructuredMask | tuple[torch.Tensor | None, torch.Tensor | None] | None


@dataclass
class PackingSettings:
    """How leaders pack the inter-node exchange: shared by PruneX and the pruning baselines,
    so the same flags give the same bytes (``--pack``, ``--bucket-mb``); a settings class
    inherits it, and ``StructuredRound`` reads it.

    Examples:
        ```python
        StructuredRound(ctx, ctx.model, ctx.settings, keeps=ctx.settings.keeps)
        ```
    """

    pack: Literal["live", "dense-masks"] = option(
        "live",
        "live: send only slices that change the output (dead filters, their BN entries and "
        "unread channels left out); dense-masks: each conv's own kept "
        "[filters, channels] block and every other tensor whole",
    )
    bucket_mb: float = option(32.0, "inter-node packing bucket size in MiB", check=POSITIVE)


def index_sets(shape, keep: Keep) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(rows, cols) kept of a tensor of ``shape`` (``None``: the whole dim)."""
    if keep is None:
        return None, None
    if isinstance(keep, StructuredMask):
        if keep.weight_shape != tuple(shape):
            raise ValueError(f"a mask of a {keep.weight_shape} weight for {tuple(shape)}")
        return keep.kept_filters(), keep.kept_channels()
    return keep


def packed_numel(shape: tuple[int, ...] | torch.Size, keep: Keep) -> int:
    """Elements sent for one tensor: |rows| |cols| times the trailing dims (|K_out| |K_in| KH
    KW for a conv's mask), all of them for ``None``."""
    rows, cols = index_sets(shape, keep)
    n = math.prod(shape[2:]) if len(shape) > 2 else 1
    n *= shape[0] if rows is None else rows.numel()
    if len(shape) > 1:
        n *= shape[1] if cols is None else cols.numel()
    return n


def model_entries(
    model: torch.nn.Module,
    masks: dict[str, StructuredMask],
    live: LiveSlices | None = None,
    unit_keeps: dict[str, tuple[torch.Tensor | None, torch.Tensor | None]] | None = None,
) -> list[tuple[str, torch.Size, Keep]]:
    """What a method packs of ``model``: every trainable parameter, then every float buffer
    (BN statistics), each under a key of this module's own (``pack_model`` and
    ``unpack_model`` take and give names in the model). Without ``live``, conv weights send their
    mask's block, the members of pruned heads and neurons their kept rows or columns
    (``unit_keeps``), and the rest goes whole (``--pack dense-masks``); with it, every tensor
    sends its live slices (``--pack live``, which already leaves pruned units out)."""
    unit_keeps = unit_keeps or {}

    def keep(name: str) -> Keep:
        if live is not None:
            return live.of(name)
        mask = masks.get(name)
        return mask if isinstance(mask, StructuredMask) else unit_keeps.get(name)

    params = [
        (_PARAM + name, p.shape, keep(name))
        for name, p in model.named_parameters()
        if p.requires_grad
    ]
    buffers = [
        (_BUFFER + n, b.shape, None if live is None else live.of(n))
        for n, b in model.named_buffers()
        if b.is_floating_point()
    ]
    return params + buffers


@dataclass(frozen=True, eq=False)
class _Slot:
    name: str
    shape: torch.Size
    bucket: int
    offset: int
    numel: int
    rows: torch.Tensor | None  # kept indices of dim 0 (K_out of a conv); None: all
    cols: torch.Tensor | None  # kept indices of dim 1 (K_in of a conv); None: all


class PackLayout:
    """Where each tensor's kept slice lives in the buckets; fixed for a given set of masks.

    ``entries`` is an ordered list of (name, shape, keep) (see ``Keep``): conv weights with a
    ``StructuredMask`` contribute their [K_out, K_in] slice, index sets their [rows, cols]
    slice, ``None`` the whole tensor.
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
            masks = [m for _, _, m in entries if isinstance(m, StructuredMask)]
            device = masks[0].filters.device if masks else "cpu"
        self.dtype = dtype
        self.device = torch.device(device)
        self.bucket_bytes = bucket_bytes
        itemsize = torch.empty((), dtype=dtype).element_size()
        self.slots: list[_Slot] = []
        bucket_numels: list[int] = []
        for name, shape, keep in entries:
            shape = torch.Size(shape)
            try:
                rows, cols = index_sets(shape, keep)
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from None
            rows = None if rows is None else rows.to(self.device)
            cols = None if cols is None else cols.to(self.device)
            n = packed_numel(shape, (rows, cols))
            full = bucket_numels and (bucket_numels[-1] + n) * itemsize > bucket_bytes
            if not bucket_numels or (full and bucket_numels[-1] > 0):
                bucket_numels.append(0)
            bucket = len(bucket_numels) - 1
            self.slots.append(_Slot(name, shape, bucket, bucket_numels[bucket], n, rows, cols))
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
            if slot.rows is not None:
                t = t.index_select(0, slot.rows)
            if slot.cols is not None:
                t = t.index_select(1, slot.cols)
            view.copy_(t.reshape(-1))
        return buffers

    def pack_model(
        self,
        params: dict[str, torch.Tensor],
        buffers: dict[str, torch.Tensor],
        out: list[torch.Tensor] | None = None,
    ) -> list[torch.Tensor]:
        """``pack`` of a ``model_entries`` layout: parameters and float buffers by their
        names in the model."""
        named = {_PARAM + n: t for n, t in params.items()}
        named.update({_BUFFER + n: t for n, t in buffers.items()})
        return self.pack(named, out=out)

    def unpack_model(
        self, packed: list[torch.Tensor]
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """``unpack`` of a ``model_entries`` layout: (parameters, float buffers) by their
        names in the model."""
        full = self.unpack(packed)
        params = {k[len(_PARAM) :]: t for k, t in full.items() if k.startswith(_PARAM)}
        buffers = {k[len(_BUFFER) :]: t for k, t in full.items() if k.startswith(_BUFFER)}
        return params, buffers

    def unpack(self, buffers: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        """Full-shape copies of the packed tensors, exactly zero outside the kept slices."""
        full = {}
        for slot in self.slots:
            view = buffers[slot.bucket].narrow(0, slot.offset, slot.numel)
            if slot.rows is None and slot.cols is None:
                full[slot.name] = view.reshape(slot.shape).clone()
                continue
            rows = (
                slot.rows.to(view.device)
                if slot.rows is not None
                else torch.arange(slot.shape[0], device=view.device)
            )
            block_shape = (rows.numel(), *slot.shape[1:])
            if slot.cols is not None:
                block_shape = (rows.numel(), slot.cols.numel(), *slot.shape[2:])
            block = view.view(block_shape)
            t = torch.zeros(slot.shape, dtype=view.dtype, device=view.device)
            if slot.cols is None:
                t.index_copy_(0, rows, block)
            else:
                t.index_put_((rows[:, None], slot.cols[None, :]), block)
            full[slot.name] = t
        return full
