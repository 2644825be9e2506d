"""Structured sparsity of conv weights (PruneX paper sec. 2.1): group masks and projections.

Framework code: PruneX projects its node consensus with it, and the pruning baselines
(gmp-hier, prune-retrain) choose their magnitude masks with the same functions, so the
structures, and the bytes packed from them, are comparable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed
from torch import nn

from suite.cluster import phases
from suite.errors import BenchError
from suite.plugins.options import FRACTION, option

DEFAULT_CHANNEL_KEEP = 0.5  # PruneX paper sec. 5.1.5
#: the conv sets' keep options, in the order they are projected (sec. 3.2)
CONV_KEEPS = ("filter_keep", "channel_keep", "shape_keep")


def structured_weights(model: nn.Module) -> list[str]:
    """Names of the trainable 4-D conv weights: the tensors the conv sets apply to.

    Args:
        model: any model.

    Returns:
        Parameter names, in parameter order.
    """
    convs = {
        f"{name}.weight" if name else "weight"
        for name, module in model.named_modules()
        if isinstance(module, nn.Conv2d)
    }
    return [
        name
        for name, p in model.named_parameters()
        if p.requires_grad and name in convs and p.dim() == 4
    ]


def keep_count(n: int, keep: float) -> int:
    """Groups kept out of ``n`` at keep rate ``keep`` (round half up, at least one group).

    Args:
        n: the groups of a set (a conv's input channels, an attention block's heads).
        keep: the keep fraction, in (0, 1].

    Returns:
        How many are kept: ``keep_count(3, 0.5) == 2``.
    """
    if not 0 < keep <= 1:
        raise ValueError(f"keep rate must be in (0, 1], got {keep}")
    return max(1, math.floor(keep * n + 0.5))


@dataclass(frozen=True, eq=False)
class StructuredMask:
    """Group bitmaps of one conv weight (C_out, C_in, KH, KW) (sec. 2.1).

    The element mask is their product, so the groups, not the elements, are what leaders
    exchange (eq. 14): C_out + C_in + C_in*KH*KW bits instead of the full tensor.

    Attributes:
        filters: (C_out,) bool.
        channels: (C_in,) bool.
        shape: (C_in, KH, KW) bool.

    Examples:
        ```python
        projected, mask = project(weight, channel_keep=0.5)
        mask.kept_channels(), mask.density(), mask.dense()
        ```
    """

    filters: torch.Tensor  # (C_out,) bool
    channels: torch.Tensor  # (C_in,) bool
    shape: torch.Tensor  # (C_in, KH, KW) bool

    @classmethod
    def full(
        cls, shape: tuple[int, ...] | torch.Size, device: torch.device | str | None = None
    ) -> StructuredMask:
        """Everything kept: Algorithm 1 line 1 (m_global <- 1)."""
        c_out, c_in, kh, kw = _conv_shape(shape)
        ones = torch.ones(c_out + c_in + c_in * kh * kw, dtype=torch.bool, device=device)
        return cls._split(ones, (c_out, c_in, kh, kw))

    @classmethod
    def from_bits(cls, bits: torch.Tensor, shape: tuple[int, ...] | torch.Size) -> StructuredMask:
        """Inverse of ``to_bits`` for a weight of ``shape``; any nonzero byte is a kept group."""
        c_out, c_in, kh, kw = _conv_shape(shape)
        expected = c_out + c_in + c_in * kh * kw
        if bits.dim() != 1 or bits.numel() != expected:
            raise ValueError(
                f"a mask of a {tuple(shape)} weight has {expected} bits, got {tuple(bits.shape)}"
            )
        return cls._split(bits != 0, (c_out, c_in, kh, kw))

    @classmethod
    def _split(cls, flat: torch.Tensor, shape: tuple[int, int, int, int]) -> StructuredMask:
        c_out, c_in, kh, kw = shape
        filters, channels, spatial = flat.split([c_out, c_in, c_in * kh * kw])
        return cls(filters, channels, spatial.reshape(c_in, kh, kw))

    @property
    def weight_shape(self) -> tuple[int, int, int, int]:
        """The conv weight's (C_out, C_in, KH, KW), read from the bitmaps' sizes: what bits
        received for this weight are decoded against (``like_bits``)."""
        return (self.filters.numel(), *self.shape.shape)

    def like_bits(self, bits: torch.Tensor) -> StructuredMask:
        """A mask of the same weight from ``bits`` (what the mask sync sends)."""
        return StructuredMask.from_bits(bits, self.weight_shape)

    def state(self) -> dict[str, torch.Tensor]:
        """The group bitmaps, for checkpoints and masks.pt (the element mask follows)."""
        return {"filters": self.filters, "channels": self.channels, "shape": self.shape}

    @classmethod
    def from_state(cls, state: dict, device=None) -> StructuredMask:
        """Inverse of ``state``; raises KeyError, TypeError or AttributeError on anything
        else, ValueError on bitmaps that are no conv weight's (a damaged or crafted file)."""
        filters, channels, shape = (state[k].bool().to(device)
                                    for k in ("filters", "channels", "shape"))
        if filters.dim() != 1 or channels.dim() != 1 or shape.dim() != 3 or (
                channels.numel() != shape.shape[0]):
            raise ValueError(f"bitmaps of shapes {tuple(filters.shape)}, {tuple(channels.shape)}"
                             f", {tuple(shape.shape)} are no conv weight's")
        return cls(filters, channels, shape)

    def set_sizes(self) -> tuple[int, int, int]:
        """Group bits of the filter, channel and shape sets."""
        return self.filters.numel(), self.channels.numel(), self.shape.numel()

    def to_bits(self) -> torch.Tensor:
        """One flat uint8 tensor (filters, channels, shape): the payload of the mask sync.

        NCCL has no bitwise OR, but MAX over 0/1 bytes is OR, so leaders all-reduce this
        with MAX to get the union of eq. (14).
        """
        flat = torch.cat([self.filters, self.channels, self.shape.reshape(-1)])
        return flat.to(torch.uint8)

    def dense(self) -> torch.Tensor:
        """Element mask shaped like the weight: filter & channel & shape position."""
        return (
            self.filters[:, None, None, None]
            & self.channels[None, :, None, None]
            & self.shape[None]
        )

    def union(self, other: StructuredMask) -> StructuredMask:
        """Group-wise OR (eq. 14). Its element mask contains the union of both element masks."""
        self._check_same_shape(other)
        return StructuredMask(
            self.filters | other.filters,
            self.channels | other.channels,
            self.shape | other.shape,
        )

    def _live_channels(self) -> torch.Tensor:
        """Channels selected and with at least one selected shape position."""
        return self.channels & self.shape.flatten(1).any(1)

    def kept_filters(self) -> torch.Tensor:
        """K_out (sec. 4.4.1): filters with at least one active element of ``dense()``."""
        return torch.nonzero(self.filters & self._live_channels().any()).flatten()

    def kept_channels(self) -> torch.Tensor:
        """K_in (sec. 4.4.1): input channels with at least one active element of ``dense()``."""
        return torch.nonzero(self._live_channels() & self.filters.any()).flatten()

    def density(self) -> float:
        """Fraction of the weight's elements kept, from the bitmaps without the dense mask."""
        kept = self.filters.sum() * (self.channels[:, None, None] & self.shape).sum()
        return kept.item() / math.prod(self.weight_shape)

    def changed_groups(self, other: StructuredMask) -> int:
        """Number of group bits that differ (the mask drift that triggers the freeze, sec. 4.5)."""
        self._check_same_shape(other)
        return int((self.to_bits() != other.to_bits()).sum().item())

    def _check_same_shape(self, other: StructuredMask) -> None:
        if self.weight_shape != other.weight_shape:
            raise ValueError(
                f"masks of different weights: {self.weight_shape} vs {other.weight_shape}"
            )


def _conv_shape(shape: tuple[int, ...] | torch.Size) -> tuple[int, int, int, int]:
    if len(shape) != 4:
        raise ValueError(
            f"structured sets are defined for 4-D conv weights (C_out, C_in, KH, KW), "
            f"got shape {tuple(shape)}"
        )
    c_out, c_in, kh, kw = (int(s) for s in shape)
    return c_out, c_in, kh, kw


def top_groups(sq_norms: torch.Tensor, keep: float | None) -> torch.Tensor:
    """Bool mask of the keep_count groups with the largest norms; ties go to lower indices.

    A stable descending sort (unlike topk) fixes the order of equal norms, so every rank
    derives the same mask from the same tensor, zero tensors included.
    """
    flat = sq_norms.reshape(-1)
    kept = torch.ones_like(flat, dtype=torch.bool)
    if keep is None:
        return kept.reshape(sq_norms.shape)
    k = keep_count(flat.numel(), keep)
    order = torch.sort(flat, descending=True, stable=True).indices
    kept[order[k:]] = False
    return kept.reshape(sq_norms.shape)


def project(
    weight: torch.Tensor,
    *,
    filter_keep: float | None = None,
    channel_keep: float | None = None,
    shape_keep: float | None = None,
    in_place: bool = False,
) -> tuple[torch.Tensor, StructuredMask]:
    """Pi_S of eq. (10) for S = S_f & S_c & S_s (sec. 2.1); ``None`` leaves a set out.

    For one set, keeping the keep_count groups of largest Frobenius norm and zeroing the rest
    is the exact Euclidean projection. For several, the sets are projected in sequence
    filter -> channel -> shape, each on the previous output (sec. 3.2); the result lies in
    every set but is not always the exact projection onto the intersection, and the order
    matters (the paper says it does not; see the module docstring).

    Args:
        weight: a (C_out, C_in, KH, KW) conv weight.
        filter_keep: the fraction of output filters kept, or None.
        channel_keep: the fraction of input channels kept, or None.
        shape_keep: the fraction of kernel positions kept, or None.
        in_place: project ``weight`` itself.

    Returns:
        The projected tensor (``weight`` itself with ``in_place``) and the group bitmaps
        chosen at each step, which always hold exactly keep_count groups per constrained set,
        even when norms are zero.

    Examples:
        ```python
        z_i, mask = project(candidate, channel_keep=0.5)
        ```
    """
    mask = _chosen_groups(weight, filter_keep, channel_keep, shape_keep)
    out = weight if in_place else weight.clone()
    _zero_pruned(out, mask, filter_keep, channel_keep, shape_keep)
    return out, mask


def _chosen_groups(
    weight: torch.Tensor,
    filter_keep: float | None,
    channel_keep: float | None,
    shape_keep: float | None,
) -> StructuredMask:
    """The group bitmaps ``project`` keeps, chosen filter -> channel -> shape, each set's
    norms taken over the squares the sets before it left (sec. 3.2). A set left out keeps
    every group: neither its norms nor its zeroing are computed, and the squares are masked
    only for a set that comes after (the keeps as in ``project``)."""
    c_out, c_in, kh, kw = _conv_shape(weight.shape)
    device = weight.device
    sq = weight.square()
    filters = _all_kept(c_out, device)
    if filter_keep is not None:
        filters = top_groups(sq.sum((1, 2, 3)), filter_keep)
        if channel_keep is not None or shape_keep is not None:
            sq = sq * filters[:, None, None, None]
    channels = _all_kept(c_in, device)
    if channel_keep is not None:
        channels = top_groups(sq.sum((0, 2, 3)), channel_keep)
        if shape_keep is not None:
            sq = sq * channels[None, :, None, None]
    shape = _all_kept((c_in, kh, kw), device)
    if shape_keep is not None:
        shape = top_groups(sq.sum(0), shape_keep)
    return StructuredMask(filters, channels, shape)


def _zero_pruned(
    out: torch.Tensor,
    mask: StructuredMask,
    filter_keep: float | None,
    channel_keep: float | None,
    shape_keep: float | None,
) -> None:
    """Zero in ``out`` what the asked sets prune (the sets left out prune nothing):
    ``apply_mask``'s result without forming the dense mask."""
    if filter_keep is not None:
        out.masked_fill_(~mask.filters[:, None, None, None], 0)
    if channel_keep is not None:
        out.masked_fill_(~mask.channels[None, :, None, None], 0)
    if shape_keep is not None:
        out.masked_fill_(~mask.shape[None], 0)


def _all_kept(size, device) -> torch.Tensor:
    return torch.ones(size, dtype=torch.bool, device=device)


def apply_mask(weight: torch.Tensor, mask: StructuredMask) -> torch.Tensor:
    """Zero the pruned groups: projection becomes masking once masks freeze (Alg. 1 line 11).

    Args:
        weight: a conv weight.
        mask: its agreed mask.

    Returns:
        A new tensor, zero off the mask.
    """
    return weight.masked_fill(~mask.dense(), 0)


def or_across_nodes(masks: dict, comm, topology) -> dict:
    """Eq. (14) of PruneX on the group bitmaps: node leaders OR their masks (MAX on uint8:
    NCCL has no bitwise OR) and broadcast the union inside their node; same keys, in order."""
    pieces = [m.to_bits() for m in masks.values()]
    bits = torch.cat(pieces)
    if topology.is_leader and topology.inter is not None:
        comm.all_reduce(
            bits, topology.inter, phase=phases.MASK_SYNC, op=torch.distributed.ReduceOp.MAX
        )
    comm.broadcast(bits, topology.intra, src=topology.intra.ranks[0], phase=phases.MASK_SYNC)
    agreed, offset = {}, 0
    for (key, mask), piece in zip(masks.items(), pieces):
        n = piece.numel()
        agreed[key] = mask.like_bits(bits[offset : offset + n])
        offset += n
    return agreed


def mask_drift(old: dict, new: dict) -> int:
    """Group bits that differ between two sets of masks with the same keys (the mask drift of
    sec. 4.5), read back once for all of them."""
    for key, mask in old.items():
        mask._check_same_shape(new[key])
    before = torch.cat([old[key].to_bits() for key in old])
    after = torch.cat([new[key].to_bits() for key in old])
    return int((before != after).sum().item())


def mask_artifact(masks: dict) -> dict:
    """``masks.pt`` of a run folder: per conv weight its group bitmaps and element mask; per
    head or neuron group (``blocks.0.attn#heads``) its unit bits."""
    return {name: {**m.state(), "dense": m.dense()} if isinstance(m, StructuredMask) else m.state()
            for name, m in masks.items()}


def read_masks_file(path: str, device) -> tuple[Path, dict]:
    """(the file, its contents) of a run's masks (its folder's masks.pt, or the file)."""
    file = Path(path) / "masks.pt" if Path(path).is_dir() else Path(path)
    try:
        saved = torch.load(file, map_location=device, weights_only=True)
    except Exception as exc:  # unpickling raises many kinds; all mean "not a masks file"
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise BenchError(f"--masks-from {path}: cannot read {file} ({why[:200]})") from None
    if not isinstance(saved, dict) or not all(isinstance(key, str) for key in saved):
        raise BenchError(f"--masks-from {file}: not a mapping of layer names to masks")
    return file, saved


def load_masks(path: str, shapes: dict[str, torch.Size], device) -> dict[str, StructuredMask]:
    """The conv masks a run saved (its folder's masks.pt, or the file itself), one per name
    of ``shapes`` (conv weight name -> its shape, checked)."""
    file, saved = read_masks_file(path, device)
    masks = {}
    for name, shape in shapes.items():
        entry = saved.get(name)
        if entry is None:
            raise BenchError(f"--masks-from {file} has no mask for layer {name}")
        try:
            mask = StructuredMask.from_state(entry)
        except (TypeError, KeyError, AttributeError, IndexError, ValueError):
            raise BenchError(
                f"--masks-from {file}: the entry of {name} is not a structured mask "
                "(filters, channels, shape bitmaps)"
            ) from None
        if mask.weight_shape != tuple(shape):
            raise BenchError(
                f"--masks-from {file}: layer {name} has shape {mask.weight_shape}, "
                f"this model's is {tuple(shape)}"
            )
        masks[name] = mask
    return masks


@dataclass
class StructuredKeepSettings:
    """The structured sets' keep fractions, shared by PruneX and the pruning baselines so the
    same flags give the same structure: a settings class inherits them. The conv keeps prune
    each conv weight's output filters, input channels and kernel positions; the head and MLP
    keeps prune each attention block's heads and each MLP's hidden neurons. Without any keep,
    ``channel_keep`` is 0.5.

    Examples:
        ```python
        @dataclass
        class MyPruningSettings(StructuredKeepSettings, PackingSettings):
            prune_at: float = option(0.5, "fraction trained dense first", check=FRACTION)
        ```
    """

    filter_keep: float | None = option(
        None, "fraction of output filters kept per conv", check=FRACTION
    )
    channel_keep: float | None = option(
        None,
        "fraction of input channels kept per conv",
        check=FRACTION,
        shown_default=f"{DEFAULT_CHANNEL_KEEP} when no keep is given",
    )
    shape_keep: float | None = option(
        None, "fraction of kernel positions kept per conv", check=FRACTION
    )
    head_keep: float | None = option(
        None,
        "fraction of attention heads kept per attention block (a head: its q, k, v rows and "
        "the output projection's columns that read it)",
        check=FRACTION,
    )
    mlp_keep: float | None = option(
        None,
        "fraction of hidden neurons kept per MLP (a neuron: fc1's row and bias, fc2's column)",
        check=FRACTION,
    )
    masks_from: str | None = option(
        None,
        "start from a run's masks (its folder or masks.pt), frozen",
        existing_path=True,
    )

    def __post_init__(self) -> None:
        if all(value is None for value in self.keeps.values()):
            self.channel_keep = DEFAULT_CHANNEL_KEEP

    def check_model(self, model: nn.Module) -> None:
        """Before any rank starts: ``--masks-from`` is readable and fits ``model``'s convs
        (shapes only: ``model`` may live on the meta device)."""
        if self.masks_from is not None and not (self.head_keep or self.mlp_keep):
            load_masks(self.masks_from, conv_shapes(model), "cpu")

    @property
    def keeps(self) -> dict[str, float | None]:
        """Keep option -> fraction (None: that set is not pruned), as ``StructuredRound``
        takes them (``keeps=``); with no keep given, ``channel_keep`` holds the default."""
        return {
            "filter_keep": self.filter_keep,
            "channel_keep": self.channel_keep,
            "shape_keep": self.shape_keep,
            "head_keep": self.head_keep,
            "mlp_keep": self.mlp_keep,
        }


def conv_shapes(model: nn.Module) -> dict[str, torch.Size]:
    """Conv weight name -> shape, for the tensors the structured sets apply to."""
    params = dict(model.named_parameters())
    return {name: params[name].shape for name in structured_weights(model)}
