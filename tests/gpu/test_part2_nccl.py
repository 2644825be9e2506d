"""GPU part 2 (``nox -s gpu -- --part 2``, estimated 5-7 minutes on one H100): every
method on one NCCL rank (every collective and comm hook through NCCL's path), checkpoint and
resume on CUDA (the run stops after iteration 3 by fault injection, not a race), and, with 4
GPUs, DDP's all-reduce seconds against its bytes at the bandwidth ``bench calibrate`` measures
on 2 nodes x 2.

Skipped without CUDA (every ordinary test session hides it: see tests/conftest.py)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from tests.gpu.common import (
    ALL_METHODS,
    COMPRESSING,
    ENV,
    ON_CUDA,
    SMALL,
    bench,
    folders,
    pytestmark,  # noqa: F401 (the skip without CUDA)
)
from tests.support.runs import finish, start, summary


def test_one_nccl_rank_runs_every_method(tmp_path):
    """One rank on NCCL: every collective and comm hook goes through NCCL's path (futures
    that complete at enqueue, event-timed spans)."""
    proc = bench("sweep", "--method", ALL_METHODS, *SMALL, *COMPRESSING, "--gpus", "1",
                 "--iterations", "3", "--results-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for method, run in folders(tmp_path).items():
        manifest = json.loads((run / "manifest.json").read_text())
        assert set(manifest["group_backends"].values()) == {"nccl"}, method
        assert summary(run)["status"] == "ok", method
    # one rank sends nothing (NCCL's all-reduce of a world of 1 is a no-op, so its span says
    # nothing of completion: part 1's hook-span probe checks that); the spans are resolved
    # from their CUDA events and lie within their iteration
    ddp = pd.read_parquet(folders(tmp_path)["ddp"] / "iterations.parquet")
    assert (ddp["bytes_inter"] + ddp["bytes_intra"] == 0).all()
    assert ddp["t_allreduce"].between(0, ddp["t_iteration"]).all(), ddp


@pytest.mark.skipif(torch.cuda.device_count() < 4, reason="2 nodes x 2 on NCCL need 4 GPUs")
def test_ddp_allreduce_time_matches_its_bytes_over_nccl(tmp_path):
    """Timed to the collective's completion, not its enqueue: DDP's all-reduce seconds are at
    least half of what its bytes take at the bandwidth ``bench calibrate`` measures."""
    profile = tmp_path / "profile.json"
    proc = bench("calibrate", "--device", "cuda", "--gpus", "4", "--gpus-per-node", "2",
                 "--steps", "3", "--sync-blocks", "1", "--block-repeats", "2",
                 "-o", str(profile))
    assert proc.returncode == 0, proc.stderr
    link = json.loads(profile.read_text())["links"]["inter"]
    proc = bench("run", "--method", "ddp", "--workload", "resnet18-cifar10", *ON_CUDA, "--gpus",
                 "4", "--gpus-per-node", "2", "--iterations", "10", "--results-dir",
                 str(tmp_path / "runs"))
    assert proc.returncode == 0, proc.stderr
    rows = pd.read_parquet(next(iter(folders(tmp_path / "runs").values())) / "iterations.parquet")
    rows = rows[rows["iteration"] > 0]
    sent = rows["bytes_inter"] + rows["bytes_intra"]  # per rank, per iteration
    predicted = sent / link["bandwidth_Bps"]
    assert (rows["t_allreduce"] >= 0.5 * predicted).all()


def test_checkpoint_and_resume_on_cuda(tmp_path):
    """A run stopped after iteration 3 (by fault injection, not a race) and resumed ends
    bitwise where an uninterrupted one does, the masks frozen after round 4 so the duals, rho
    and the masks' agreement cross the cut. First two uninterrupted twins must agree bit for
    bit (``--deterministic``, strict: an op without a deterministic kernel ends the run
    instead of warning); where they do not, the keys they differ at and the ops that warned
    are the failure, not the resume."""
    # --fixed-rho: adaptive rho follows residuals that rounding moves, so masks could swap
    # between the runs (the CPU twin in tests/run needs it too)
    args = ["--method", "prunex", *SMALL, "--gpus", "2", "--gpus-per-node", "1",
            "--checkpoint-every", "2", "--freeze-round", "4", "--freeze-share", "1",
            "--freeze-patience", "100",
            "--fixed-rho", "--deterministic"]
    strict = {**ENV, "PRUNEX_STRICT_DETERMINISM": "1"}
    for name in ("full", "twin"):
        code, err = finish(start(tmp_path, name, *args, "--iterations", "8", env=strict),
                           timeout=300)
        assert code == 0, err
    models = {name: torch.load(tmp_path / name / "model.pt", map_location="cpu",
                               weights_only=True) for name in ("full", "twin")}
    apart = {key: (a - models["twin"][key]).abs().max().item()
             for key, a in models["full"].items()
             if not torch.equal(a, models["twin"][key])}
    warned = summary(tmp_path / "full").get("nondeterministic_ops")
    assert not apart, f"two uninterrupted runs differ (ops that warned: {warned}): {apart}"
    stop = {**strict, "PRUNEX_STOP_AFTER_ITERATION": "3"}  # every rank stops there, no race
    code, err = finish(start(tmp_path, "cut", *args, "--iterations", "8", env=stop), timeout=300)
    assert code == 1 and summary(tmp_path / "cut")["status"] == "interrupted", err
    proc = bench("run", "--resume", str(tmp_path / "cut"), env=strict)
    assert proc.returncode == 0, proc.stderr
    done = summary(tmp_path / "cut")
    assert done["status"] == "ok" and done["resumed_at_iteration"] == 3
    assert done["masks_frozen_at"]["round"] > 3  # the freeze came after the cut
    resumed = torch.load(tmp_path / "cut" / "model.pt", map_location="cpu", weights_only=True)
    for key, full in models["full"].items():
        assert torch.equal(full, resumed[key]), key
    losses = [pd.read_parquet(tmp_path / name / "iterations.parquet")["loss"].tolist()
              for name in ("full", "cut")]
    assert losses[0] == losses[1]
