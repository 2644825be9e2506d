"""Fair comparisons: one lr schedule and sample budget for every method, PruneX's penalties
that hold its masks still, the pruning baselines at PruneX's structure and bytes, repeats."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from methods.prunex.freeze import FreezePolicy
from methods.prunex.method import PruneX, proximal_weight
from methods.prunex.penalties import rho1_for_pull, round_pull
from suite.data.schedule import LRSchedule
from suite.plugins.registry import METHODS
from suite.report.figures import phase_breakdown
from suite.report.load import report_runs
from suite.report.render import run_table, summary_table
from suite.results.stats import t95
from suite.results.view import RunView
from suite.structured.groups import trace_channel_groups
from suite.structured.liveness import live_slices
from suite.structured.masks import StructuredMask, project
from suite.structured.packing import PackLayout, model_entries, packed_numel
from tests.support.distributed import run_ranks
from tests.support.helpers import cnn_fmnist_model, make_context, run_iterations

BUDGET = 10  # local steps per rank: rounds of 4, 4 and a short 2
SCHEDULE = LRSchedule("cosine", 0.05, warmup_samples=24, total_samples=BUDGET * 8)


# ---------------------------------------------------------------------- schedule and budget
def test_schedules_warm_up_then_follow_their_shape():
    cosine = LRSchedule("cosine", 0.1, warmup_samples=100, total_samples=1100)
    assert cosine.lr(0, 10) == pytest.approx(0.01)  # the first step already moves
    assert cosine.lr(90, 10) == pytest.approx(0.1)
    assert cosine.lr(100, 10) == pytest.approx(0.1)
    assert cosine.lr(600, 10) == pytest.approx(0.05)  # half way through the decay
    assert cosine.lr(1100, 10) == pytest.approx(0.0, abs=1e-12)
    step = LRSchedule("step", 0.1, warmup_samples=0, total_samples=1000)
    assert [step.lr(s, 10) for s in (0, 499, 500, 749, 750)] == pytest.approx(
        [0.1, 0.1, 0.01, 0.01, 0.001]
    )
    assert LRSchedule("constant", 0.1, 0, 1000).lr(999, 10) == 0.1
    with pytest.raises(ValueError, match="unknown lr schedule"):
        LRSchedule("linear", 0.1, 0, 10)


def schedule_worker(rank):
    out = {}
    for name in ("ddp", "prunex", "localsgd-hier"):
        ctx = make_context(
            rank, gpus_per_node=2, method=name, options={"local_steps": 4} if name != "ddp" else {},
            budget_steps=BUDGET, schedule=SCHEDULE, bn=True,
        )
        method = METHODS.get(name).factory(ctx)
        rows = run_iterations(method, ctx.recorder, math.ceil(BUDGET / method.steps_per_iteration))
        out[name] = {
            "lr": [r["lr"] for r in rows],
            "steps": ctx.loader.step,
            "steps_per_iteration": method.steps_per_iteration,
        }
    out["drift"] = drift_worker(rank)
    return out


@pytest.fixture(scope="module")
def scheduled():
    return run_ranks(schedule_worker, 4)


def test_every_method_takes_the_same_samples_and_the_same_lr_at_each(scheduled):
    for rank in scheduled:
        rank = {k: v for k, v in rank.items() if k != "drift"}
        assert {m["steps"] for m in rank.values()} == {BUDGET}  # the last round is cut to fit
        ddp = rank["ddp"]["lr"]
        for name in ("prunex", "localsgd-hier"):
            run = rank[name]
            assert run["steps_per_iteration"] == 4 and len(run["lr"]) == 3
            ends = [min(4 * (r + 1), BUDGET) for r in range(3)]  # steps done at each round end
            # a round records the lr of its last step: DDP's step at the same sample count
            assert run["lr"] == pytest.approx([ddp[e - 1] for e in ends])
    assert scheduled[0]["ddp"]["lr"] == pytest.approx(
        [SCHEDULE.lr(8 * k, 8) for k in range(BUDGET)]
    )


# ---------------------------------------------------------------------- PruneX's penalties
def test_the_proximal_step_is_the_minimizer_and_the_rule_gives_its_pull():
    g = torch.Generator().manual_seed(0)
    theta = torch.randn(5, generator=g, dtype=torch.float64)
    anchor = torch.randn(5, generator=g, dtype=torch.float64)
    lr, rho = 0.05, 3.0
    stepped = theta.lerp(anchor, proximal_weight(lr, rho))
    grid = torch.linspace(-4, 4, 80001, dtype=torch.float64)  # brute force, per coordinate
    for i in range(5):
        objective = (grid - theta[i]) ** 2 / (2 * lr) + rho / 2 * (grid - anchor[i]) ** 2
        assert stepped[i].item() == pytest.approx(grid[objective.argmin()].item(), abs=1e-4)
    for steps in (4, 32):
        rho1 = rho1_for_pull(0.8, lr=lr, local_steps=steps)
        x = torch.ones(1)
        for _ in range(steps):  # the penalty alone, anchored at 0
            x = x.lerp(torch.zeros(1), proximal_weight(lr, rho1))
        assert 1 - x.item() == pytest.approx(0.8) == round_pull(rho1, lr=lr, local_steps=steps)


def drift_worker(rank):
    ctx = make_context(
        rank, gpus_per_node=2, method="prunex", options={"local_steps": 4}, bn=True,
        model_fn=cnn_fmnist_model, budget_steps=40,
    )
    method = PruneX(ctx, hierarchical=True)
    rows = run_iterations(method, ctx.recorder, 8)
    return [r["mask_drift_fraction"] for r in rows], method.rho1[0], method.warnings


def test_default_penalties_hold_the_masks_still_by_round_three(scheduled):
    drifts, rho1, warnings = scheduled[0]["drift"]
    assert rho1 > 1.0  # from the round pull, not the paper's 1.5e-3
    assert drifts[0] > 0.2  # the first projection moves about half the channel bits
    assert all(d <= 0.05 for d in drifts[3:]), drifts
    assert warnings == []


def test_oscillating_masks_are_reported_once():
    printed = []
    policy = FreezePolicy(SimpleNamespace(topology=SimpleNamespace(rank=1)), structured_bits=100)
    for drift in (90, 60, 10, 70, 80, 51, 99, 99):
        policy.watch_oscillation(drift, [1.5e-3])
        printed.append(len(policy.warnings))
    assert printed == [0, 0, 0, 0, 0, 1, 1, 1]
    assert policy.warnings[0].startswith("masks oscillate: penalties too weak for lr*H")


# ---------------------------------------------------------------------- pruning baselines
def pruning_worker(rank):
    out = {}
    ctx = make_context(
        rank, gpus_per_node=2, method="prune-retrain",
        options={"local_steps": 4, "prune_at": 0.0, "channel_keep": 0.5},
        model_fn=cnn_fmnist_model, bn=True, budget_steps=12,
    )
    method = METHODS.get("prune-retrain").factory(ctx)
    for _ in range(4):  # one round by hand, up to the prune
        method.forward_backward()
        method.apply_update()
    method.node_average()
    mine = {n: project(method.params[n].data, channel_keep=0.5)[1] for n in method.shapes}
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, {n: m.to_bits() for n, m in mine.items()})
    method.prune(1.0)
    expected = {n: torch.stack([g[n] for g in gathered]).amax(0) for n in method.shapes}
    out["top_k_union"] = all(
        torch.equal(method.masks[n].to_bits(), expected[n]) for n in method.shapes
    )
    method.exchange_between_nodes()
    rows = run_iterations(method, ctx.recorder, 2)  # the fixed support, packed
    out["bits"] = torch.cat([method.masks[n].to_bits() for n in method.shapes])
    out["bytes_inter"] = [r["bytes_inter"] for r in rows]
    # PruneX's formula at these masks: the live slices (--pack live, both methods' default)
    groups = trace_channel_groups(method.module, ctx.example_input())
    live = live_slices(method.module, groups, method.masks)
    tensors = {**method.params, **method.buffers}
    out["packed_numel"] = sum(packed_numel(t.shape, live.of(n)) for n, t in tensors.items())
    out["mask_block_numel"] = sum(
        packed_numel(p.shape, method.masks.get(n)) for n, p in method.params.items()
    ) + sum(b.numel() for b in method.buffers.values())
    layout = PackLayout(model_entries(method.module, method.masks, live=live))
    out["layout_numel"] = layout.numel
    out["density"] = method.density()
    return out


@pytest.fixture(scope="module")
def pruned():
    return run_ranks(pruning_worker, 4)


def test_prune_retrain_masks_are_the_nodes_top_k_groups_or_ed(pruned):
    assert all(r["top_k_union"] for r in pruned)
    assert all(torch.equal(r["bits"], pruned[0]["bits"]) for r in pruned)
    assert 0.5 <= pruned[0]["density"] < 1.0


def test_pruned_exchange_sends_prunex_packed_bytes(pruned):
    leaders, followers = [pruned[0], pruned[2]], [pruned[1], pruned[3]]
    for leader in leaders:
        # two leaders: a ring all-reduce sends 2 (n - 1) / n = 1 x the packed fp32 buffer
        assert leader["layout_numel"] == leader["packed_numel"]
        assert leader["bytes_inter"] == [4.0 * leader["packed_numel"]] * 2
        assert leader["packed_numel"] < leader["mask_block_numel"]  # dead filters stay home
    assert all(r["bytes_inter"] == [0.0, 0.0] for r in followers)


def test_gmp_keep_follows_the_cubic_schedule():
    from baselines.pruning import cubic_fraction, keeps_at

    target, end = 0.3, 0.5
    for progress in (0.0, 0.1, 0.25, 0.4, 0.5, 0.9):
        closed = target + (1 - target) * (1 - min(progress / end, 1)) ** 3
        keeps = keeps_at(
            {"channel_keep": target, "filter_keep": None}, cubic_fraction(progress, end)
        )
        assert keeps["channel_keep"] == pytest.approx(closed) and keeps["filter_keep"] is None


def test_structured_masks_are_framework_code():
    """Baselines and PruneX choose groups with the framework's one projection
    (StructuredRound.project / .select), none of their own."""
    import inspect

    import baselines.pruning as pruning
    import methods.prunex.method as prunex

    for module in (pruning, prunex):
        source = inspect.getsource(module)
        assert "StructuredRound(" in source, module.__name__
        assert "def project" not in source and "import project" not in source, module.__name__
    assert StructuredMask.__module__ == "suite.structured.masks"


# ---------------------------------------------------------------------- repeats
def repeat(tmp_path, seed, accuracy, phases, run_id):
    summary = {
        "run_id": run_id, "method": "prunex", "workload": "cnn-fmnist", "dataset": "fmnist",
        "gpus": 4, "nodes": 2, "options": {}, "seed": seed, "final_accuracy": accuracy,
        "best_accuracy": accuracy, "epochs": 1.0, "train_seconds": 10.0 + seed,
        "iteration_seconds": 1.0, "inter_node_bytes_total": 1e6, "phase_seconds": phases,
        "steps_per_iteration": 1, "status": "ok",
    }
    manifest = {"recipe": {"batch_size": 32, "lr": 0.05, "lr_schedule": "cosine"}}
    return RunView(tmp_path / run_id, summary, manifest)


def test_repeats_of_one_configuration_are_one_row_with_a_t_interval(tmp_path):
    runs = [repeat(tmp_path, 0, 0.80, {}, "a"), repeat(tmp_path, 1, 0.84, {}, "b")]
    table = summary_table(run_table(report_runs(runs)))
    assert len(table) == 1
    row = table.iloc[0]
    assert row.repeats == 2 and row.seeds == "0,1" and row.run_id == "a,b"
    assert row.final_acc == pytest.approx(0.82)
    std = math.sqrt(2 * 0.02**2)  # sample std of 0.80 and 0.84
    assert row.final_acc_ci95 == pytest.approx(t95(2) * std / math.sqrt(2))
    assert row.train_s == pytest.approx(10.5)


def test_no_repeat_overwrites_another_in_the_phase_figure(tmp_path):
    tmp_path.mkdir(exist_ok=True)
    runs = [
        repeat(tmp_path, 0, 0.8, {"local_compute": 1.0, "inter_allreduce": 0.2}, "a"),
        repeat(tmp_path, 1, 0.8, {"local_compute": 3.0, "inter_allreduce": 0.4}, "b"),
    ]
    figure = phase_breakdown(report_runs(runs), tmp_path)
    assert figure.run_ids == ["a", "b"]
    assert figure.table.local_compute.tolist() == [2.0]  # the mean, not the last seed
