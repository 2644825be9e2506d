"""PruneX's initial penalties from how hard one round of eq. (8) pulls theta to its anchor.

Why: the paper's absolute rho1 = 1.5e-3 (sec. 5.1.5) belongs to its recipe (lr 1e-3, hundreds of
local epochs). At the CPU recipe (lr 0.05, H = 32, momentum 0.9) one round closes only ~2 % of
theta's distance to its anchor z_i - u, so a channel the projection zeroes keeps its value in
theta, its whole value moves into u (u += theta - 0, eq. 12), and its next candidate theta + u
is ~2 theta: kept and pruned halves swap every round and the masks oscillate.

How a round pulls. Eq. (8) is min_theta f(theta) + rho1/2 ||theta - a||^2 with the anchor
a = z_i - u fixed for the round. Local SGD solves it by proximal stochastic gradient: the
optimizer's (momentum) step on f, then the exact proximal step of the quadratic,

    theta <- argmin_x 1/(2 lr) ||x - theta||^2 + rho1/2 ||x - a||^2
           = (theta + lr rho1 a) / (1 + lr rho1)

(methods/prunex/method.py; tests/methods/test_hsadmm.py checks it against a brute-force minimum).
Putting rho1 (theta - a) into the gradient instead would run it through the momentum: with
momentum beta its contraction per step can never beat sqrt(beta), so with beta = 0.9 a round
of H = 4 steps could close at most 1 - 0.9^2 = 19 % of the distance, whatever rho1. The exact
step contracts the distance by 1 / (1 + lr rho1) per step, so after H steps

    pull = 1 - (1 + lr rho1)^(-H)   =>   rho1 = ((1 - pull)^(-1/H) - 1) / lr,

the rule used here at the recipe's peak lr (the pull follows the lr schedule from there).

rho2 weighs the global z against the node's P local models in the closed-form z_i step
(corrected eq. 9): its share is rho2 / (P rho1 + rho2). It keeps the paper's ratio
rho2 = rho1 / 10. Residual balancing (Boyd 3.4.1) adapts both from there.
"""

from __future__ import annotations

#: the paper's absolute penalties (sec. 5.1.5), reachable with --penalties paper
PAPER_RHO1 = 1.5e-3
PAPER_RHO2 = 1.5e-4
#: rho2 / rho1 in the paper's values
RHO2_RATIO = PAPER_RHO2 / PAPER_RHO1
#: default fraction of the distance to the anchor one round closes
DEFAULT_ROUND_PULL = 0.8


def round_pull(rho1: float, *, lr: float, local_steps: int) -> float:
    """Fraction of theta's distance to its anchor that ``local_steps`` proximal steps close."""
    return 1.0 - (1.0 + lr * rho1) ** -local_steps


def rho1_for_pull(pull: float, *, lr: float, local_steps: int) -> float:
    """The rho1 whose round of ``local_steps`` proximal steps at ``lr`` pulls ``pull``."""
    if not 0.0 < pull < 1.0:
        raise ValueError(f"the round pull must lie in (0, 1), got {pull}")
    return ((1.0 - pull) ** (-1.0 / local_steps) - 1.0) / lr


def initial_penalties(
    settings, *, lr: float, local_steps: int, hierarchical: bool
) -> tuple[float, float]:
    """(rho1, rho2) at round 0: those given, else the paper's (``--penalties paper``), else
    rho1 from the round pull at the recipe's peak lr and rho2 = rho1 / 10."""
    rho1, rho2 = settings.rho1, getattr(settings, "rho2", None)
    paper = settings.penalties == "paper"
    if rho1 is None and paper:
        rho1 = PAPER_RHO1
    elif rho1 is None:
        pull = settings.round_pull
        rho1 = rho1_for_pull(pull, lr=lr, local_steps=local_steps)
    if rho2 is None:
        rho2 = PAPER_RHO2 if paper else rho1 * RHO2_RATIO
    return rho1, (rho2 if hierarchical else 0.0)
