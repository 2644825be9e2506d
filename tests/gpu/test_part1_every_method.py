"""GPU part 1 (``nox -s gpu -- --part 1``, estimated 4-6 minutes on one H100): every method
on CUDA with 2 nodes x 2 ranks sharing the GPUs, a DDP comm hook's span that ends at the
collective's completion, Top-K replicas that stay bitwise equal, and a GPU run's folder read
where there is no GPU.

Skipped without CUDA (every ordinary test session hides it: see tests/conftest.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest
import torch

from tests.gpu.common import (
    ALL_METHODS,
    COMPRESSING,
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
    proc = bench("sweep", "--method", ALL_METHODS, *SMALL, *COMPRESSING, "--gpus", "4",
                 "--gpus-per-node", "2", "--iterations", "4", "--results-dir", str(root))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return root


def test_every_method_runs_on_cuda(shared_gpu_runs):
    """Each run ended ok on CUDA, its 4 ranks sharing the cores (suite.cluster.ranks:
    rank_threads), not each taking them all."""
    runs = folders(shared_gpu_runs)
    assert set(runs) == set(ALL_METHODS.split(","))
    threads = (int(os.environ["OMP_NUM_THREADS"]) if os.environ.get("OMP_NUM_THREADS")
               else max(1, len(os.sched_getaffinity(0)) // 4))
    for method, run in runs.items():
        done = summary(run)
        assert done["status"] == "ok", (method, done.get("error"))
        manifest = json.loads((run / "manifest.json").read_text())
        assert manifest["numerics"]["device"].startswith("cuda")
        assert manifest["numerics"]["device_name"]
        assert manifest["hardware"]["threads_per_rank"] == threads, method
        rows = pd.read_parquet(run / "iterations.parquet")
        assert (rows["t_local_compute"] > 0).all(), method


def test_powersgd_compresses_within_the_run(shared_gpu_runs):
    """From --start-powersgd-iter 2 on, PowerSGD's rank-2 factors are a small part of DDP's
    bytes; before it, its vanilla all-reduce sends as much."""
    runs = folders(shared_gpu_runs)
    sent = {m: pd.read_parquet(runs[m] / "iterations.parquet").groupby("iteration")[
        ["bytes_inter", "bytes_intra"]].sum().sum(axis=1) for m in ("ddp", "powersgd")}
    assert (sent["powersgd"].loc[2:] < 0.5 * sent["ddp"].loc[2:]).all(), sent
    assert (sent["powersgd"].loc[:1] >= 0.9 * sent["ddp"].loc[:1]).all(), sent


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
    proc = bench("export", str(prunex), "--repeats", "3", "-o", str(tmp_path / "small.pt"),
                 env=hidden)
    assert proc.returncode == 0, proc.stderr
    for name in ("model.pt", "masks.pt"):
        saved = torch.load(prunex / name, weights_only=True)  # no map_location needed
        assert saved is not None


def test_a_hook_span_ends_when_its_collective_completes():
    """A comm hook whose world-1 NCCL all-reduce waits for a ~50 ms GPU sleep queued on a side
    stream: the recorded span (CUDA events, the end recorded in the future's callback) holds
    the sleep, timed itself with events. The span's own stream never waits for the side
    stream, so an end marked at the launch would give about 0 (checked too: the probe can
    tell the two apart). NCCL is formed before (device_id, one untimed all-reduce), so its
    communicator's creation is not in the span."""
    import torch.distributed as dist

    from baselines.ddp import timed_hook
    from suite.cluster.comm import Communicator
    from suite.cluster.recorder import Recorder
    from suite.cluster.topology import lay_out

    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1,
                            device_id=device)
    try:
        dist.all_reduce(torch.ones(1024, device=device))  # untimed: NCCL formed and connected
        torch.cuda.synchronize(device)
        topology = lay_out(0, 1, 1, world_pg=dist.group.WORLD, new_group=dist.new_group,
                           emulated=False, hostnames=["here"])
        recorder = Recorder(0, device)
        comm = Communicator(topology, recorder, device)
        cycles = sleep_cycles(0.05, device)
        side = torch.cuda.Stream(device)
        slept = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        buffer = torch.ones(1024, device=device)

        def sleeping_allreduce(_state, bucket):
            side.wait_stream(torch.cuda.current_stream(device))  # the buffer is ready
            with torch.cuda.stream(side):  # NCCL waits for the stream it is launched from
                slept[0].record()
                torch.cuda._sleep(cycles)
                slept[1].record()
                return comm.all_reduce_async(bucket.buffer(), topology.world, phase="allreduce")

        class Bucket:
            def buffer(self):
                return buffer

        recorder.begin_iteration(0)
        before = recorder.mark()
        future = timed_hook(sleeping_allreduce, recorder, phase="compress")(None, Bucket())
        launched = recorder.mark()  # where an end marked at the launch would fall
        future.wait()
        row = recorder.end_iteration()
        torch.cuda.synchronize(device)
        sleep = slept[0].elapsed_time(slept[1]) / 1000
        at_launch = before.until(launched)
    finally:
        dist.destroy_process_group()
    assert sleep >= 0.02, sleep  # the sleep ran
    assert row["t_compress"] >= 0.9 * sleep, (row, sleep)  # launch to completion
    assert at_launch < 0.1 * sleep, (at_launch, sleep)  # an end at launch would fail above


def sleep_cycles(seconds: float, device: torch.device) -> int:
    """GPU clock cycles of ``torch.cuda._sleep`` that take about ``seconds`` (timed once)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    probe = 10_000_000
    start.record()
    torch.cuda._sleep(probe)
    end.record()
    torch.cuda.synchronize(device)
    return int(probe * seconds / (start.elapsed_time(end) / 1000))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs: a rank on the second")
def test_a_mark_taken_where_another_device_is_current_lands_on_the_ranks():
    """A comm hook's end mark is taken in its future's callback, on the thread that completed
    the collective (gloo's worker), whose current device may be GPU 0 for a rank of GPU 1:
    the mark still goes on the rank's device, where its begin is, so the span can be read."""
    from suite.cluster.recorder import Recorder

    device = torch.device("cuda", 1)
    recorder = Recorder(1, device)
    with torch.cuda.device(device):
        begin = recorder.mark()
    with torch.cuda.device(0):  # the callback thread's device
        end = recorder.mark()
    torch.cuda.synchronize(device)
    assert begin.until(end) >= 0
