"""Does a run interrupted by SIGTERM and resumed from its checkpoint end where the
uninterrupted run ends? For every method: one uninterrupted run, one stopped by SIGTERM to
the launcher once a few iterations are on disk, then ``bench run --resume``; prints the
largest absolute difference of the final models and whether the per-iteration losses match.

    python -m benchmarks.resume_equality [--methods prunex,ddp,...]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch

ENV = {**os.environ, "PRUNEX_PROGRESS": "0", "PRUNEX_FLUSH_SECONDS": "0"}
RUN = ["--dataset", "synthetic", "--synthetic-size", "2048,256", "--batch-size", "16",
       "--checkpoint-every", "3"]  # fmt: skip
LAYOUT = ["--gpus", "4", "--gpus-per-node", "2"]
ITERATIONS = {"round": 10, "step": 24}  # round-based methods: 10 rounds of 4 local steps
ROUND_METHODS = ("prunex", "prunex-flat", "localsgd-hier")


def run(results: Path, run_id: str, method: str, stop_after: int | None = None) -> None:
    kind = "round" if method in ROUND_METHODS else "step"
    extra = ["--local-steps", "4"] if kind == "round" else []
    if method.startswith("prunex"):
        extra += ["--freeze-round", "6"]
    args = [sys.executable, "-m", "suite.cli", "run", "--method", method, *RUN, *LAYOUT, *extra,
            "--iterations", str(ITERATIONS[kind]), "--results-dir", str(results),
            "--run-id", run_id]  # fmt: skip
    proc = subprocess.Popen(args, env=ENV, stderr=subprocess.PIPE, text=True)
    if stop_after is not None:
        while iterations_on_disk(results / run_id) < stop_after and proc.poll() is None:
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate()
    if stop_after is None and proc.returncode:
        raise SystemExit(err)


def iterations_on_disk(folder: Path) -> int:
    files = list((folder / "parts").glob("iterations-rank00000-*.parquet"))
    return sum(len(pd.read_parquet(f, columns=["iteration"])) for f in files if f.exists())


def compare(method: str, root: Path) -> dict:
    run(root, f"{method}-full", method)
    run(root, f"{method}-cut", method, stop_after=4)
    cut = root / f"{method}-cut"
    stopped = json.loads((cut / "summary.json").read_text())
    proc = subprocess.run([sys.executable, "-m", "suite.cli", "run", "--resume", str(cut)],
                          env=ENV, capture_output=True, text=True)  # fmt: skip
    if proc.returncode:
        raise SystemExit(proc.stderr)
    full = torch.load(root / f"{method}-full" / "model.pt", map_location="cpu", weights_only=True)
    resumed = torch.load(cut / "model.pt", map_location="cpu", weights_only=True)
    diff = max((full[k].double() - resumed[k].double()).abs().max().item() for k in full)
    losses = [pd.read_parquet(root / r / "iterations.parquet").groupby("iteration")["loss"].mean()
              for r in (f"{method}-full", f"{method}-cut")]  # fmt: skip
    gap = (losses[0] - losses[1]).abs()
    summary = json.loads((cut / "summary.json").read_text())
    return {"method": method, "stopped_status": stopped["status"],
            "resumed_at": summary["resumed_at_iteration"], "max_abs_diff": diff,
            "bitwise": diff == 0.0, "losses_equal": bool((gap == 0).all()),
            "first_loss_difference_at": int(gap[gap > 0].index.min()) if (gap > 0).any() else None,
            "max_loss_difference": float(gap.max())}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default="prunex,prunex-flat,ddp,ddp-bf16,ddp-fp16,"
                        "powersgd,topk,topk-hier,localsgd-hier")  # fmt: skip
    parser.add_argument("--gpus", default="4")
    parser.add_argument("--gpus-per-node", default="2")
    args = parser.parse_args()
    LAYOUT[:] = ["--gpus", args.gpus, "--gpus-per-node", args.gpus_per_node]
    with tempfile.TemporaryDirectory() as root:
        for method in args.methods.split(","):
            print(json.dumps(compare(method, Path(root))), flush=True)


if __name__ == "__main__":
    main()
