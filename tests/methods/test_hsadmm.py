"""The per-layer H-SADMM math against numerical minimization and brute-force projections.

Finding on sec. 3.2 ("the order of projection does not affect the final support"): false.
For S_f & S_c the sequential filter->channel and channel->filter projections can keep
different supports (a 2x2 counterexample below; about 40% of random 4x3x2x2 tensors at keep
0.5/0.5), and neither order is the exact projection onto the intersection in general.
"""

import itertools
import math

import pytest
import torch

from methods.prunex import hsadmm
from suite.structured.masks import StructuredMask, apply_mask, keep_count, project

SHAPE = (4, 3, 2, 2)
KINDS = ("filter", "channel", "shape")


# ---------------------------------------------------------------- eq. (6), z_i subproblem
def smooth_objective(zi, thetas, us, z, v, *, rho1, rho2, lam, num_nodes):
    """The z_i-dependent smooth terms of eq. (6) for one node and one layer."""
    value = lam / (2 * num_nodes) * zi.square().sum()
    for theta, u in zip(thetas, us, strict=True):
        value = value + rho1 / 2 * (theta - zi + u).square().sum()
    return value + rho2 / 2 * (zi - z + v).square().sum()


def random_node(seed, procs=3):
    g = torch.Generator().manual_seed(seed)
    shape = (3, 2, 2, 2)
    thetas = [torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(procs)]
    us = [0.3 * torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(procs)]
    z = torch.randn(shape, generator=g, dtype=torch.float64)
    v = 0.3 * torch.randn(shape, generator=g, dtype=torch.float64)
    z_old = torch.randn(shape, generator=g, dtype=torch.float64)  # z_i^k, for the printed eq.
    rho1, rho2, lam = (0.1 + torch.rand(3, generator=g, dtype=torch.float64)).tolist()
    return thetas, us, z, v, z_old, {"rho1": rho1, "rho2": rho2, "lam": lam}


def numeric_minimizer(objective, like):
    x = torch.zeros_like(like, requires_grad=True)
    opt = torch.optim.LBFGS(
        [x],
        lr=1,
        max_iter=200,
        tolerance_grad=1e-14,
        tolerance_change=0,
        line_search_fn="strong_wolfe",
    )

    def closure():
        opt.zero_grad()
        loss = objective(x)
        loss.backward()
        return loss

    opt.step(closure)
    return x.detach()


@pytest.mark.parametrize("seed", range(3))
def test_node_candidate_minimizes_eq6_and_printed_eq9_does_not(seed):
    nodes, procs = 2, 3
    thetas, us, z, v, z_old, hp = random_node(seed, procs)

    def objective(zi):
        return smooth_objective(zi, thetas, us, z, v, num_nodes=nodes, **hp)

    best = numeric_minimizer(objective, z)
    theta_u_sum = sum(t + u for t, u in zip(thetas, us, strict=True))
    cand = hsadmm.node_candidate(theta_u_sum, z, v, num_nodes=nodes, procs_per_node=procs, **hp)
    assert torch.allclose(cand, best, rtol=1e-5, atol=1e-8)

    # eq. (9) as printed: no factor P in the normalizer, z_i^k where z^k belongs
    printed = (hp["rho1"] * theta_u_sum + hp["rho2"] * (z_old - v)) / (
        hp["lam"] / nodes + hp["rho1"] + hp["rho2"]
    )
    assert (printed - best).norm() > 0.1 * best.norm()
    assert objective(printed) > objective(best) + 1e-3


def test_flat_ablation_is_the_one_node_special_case():
    world = 4
    thetas, us, z, v, _, hp = random_node(7, procs=world)
    theta_u_sum = sum(t + u for t, u in zip(thetas, us, strict=True))
    flat = hsadmm.node_candidate(
        theta_u_sum,
        z,
        v,
        rho1=hp["rho1"],
        rho2=0.0,
        lam=hp["lam"],
        num_nodes=1,
        procs_per_node=world,
    )
    expected = hp["rho1"] * theta_u_sum / (hp["lam"] + world * hp["rho1"])
    assert torch.allclose(flat, expected, rtol=1e-12)

    def flat_objective(x):  # lam/2 ||z||^2 + sum over all N ranks rho1/2 ||theta - z + u||^2
        return smooth_objective(
            x, thetas, us, z, v, rho1=hp["rho1"], rho2=0.0, lam=hp["lam"], num_nodes=1
        )

    assert torch.allclose(flat, numeric_minimizer(flat_objective, z), rtol=1e-5, atol=1e-8)


# ---------------------------------------------------------------- brute-force projections
def supports(n, keep):
    """All supports of the right size for one group set, as a (count, n) 0/1 matrix."""
    if keep is None:
        return torch.ones(1, n, dtype=torch.float64)
    rows = []
    for subset in itertools.combinations(range(n), keep_count(n, keep)):
        row = torch.zeros(n, dtype=torch.float64)
        row[list(subset)] = 1
        rows.append(row)
    return torch.stack(rows)


def element_masks(shape, filter_keep=None, channel_keep=None, shape_keep=None):
    """Every feasible element mask of S_f & S_c & S_s (each set at its exact size)."""
    c_out, c_in, kh, kw = shape
    f = supports(c_out, filter_keep)
    c = supports(c_in, channel_keep)
    s = supports(c_in * kh * kw, shape_keep).reshape(-1, c_in, kh, kw)
    masks = f[:, None, None, :, None, None, None] * c[None, :, None, None, :, None, None]
    masks = masks * s[None, None, :, None]
    return masks.reshape(-1, *shape)


def brute_projection(w, **keeps):
    """argmin ||w - x|| over x in the set: for a fixed support the best x is w on it."""
    masks = element_masks(w.shape, **keeps)
    dist = (w - w * masks).flatten(1).norm(dim=1)
    return w * masks[dist.argmin()], dist.min().item()


def random_weight(seed, shape=SHAPE):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def live_groups(x):
    """Groups of x (filters, channels, shape positions) with a nonzero norm."""
    sq = x.square()
    return [int(sq.sum(d).gt(0).sum()) for d in ((1, 2, 3), (0, 2, 3), 0)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("keep", [0.25, 0.5, 0.75])
def test_single_set_projection_is_exact(kind, keep):
    for seed in range(5):
        w = random_weight(seed)
        projected, mask = project(w, **{f"{kind}_keep": keep})
        exact, exact_dist = brute_projection(w, **{f"{kind}_keep": keep})
        assert torch.equal(projected, exact)
        assert math.isclose((w - projected).norm().item(), exact_dist, rel_tol=1e-12)
        assert torch.equal(projected, apply_mask(w, mask))


@pytest.mark.parametrize(
    "keeps",
    [
        {"filter_keep": 0.5, "channel_keep": 0.5},
        {"filter_keep": 0.5, "shape_keep": 0.25},
        {"channel_keep": 0.5, "shape_keep": 0.5},
        {"filter_keep": 0.5, "channel_keep": 0.5, "shape_keep": 0.5},
    ],
)
def test_composite_projection_is_sequential_and_feasible(keeps):
    sizes = zip(KINDS, (4, 3, 12), strict=True)
    counts = [keep_count(n, keeps.get(f"{k}_keep", 1.0)) for k, n in sizes]
    for seed in range(5):
        w = random_weight(seed)
        projected, mask = project(w, **keeps)
        sequential = w
        for kind in KINDS:  # filter -> channel -> shape, each on the previous output
            key = f"{kind}_keep"
            if key in keeps:
                sequential, _ = brute_projection(sequential, **{key: keeps[key]})
        assert torch.equal(projected, sequential)
        assert all(live <= k for live, k in zip(live_groups(projected), counts, strict=True))
        assert [int(b.sum()) for b in (mask.filters, mask.channels, mask.shape)] == counts
        _, exact_dist = brute_projection(w, **keeps)
        assert (w - projected).norm().item() >= exact_dist - 1e-12


def test_projection_order_matters_and_sequential_is_not_exact():
    """Counterexample to sec. 3.2: filter->channel and channel->filter keep different supports."""
    w = torch.tensor([[2.0, 2.1], [0.0, 2.5]], dtype=torch.float64).reshape(2, 2, 1, 1)
    filter_first, _ = project(w, filter_keep=0.5, channel_keep=0.5)
    channel_first, _ = project(project(w, channel_keep=0.5)[0], filter_keep=0.5)
    # filter 0 (norm 2.90 > 2.5) is kept, then channel 1 (2.1 > 2.0): support {(0, 1)}
    assert torch.equal(filter_first.flatten(), torch.tensor([0, 2.1, 0, 0], dtype=torch.float64))
    # channel 1 (norm 3.26 > 2.0) is kept, then filter 1 (2.5 > 2.1): support {(1, 1)}
    assert torch.equal(channel_first.flatten(), torch.tensor([0, 0, 0, 2.5], dtype=torch.float64))
    exact, exact_dist = brute_projection(w, filter_keep=0.5, channel_keep=0.5)
    assert torch.equal(exact, channel_first)
    assert (w - filter_first).norm().item() > exact_dist + 0.1

    differ = 0
    for seed in range(50):
        x = random_weight(seed)
        a, _ = project(x, filter_keep=0.5, channel_keep=0.5)
        b, _ = project(project(x, channel_keep=0.5)[0], filter_keep=0.5)
        differ += not torch.equal(a, b)
    assert differ > 0  # not a corner case: common on random tensors


@pytest.mark.parametrize("kind", KINDS)
def test_projected_candidate_solves_the_constrained_z_step(kind):
    """Pi_S(z~) minimizes the whole eq. (6) z_i subproblem over S (a single set: exact)."""
    nodes, procs = 2, 3
    thetas, us, z, v, _, hp = random_node(11, procs)

    def objective(x):
        return smooth_objective(x, thetas, us, z, v, num_nodes=nodes, **hp)

    cand = hsadmm.node_candidate(
        sum(t + u for t, u in zip(thetas, us, strict=True)),
        z,
        v,
        num_nodes=nodes,
        procs_per_node=procs,
        **hp,
    )
    projected, _ = project(cand, **{f"{kind}_keep": 0.5})
    values = []
    for mask in element_masks(cand.shape, **{f"{kind}_keep": 0.5}):
        # the best z on this support: the candidate restricted to it (zero gradient there)
        x = (cand * mask).requires_grad_()
        value = objective(x)
        (grad,) = torch.autograd.grad(value, x)
        assert (grad * mask).abs().max() < 1e-10
        values.append(value.item())
    assert math.isclose(objective(projected).item(), min(values), rel_tol=1e-12)


# ---------------------------------------------------------------- project edge cases
def test_keep_count():
    assert keep_count(10, 0.5) == 5
    assert keep_count(3, 0.5) == 2  # 1.5 rounds half up
    assert keep_count(4, 0.375) == 2
    assert keep_count(5, 0.01) == 1  # never prune a whole layer
    assert keep_count(7, 1.0) == 7


@pytest.mark.parametrize("bad", [0.0, -0.5, 1.01, float("nan")])
def test_bad_keep_raises(bad):
    with pytest.raises(ValueError):
        keep_count(4, bad)
    with pytest.raises(ValueError):
        project(random_weight(0), channel_keep=bad)


@pytest.mark.parametrize("shape", [(4, 3), (4, 3, 2), (2, 4, 3, 2, 2)])
def test_non_conv_weight_raises(shape):
    with pytest.raises(ValueError):
        project(torch.ones(shape), filter_keep=0.5)


def test_keep_one_is_identity():
    w = random_weight(3)
    projected, mask = project(w, filter_keep=1.0, channel_keep=1.0, shape_keep=1.0)
    assert torch.equal(projected, w)
    assert torch.equal(mask.to_bits(), StructuredMask.full(SHAPE).to_bits())
    unconstrained, mask = project(w)
    assert torch.equal(unconstrained, w) and mask.density() == 1.0


def test_ties_keep_lower_indices():
    projected, mask = project(torch.ones(SHAPE), filter_keep=0.5, channel_keep=0.34)
    assert mask.filters.tolist() == [True, True, False, False]
    assert mask.channels.tolist() == [True, False, False]
    assert projected.sum().item() == 2 * 4
    w = torch.zeros(SHAPE)
    w[1], w[2] = 3.0, 3.0  # filter norms 0, a, a, 0 with a tie for the single kept filter
    _, mask = project(w, filter_keep=0.25)
    assert mask.filters.tolist() == [False, True, False, False]
    _, mask = project(torch.ones(SHAPE), shape_keep=0.25)
    assert mask.shape.flatten().nonzero().flatten().tolist() == [0, 1, 2]


def test_zero_tensor_keeps_exact_counts():
    projected, mask = project(
        torch.zeros(SHAPE), filter_keep=0.5, channel_keep=0.5, shape_keep=0.5
    )
    assert not projected.any()
    assert [int(b.sum()) for b in (mask.filters, mask.channels, mask.shape)] == [2, 2, 6]
    assert mask.filters.tolist() == [True, True, False, False]


def test_project_is_deterministic():
    w = random_weight(5).float()
    a, ma = project(w, filter_keep=0.5, channel_keep=0.5, shape_keep=0.5)
    b, mb = project(w.clone(), filter_keep=0.5, channel_keep=0.5, shape_keep=0.5)
    assert torch.equal(a, b) and ma.changed_groups(mb) == 0


# ---------------------------------------------------------------- StructuredMask
def random_mask(g, shape=SHAPE, p=0.5):
    c_out, c_in, kh, kw = shape
    bits = torch.rand(c_out + c_in + c_in * kh * kw, generator=g) < p
    return StructuredMask.from_bits(bits.to(torch.uint8), shape)


def test_dense_mask_and_index_sets():
    g = torch.Generator().manual_seed(0)
    dead_through_shape = 0
    for _ in range(200):
        mask = random_mask(g, p=0.4)  # sparse shape bitmaps: channels die through the shape set
        dense = mask.dense()
        dead_through_shape += bool((mask.channels & ~mask.shape.flatten(1).any(1)).any())
        expected = torch.zeros(SHAPE, dtype=torch.bool)
        for o, c, h, w in itertools.product(*map(range, SHAPE)):
            expected[o, c, h, w] = mask.filters[o] & mask.channels[c] & mask.shape[c, h, w]
        assert torch.equal(dense, expected)
        k_out = dense.any(dim=(1, 2, 3)).nonzero().flatten()
        k_in = dense.any(dim=(0, 2, 3)).nonzero().flatten()
        assert torch.equal(mask.kept_filters(), k_out)
        assert torch.equal(mask.kept_channels(), k_in)
        assert mask.density() == pytest.approx(dense.double().mean().item(), abs=1e-15)
    assert dead_through_shape > 0


def test_full_mask():
    mask = StructuredMask.full(torch.Size(SHAPE))
    assert mask.dense().all() and mask.density() == 1.0
    assert mask.kept_filters().tolist() == [0, 1, 2, 3]
    assert mask.kept_channels().tolist() == [0, 1, 2]


def test_bits_round_trip_union_and_max_allreduce():
    g = torch.Generator().manual_seed(1)
    a, b = random_mask(g), random_mask(g)
    bits = a.to_bits()
    assert bits.dtype == torch.uint8 and bits.shape == (4 + 3 + 12,)
    assert torch.equal(bits, torch.cat([a.filters, a.channels, a.shape.flatten()]).to(torch.uint8))
    assert torch.equal(StructuredMask.from_bits(bits, SHAPE).to_bits(), bits)
    union = a.union(b)
    for field in ("filters", "channels", "shape"):
        assert torch.equal(getattr(union, field), getattr(a, field) | getattr(b, field))
    # an all-reduce with MAX over the uint8 bits (what NCCL does) is the union
    assert torch.equal(torch.maximum(a.to_bits(), b.to_bits()), union.to_bits())
    assert torch.equal(
        StructuredMask.from_bits(torch.maximum(bits, b.to_bits()), SHAPE).dense(), union.dense()
    )
    assert (union.dense() | ~(a.dense() | b.dense())).all()  # contains both element masks


def test_from_bits_wrong_size_raises():
    with pytest.raises(ValueError):
        StructuredMask.from_bits(torch.ones(18, dtype=torch.uint8), SHAPE)
    with pytest.raises(ValueError):
        StructuredMask.full((4, 3))


def test_changed_groups():
    g = torch.Generator().manual_seed(2)
    a, b = random_mask(g), random_mask(g)
    assert a.changed_groups(a) == 0
    assert a.changed_groups(b) == int((a.to_bits() != b.to_bits()).sum())
    flipped = a.to_bits().clone()
    flipped[[0, 5, 10]] ^= 1
    assert a.changed_groups(StructuredMask.from_bits(flipped, SHAPE)) == 3
    with pytest.raises(ValueError):
        a.changed_groups(StructuredMask.full((4, 3, 3, 3)))


# ---------------------------------------------------------------- penalties and tolerances
def test_balance_penalty():
    assert hsadmm.balance_penalty(1.0, 11.0, 1.0) == 2.0  # primal > mu * dual: raise
    assert hsadmm.balance_penalty(1.0, 1.0, 11.0) == 0.5  # dual > mu * primal: lower
    assert hsadmm.balance_penalty(1.0, 3.0, 1.0) == 1.0
    assert hsadmm.balance_penalty(1.0, 10.0, 1.0) == 1.0  # boundary: no change
    assert hsadmm.balance_penalty(8.0, 100.0, 1.0) == 10.0  # capped at rho_max
    assert hsadmm.balance_penalty(8.0, 100.0, 1.0, rho_max=20.0) == 16.0
    assert hsadmm.balance_penalty(1.0, 3.0, 1.0, mu=2.0, tau=3.0) == 3.0
    assert hsadmm.balance_penalty(1.0, 0.0, 0.0) == 1.0


def test_tolerances():
    assert hsadmm.primal_tolerance(100, 3.0, 5.0, eps_abs=1e-2, eps_rel=1e-3) == pytest.approx(
        10 * 1e-2 + 1e-3 * 5.0
    )
    assert hsadmm.dual_tolerance(16, 2.0, eps_abs=1e-3, eps_rel=1e-2) == pytest.approx(
        4 * 1e-3 + 1e-2 * 2.0
    )
