"""Where local ranks run (CUDA devices, shared GPUs on gloo, CPU), and a run inside an
existing torchrun job."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from suite.cluster.ranks import gpu_sharing, own_device_or_refuse, rank_threads, ranks_sharing
from suite.errors import BenchError
from suite.results.machine import backend_for, ranks_per_gpu
from tests.support.runs import processes_with


def test_more_ranks_than_gpus_share_them_on_gloo():
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert [ranks_per_gpu(n, 1) for n in (1, 2, 4)] == [1, 2, 4]
    assert ranks_per_gpu(4, 8) == 1 and ranks_per_gpu(5, 2) == 3
    assert backend_for(cuda, ranks_per_gpu(4, 4)) == "nccl"  # a GPU per rank
    assert backend_for(cuda, ranks_per_gpu(4, 1)) == "gloo"  # NCCL refuses two on one GPU
    assert backend_for(cpu, 1) == "gloo"
    assert gpu_sharing(cpu, "gloo") is None  # nothing to say on CPU ranks


def test_cuda_ranks_share_the_cores_cpu_ranks_take_one(monkeypatch):
    """4 CUDA ranks on 16 cores get 4 threads each (left to torch, each would take all 16);
    CPU ranks one; OMP_NUM_THREADS, where set, wins for both."""
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert rank_threads(cuda, cores=16) == 4 and rank_threads(cuda, cores=2) == 1
    assert rank_threads(cuda) == max(1, len(os.sched_getaffinity(0)) // 4)
    assert rank_threads(cpu, cores=16) == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert rank_threads(cuda, cores=16) == 3 and rank_threads(cpu) == 3


def cluster_ranks(devices: list[str], monkeypatch) -> list[str | None]:
    """Each "rank" (a thread with its own client of one real TCPStore) checks that it owns
    its device, as 8 srun tasks of one host would: LOCAL_WORLD_SIZE 8, one device visible to
    each. Returns each rank's refusal, or None."""
    import threading
    from datetime import timedelta

    import torch.distributed as dist

    world = len(devices)
    master = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=30))
    outcome: list[str | None] = [None] * world
    monkeypatch.setenv("WORLD_SIZE", str(world))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(world))

    def rank_thread(rank: int) -> None:
        client = dist.TCPStore("127.0.0.1", master.port, world, is_master=False,
                               timeout=timedelta(seconds=30))
        try:
            own_device_or_refuse(client, "node1", devices[rank], rank=rank)
        except BenchError as exc:
            outcome[rank] = str(exc)

    threads = [threading.Thread(target=rank_thread, args=(r,)) for r in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return outcome


def test_ranks_that_each_own_a_gpu_run_however_many_they_see(monkeypatch):
    """srun --ntasks-per-node=8 --gpus-per-task=1: 8 local ranks, one visible GPU each, all
    different: decided by UUID only, none is refused (the old count rule refused all)."""
    devices = [f"GPU-{i:08x}-uuid" for i in range(8)]
    assert cluster_ranks(devices, monkeypatch) == [None] * 8


def test_two_ranks_on_one_gpu_are_refused_by_uuid(monkeypatch):
    devices = ["GPU-a", "GPU-b", "GPU-a", "GPU-c"]
    outcome = cluster_ranks(devices, monkeypatch)
    assert outcome[1] is None and outcome[3] is None
    for rank in (0, 2):
        assert outcome[rank].startswith("ranks 0, 2 share GPU GPU-a on node1"), outcome[rank]
    assert ranks_sharing({0: "h a", 1: "h b", 2: "h a"}, 2) == [0, 2]
    assert ranks_sharing({0: "h1 a", 1: "h2 a"}, 0) == [0]  # one UUID on two hosts: two GPUs


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


@pytest.mark.integration  # a real run of a minute: nox -s integration
def test_ranks_start_from_the_fork_server_and_nothing_outlives_the_run(tmp_path):
    """When ``bench run`` returns, neither its ranks nor the fork server they were forked
    from are left (the server used to outlive it by its second of teardown); a temporary
    folder too long for the server's socket falls back to spawn."""
    from tests.support.runs import BENCH, ENV, TINY

    marker = f"PRUNEX_TEST_MARK={os.getpid()}-{tmp_path.name}"
    env = {**ENV, marker.split("=")[0]: marker.split("=")[1]}
    proc = subprocess.run([*BENCH, "run", *TINY, "--gpus", "2", "--gpus-per-node", "1",
                           "--iterations", "2", "--results-dir", str(tmp_path / "r")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert processes_with(marker) == []
    long_tmp = tmp_path / ("t" * (110 - len(str(tmp_path))))
    long_tmp.mkdir()
    code = ("import tempfile, sys; tempfile.tempdir = sys.argv[1]; "
            "from suite.cluster.ranks import rank_start_method as m; print(m())")
    methods = [subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True,
                              text=True, env=ENV).stdout.strip() for folder in ("/tmp", long_tmp)]
    assert methods == ["forkserver", "spawn"]
