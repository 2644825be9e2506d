"""A rank killed among many: one rank of a running ``bench run`` is SIGKILLed (as the kernel's
OOM killer or a lost GPU would end it), and the run must end ``failed`` within a minute,
naming that rank, with no process of the run left and every row the ranks flushed kept.

    python benchmarks/rank_kill.py                         # 64 ranks, 8 per node, rank 37
    python benchmarks/rank_kill.py --ranks 16 --kill-rank 5
    python benchmarks/rank_kill.py --smoke                 # 2 ranks, synthetic data

The run flushes every iteration (``PRUNEX_FLUSH_SECONDS=0``) and is given many iterations;
once the chosen rank has flushed ``--after`` iterations its pid (the summary's ``processes``,
in rank order) is killed. Prints one markdown row: seconds from the kill to the launcher's
exit, the summary's status and error, the processes of the run still alive afterwards, and
the rows kept (iterations with a row of every rank).
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
from runs import children, smoke_defaults

from suite.api import schema

SMOKE = {"ranks": 2, "gpus_per_node": 1, "kill_rank": 1, "dataset": "synthetic"}
#: the run must have ended this soon after the kill (the issue's bound)
LIMIT_SECONDS = 60


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rindex(")") + 2] != "Z"


def flushed(folder: Path, rank: int) -> int:
    """Iteration files the rank has flushed so far."""
    return len(list((folder / "parts").glob(f"iterations-rank{rank:05d}-*.parquet")))


def tail(out: Path) -> str:
    """The end of the run's output."""
    return (out / "bench.log").read_text(errors="replace")[-600:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--kill-rank", type=int, default=37)
    parser.add_argument("--after", type=int, default=2, help="its flushed iterations first")
    parser.add_argument("--method", default="prunex")
    parser.add_argument("--dataset", default="fmnist")
    parser.add_argument("--smoke", action="store_true", help="2 ranks, synthetic data")
    args = parser.parse_args(argv)
    if args.smoke:
        smoke_defaults(args, SMOKE, argv)
    out = Path(tempfile.mkdtemp(prefix="rank-kill-"))
    folder = out / "run"
    command = [sys.executable, "-m", "suite.cli", "run", "--method", args.method, "--dataset",
               args.dataset, "--gpus", str(args.ranks), "--gpus-per-node",
               str(args.gpus_per_node), "--iterations", "100000", "--eval-every", "100000",
               "--results-dir", str(out), "--run-id", "run"]
    if args.method.startswith(("prunex", "localsgd", "gmp", "prune")):
        command += ["--local-steps", "2"]
    env = {**os.environ, "PRUNEX_PROGRESS": "0", "PRUNEX_FLUSH_SECONDS": "0"}
    log = (out / "bench.log").open("w+")  # a file, never a pipe: 64 ranks' lines would fill
    proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    while proc.poll() is None and flushed(folder, args.kill_rank) < args.after:
        time.sleep(0.2)
    if proc.poll() is not None:
        raise SystemExit(f"the run ended before the kill: {tail(out)}")
    processes = json.loads((folder / "summary.json").read_text())[schema.PROCESSES]
    victim = int(processes[args.kill_rank][1])
    tree, below = children(), []
    todo = list(tree.get(proc.pid, []))
    while todo:  # every process below the launcher, to check none outlives the run
        below.append(todo.pop())
        todo += tree.get(below[-1], [])
    killed = time.perf_counter()
    os.kill(victim, signal.SIGKILL)
    try:
        proc.wait(timeout=10 * LIMIT_SECONDS)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    seconds = time.perf_counter() - killed
    time.sleep(1)
    left = [pid for pid in below + [int(p[1]) for p in processes] if alive(pid)]
    summary = json.loads((folder / "summary.json").read_text())
    rows = pd.read_parquet(folder / "iterations.parquet", columns=[schema.ITERATION,
                                                                   schema.RANK])
    whole = int((rows.groupby(schema.ITERATION)[schema.RANK].nunique() == args.ranks).sum())
    error = str(summary.get(schema.ERROR))
    named = f"rank {args.kill_rank}" in error
    print("| ranks | killed | seconds to exit | status | names the rank | processes left | "
          "iterations with every rank's row | error |\n|---:|---:|---:|---|---|---:|---:|---|")
    print(f"| {args.ranks} | rank {args.kill_rank} (pid {victim}) | {seconds:.1f} | "
          f"{summary.get(schema.STATUS)} | {named} | {len(left)} | {whole} | "
          f"{error[:160]} |")
    ok = (summary.get(schema.STATUS) == schema.Status.FAILED and named and not left
          and seconds <= LIMIT_SECONDS and whole >= args.after and proc.returncode == 1)
    if not ok:
        print(f"output: {tail(out)}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
