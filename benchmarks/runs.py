"""What the benchmark scripts share: run a `bench` command quietly, run a `bench sweep` whose
failed cells are reported but not fatal, find the run folder a command wrote (each cell
gets its own results directory, so there is exactly one), and read the runs that finished."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd


def bench(*args: str) -> None:
    """``bench ARGS`` in this interpreter, without progress bars; exits with its stderr if it
    fails."""
    env = {**os.environ, "PRUNEX_PROGRESS": "0"}
    proc = subprocess.run([sys.executable, "-m", "suite.cli", *args], env=env, text=True,
                          capture_output=True)  # fmt: skip
    if proc.returncode:
        raise SystemExit(f"bench {' '.join(args)} failed:\n{proc.stderr}")


def sweep(*args: str) -> None:
    """``bench sweep ARGS`` with its progress shown; a failed cell (exit 1) is listed by the
    sweep and the measurement goes on, anything else stops it."""
    proc = subprocess.run([sys.executable, "-m", "suite.cli", "sweep", *args], text=True)
    if proc.returncode not in (0, 1):
        sys.exit(proc.returncode)


def only_run(directory: Path) -> Path:
    (folder,) = [p for p in directory.iterdir() if p.is_dir()]
    return folder


def finished_runs(root: Path, method: str | None = None):
    """(folder, summary, manifest) of every run under ``root`` that ended ok."""
    for path in sorted(root.rglob("summary.json")):
        summary = json.loads(path.read_text())
        if summary.get("status") != "ok" or method not in (None, summary["method"]):
            continue
        yield path.parent, summary, json.loads((path.parent / "manifest.json").read_text())


RUN_COLUMNS = ["method", "seed", "lr", "run", "accuracy", "epochs", "inter_MB_per_epoch",
               "samples_per_rank", "frozen_at_round"]  # fmt: skip


def run_table(root: Path) -> pd.DataFrame:
    """One row per finished run under ``root``: its lr, final accuracy in %, inter-node MB per
    epoch and (PruneX) the round its masks froze at. A cell run twice (e.g. after its identity
    changed) counts once."""
    rows = [
        {"method": s["method"], "seed": s["seed"], "lr": m["recipe"]["lr"], "run": str(folder),
         "accuracy": 100 * s["final_accuracy"], "epochs": s["epochs"],
         "inter_MB_per_epoch": s["inter_node_bytes_total"] / 1e6 / s["epochs"],
         "samples_per_rank": s.get("samples_per_rank"),
         "frozen_at_round": (s.get("masks_frozen_at") or {}).get("round")}
        for folder, s, m in finished_runs(root)
    ]  # fmt: skip
    return pd.DataFrame(rows, columns=RUN_COLUMNS).drop_duplicates(["method", "seed", "lr"])
