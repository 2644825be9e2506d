"""Where local ranks run (CUDA devices, shared GPUs on gloo, CPU), and a run inside an
existing torchrun job."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from suite.cluster.ranks import backend_for, gpu_sharing, ranks_per_gpu


def test_more_ranks_than_gpus_share_them_on_gloo():
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert [ranks_per_gpu(n, 1) for n in (1, 2, 4)] == [1, 2, 4]
    assert ranks_per_gpu(4, 8) == 1 and ranks_per_gpu(5, 2) == 3
    assert backend_for(cuda, 4, 4) == "nccl"  # a GPU per rank
    assert backend_for(cuda, 4, 1) == "gloo"  # NCCL refuses two ranks on one GPU
    assert backend_for(cpu, 4, 0) == "gloo"
    assert gpu_sharing(cpu, "gloo") is None  # nothing to say on CPU ranks


def test_cuda_without_a_gpu_is_one_line(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    proc = subprocess.run(
        [sys.executable, "-m", "suite.cli", "run", "--device", "cuda", "--gpus", "2",
         "--results-dir", str(tmp_path), "--dataset", "synthetic", "--iterations", "1"],
        capture_output=True, text=True,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].endswith("no CUDA device is visible")


def test_torchrun_launcher_uses_the_job_as_it_is(tmp_path):
    """Under torchrun the ranks exist already: bench run joins them and discovers one host."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "suite.cli",
        "run",
        "--launcher",
        "torchrun",
        "--method",
        "ddp",
        "--dataset",
        "synthetic",
        "--iterations",
        "2",
        "--batch-size",
        "16",
        "--results-dir",
        str(tmp_path),
        "--run-id",
        "tr",
    ]
    env = {**os.environ, "PRUNEX_PROGRESS": "0", "OMP_NUM_THREADS": "1"}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, textwrap.shorten(out.stderr, 2000)
    summary = json.loads((tmp_path / "tr" / "summary.json").read_text())
    assert summary["status"] == "ok"
    assert (summary["gpus"], summary["nodes"], summary["gpus_per_node"]) == (2, 1, 2)
