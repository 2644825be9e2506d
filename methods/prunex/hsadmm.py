"""Per-layer H-SADMM update rules (paper sec. 3) as pure tensor functions.

Nothing here communicates: the distributed method and the single-process reference in the
tests call the same functions, so the math is written (and tested) once.

Corrections to the paper, derived from the augmented Lagrangian, eq. (6):

* Eq. (9). The z_i-subproblem for node i and one layer is

      min_z  lam/(2M) ||z||^2 + I_S(z) + sum_{j=1..P} rho1/2 ||theta_ij - z + u_ij||^2
                                       + rho2/2 ||z - z_glob + v_i||^2.

  Zeroing the gradient of the smooth part gives

      z~_i = [rho1 sum_j (theta_ij + u_ij) + rho2 (z_glob - v_i)] / (lam/M + P rho1 + rho2).

  The printed eq. (9) normalizes by lam/M + rho1 + rho2 (the factor P is missing: there are
  P intra-node penalty terms) and uses z_i^k where the global z^k belongs (the rho2 term of
  eq. (6) couples z_i to z, not to its own previous value).

* Eq. (10). The smooth part equals gamma/2 ||z - z~_i||^2 + const with gamma the normalizer
  above, an isotropic quadratic, so its minimizer over S is exactly the Euclidean projection
  Pi_S(z~_i), whatever the (non-convex) S.

* Sec. 3.2 claims that, for S = S_f & S_c, the order of the sequential projections does not
  affect the support. It does: see ``project`` and tests/test_hsadmm.py for a 2x2 counter-
  example. Sequential projection is feasible for every set but is not, in general, the exact
  projection onto the intersection.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def node_candidate(
    theta_u_sum: torch.Tensor,
    z: torch.Tensor,
    v: torch.Tensor,
    *,
    rho1: float,
    rho2: float,
    lam: float,
    num_nodes: int,
    procs_per_node: int,
) -> torch.Tensor:
    """Dense node candidate z~_i: corrected eq. (9), the unconstrained minimizer over z_i of (6).

    ``theta_u_sum`` is sum_j (theta_ij + u_ij) over the node's P ranks (the intra-node SUM
    all-reduce), ``z`` the global consensus z^k and ``v`` the node's scaled dual v_i^k.

    The flat ablation "PruneX (AR)" (every rank against one global z) is the special case
    num_nodes=1, procs_per_node=N, rho2=0, where this reduces to rho1 sum / (lam + N rho1).
    """
    gamma = lam / num_nodes + procs_per_node * rho1 + rho2
    return (rho1 * theta_u_sum + rho2 * (z - v)) / gamma


def keep_count(n: int, keep: float) -> int:
    """Groups kept out of ``n`` at keep rate ``keep`` (round half up, at least one group)."""
    if not 0 < keep <= 1:
        raise ValueError(f"keep rate must be in (0, 1], got {keep}")
    return max(1, math.floor(keep * n + 0.5))


@dataclass(frozen=True, eq=False)
class StructuredMask:
    """Group bitmaps of one conv weight (C_out, C_in, KH, KW) (sec. 2.1).

    The element mask is their product, so the groups, not the elements, are what leaders
    exchange (eq. 14): C_out + C_in + C_in*KH*KW bits instead of the full tensor.
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
        return (self.filters.numel(), *self.shape.shape)

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


def _top_groups(sq_norms: torch.Tensor, keep: float | None) -> torch.Tensor:
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
) -> tuple[torch.Tensor, StructuredMask]:
    """Pi_S of eq. (10) for S = S_f & S_c & S_s (sec. 2.1); ``None`` leaves a set out.

    For one set, keeping the keep_count groups of largest Frobenius norm and zeroing the rest
    is the exact Euclidean projection. For several, the sets are projected in sequence
    filter -> channel -> shape, each on the previous output (sec. 3.2); the result lies in
    every set but is not always the exact projection onto the intersection, and the order
    matters (the paper says it does not; see the module docstring).

    Returns the projected tensor and the group bitmaps chosen at each step, which always hold
    exactly keep_count groups per constrained set, even when norms are zero.
    """
    c_out, c_in, kh, kw = _conv_shape(weight.shape)
    sq = weight.square()
    filters = _top_groups(sq.sum((1, 2, 3)), filter_keep)
    sq = sq * filters[:, None, None, None]
    channels = _top_groups(sq.sum((0, 2, 3)), channel_keep)
    sq = sq * channels[None, :, None, None]
    shape = _top_groups(sq.sum(0), shape_keep)
    mask = StructuredMask(filters, channels, shape)
    return apply_mask(weight, mask), mask


def apply_mask(weight: torch.Tensor, mask: StructuredMask) -> torch.Tensor:
    """Zero the pruned groups: projection becomes masking once masks freeze (Alg. 1 line 11)."""
    return weight.masked_fill(~mask.dense(), 0)


def balance_penalty(
    rho: float,
    primal_norm: float,
    dual_norm: float,
    *,
    mu: float = 10.0,
    tau: float = 2.0,
    rho_max: float = 10.0,
) -> float:
    """Residual balancing (Boyd et al. 2011, sec. 3.4.1), capped at rho_max (paper sec. 5.1.5).

    A large primal residual means consensus is too loose (raise rho); a large dual residual
    means z moves too much (lower rho). The caller rescales scaled duals by rho_old / rho_new.
    """
    if primal_norm > mu * dual_norm:
        rho = rho * tau
    elif dual_norm > mu * primal_norm:
        rho = rho / tau
    return min(rho, rho_max)


def primal_tolerance(
    num_elements: int, x_norm: float, z_norm: float, *, eps_abs: float, eps_rel: float
) -> float:
    """Boyd's eps_pri = sqrt(p) eps_abs + eps_rel max(||x||, ||z||) for a consensus constraint."""
    return math.sqrt(num_elements) * eps_abs + eps_rel * max(x_norm, z_norm)


def dual_tolerance(num_elements: int, y_norm: float, *, eps_abs: float, eps_rel: float) -> float:
    """Boyd's eps_dual = sqrt(n) eps_abs + eps_rel ||y||, with y = rho * scaled dual."""
    return math.sqrt(num_elements) * eps_abs + eps_rel * y_norm
