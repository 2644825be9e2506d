"""`bench calibrate --launcher torchrun|slurm`: the flags a job's ranks are given, and the
refusals that come before any rank (the SLURM run itself: tests/launchers/test_multihost.py)."""

from __future__ import annotations

from suite.config import flag_of
from suite.sim.calibrate import job_arguments, rank_error
from tests.support.runs import bench_here, one_line


def test_a_jobs_ranks_get_the_flags_that_measure_and_none_that_launch():
    flags = {"workload": "cnn-fmnist", "gpus": 6, "gpus_per_node": 2, "sizes": [4096, 65536],
             "compute_only": False, "description": None, "launcher": "slurm",
             "output": "p.json", "gpus_given": True, "slurm_cpus_per_task": 2, "steps": 3}
    args = job_arguments(flags)
    assert args == ["--workload", "cnn-fmnist", "--gpus", "6", "--gpus-per-node", "2",
                    "--sizes", "4096,65536", "--steps", "3"]
    assert all(flag_of(name) not in args for name in ("launcher", "output", "compute_only"))


def test_torchrun_outside_a_job_is_one_line(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_JOB_ID"):
        monkeypatch.delenv(name, raising=False)
    result = bench_here("calibrate", "--launcher", "torchrun", "--gpus", "2")
    assert "--launcher torchrun calibrates inside a job" in one_line(result)


def test_emulated_links_are_calibrated_locally():
    result = bench_here("calibrate", "--launcher", "slurm", "--network", "emulated",
                        "--inter-bw", "1gbit")
    assert "--network emulated calibrates with --launcher local" in one_line(result)


def test_a_failed_jobs_message_carries_its_ranks_error(tmp_path):
    """The job's log holds torch's warnings and the failing rank's one-line error; the
    user reads that error in the submitting command's message."""
    log = tmp_path / "hosts-calibrate-7.out"
    log.write_text("[W1129 socket.cpp:207] [c10d] The hostname cannot be retrieved.\n"
                   "Error: all-reduce times over 6 ranks do not grow with size\n"
                   "srun: error: pxh1: task 0: Exited with exit code 2\n")
    assert rank_error(log) == ": Error: all-reduce times over 6 ranks do not grow with size"
    assert rank_error(tmp_path / "missing.out") == ""
