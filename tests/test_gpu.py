"""The checks of a GPU machine (``nox -s gpu``): every method on CUDA, NCCL where it can run,
event-timed phases that see the communication, Top-K replicas that stay equal, checkpoints
that resume on CUDA, and a GPU run's folder read where there is no GPU.

Skipped without CUDA (every ordinary test session hides it: see tests/conftest.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from tests.distributed import run_ranks
from tests.helpers import cnn_fmnist_model, make_context, run_iterations
from tests.test_reliability import finish, start, summary, wait_until

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA device (run with nox -s gpu)"
    ),
]

BENCH = [sys.executable, "-m", "suite.cli"]
ENV = {**os.environ, "PRUNEX_PROGRESS": "0", "PRUNEX_FLUSH_SECONDS": "0"}
ALL_METHODS = (
    "prunex,prunex-flat,ddp,ddp-bf16,ddp-fp16,powersgd,topk,topk-hier,localsgd-hier,"
    "gmp-hier,prune-retrain"
)
#: small CUDA runs on synthetic data; SMALL adds the workload (cnn-fmnist)
ON_CUDA = ["--dataset", "synthetic", "--synthetic-size", "2048,512", "--batch-size", "32",
           "--local-steps", "2", "--device", "cuda"]  # fmt: skip
SMALL = ["--workload", "cnn-fmnist", *ON_CUDA]


def bench(*args: str, env: dict | None = None, timeout: float = 570) -> subprocess.CompletedProcess:
    return subprocess.run([*BENCH, *args], capture_output=True, text=True,
                          env=env or ENV, timeout=timeout)  # fmt: skip


def folders(root: Path) -> dict[str, Path]:
    """method -> its run folder under ``root``."""
    found = {}
    for path in root.rglob("summary.json"):
        found[json.loads(path.read_text())["method"]] = path.parent
    return found


@pytest.fixture(scope="module")
def shared_gpu_runs(tmp_path_factory) -> Path:
    """Every method, 2 nodes x 2 ranks placed round-robin on the visible GPUs (gloo where
    ranks share one)."""
    root = tmp_path_factory.mktemp("cuda")
    proc = bench("sweep", "--method", ALL_METHODS, *SMALL, "--gpus", "4", "--gpus-per-node",
                 "2", "--iterations", "4", "--results-dir", str(root))  # fmt: skip
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


def test_one_nccl_rank_runs_every_method(tmp_path):
    """One rank on NCCL: every collective and comm hook goes through NCCL's path (futures
    that complete at enqueue, event-timed spans)."""
    proc = bench("sweep", "--method", ALL_METHODS, *SMALL, "--gpus", "1", "--iterations", "3",
                 "--results-dir", str(tmp_path))  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for method, run in folders(tmp_path).items():
        manifest = json.loads((run / "manifest.json").read_text())
        assert set(manifest["group_backends"].values()) == {"nccl"}, method
        assert summary(run)["status"] == "ok", method
    ddp = pd.read_parquet(folders(tmp_path)["ddp"] / "iterations.parquet")
    assert (ddp["t_allreduce"] > 0).all()  # the hook's span, read from its CUDA events


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL between ranks needs 2 GPUs")
def test_ddp_allreduce_time_matches_its_bytes_over_nccl(tmp_path):
    """Timed to the collective's completion, not its enqueue: DDP's all-reduce seconds are at
    least half of what its bytes take at the bandwidth ``bench calibrate`` measures."""
    profile = tmp_path / "profile.json"
    proc = bench("calibrate", "--device", "cuda", "--gpus", "2", "--gpus-per-node", "1",
                 "--steps", "3", "--sync-blocks", "1", "--block-repeats", "2",
                 "-o", str(profile))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    link = json.loads(profile.read_text())["links"]["inter"]
    proc = bench("run", "--method", "ddp", "--workload", "resnet18-cifar10", *ON_CUDA, "--gpus",
                 "2", "--gpus-per-node", "1", "--iterations", "10", "--results-dir",
                 str(tmp_path / "runs"))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rows = pd.read_parquet(next(iter(folders(tmp_path / "runs").values())) / "iterations.parquet")
    rows = rows[rows["iteration"] > 0]
    sent = rows["bytes_inter"] + rows["bytes_intra"]  # per rank, per iteration
    predicted = sent / link["bandwidth_Bps"]
    assert (rows["t_allreduce"] >= 0.5 * predicted).all()


def topk_worker(rank):
    from baselines.topk import TopK

    ctx = make_context(rank, gpus_per_node=2, method="topk", options={"topk_ratio": 0.05},
                       model_fn=cnn_fmnist_model, device=torch.device("cuda", 0))  # fmt: skip
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


def test_checkpoint_and_resume_on_cuda(tmp_path):
    args = ["--method", "prunex", *SMALL, "--gpus", "2", "--gpus-per-node", "1",
            "--checkpoint-every", "2", "--freeze-round", "4"]  # fmt: skip
    code, err = finish(start(tmp_path, "full", *args, "--iterations", "8"), timeout=300)
    assert code == 0, err
    proc = start(tmp_path, "cut", *args, "--iterations", "8")
    wait_until(tmp_path / "cut", 3, proc, timeout=240)
    proc.terminate()
    code, err = finish(proc, timeout=300)
    assert code == 1 and summary(tmp_path / "cut")["status"] == "interrupted", err
    proc = bench("run", "--resume", str(tmp_path / "cut"))
    assert proc.returncode == 0, proc.stderr
    done = summary(tmp_path / "cut")
    assert done["status"] == "ok" and done["resumed_at_iteration"] >= 2
    full = torch.load(tmp_path / "full" / "model.pt", map_location="cpu", weights_only=True)
    cut = torch.load(tmp_path / "cut" / "model.pt", map_location="cpu", weights_only=True)
    for key in full:  # cuDNN may pick other kernels: equal up to their rounding
        assert torch.allclose(full[key].float(), cut[key].float(), rtol=1e-3, atol=1e-4), key


def test_a_gpu_run_is_read_without_cuda(shared_gpu_runs, tmp_path):
    """Reports and exports of a GPU run's folder on a machine without a GPU."""
    hidden = {**ENV, "CUDA_VISIBLE_DEVICES": ""}
    proc = bench("report", str(shared_gpu_runs), "-o", str(tmp_path / "report"), env=hidden)
    assert proc.returncode == 0, proc.stderr
    prunex = folders(shared_gpu_runs)["prunex"]
    proc = bench("export", str(prunex), "--repeats", "1", "-o", str(tmp_path / "small.pt"),
                 env=hidden)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    for name in ("model.pt", "masks.pt"):
        saved = torch.load(prunex / name, weights_only=True)  # no map_location needed
        assert saved is not None
