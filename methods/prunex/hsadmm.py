"""Per-layer H-SADMM update rules (paper sec. 3) as pure tensor functions.

Nothing here communicates: the distributed method and the single-process reference in the
tests call the same functions, so the math is written (and tested) once. Besides the z_i step,
the residual bookkeeping of a round lives here: the duals' updates with their residual norms
(``dual_update``), their scaling and reading (``scale_duals``, ``residual_norms``), Boyd's
stopping test (``within_tolerance``) and residual balancing (``rebalance``).

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
  affect the support. It does: see ``project`` and tests/methods/test_hsadmm.py for a 2x2 counter-
  example. Sequential projection is feasible for every set but is not, in general, the exact
  projection onto the intersection.
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "balance_penalty",
    "dual_tolerance",
    "dual_update",
    "node_candidate",
    "primal_tolerance",
    "rebalance",
    "residual_norms",
    "scale_duals",
    "squared_norms",
    "within_tolerance",
]


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
    in_place: bool = False,
) -> torch.Tensor:
    """Dense node candidate z~_i: corrected eq. (9), the unconstrained minimizer over z_i of (6).

    ``theta_u_sum`` is sum_j (theta_ij + u_ij) over the node's P ranks (the intra-node SUM
    all-reduce), ``z`` the global consensus z^k and ``v`` the node's scaled dual v_i^k.

    The flat ablation "PruneX (AR)" (every rank against one global z) is the special case
    num_nodes=1, procs_per_node=N, rho2=0, where this reduces to rho1 sum / (lam + N rho1).
    ``in_place`` writes the result into ``theta_u_sum`` (the same bits, no new tensor).
    With rho2 = 0 (flat) the rho2 term is left out, not added as zeros: equal values, but a
    -0.0 of the first term stays -0.0.
    """
    gamma = lam / num_nodes + procs_per_node * rho1 + rho2
    cand = theta_u_sum.mul_(rho1) if in_place else theta_u_sum * rho1
    if rho2:
        cand.add_((z - v).mul_(rho2))
    return cand.div_(gamma)


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


def within_tolerance(
    row: list[float],
    num_elements: int,
    *,
    world_size: int,
    num_nodes: int,
    procs_per_node: int,
    hierarchical: bool,
    eps_abs: float,
    eps_rel: float,
) -> bool:
    """Boyd's eps_pri and eps_dual test of one block at both levels.

    Why a table row: every piece is a squared norm summed over the world (``dual_update``,
    then one all-reduce, with ``scale_duals`` applied), so each level's constraint counts
    ``num_elements`` once per rank (intra) or per node (inter); a node's z_i, held by its
    ``procs_per_node`` ranks, enters the inter-node test once. Flat: the intra level only.
    """
    tol = {"eps_abs": eps_abs, "eps_rel": eps_rel}
    n = num_elements
    ok = math.sqrt(row[0]) <= primal_tolerance(
        world_size * n, math.sqrt(row[2]), math.sqrt(row[3]), **tol
    ) and math.sqrt(row[1]) <= dual_tolerance(world_size * n, math.sqrt(row[4]), **tol)
    if not hierarchical:
        return ok
    z_node_norm = math.sqrt(row[3] / procs_per_node)
    return (
        ok
        and math.sqrt(row[5])
        <= primal_tolerance(num_nodes * n, z_node_norm, math.sqrt(row[7]), **tol)
        and math.sqrt(row[6]) <= dual_tolerance(num_nodes * n, math.sqrt(row[8]), **tol)
    )


def squared_norms(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Each tensor's squared L2 norm in float64, from one batched reduction
    (``_foreach_norm``, a multi-tensor kernel on CUDA) and one stack: no per-tensor kernel."""
    return torch.stack(torch._foreach_norm(tensors)).double().square()


def dual_update(
    theta: list[torch.Tensor],
    z_node: list[torch.Tensor],
    z: list[torch.Tensor],
    *,
    u: list[torch.Tensor],
    v: list[torch.Tensor],
    z_node_old: list[torch.Tensor],
    z_old: list[torch.Tensor],
    hierarchical: bool,
    leader: bool,
    stopping: bool,
) -> torch.Tensor:
    """Eqs. (12)-(13) in place, u += theta - z_i and (hierarchical) v += z_i - z, and this
    rank's pieces of the residual norms, to be summed over the world.

    Returns a (blocks, 9) float64 table of squared norms, one batched reduction per column:
    0 ||theta - z_i||^2, 1 ||z_i - z_i^old||^2, 5 ||z_i - z||^2 and 6 ||z - z^old||^2 (the
    residuals, for rho balancing and the layer rows), and only with ``stopping`` the
    tolerances' 2 ||theta||^2, 3 ||z_i||^2, 4 ||u||^2, 7 ||z||^2, 8 ||v||^2. Columns 5-8
    are the ``leader``'s (hierarchical); a piece a rank does not hold is zero. The penalties'
    rho^2 factors are left to ``scale_duals`` after the world sum (rho is the same on every
    rank), so the table needs no host-to-device copy.

    Why ``z_node_old`` and ``z_old`` are overwritten with the differences: they are not needed
    after this (the caller replaces them by ``z_node`` and ``z``), so the differences take no
    new memory. ``z_old`` is left alone where no column needs it (flat, or not a leader).
    """
    stats = torch.zeros(len(theta), 9, dtype=torch.float64, device=theta[0].device)
    r_intra = torch._foreach_sub(theta, z_node)
    stats[:, 0] = squared_norms(r_intra)
    torch._foreach_add_(u, r_intra)  # eq. (12)
    del r_intra
    torch._foreach_sub_(z_node_old, z_node)  # ||z_i - z_i^old|| as ||z_i^old - z_i||
    stats[:, 1] = squared_norms(z_node_old)
    if stopping:
        stats[:, 2] = squared_norms(theta)
        stats[:, 3] = squared_norms(z_node)
        stats[:, 4] = squared_norms(u)
    if hierarchical:
        r_inter = torch._foreach_sub(z_node, z)
        torch._foreach_add_(v, r_inter)  # eq. (13)
        if leader:
            stats[:, 5] = squared_norms(r_inter)
        del r_inter
        if leader:
            torch._foreach_sub_(z_old, z)  # likewise
            stats[:, 6] = squared_norms(z_old)
            if stopping:
                stats[:, 7] = squared_norms(z)
                stats[:, 8] = squared_norms(v)
    return stats


def scale_duals(row: list[float], rho1: float, rho2: float) -> list[float]:
    """One block's row of the world-summed table with its dual pieces scaled by rho^2: the
    dual residuals are rho (z^old - z) and the tolerances' y is rho u, rho v (scaled duals)."""
    row = list(row)
    for column, rho in ((1, rho1), (4, rho1), (6, rho2), (8, rho2)):
        row[column] *= rho**2
    return row


def residual_norms(row: list[float], *, hierarchical: bool) -> tuple[float, float, float, float]:
    """r_intra, s_intra, r_inter, s_inter of one block from its scaled row (the inter-node
    pair NaN where there is no inter-node level: flat)."""
    r_inter = s_inter = math.nan
    if hierarchical:
        r_inter, s_inter = math.sqrt(row[5]), math.sqrt(row[6])
    return math.sqrt(row[0]), math.sqrt(row[1]), r_inter, s_inter


def rebalance(
    rho: float, scaled_dual: torch.Tensor, primal_norm: float, dual_norm: float, *, rho_max: float
) -> float:
    """``balance_penalty``'s new rho, with the scaled dual rescaled in place by
    rho_old / rho_new, so that the unscaled dual y = rho u stays what it was (Boyd 3.4.1)."""
    new = balance_penalty(rho, primal_norm, dual_norm, rho_max=rho_max)
    if new != rho:
        scaled_dual.mul_(rho / new)
    return new
