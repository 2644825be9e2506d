"""The baselines on 2 emulated nodes x 2 real gloo ranks: agreement, bytes by formula, error
feedback, and one end-to-end CLI run each.

All multi-rank scenarios run inside one spawn of four processes (module fixture): starting
the ranks costs far more than the few steps each method takes on the tiny CNN.
"""

import json
import math

import pandas as pd
import pytest
import torch

from baselines.ddp import DDPMethod, make_ddp_bf16, make_ddp_fp16
from baselines.localsgd import HierarchicalLocalSGD
from baselines.powersgd import PowerSGD
from baselines.topk import ErrorFeedbackTopK, TopK, pack, unpack
from tests.support.distributed import run_ranks
from tests.support.helpers import cnn_fmnist_model, make_context, run_iterations
from tests.support.runs import SMALL, bench

STEPS = 4
TOPK_RATIO = 0.05
POWERSGD_RANK, POWERSGD_START = 2, 2
LOCAL_STEPS, INTRA_PERIOD, ROUNDS = 4, 2, 2

SCENARIOS = {
    # name: (factory, registered method whose options it takes, options, iterations)
    "ddp": (DDPMethod, "ddp", {}, STEPS),
    "ddp-bf16": (make_ddp_bf16, "ddp-bf16", {}, STEPS),
    "ddp-fp16": (make_ddp_fp16, "ddp-fp16", {}, STEPS),
    "topk": (lambda ctx: TopK(ctx, hierarchical=False), "topk", {"topk_ratio": TOPK_RATIO}, STEPS),
    "topk-hier": (
        lambda ctx: TopK(ctx, hierarchical=True),
        "topk-hier",
        {"topk_ratio": TOPK_RATIO},
        STEPS,
    ),
    "topk-dense": (lambda ctx: TopK(ctx, hierarchical=False), "topk", {"topk_ratio": 1.0}, STEPS),
    "topk-hier-dense": (
        lambda ctx: TopK(ctx, hierarchical=True),
        "topk-hier",
        {"topk_ratio": 1.0},
        STEPS,
    ),
    "powersgd": (
        PowerSGD,
        "powersgd",
        {"powersgd_rank": POWERSGD_RANK, "start_powersgd_iter": POWERSGD_START},
        STEPS,
    ),
    "localsgd-hier": (
        HierarchicalLocalSGD,
        "localsgd-hier",
        {"local_steps": LOCAL_STEPS, "intra_average_period": INTRA_PERIOD},
        ROUNDS,
    ),
}


def baselines_worker(rank):
    out = {}
    for name, (factory, method, options, iterations) in SCENARIOS.items():
        ctx = make_context(
            rank, gpus_per_node=2, method=method, options=options, model_fn=cnn_fmnist_model
        )
        method = factory(ctx)
        rows = run_iterations(method, ctx.recorder, iterations)
        out[name] = {
            "params": [p.detach().clone() for p in method.module.parameters()],
            "buffers": [b.clone() for b in method.module.buffers()],
            "rows": rows,
            "steps_per_iteration": method.steps_per_iteration,
            # from a first attempt, and from one resumed at iteration 5
            "one_offs": [sorted(method.one_off_iterations(first)) for first in (0, 5)],
        }
        if name == "powersgd":
            state = method.powersgd
            out[name]["pq"] = tuple(
                sum(t.numel() for t in memory.values())
                for memory in (state.p_memory_dict, state.q_memory_dict)
            )
    return out


@pytest.fixture(scope="module")
def runs():
    return run_ranks(baselines_worker, 4)


def shapes():
    return [p.shape for p in cnn_fmnist_model().parameters()]


def numel(shape) -> int:
    return math.prod(shape)


def per_link(out, name, it):
    rows = [o[name]["rows"][it] for o in out]
    return [r["bytes_intra"] for r in rows], [r["bytes_inter"] for r in rows]


def assert_same_on_all_ranks(out, name, key="params"):
    for o in out[1:]:
        for a, b in zip(o[name][key], out[0][name][key]):
            assert torch.equal(a, b), name


@pytest.mark.parametrize(
    "name", ["ddp", "ddp-bf16", "ddp-fp16", "topk", "topk-hier", "powersgd", "localsgd-hier"]
)
def test_all_ranks_end_with_the_same_model(runs, name):
    assert_same_on_all_ranks(runs, name)
    assert all(math.isfinite(r["loss"]) for o in runs for r in o[name]["rows"])


def test_half_precision_ddp_sends_half_of_ddp(runs):
    grad = sum(numel(s) for s in shapes())
    for name in ("ddp-bf16", "ddp-fp16"):
        for it in range(STEPS):
            intra, inter = per_link(runs, name, it)
            sent = 1.5 * 2 * grad  # flat ring of 4: each rank sends 1.5 x the 2-byte buffer
            assert inter == [0, sent, 0, sent]  # ranks 1 and 3 send across the node boundary
            assert intra == [sent, 0, sent, 0]
            ddp_intra, ddp_inter = per_link(runs, "ddp", it)
            assert (sum(intra), sum(inter)) == (sum(ddp_intra) / 2, sum(ddp_inter) / 2)
            assert all(o[name]["rows"][it]["t_allreduce"] > 0 for o in runs)


def topk_sizes(ratio):
    """(k over matrices and conv kernels, numel of the 1-D tensors), from the layer shapes."""
    k = sum(max(1, math.ceil(ratio * numel(s))) for s in shapes() if len(s) > 1)
    dense = sum(numel(s) for s in shapes() if len(s) == 1)
    return k, dense


def test_topk_bytes_are_the_allgather_with_indices_plus_the_dense_allreduce(runs):
    k, dense = topk_sizes(TOPK_RATIO)
    n = 4
    sent = (n - 1) * (4 * k + 4 * k) + 2 * (n - 1) / n * 4 * dense  # per rank
    for it in range(STEPS):
        intra, inter = per_link(runs, "topk", it)
        assert inter == [0, sent, 0, sent]  # ranks 1 and 3 send across the node boundary
        assert intra == [sent, 0, sent, 0]
        assert all(o["topk"]["rows"][it]["t_allgather"] > 0 for o in runs)


def test_hierarchical_topk_crosses_nodes_only_between_leaders(runs):
    k, dense = topk_sizes(TOPK_RATIO)
    full = 4 * sum(numel(s) for s in shapes())
    nodes = 2
    leader_inter = (nodes - 1) * 8 * k + 2 * (nodes - 1) / nodes * 4 * dense
    # intra: the node all-reduce (2 ranks: each sends S); the leader's broadcast of the
    # gathered pairs and the 1-D mean (the follower ends the chain)
    leader_intra = full + nodes * 8 * k + 4 * dense
    for it in range(STEPS):
        intra, inter = per_link(runs, "topk-hier", it)
        assert inter == [leader_inter, 0, leader_inter, 0]
        assert intra == [leader_intra, full, leader_intra, full]


@pytest.mark.parametrize("name", ["topk-dense", "topk-hier-dense"])
def test_topk_ratio_one_is_dense_averaging(runs, name):
    for o in runs:
        for got, want in zip(o[name]["params"], o["ddp"]["params"]):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_error_feedback_carries_what_is_not_sent():
    torch.manual_seed(0)
    compressor = ErrorFeedbackTopK([10], ratio=0.2)  # k = 2
    g1, g2 = torch.randn(10), torch.randn(10)
    values, indices = compressor.compress(g1.clone())
    assert torch.equal(indices.sort().values, g1.abs().topk(2).indices.sort().values.int())
    sent = torch.zeros(10).index_put_((indices.long(),), values)
    torch.testing.assert_close(sent + compressor.residual, g1)  # nothing is lost
    assert torch.equal(compressor.residual[indices.long()], torch.zeros(2))

    carried = compressor.residual.clone()
    values, indices = compressor.compress(g2.clone())
    acc = carried + g2  # the second step selects from residual + fresh gradient
    assert torch.equal(indices.sort().values, acc.abs().topk(2).indices.sort().values.int())
    torch.testing.assert_close(values, acc[indices.long()])

    got_values, got_indices = unpack(pack(values, indices).unsqueeze(0))
    assert torch.equal(got_indices[0], indices) and torch.equal(got_values[0], values)
    dense = compressor.decompress(got_values, got_indices)
    torch.testing.assert_close(dense, torch.zeros(10).index_put_((indices.long(),), values))


def powersgd_sizes(rank):
    """(uncompressed numel, |P|, |Q|) for the model, per PowerSGD's rule (min rate 2)."""
    uncompressed = p_size = q_size = 0
    for shape in shapes():
        n = shape[0]
        m = numel(shape) // n
        r = min(n, m, rank)
        if len(shape) > 1 and (n + m) * r * 2 < n * m:
            p_size, q_size = p_size + n * r, q_size + m * r
        else:
            uncompressed += numel(shape)
    return uncompressed, p_size, q_size


def test_powersgd_bytes_are_the_vanilla_then_uncompressed_p_and_q_allreduces(runs):
    uncompressed, p_size, q_size = powersgd_sizes(POWERSGD_RANK)
    assert p_size and q_size  # the model does have a layer worth compressing
    assert all(o["powersgd"]["pq"] == (p_size, q_size) for o in runs)  # torch agrees
    full = sum(numel(s) for s in shapes())
    for it in range(STEPS):
        elements = full if it < POWERSGD_START else uncompressed + p_size + q_size
        sent = 1.5 * 4 * elements  # ring all-reduce over 4 ranks, fp32
        intra, inter = per_link(runs, "powersgd", it)
        assert inter == [0, sent, 0, sent]
        assert intra == [sent, 0, sent, 0]
        assert all(o["powersgd"]["rows"][it]["t_allreduce"] > 0 for o in runs)


def test_one_off_iterations_are_ddps_bucket_rebuild_and_powersgds_first_compression(runs):
    """What the summary's means leave out beside each attempt's first iteration: DDP
    rebuilds its buckets in its second iteration, PowerSGD also allocates its factors at its
    first compressed step (iteration 2 here, or the resumed attempt's first)."""
    one_offs = {name: runs[0][name]["one_offs"] for name in SCENARIOS}
    assert one_offs["ddp"] == one_offs["ddp-bf16"] == [[1], [6]]
    assert one_offs["powersgd"] == [[1, POWERSGD_START], [5, 6]]
    assert one_offs["topk"] == one_offs["localsgd-hier"] == [[], []]


def test_localsgd_averages_in_nodes_then_over_the_world_each_round(runs):
    assert_same_on_all_ranks(runs, "localsgd-hier", "buffers")  # BN statistics too
    assert all(o["localsgd-hier"]["steps_per_iteration"] == LOCAL_STEPS for o in runs)
    model = cnn_fmnist_model()
    float_numel = sum(p.numel() for p in model.parameters()) + sum(
        b.numel() for b in model.buffers() if b.is_floating_point()
    )
    size = 4 * float_numel
    intra_averages = (LOCAL_STEPS - 1) // INTRA_PERIOD
    node_average = 2 * (2 - 1) / 2 * size  # each of 2 ranks sends S
    world_average = 2 * (4 - 1) / 4 * size
    for it in range(ROUNDS):
        intra, inter = per_link(runs, "localsgd-hier", it)
        assert inter == [0, world_average, 0, world_average]
        local = intra_averages * node_average
        assert intra == [local + world_average, local, local + world_average, local]
        rows = [o["localsgd-hier"]["rows"][it] for o in runs]
        assert all(r["t_intra_allreduce"] > 0 and r["t_allreduce"] > 0 for r in rows)


CLI_METHODS = {
    "topk": [],
    "topk-hier": [],
    "ddp-bf16": [],
    "ddp-fp16": [],
    "powersgd": ["--start-powersgd-iter", "2"],
    "localsgd-hier": ["--local-steps", "4", "--intra-average-period", "2"],
}


@pytest.mark.slow
@pytest.mark.parametrize("method", [
    pytest.param(m, marks=pytest.mark.integration) if m in ("ddp-bf16", "topk-hier") else m
    for m in CLI_METHODS])  # the twins of ddp-fp16 and topk: nox -s integration
def test_cli_end_to_end(method, tmp_path):
    proc = bench(
        "run",
        "--method",
        method,
        *SMALL,
        "--gpus",  # two nodes of one rank: the CLI path, at half the start-up cost
        "2",
        "--gpus-per-node",
        "1",
        "--iterations",
        "3",
        "--results-dir",
        str(tmp_path),
        *CLI_METHODS[method],
    )
    assert proc.returncode == 0, proc.stderr
    (run,) = tmp_path.iterdir()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["iterations"] == 3
    assert summary["final_accuracy"] is not None
    rows = pd.read_parquet(run / "iterations.parquet")
    assert len(rows) == 3 * 2
    assert summary["inter_node_bytes_total"] == rows["bytes_inter"].sum() > 0
    if method == "localsgd-hier":
        assert summary["steps_per_iteration"] == 4
