"""GPU part 1 (``nox -s gpu -- --part 1``, estimated 4-6 minutes on one H100): every method
on CUDA with 2 nodes x 2 ranks sharing the GPUs, a DDP comm hook's span that ends at the
collective's completion, Top-K replicas that stay bitwise equal, and a GPU run's folder read
where there is no GPU.

Skipped without CUDA (every ordinary test session hides it: see tests/conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from tests.gpu.common import (
    ALL_METHODS,
    ENV,
    SMALL,
    bench,
    folders,
    pytestmark,  # noqa: F401 (the skip without CUDA)
)
from tests.support.distributed import run_ranks
from tests.support.helpers import cnn_fmnist_model, make_context, run_iterations
from tests.support.runs import summary


@pytest.fixture(scope="module")
def shared_gpu_runs(tmp_path_factory) -> Path:
    """Every method, 2 nodes x 2 ranks placed round-robin on the visible GPUs (gloo where
    ranks share one)."""
    root = tmp_path_factory.mktemp("cuda")
    proc = bench("sweep", "--method", ALL_METHODS, *SMALL, "--gpus", "4", "--gpus-per-node",
                 "2", "--iterations", "4", "--results-dir", str(root))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return root


def test_every_method_runs_on_cuda(shared_gpu_runs):
    runs = folders(shared_gpu_runs)
    assert set(runs) == set(ALL_METHODS.split(","))
    for method, run in runs.items():
        done = summary(run)
        assert done["status"] == "ok", (method, done.get("error"))
        manifest = json.loads((run / "manifest.json").read_text())
        assert manifest["numerics"]["device"].startswith("cuda")
        assert manifest["numerics"]["device_name"]
        rows = pd.read_parquet(run / "iterations.parquet")
        assert (rows["t_local_compute"] > 0).all(), method


def topk_worker(rank):
    from baselines.topk import TopK

    ctx = make_context(rank, gpus_per_node=2, method="topk", options={"topk_ratio": 0.05},
                       model_fn=cnn_fmnist_model, device=torch.device("cuda", 0))
    method = TopK(ctx, hierarchical=False)
    run_iterations(method, ctx.recorder, 6)
    return [p.detach().cpu() for p in method.module.parameters()]


def test_topk_replicas_stay_bitwise_equal_on_cuda():
    """Decompression in a fixed order: every rank ends with the same bytes, so evaluating
    rank 0's model is evaluating all of them."""
    params = run_ranks(topk_worker, 4)
    for other in params[1:]:
        for a, b in zip(params[0], other):
            assert torch.equal(a, b)


def test_a_gpu_run_is_read_without_cuda(shared_gpu_runs, tmp_path):
    """Reports and exports of a GPU run's folder on a machine without a GPU."""
    hidden = {**ENV, "CUDA_VISIBLE_DEVICES": ""}
    proc = bench("report", str(shared_gpu_runs), "-o", str(tmp_path / "report"), env=hidden)
    assert proc.returncode == 0, proc.stderr
    prunex = folders(shared_gpu_runs)["prunex"]
    proc = bench("export", str(prunex), "--repeats", "1", "-o", str(tmp_path / "small.pt"),
                 env=hidden)
    assert proc.returncode == 0, proc.stderr
    for name in ("model.pt", "masks.pt"):
        saved = torch.load(prunex / name, weights_only=True)  # no map_location needed
        assert saved is not None


def test_a_hook_span_ends_when_its_collective_completes():
    """A comm hook that queues a 50 ms GPU sleep and then a world-1 NCCL all-reduce: the
    recorded span (CUDA events, the end recorded in the future's callback) holds the sleep.
    A span timed on the host would end at the enqueue, microseconds after its start."""
    import torch.distributed as dist

    from baselines.ddp import timed_hook
    from suite.cluster.comm import Communicator
    from suite.cluster.recorder import Recorder
    from suite.cluster.topology import lay_out

    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        topology = lay_out(0, 1, 1, world_pg=dist.group.WORLD, new_group=dist.new_group,
                           emulated=False, hostnames=["here"])
        recorder = Recorder(0, device)
        comm = Communicator(topology, recorder, device)
        cycles = sleep_cycles(0.05, device)

        def sleeping_allreduce(_state, bucket):
            torch.cuda._sleep(cycles)
            return comm.all_reduce_async(bucket.buffer(), topology.world, phase="allreduce")

        class Bucket:
            def buffer(self):
                return torch.ones(1024, device=device)

        recorder.begin_iteration(0)
        timed_hook(sleeping_allreduce, recorder, phase="compress")(None, Bucket()).wait()
        row = recorder.end_iteration()
    finally:
        dist.destroy_process_group()
    assert row["t_compress"] >= 0.04, row  # the hook's span: launch to completion
    assert row["t_allreduce"] >= 0.0


def sleep_cycles(seconds: float, device: torch.device) -> int:
    """GPU clock cycles of ``torch.cuda._sleep`` that take about ``seconds`` (timed once)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    probe = 10_000_000
    start.record()
    torch.cuda._sleep(probe)
    end.record()
    torch.cuda.synchronize(device)
    return int(probe * seconds / (start.elapsed_time(end) / 1000))
