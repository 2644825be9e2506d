"""The `bench` command as the tests drive it: in a subprocess (runs start real ranks), in this
process (commands that start none), and the run folders they leave."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[2]
BENCH = [sys.executable, "-m", "suite.cli"]
#: no progress bar on stderr, every row flushed at once
ENV = {**os.environ, "PRUNEX_PROGRESS": "0", "PRUNEX_FLUSH_SECONDS": "0"}
#: the smallest real runs: synthetic data, a few samples
TINY = ["--dataset", "synthetic", "--synthetic-size", "256,64", "--batch-size", "16"]
ONE_RANK = ["--gpus", "1", "--gpus-per-node", "1"]
SMALL = ["--dataset", "synthetic", "--gpus", "4", "--gpus-per-node", "2", "--batch-size", "16"]


def process_environment(pid: int | str) -> dict[str, str] | None:
    """A live process's environment (None: gone meanwhile, or not ours to read), to tell this
    test's processes from other tests' running beside them."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    pairs = (entry.split(b"=", 1) for entry in raw.split(b"\0") if b"=" in entry)
    return {key.decode(errors="replace"): value.decode(errors="replace") for key, value in pairs}


def processes_with(marker: str) -> list[str]:
    """Processes whose environment carries ``marker`` (``NAME=VALUE``: this test's runs, no
    other test's)."""
    name, value = marker.split("=", 1)
    return [pid for pid in os.listdir("/proc")
            if pid.isdigit() and (process_environment(pid) or {}).get(name) == value]


def bench(*args, cwd=None, env: dict | None = None, timeout: float = 300):
    """``bench ARGS`` in a subprocess; the CompletedProcess."""
    return subprocess.run([*BENCH, *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout, env=env or ENV)


def bench_here(*args):
    """``bench ARGS`` in this process (for commands that start no rank): no interpreter and
    torch import per call."""
    from click.testing import CliRunner

    from suite.cli import main

    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def one_line_error(proc) -> str:
    """The one line a failed subprocess printed on stderr."""
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def one_line(result) -> str:
    """The one line a failed in-process command printed on stderr."""
    assert result.exit_code != 0, result.output
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


def only_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def start(results: Path, run_id: str, *args: str, env: dict | None = None) -> subprocess.Popen:
    """``bench run`` in its own session (so a signal can go to the whole group, as Ctrl-C)."""
    return subprocess.Popen(
        [*BENCH, "run", "--results-dir", str(results), "--run-id", run_id, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env or ENV,
        start_new_session=True,
    )


def finish(proc: subprocess.Popen, timeout: float = 120) -> tuple[int, str]:
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, err


def streamed_iterations(folder: Path) -> int:
    """Iterations whose rows every rank has written to parts/ so far."""
    frames = []
    for file in (folder / "parts").glob("iterations-rank*.parquet"):
        try:
            frames.append(pd.read_parquet(file, columns=["iteration", "rank"]))
        except (OSError, ValueError):
            pass
    if not frames:
        return 0
    rows = pd.concat(frames)
    ranks = rows["rank"].nunique()
    counts = rows.groupby("iteration")["rank"].nunique()
    return int((counts == ranks).sum())


def wait_until(folder: Path, iterations: int, proc: subprocess.Popen, timeout=180) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1]
        done = streamed_iterations(folder)
        if done >= iterations:
            return done
        time.sleep(0.2)
    raise AssertionError(f"{folder} did not reach {iterations} iterations")


def wait_for_checkpoint(folder: Path, timeout: float = 180) -> None:
    """Until the run in ``folder`` (a SLURM job's: no process to watch) wrote a checkpoint."""
    latest = folder / "checkpoints" / "latest.json"
    deadline = time.monotonic() + timeout
    while not latest.exists():
        assert time.monotonic() < deadline, f"no checkpoint in {folder} within {timeout:g} s"
        time.sleep(0.5)


def summary(folder: Path) -> dict:
    return json.loads((folder / "summary.json").read_text())


def rank_pid(folder: Path, rank: int) -> int:
    return summary(folder)["processes"][rank][1]


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except (OSError, IndexError):
        return False
    return state != "Z"


class Planted:
    """What a crafted pickle (a checkpoint's `.metadata`, a CIFAR-10 batch) unpickles to with
    plain pickle: ``touch TARGET`` run by the shell, so a test sees whether it ran."""

    def __init__(self, target: Path):
        self.target = target

    def __reduce__(self):
        return os.system, (f"touch {self.target}",)

