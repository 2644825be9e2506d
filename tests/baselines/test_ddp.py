"""DDP through the instrumented comm hook equals single-process SGD on the joint batch."""

import torch
from torch import nn

from baselines.ddp import DDPMethod
from suite.data.sharding import ShardedLoader
from tests.support.distributed import run_ranks
from tests.support.helpers import TinyCNN, make_context, run_iterations, tiny_data

STEPS = 4


def ddp_worker(rank):
    ctx = make_context(rank, gpus_per_node=2)
    method = DDPMethod(ctx)
    rows = run_iterations(method, ctx.recorder, STEPS)
    return [p.detach().clone() for p in method.model.module.parameters()], rows


def reference_params():
    torch.manual_seed(0)
    model = TinyCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    loaders = [iter(ShardedLoader(tiny_data(), r, 4, 8, 0)) for r in range(4)]
    for _ in range(STEPS):
        batches = [next(it) for it in loaders]
        x = torch.cat([b[0] for b in batches])
        y = torch.cat([b[1] for b in batches])
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return [p.detach() for p in model.parameters()]


def test_ddp_equals_single_process_sgd_and_counts_bytes():
    out = run_ranks(ddp_worker, 4)
    expected = reference_params()
    for params, _ in out:
        for got, want in zip(params, expected):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    grad_bytes = sum(p.numel() * 4 for p in expected)
    for it in range(STEPS):
        inter = sum(rows[it]["bytes_inter"] for _, rows in out)
        intra = sum(rows[it]["bytes_intra"] for _, rows in out)
        # flat ring of 4 over 2 nodes: each rank sends 1.5 S; two of the four edges cross
        assert inter == 2 * 1.5 * grad_bytes
        assert intra == 2 * 1.5 * grad_bytes
        assert all(rows[it]["t_allreduce"] > 0 for _, rows in out)
