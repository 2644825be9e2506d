"""What a timing or a batch means must not depend on the device: phases that add up to the
iteration, PruneX's fused local step equal to the per-tensor step it replaced, Top-K's
decompression in a fixed order, and the device-resident loader equal to the host one."""

from __future__ import annotations

import statistics

import pytest
import torch
from torch import nn

from baselines.topk import ErrorFeedbackTopK
from methods.prunex.method import PruneX, proximal_weight
from suite.api import project
from suite.data.sharding import ShardedLoader
from suite.data.workload import TensorData
from suite.plugins.registry import METHODS
from tests.support.distributed import run_ranks
from tests.support.helpers import cnn_fmnist_model, make_context, run_iterations

#: every built-in method, with options that make its few iterations exercise its phases
PHASE_RUNS = {
    "prunex": {"local_steps": 4, "channel_keep": 0.5, "freeze_round": 2},
    "prunex-flat": {"local_steps": 4, "channel_keep": 0.5},
    "ddp": {"bucket_cap_mb": 0.05},  # ~20 buckets: their spans overlap one another
    "ddp-bf16": {},
    "ddp-fp16": {},
    "powersgd": {"powersgd_rank": 2, "start_powersgd_iter": 2},
    "topk": {"topk_ratio": 0.05},
    "topk-hier": {"topk_ratio": 0.05},
    "localsgd-hier": {"local_steps": 4},
    "gmp-hier": {"local_steps": 4, "channel_keep": 0.5},
    "prune-retrain": {"local_steps": 4, "channel_keep": 0.5, "prune_at": 0.0},
}
ITERATIONS = 3


def phases_worker(rank):
    out = {}
    for name, options in PHASE_RUNS.items():
        ctx = make_context(
            rank, gpus_per_node=2, method=name, options=options, batch_size=16,
            model_fn=cnn_fmnist_model, bn=True, budget_steps=12,
        )
        method = METHODS.get(name).factory(ctx)
        rows = run_iterations(method, ctx.recorder, ITERATIONS)
        out[name] = (rows, tuple(method.overlapped_phases))
    return out


@pytest.fixture(scope="module")
def phase_rows():
    return run_ranks(phases_worker, 4)


@pytest.mark.parametrize("name", list(PHASE_RUNS))
def test_phases_add_up_to_the_iteration(phase_rows, name):
    """No phase lost or counted twice: the recorded phases of an iteration, less those that
    overlap local compute, sum to within 5 % of its measured time (iteration 0 too: its
    setup happens before it). The median over ranks and iterations, so one descheduled
    moment of a rank on a busy 2-core machine does not decide it."""
    shares = []
    for rows, overlapped in (out[name] for out in phase_rows):
        for row in rows:
            phases = sum(
                value
                for key, value in row.items()
                if key.startswith("t_") and key != "t_iteration" and key[2:] not in overlapped
            )
            shares.append(phases / row["t_iteration"])
    assert statistics.median(shares) == pytest.approx(1.0, abs=0.05)


def test_overlapping_bucket_spans_count_once(phase_rows):
    """DDP's bucket all-reduces overlap backward and each other: their time is the union of
    their spans, never more than the iteration that holds them."""
    for rows, _ in (out["ddp"] for out in phase_rows):
        for row in rows:
            assert 0 < row["t_allreduce"] <= row["t_iteration"], row


def reference_local_compute(method: PruneX) -> tuple[float, int]:
    """PruneX's local step as it was before the foreach rewrite: one lerp_ per tensor and a
    host read of the loss per step (kept here as the reference)."""
    anchors = [z - u for z, u in zip(method.z_node, method.u)]
    total, samples = 0.0, 0
    for _ in range(method.ctx.round_steps()):
        x, y = next(method.batches)
        method.optimizer.zero_grad(set_to_none=True)
        loss = method.loss_fn(method.model(x), y)
        loss.backward()
        method.ctx.apply_lr(method.optimizer)
        method.optimizer.step()
        with torch.no_grad():
            for param, anchor, rho in zip(method.params, anchors, method.rho1):
                param.lerp_(anchor, proximal_weight(method.ctx.recipe.lr, rho))
            for name, mask in method.structure.support.items():
                method.named_params[name].mul_(mask)
        total += loss.item() * len(y)
        samples += len(y)
    return total / samples, samples


def foreach_worker(rank):
    results = []
    for frozen in (False, True):
        made = []
        for _ in range(2):
            ctx = make_context(
                rank, gpus_per_node=1, method="prunex", batch_size=16, bn=True,
                options={"local_steps": 4, "channel_keep": 0.5, "after_freeze": "admm"},
                model_fn=cnn_fmnist_model,
            )
            method = METHODS.get("prunex").factory(ctx)
            method.rho1 = [0.5 + 0.25 * i for i in range(len(method.rho1))]  # per-block weights
            with torch.no_grad():
                for z in method.z_node:
                    z.mul_(0.5)
                for u in method.u:
                    u.normal_(0, 0.01, generator=torch.Generator().manual_seed(1))
            if frozen:  # a support that prunes: keep() multiplies it in after every step
                weights = method.named_params
                method.structure.agree(
                    {n: project(weights[n].detach(), channel_keep=0.5)[1] for n in weights
                     if n in method.structure.shapes}
                )
                method.freeze(rounds_done=0)
            made.append(method)
        fused, reference = made
        loss, samples = fused.local_compute()
        ref_loss, ref_samples = reference_local_compute(reference)
        results.append(
            {
                "loss_equal": float(loss) == ref_loss and samples == ref_samples,
                "params_equal": all(
                    torch.equal(a, b) for a, b in zip(fused.params, reference.params)
                ),
            }
        )
    return results


def test_prunex_foreach_step_equals_the_per_tensor_step():
    (results,) = run_ranks(foreach_worker, 1)
    assert results == [{"loss_equal": True, "params_equal": True}] * 2


def test_topk_decompression_is_the_same_bytes_every_time():
    """Repeated indices across contributors (the same positions chosen by several ranks)
    sum in contributor order, twice the same, and as one CPU index_add_ over all rows."""
    numels = [50, 30]
    compressor = ErrorFeedbackTopK(numels, ratio=0.2)
    g = torch.Generator().manual_seed(0)
    rows = [ErrorFeedbackTopK(numels, ratio=0.2).compress(torch.randn(80, generator=g))
            for _ in range(4)]
    rows.append(rows[0])  # a contributor that chose exactly the positions of another
    values = torch.stack([v for v, _ in rows])
    indices = torch.stack([i for _, i in rows])
    first = compressor.decompress(values, indices)
    second = compressor.decompress(values.clone(), indices.clone())
    assert torch.equal(first, second)
    one_pass = torch.zeros(80).index_add_(0, indices.reshape(-1).long(), values.reshape(-1))
    assert torch.equal(first, one_pass.div_(5))


def test_device_resident_batches_are_the_host_batches():
    """The resident path (the shard on the device, gathered and augmented there) yields the
    host path's batches bit for bit, across epochs and after a restore."""
    g = torch.Generator().manual_seed(0)
    data = TensorData(torch.randn(90, 3, 8, 8, generator=g), torch.randint(0, 10, (90,)), True)
    host = ShardedLoader(data, 1, 2, 8, seed=3)
    resident = ShardedLoader(data, 1, 2, 8, seed=3, device=torch.device("cpu"))
    for _ in range(13):  # 5 steps per epoch: into the third epoch
        (x, y), (rx, ry) = next(host), next(resident)
        assert torch.equal(x, rx) and torch.equal(y, ry)
    restored = ShardedLoader(data, 1, 2, 8, seed=3, device=torch.device("cpu"))
    restored.load_state_dict(host.state_dict())
    for _ in range(3):
        (x, y), (rx, ry) = next(host), next(restored)
        assert torch.equal(x, rx) and torch.equal(y, ry)


def test_artifacts_are_moved_to_the_cpu_whole():
    from suite.results.finish import on_cpu

    model = nn.BatchNorm2d(3)
    state = model.state_dict()
    moved = on_cpu({"model": state, "masks": [(torch.ones(2, dtype=torch.bool), 3)]})
    assert type(moved["model"]) is type(state) and moved["model"]._metadata == state._metadata
    nn.BatchNorm2d(3).load_state_dict(moved["model"])
    assert isinstance(moved["masks"][0], tuple) and moved["masks"][0][1] == 3


def test_gpu_memory_estimate_counts_the_batch_activations():
    """The GPU guard's estimate grows with the batch by the activations of a meta forward
    pass, and holds the parameter copies and the resident shard besides."""
    from suite.commands.capacity import (
        CUDA_CONTEXT_BYTES,
        PARAMETER_COPIES,
        activation_bytes,
        gpu_rank_memory_estimate,
        model_on_meta_device,
    )
    from suite.config import RunConfig
    from suite.run.plan import plan_run

    plan = plan_run(RunConfig(method="ddp", workload="resnet18-cifar10", dataset="synthetic",
                              gpus=4))
    model = model_on_meta_device(plan)
    small, large = activation_bytes(model, plan, 8), activation_bytes(model, plan, 16)
    assert small > 0 and large == 2 * small
    params = sum(p.numel() for p in model.parameters())
    estimate = gpu_rank_memory_estimate(plan, model)
    assert estimate > CUDA_CONTEXT_BYTES + PARAMETER_COPIES * 4 * params + 2 * small
