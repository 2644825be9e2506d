"""What the benchmark scripts share: run a `bench` command quietly, run a `bench sweep` whose
failed cells are reported but not fatal, and find the run folder a command wrote (each cell
gets its own results directory, so there is exactly one)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


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
