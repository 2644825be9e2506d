"""``--launcher slurm``: every setting reaches the ranks (the run's plan travels whole, as
JSON: its configuration and its facts), the job asks for what the ranks use, ``--dry-run``
works where SLURM is not installed, and real jobs on a real one-node SLURM
(``.ci/slurm-up``: Debian's slurm-wlm and munge on localhost) end ``ok``, and checkpoint,
requeue and resume to the same model when SLURM signals them mid-way."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from suite.config import RunConfig
from suite.launchers.slurm import SlurmRequest, submission
from suite.plugins.registry import METHODS
from suite.run.plan import plan_run
from tests.support.runs import process_environment, wait_for_checkpoint

REPO = Path(__file__).resolve().parents[2]
BENCH = [sys.executable, "-m", "suite.cli"]

#: a value other than the default for every RunConfig field (a new field fails the test
#: below until it is given one here, and so until it is known to reach the ranks)
NON_DEFAULT = {
    "method": "gmp-hier",
    "workload": "resnet18-fmnist",
    "dataset": "synthetic",
    "data_dir": "/data/fmnist",
    "download": True,
    "gpus": 8,
    "gpus_per_node": 4,
    "device": "cpu",
    "iterations": 123,
    "epochs": 2.5,
    "eval_every": 7,
    "bn_recalibrate": 4,
    "target_accuracy": 0.83,
    "tensorboard": True,
    "deterministic": True,
    "seed": 3,
    "results_dir": "/results",
    "run_id": "r-1",
    "tag": "night",
    "batch_size": 96,
    "lr": 0.03,
    "momentum": 0.8,
    "weight_decay": 1e-4,
    "lr_schedule": "step",
    "warmup_epochs": 0.3,
    "synthetic_size": (512, 128),
    "image_size": 40,
    "network": "emulated",
    "inter_bw": "1gbit",
    "checkpoint_every": 11,
    "checkpoint_minutes": 9.5,
    "max_restarts": 2,
    "collective_timeout": 45.0,
    "resume": True,
    "overwrite": True,
}


def other_value(opt):
    """A valid value of a method option that is not its default."""
    if opt.kind is bool:
        return not opt.default
    if opt.choices:
        return next(c for c in opt.choices if c != opt.default)
    if opt.existing_path:
        return str(REPO)
    if opt.kind is int:
        return (opt.default or 1) + 1
    if opt.kind is float:
        return round((opt.default or 0.4) * 0.5, 6)
    return "x"


def test_every_field_and_option_reaches_the_ranks_whole(tmp_path):
    fields = {f.name for f in dataclasses.fields(RunConfig)} - {"launcher", "options"}
    assert fields == set(NON_DEFAULT), "give the new RunConfig field a value in NON_DEFAULT"
    for name, value in NON_DEFAULT.items():
        assert value != getattr(RunConfig(), name), name
    checked = 0
    planned = plan_run(RunConfig(dataset="synthetic", gpus=8, gpus_per_node=4, run_id="r-1"))
    for method in METHODS.names():
        options = {o.name: other_value(o) for o in METHODS.get(method).options}
        config = RunConfig(**{**NON_DEFAULT, "method": method, "results_dir": str(tmp_path)},
                           options=options)
        # the JSON carries the configuration as it is (a plan resolved from it would refuse
        # some of these values together; that is not what this test is about)
        plan = dataclasses.replace(planned, config=config)
        _, agent = submission(plan, SlurmRequest(), preview=True)
        back = RunConfig.from_json(json.dumps(json.loads(agent.plan_json)["config"]))
        assert back == config, method
        checked += len(options)
    assert checked > 30


def test_the_issue_dry_run_carries_all_four_flags(tmp_path):
    proc = subprocess.run(
        [*BENCH, "run", "--launcher", "slurm", "--dry-run", "--gpus", "8", "--gpus-per-node",
         "4", "--lr-schedule", "step", "--warmup-epochs", "0.3", "--bn-recalibrate", "4",
         "--tensorboard", "--results-dir", str(tmp_path), "--run-id", "r8"],
        capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stderr
    line = next(text for text in proc.stdout.splitlines() if text.startswith("#   {"))
    ranks = json.loads(line[4:])["config"]  # the configuration every rank receives
    assert (ranks["lr_schedule"], ranks["warmup_epochs"], ranks["bn_recalibrate"]) == (
        "step",
        0.3,
        4,
    )
    assert ranks["tensorboard"] is True and ranks["device"] == "cuda"
    script = proc.stdout
    assert "#SBATCH --nodes=2" in script and "#SBATCH --ntasks-per-node=1" in script
    assert "#SBATCH --gpus-per-node=4" in script and "#SBATCH --cpus-per-task=32" in script
    assert "srun " in script and "--cpus-per-task=32" in script.split("srun ")[1]
    assert "#SBATCH --signal=TERM@180" in script and "#SBATCH --requeue" in script
    assert "160 s to checkpoint" in script  # the agents' shutdown timeout: the lead less 20 s


def test_cpu_partitions_get_no_gpu_request(tmp_path):
    proc = subprocess.run(
        [*BENCH, "run", "--launcher", "slurm", "--dry-run", "--device", "cpu", "--gpus", "4",
         "--gpus-per-node", "2", "--slurm-cpus-per-task", "6", "--slurm-signal-lead", "90",
         "--slurm-partition", "cpu", "--results-dir", str(tmp_path)],
        capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert "gpus" not in proc.stdout.split("# command")[0].replace("prunex-4g", "")
    assert "#SBATCH --partition=cpu" in proc.stdout and "--cpus-per-task=6" in proc.stdout
    assert "(3 threads each)" in proc.stdout and "#SBATCH --signal=TERM@90" in proc.stdout


@pytest.mark.integration  # a real run of a minute: nox -s integration
def test_slurm_without_sbatch_is_one_line_and_dry_run_still_prints_the_job(tmp_path):
    env = {**os.environ, "PATH": str(tmp_path)}  # neither sbatch nor srun
    args = [*BENCH, "run", "--launcher", "slurm", "--gpus", "8", "--gpus-per-node", "4",
            "--results-dir", str(tmp_path)]
    proc = subprocess.run(args, capture_output=True, text=True, env=env)
    assert proc.returncode == 2 and "sbatch not found on PATH" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    proc = subprocess.run([*args, "--dry-run"], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("#!/bin/bash") and "#SBATCH --nodes=2" in proc.stdout
    assert "suite.run.entry.rank_main(PLAN)" in proc.stdout and '"gpus": 8' in proc.stdout


def test_local_run_in_a_multi_node_allocation_is_refused(tmp_path):
    env = {**os.environ, "SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "2", "SLURM_PROCID": "0"}
    proc = subprocess.run([*BENCH, "run", "--gpus", "2", "--results-dir", str(tmp_path)],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "Error: inside a SLURM allocation of 2 nodes but not in a job step: run it under srun "
        "(one task per GPU) or torchrun, or submit it with --launcher slurm; --launcher local "
        "uses this node only"
    ]


def test_slurm_job_for_64_gpus_at_4_per_node(tmp_path):
    proc = subprocess.run(
        [*BENCH, "run", "--launcher", "slurm", "--dry-run", "--gpus", "64", "--gpus-per-node",
         "4", "--method", "prunex", "--workload", "resnet152-cifar10", "--channel-keep", "0.3",
         "--results-dir", str(tmp_path), "--run-id", "r64", "--checkpoint-minutes", "20",
         "--max-restarts", "2"],
        capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stderr
    script = proc.stdout
    assert "#SBATCH --nodes=16" in script and "#SBATCH --ntasks-per-node=1" in script
    assert "#SBATCH --gpus-per-node=4" in script and "torch elastic agent for 4 ranks" in script
    line = next(text for text in script.splitlines() if text.startswith("#   {"))
    plan = json.loads(line[4:])  # the plan every rank receives, whole
    ranks = plan["config"]
    assert plan["facts"]["run_id"] == "r64" and plan["facts"]["layout"]["nodes"] == 16
    assert (ranks["gpus"], ranks["gpus_per_node"], ranks["device"]) == (64, 4, "cuda")
    assert ranks["options"] == {"channel_keep": 0.3} and ranks["results_dir"] == str(tmp_path)
    assert ranks["checkpoint_minutes"] == 20.0 and ranks["max_restarts"] == 2
    # preempted or out of time: SIGTERM first, then requeue, and the next start resumes
    assert "#SBATCH --requeue" in script and "#SBATCH --signal=TERM@180" in script
    assert f"-m submitit.core._submit {tmp_path}/r64/slurm-job" in script
    body = script.split("# each of")[0]
    path = tmp_path / "job.sbatch"
    path.write_text(body)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0


# -- a real SLURM -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def slurm():
    """The one-node SLURM of .ci/slurm-up (started here if it is not running)."""
    if os.geteuid() != 0:
        pytest.skip("a local SLURM needs root (slurmd runs jobs as their user)")
    if shutil.which("apt-get") is None and shutil.which("slurmctld") is None:
        pytest.skip("slurm-wlm is not installed and apt-get is not there to install it")
    proc = subprocess.run([str(REPO / ".ci" / "slurm-up")], capture_output=True, text=True)
    if proc.returncode:
        pytest.skip(f"SLURM could not be started: {proc.stderr.strip()[-300:]}")


def submit(tmp_path: Path, run_id: str, *extra: str) -> str:
    proc = subprocess.run(
        [*BENCH, "run", "--launcher", "slurm", "--device", "cpu", "--method", "ddp", "--gpus",
         "2", "--gpus-per-node", "2", "--iterations", "60", "--eval-every", "1000", "--seed",
         "1", "--results-dir", str(tmp_path), "--run-id", run_id, "--slurm-time", "10",
         "--slurm-cpus-per-task", "1", *extra],
        capture_output=True, text=True, cwd=REPO, env={**os.environ, "PRUNEX_PROGRESS": "0"},
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split("Submitted batch job ")[1].split(";")[0]


def job_state(job: str) -> tuple[str, str]:
    out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T %r"], capture_output=True,
                         text=True).stdout.split()
    return (out[0], out[1]) if len(out) == 2 else ("GONE", "")


def wait_until_gone(job: str, timeout: float) -> None:
    """Wait for the job to leave the queue; a requeued job held back by SLURM's BeginTime
    delay (about two minutes) is started at once, as an operator would."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        state, reason = job_state(job)
        if state == "GONE":
            return
        if state == "PENDING" and reason == "BeginTime":
            subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"])
        time.sleep(1)
    subprocess.run(["scancel", job])
    pytest.fail(f"job {job} still in the queue after {timeout:g} s")


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def job_of(pid: str) -> str | None:
    """The SLURM job a process belongs to (other tests' ranks may run beside these jobs)."""
    return (process_environment(pid) or {}).get("SLURM_JOB_ID")


@pytest.mark.integration  # a real run of a minute: nox -s integration
def test_real_slurm_runs_end_ok_and_a_signalled_run_requeues_to_the_same_model(slurm, tmp_path):
    plain = submit(tmp_path, "plain")
    signalled = submit(tmp_path, "signalled", "--checkpoint-every", "10")
    wait_for_checkpoint(tmp_path / "signalled")
    subprocess.run(["scancel", "--signal=TERM", signalled], check=True)
    wait_until_gone(plain, 300)
    wait_until_gone(signalled, 400)

    done = summary(tmp_path / "plain")
    assert done["status"] == "ok", done.get("error")
    resumed = summary(tmp_path / "signalled")
    assert resumed["status"] == "ok", resumed.get("error")
    assert 10 <= resumed["resumed_at_iteration"] < 60
    log = "".join(p.read_text() for p in (tmp_path / "signalled" / "slurm-job").glob("*.out"))
    assert "requeued, its next start resumes" in log
    # no process of either job outlives it: node agents (submitit) and their ranks
    # (ranks forked by the fork server carry its command line)
    pattern = "submitit.core._submit|multiprocessing.(spawn|forkserver)"
    left = [pid for pid in subprocess.run(["pgrep", "-f", pattern], capture_output=True,
                                          text=True).stdout.split()
            if job_of(pid) in (plain, signalled)]
    if left:
        listing = subprocess.run(["ps", "-o", "pid,ppid,etime,stat,cmd", "-p", ",".join(left)],
                                 capture_output=True, text=True).stdout
        pytest.fail(f"processes left behind:\n{listing}")
    a = torch.load(tmp_path / "plain" / "model.pt", map_location="cpu", weights_only=True)
    b = torch.load(tmp_path / "signalled" / "model.pt", map_location="cpu", weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# -- data prepared once ----------------------------------------------------------------------
FMNIST = Path("/usr/share/datasets/fashion-mnist")


def download_worker(rank, network: str, data_dir: str, seconds: float = 1.0,
                    backend_seconds: float | None = None):
    """``--download`` with a local folder standing in for the network: rank 0's download
    copies the files from it (slowly: ``seconds``), the others must wait and then read what
    it wrote. ``backend_seconds``: the process group's own timeout, for the wait to outlast."""
    from datetime import timedelta

    from suite.compat import set_timeout
    from suite.data.datasets import load_data
    from suite.errors import BenchError
    from suite.run.setup import load_data_once

    if backend_seconds is not None:
        set_timeout(timedelta(seconds=backend_seconds))
    calls = []

    def load(download: bool):
        calls.append(download)
        if download:
            if not Path(network).is_dir():
                raise BenchError(f"download from {network} failed: unreachable")
            time.sleep(seconds)  # a slow network: the others would find nothing if they ran now
            shutil.copytree(network, data_dir, dirs_exist_ok=True)
        return load_data("fmnist", data_dir=data_dir)

    try:
        train, _, _ = load_data_once(load, download=True)
    except BenchError as exc:
        return {"calls": calls, "error": str(exc)}
    return {"calls": calls, "samples": len(train)}


@pytest.mark.skipif(not FMNIST.is_dir(), reason="needs Debian's dataset-fashion-mnist")
def test_download_happens_once_on_rank_0_and_each_rank_decodes_once(tmp_path):
    from tests.support.distributed import run_ranks

    out = run_ranks(download_worker, 3, str(FMNIST), str(tmp_path / "data"))
    assert out[0]["calls"] == [True] and all(o["calls"] == [False] for o in out[1:])
    assert all(o.get("samples") == 60000 for o in out), out
    failed = run_ranks(download_worker, 3, str(tmp_path / "offline"), str(tmp_path / "d2"))
    assert all(o["error"] == f"download from {tmp_path / 'offline'} failed: unreachable"
               for o in failed)
    assert [o["calls"] for o in failed] == [[True], [], []]


@pytest.mark.skipif(not FMNIST.is_dir(), reason="needs Debian's dataset-fashion-mnist")
def test_the_download_wait_outlasts_the_backend_timeout(tmp_path):
    """The others wait on the job's store with the download's own limit: a download longer
    than the process group's timeout (2 s here; --collective-timeout's 375 s in a run) is no
    collective timeout."""
    from tests.support.distributed import run_ranks

    out = run_ranks(download_worker, 2, str(FMNIST), str(tmp_path / "data"), 5.0, 2.0)
    assert all(o.get("samples") == 60000 for o in out), out
