"""Run folders: manifest, tables and summary, all written atomically.

Layout of ``results/<run_id>/``::

    manifest.json        config, versions, git revision, hardware, topology
    iterations.parquet   one row per (iteration, rank): phase seconds, bytes per link, loss, ...
    evals.parquet        one row per evaluation: accuracy, elapsed seconds, cumulative bytes
    layers.parquet       (PruneX) per-layer residuals, penalties, density per round
    summary.json         the keys ``bench compare`` and ``bench report`` read
    parts/               per-rank rows while a run is live; merged and removed at the end
    errors/              on failure: one file per failing rank, first line = the reason

Every file is written to a temporary name and renamed, so a reader never sees half a file.
The summary says ``running`` while the run is live, and ``ok`` or ``failed`` (with the error)
at the end; a run killed too hard to say anything keeps ``running`` and is treated as failed.
"""

from __future__ import annotations

import json
import os
import platform
import secrets
import shutil
import subprocess
import time
from pathlib import Path

import pandas as pd
import torch

SUMMARY_KEYS = (
    "run_id",
    "status",
    "error",
    "method",
    "workload",
    "dataset",
    "gpus",
    "nodes",
    "gpus_per_node",
    "iterations",
    "epochs",
    "final_accuracy",
    "best_accuracy",
    "inter_node_bytes_total",
    "intra_node_bytes_total",
    "inter_node_bytes_per_iteration",
    "wall_seconds",
    "train_seconds",
    "iteration_seconds",
    "time_to_target_seconds",
    "target_accuracy",
    "phase_seconds",
    "options",
    "simulated",
)


def make_run_id(method: str, workload: str, gpus: int) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{method}-{workload}-{gpus}g-{secrets.token_hex(2)}"


def atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_json(path: Path, obj) -> None:
    atomic_write_bytes(
        path, (json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n").encode()
    )


def read_json(path: Path):
    return json.loads(Path(path).read_text())


def write_table(path: Path, rows: list[dict] | pd.DataFrame) -> None:
    frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    frame.to_parquet(tmp, index=False)
    os.replace(tmp, path)


def write_torch(path: Path, obj) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def git_revision() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).resolve().parent,
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def hardware() -> dict:
    info = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "cuda_devices": [],
    }
    if torch.cuda.is_available():
        info["cuda_devices"] = [
            torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())
        ]
    return info


def versions() -> dict:
    import timm
    import torchvision

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "timm": timm.__version__,
        "pandas": pd.__version__,
        "cuda": torch.version.cuda,
    }


class RunFolder:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    @property
    def parts(self) -> Path:
        return self.path / "parts"

    @property
    def errors(self) -> Path:
        return self.path / "errors"

    def create(self) -> RunFolder:
        self.parts.mkdir(parents=True, exist_ok=True)
        return self

    # -- per-rank parts -----------------------------------------------------------------
    def write_rank_rows(self, rank: int, table: str, rows: list[dict]) -> None:
        if rows:
            write_table(self.parts / f"{table}-rank{rank:05d}.parquet", rows)

    def merge_parts(self) -> None:
        """Fold the per-rank files into the final tables (idempotent, re-runnable)."""
        if not self.parts.exists():
            return
        for table in ("iterations", "evals", "layers"):
            files = sorted(self.parts.glob(f"{table}-rank*.parquet"))
            if not files:
                continue
            frame = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
            keys = [k for k in ("iteration", "rank") if k in frame.columns]
            if keys:
                frame = frame.sort_values(keys, kind="stable").reset_index(drop=True)
            write_table(self.path / f"{table}.parquet", frame)
        shutil.rmtree(self.parts, ignore_errors=True)

    # -- summary ------------------------------------------------------------------------
    def summary(self) -> dict | None:
        path = self.path / "summary.json"
        return read_json(path) if path.exists() else None

    def write_summary(self, summary: dict) -> None:
        write_json(self.path / "summary.json", summary)

    def mark_failed(self, error: str, **known) -> None:
        """Record a failure without losing rows the ranks already flushed.

        ``known`` adds identifying keys (method, workload, gpus, ...) so a failed run still
        shows up, as failed, in listings and comparisons.
        """
        self.merge_parts()
        summary = {**known, **(self.summary() or {})}
        if summary.get("status") == "failed" and summary.get("error"):
            return  # the ranks already said why
        summary.update(status="failed", error=error)
        self.write_summary(summary)

    def table(self, name: str) -> pd.DataFrame | None:
        path = self.path / f"{name}.parquet"
        return pd.read_parquet(path) if path.exists() else None
