"""Does a run interrupted by SIGTERM and resumed from its checkpoint end where the
uninterrupted run ends? For every method: one uninterrupted run, one stopped by SIGTERM to
the launcher once a few iterations are on disk, then ``bench run --resume``; prints the
largest absolute difference of the final models and whether the per-iteration losses match.

    python -m benchmarks.resume_equality [--methods prunex,ddp,...]
    python benchmarks/resume_equality.py --smoke    # prunex, 2 ranks, 4 short rounds

``--smoke`` stops the cut run by ``PRUNEX_STOP_AFTER_ITERATION`` (``--stop env``) instead of a
signal, which would race a run of a few milliseconds per iteration.
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

from suite.api import flag_of, schema

ENV = {**os.environ, "PRUNEX_PROGRESS": "0", "PRUNEX_FLUSH_SECONDS": "0"}
ROUND_METHODS = ("prunex", "prunex-flat", "localsgd-hier")
#: the measurement: round-based methods 10 rounds of 4 local steps, the others 24 steps; a
#: checkpoint every 3, the cut run stopped once 4 iterations are on disk
PLAN = {
    "run": ["--dataset", "synthetic", "--synthetic-size", "2048,256", "--batch-size", "16",
            "--checkpoint-every", "3"],
    "iterations": {"round": 10, "step": 24},
    "freeze_round": "6",
    "stop_after": 4,
}
#: --smoke: 4 rounds (6 steps) on a few samples, a checkpoint every iteration, stopped after 2
SMOKE_PLAN = {
    "run": ["--dataset", "synthetic", "--synthetic-size", "256,64", "--batch-size", "16",
            "--checkpoint-every", "1"],
    "iterations": {"round": 4, "step": 6},
    "freeze_round": "2",
    "stop_after": 2,
}
#: --smoke's options where not given
SMOKE = {"methods": "prunex", "gpus": "2", "gpus_per_node": "1", "stop": "env"}


def run(
    results: Path,
    run_id: str,
    method: str,
    plan: dict,
    layout: list[str],
    stop_after: int | None = None,
    stop: str = "sigterm",
) -> None:
    kind = "round" if method in ROUND_METHODS else "step"
    extra = ["--local-steps", "4"] if kind == "round" else []
    if method.startswith("prunex"):
        extra += ["--freeze-round", plan["freeze_round"]]
    args = [sys.executable, "-m", "suite.cli", "run", "--method", method, *plan["run"], *layout,
            *extra, "--iterations", str(plan["iterations"][kind]), "--results-dir",
            str(results), "--run-id", run_id]
    env = ENV
    if stop_after is not None and stop == "env":
        env = {**ENV, "PRUNEX_STOP_AFTER_ITERATION": str(stop_after)}
    proc = subprocess.Popen(args, env=env, stderr=subprocess.PIPE, text=True)
    if stop_after is not None and stop == "sigterm":
        while iterations_on_disk(results / run_id) < stop_after and proc.poll() is None:
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate()
    if stop_after is None and proc.returncode:
        raise SystemExit(err)


def iterations_on_disk(folder: Path) -> int:
    files = list((folder / "parts").glob("iterations-rank00000-*.parquet"))
    return sum(len(pd.read_parquet(f, columns=[schema.ITERATION])) for f in files if f.exists())


def compare(method: str, root: Path, plan: dict, layout: list[str], stop: str) -> dict:
    run(root, f"{method}-full", method, plan, layout)
    run(root, f"{method}-cut", method, plan, layout, stop_after=plan["stop_after"], stop=stop)
    cut = root / f"{method}-cut"
    stopped = json.loads((cut / "summary.json").read_text())
    proc = subprocess.run([sys.executable, "-m", "suite.cli", "run", "--resume", str(cut)],
                          env=ENV, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(proc.stderr)
    full = torch.load(root / f"{method}-full" / "model.pt", map_location="cpu", weights_only=True)
    resumed = torch.load(cut / "model.pt", map_location="cpu", weights_only=True)
    diff = max((full[k].double() - resumed[k].double()).abs().max().item() for k in full)
    losses = [pd.read_parquet(root / r / "iterations.parquet").groupby(schema.ITERATION)[
        schema.LOSS].mean() for r in (f"{method}-full", f"{method}-cut")]
    gap = (losses[0] - losses[1]).abs()
    summary = json.loads((cut / "summary.json").read_text())
    return {schema.METHOD: method, "stopped_status": stopped[schema.STATUS],
            "resumed_at": summary[schema.RESUMED_AT_ITERATION], "max_abs_diff": diff,
            "bitwise": diff == 0.0, "losses_equal": bool((gap == 0).all()),
            "first_loss_difference_at": int(gap[gap > 0].index.min()) if (gap > 0).any() else None,
            "max_loss_difference": float(gap.max())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default="prunex,prunex-flat,ddp,ddp-bf16,ddp-fp16,"
                        "powersgd,topk,topk-hier,localsgd-hier")
    parser.add_argument("--gpus", default="4")
    parser.add_argument("--gpus-per-node", default="2")
    parser.add_argument("--stop", choices=["sigterm", "env"], default="sigterm",
                        help="how the cut run stops: SIGTERM to the launcher once the "
                        "iterations are on disk, or PRUNEX_STOP_AFTER_ITERATION")
    parser.add_argument("--smoke", action="store_true",
                        help="prunex alone, 2 ranks as 2 nodes, 4 rounds of 4 local steps on "
                        "a few synthetic samples, stopped after round 2 (--stop env)")
    args = parser.parse_args()
    plan = PLAN
    if args.smoke:
        given = {a.split("=")[0] for a in sys.argv[1:]}
        for key, value in SMOKE.items():
            if flag_of(key) not in given:
                setattr(args, key, value)
        plan = SMOKE_PLAN
    layout = ["--gpus", args.gpus, "--gpus-per-node", args.gpus_per_node]
    with tempfile.TemporaryDirectory() as root:
        for method in args.methods.split(","):
            row = compare(method, Path(root), plan, layout, args.stop)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
