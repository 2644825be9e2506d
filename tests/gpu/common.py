"""What both GPU parts share: the skip without CUDA, the methods, small CUDA runs and the
`bench` command with a GPU job's time limit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

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
           "--local-steps", "2", "--device", "cuda"]
SMALL = ["--workload", "cnn-fmnist", *ON_CUDA]
#: PowerSGD compresses from iteration 2 (torch's earliest with error feedback), so runs of 3-6
#: iterations hold compressed steps, not only its vanilla all-reduce warm-up (default 10)
COMPRESSING = ["--start-powersgd-iter", "2"]


def bench(*args: str, env: dict | None = None, timeout: float = 570) -> subprocess.CompletedProcess:
    return subprocess.run([*BENCH, *args], capture_output=True, text=True,
                          env=env or ENV, timeout=timeout)


def folders(root: Path) -> dict[str, Path]:
    """method -> its run folder under ``root``."""
    found = {}
    for path in root.rglob("summary.json"):
        found[json.loads(path.read_text())["method"]] = path.parent
    return found
