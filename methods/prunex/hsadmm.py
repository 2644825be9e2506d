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
  affect the support. It does: see ``project`` and tests/methods/test_hsadmm.py for a 2x2 counter-
  example. Sequential projection is feasible for every set but is not, in general, the exact
  projection onto the intersection.
"""

from __future__ import annotations

import math

import torch

__all__ = ["balance_penalty", "dual_tolerance", "node_candidate", "primal_tolerance"]


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
