"""A PowerSGD run stopped after a checkpoint and resumed (issue 55): its error feedback and
warm-start Q come back keyed by the parameters each bucket holds (several buckets here), its
generator too, and the run ends with the model and losses of the run never stopped."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from tests.support.runs import BENCH, ENV, finish, start, summary

RUN = ["--method", "powersgd", "--dataset", "synthetic", "--synthetic-size", "512,128",
       "--gpus", "2", "--gpus-per-node", "1", "--batch-size", "16", "--iterations", "8",
       "--start-powersgd-iter", "2", "--bucket-cap-mb", "0.05", "--checkpoint-every", "2",
       "--eval-every", "1000"]


@pytest.mark.integration  # three runs, ~25 s: beside the fast suite's 15 minutes
def test_a_resumed_powersgd_run_equals_the_uninterrupted_one(tmp_path):
    import subprocess

    code, err = finish(start(tmp_path, "full", *RUN))
    assert code == 0, err
    stop = {**ENV, "PRUNEX_STOP_AFTER_ITERATION": "4"}  # every rank stops there, no race
    code, err = finish(start(tmp_path, "cut", *RUN, env=stop))
    assert code == 1 and summary(tmp_path / "cut")["status"] == "interrupted", err
    resumed = subprocess.run([*BENCH, "run", "--resume", str(tmp_path / "cut")],
                             capture_output=True, text=True, env=ENV, timeout=180)
    assert resumed.returncode == 0, resumed.stderr
    assert summary(tmp_path / "cut")["resumed_at_iteration"] == 4
    full, cut = (torch.load(tmp_path / name / "model.pt", weights_only=True)
                 for name in ("full", "cut"))
    assert all(torch.equal(full[k], cut[k]) for k in full)
    losses = [pd.read_parquet(tmp_path / name / "iterations.parquet")["loss"].tolist()
              for name in ("full", "cut")]
    assert losses[0] == losses[1]
