"""What the framework costs as the world grows: at 8, 16, 32 and 64 ranks, the seconds from
``bench run`` to the first iteration, the framework's own time per iteration with the
method's compute and communication left out, the store operations per rank per iteration,
the seconds to finish and merge the folder, and ``bench report`` on the run.

    python benchmarks/orchestration.py                       # 8,16,32,64 ranks, 8 per node
    python benchmarks/orchestration.py --ranks 8,16 --method ddp
    python benchmarks/orchestration.py --smoke               # 2 ranks, synthetic data

Per rank count, one ``bench run --gpus N --gpus-per-node G --iterations I --eval-every
100000`` (emulated nodes on this machine), read as it goes:

* to first iteration: from starting ``bench run`` to rank 0's progress bar counting the first
  iteration done (launcher, fork server, rendezvous, gloo's connections, setup, warm-up and
  the first iteration itself);
* framework ms per iteration: the training loop's own time outside the method's phases, per
  steady iteration: ``(wall - train - evaluation) / iterations`` (agreements, row flushes,
  the loop's checks), plus the recorder's share inside an iteration (its row's seconds less
  its phases' union);
* store ops per rank per iteration: the ``store_ops`` column of the rows (heartbeats: one a
  second, so per iteration it follows the iteration's length, per second it is 1);
* finish and merge: from the bar's last iteration to the ``ok`` summary (rank 0 merges every
  rank's rows and writes the summary), and to the launcher's exit;
* report: ``bench report`` of the run's folder.

Prints a markdown table (``--out`` also writes it) and whether any row grows faster than
linearly in the ranks (its value per rank, from the smallest world to the largest, rising
by more than the world's factor).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from runs import only_run, smoke_defaults

from suite.api import schema

#: --smoke: 2 ranks as 2 nodes, 3 iterations of synthetic data
SMOKE = {"ranks": "2", "gpus_per_node": 1, "dataset": "synthetic", "iterations": 3}
PROGRESS = re.compile(r"\|\s*(\d+)/(\d+) \[")


@dataclass
class Row:
    ranks: int
    nodes: int
    status: str
    to_first_s: float
    framework_ms: float
    loop_ms: float
    recorder_ms: float
    store_ops: float
    store_ops_per_s: float
    finish_s: float
    exit_s: float
    report_s: float


class Watched:
    """A ``bench run`` whose stderr (the progress bar) is read as it comes."""

    def __init__(self, command: list[str], env: dict):
        self.started = time.perf_counter()
        self.first = self.last = None
        self.proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, bufsize=1)
        self.err: list[str] = []
        self.reader = threading.Thread(target=self.read, daemon=True)
        self.reader.start()

    def read(self) -> None:
        buffer = ""
        while chunk := self.proc.stderr.read(1):
            buffer += chunk
            if chunk in "\r\n":
                match = PROGRESS.search(buffer)
                if match:
                    done, total = int(match.group(1)), int(match.group(2))
                    now = time.perf_counter() - self.started
                    if done >= 1 and self.first is None:
                        self.first = now
                    if done == total and self.last is None:
                        self.last = now
                elif buffer.strip():
                    self.err.append(buffer.strip())
                buffer = ""


def finish_times(watched: Watched, out: Path) -> tuple[float, float]:
    """(seconds from start to an ``ok`` summary, to the launcher's exit)."""
    summary_at = None
    while watched.proc.poll() is None:
        if summary_at is None and ok_summary(out):
            summary_at = time.perf_counter() - watched.started
        time.sleep(0.05)
    exit_at = time.perf_counter() - watched.started
    if summary_at is None and ok_summary(out):
        summary_at = exit_at
    return summary_at or float("nan"), exit_at


def ok_summary(out: Path) -> bool:
    for path in out.glob("*/summary.json"):
        try:
            return json.loads(path.read_text()).get(schema.STATUS) == schema.Status.OK
        except (OSError, ValueError):
            return False
    return False


def framework_shares(folder: Path) -> tuple[float, float, float, float]:
    """(loop ms, recorder ms per steady iteration, store ops per rank per iteration, per
    second) from the run's summary and rows."""
    summary = json.loads((folder / "summary.json").read_text())
    iterations = summary[schema.ITERATIONS]
    outside = (summary[schema.WALL_SECONDS] - summary[schema.TRAIN_SECONDS]
               - (summary.get(schema.EVALUATION_SECONDS) or 0.0))
    rows = pd.read_parquet(folder / "iterations.parquet")
    steady = rows[~rows[schema.ONE_OFF].astype(bool)] if schema.ONE_OFF in rows else rows
    phases = schema.phase_columns(steady.columns)
    inside = (steady[schema.T_ITERATION] - steady[phases].fillna(0).sum(axis=1)).clip(lower=0)
    ops = rows[schema.STORE_OPS] if schema.STORE_OPS in rows else pd.Series(dtype=float)
    ranks = rows[schema.RANK].nunique()
    per_second = ops.sum() / ranks / summary[schema.WALL_SECONDS] if len(ops) else float("nan")
    return (1e3 * outside / iterations, 1e3 * float(inside.mean()), float(ops.mean()),
            float(per_second))


def measure(ranks: int, args) -> Row:
    out = Path(tempfile.mkdtemp(prefix="orchestration-"))
    gpn = min(args.gpus_per_node, ranks)
    command = [sys.executable, "-m", "suite.cli", "run", "--method", args.method, "--workload",
               args.workload, "--dataset", args.dataset, "--gpus", str(ranks), "--gpus-per-node",
               str(gpn), "--iterations", str(args.iterations), "--eval-every", "100000",
               "--results-dir", str(out)]
    if args.method.startswith(("prunex", "localsgd", "gmp", "prune")):
        command += ["--local-steps", str(args.local_steps)]
    if args.dataset == "synthetic":
        command += ["--synthetic-size", f"{max(256, 16 * ranks)},64", "--batch-size", "8"]
    watched = Watched(command, {**os.environ, "PRUNEX_PROGRESS": "1"})
    summary_at, exit_at = finish_times(watched, out)
    watched.reader.join(timeout=10)
    nan = float("nan")
    if watched.proc.returncode != 0 or not ok_summary(out):
        why = (watched.err or [f"exit {watched.proc.returncode}"])[-1][:100]
        return Row(ranks, ranks // gpn, f"failed: {why}", nan, nan, nan, nan, nan, nan, nan,
                   nan, nan)
    folder = only_run(out)
    loop_ms, recorder_ms, ops, ops_per_s = framework_shares(folder)
    started = time.perf_counter()
    report = subprocess.run([sys.executable, "-m", "suite.cli", "report", str(folder), "-o",
                             str(out / "report")], capture_output=True, text=True)
    report_s = time.perf_counter() - started if report.returncode == 0 else nan
    last = watched.last if watched.last is not None else nan
    return Row(ranks, ranks // gpn, "ok", round(watched.first or nan, 1),
               round(loop_ms + recorder_ms, 1), round(loop_ms, 1), round(recorder_ms, 2),
               round(ops, 2), round(ops_per_s, 2), round(summary_at - last, 1),
               round(exit_at - last, 1), round(report_s, 1))


def table(rows: list[Row]) -> str:
    head = ("| ranks | nodes | status | to first iteration s | framework ms/iteration | "
            "of it: loop ms | of it: recorder ms | store ops per rank per iteration | "
            "store ops per rank per s | finish and merge s | to exit s | bench report s |\n"
            "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    return "\n".join([head, *(
        f"| {r.ranks} | {r.nodes} | {r.status} | {r.to_first_s} | {r.framework_ms} | "
        f"{r.loop_ms} | {r.recorder_ms} | {r.store_ops} | {r.store_ops_per_s} | {r.finish_s} | "
        f"{r.exit_s} | {r.report_s} |" for r in rows)])


def superlinear(rows: list[Row]) -> list[str]:
    """The columns whose value grows faster than the world between the smallest and the
    largest run (time per rank rising; store ops per rank rising at all)."""
    done = [r for r in rows if r.status == schema.Status.OK]
    if len(done) < 2:
        return []
    small, large = done[0], done[-1]
    factor = large.ranks / small.ranks
    found = []
    for name in ("to_first_s", "framework_ms", "finish_s", "report_s"):
        if getattr(large, name) > factor * getattr(small, name) * 1.1:
            found.append(name)
    if large.store_ops_per_s > small.store_ops_per_s * 1.5:
        found.append("store_ops_per_s")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="8,16,32,64")
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--method", default="prunex")
    parser.add_argument("--workload", default="cnn-fmnist")
    parser.add_argument("--dataset", default="fmnist")
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--local-steps", type=int, default=2)
    parser.add_argument("--out", default=None, help="also write the table here")
    parser.add_argument("--smoke", action="store_true", help="2 ranks, synthetic data")
    args = parser.parse_args(argv)
    if args.smoke:
        smoke_defaults(args, SMOKE, argv)
    rows = []
    for ranks in (int(n) for n in str(args.ranks).split(",") if n):
        rows.append(measure(ranks, args))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    text = table(rows)
    faster = superlinear(rows)
    text += ("\n\nno row grows faster than linearly in the ranks" if not faster else
             f"\n\ngrowing faster than linearly: {', '.join(faster)}")
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0 if all(r.status == schema.Status.OK for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
