"""What a local run's ranks hold in memory: the proportional set size (PSS, the kernel's
``/proc/PID/smaps_rollup``: a page shared by k processes counts 1/k in each) of every rank
of a ``bench run``, sampled while it runs, at several rank counts.

PSS is what the ranks add to the machine: they are forked from one server that imported
torch, so their interpreters share most pages, and the host's decoded dataset is mapped
once for all of them (suite.data.shared). RSS would count each shared page once per rank.
The capacity check (suite.commands.capacity) charges a rank what this measures.

    python benchmarks/rank_memory.py                          # 8, 16, 32, 64 ranks, fmnist
    python benchmarks/rank_memory.py --ranks 64 --method ddp
    python benchmarks/rank_memory.py --smoke                  # 2 ranks, synthetic data

Each rank count runs ``bench run --method M --gpus N --gpus-per-node G --workload W
--dataset D --iterations I --local-steps 2 --eval-every 100000`` into a temporary folder and
samples every ``--interval`` seconds; prints a markdown row per run (peak of the ranks' total
PSS, per rank at that moment, the launcher and fork server, the machine's lowest
MemAvailable) and writes them as JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from runs import children, only_run, smoke_defaults

from suite.api import schema

MIB = 2**20
#: --smoke: 2 ranks as 2 nodes, 2 iterations of synthetic data
SMOKE = {"ranks": "2", "gpus_per_node": 1, "dataset": "synthetic", "iterations": 2}


@dataclass
class Measured:
    ranks: int
    gpus_per_node: int
    method: str
    workload: str
    dataset: str
    status: str
    wall_seconds: float
    samples: int
    peak_ranks_pss_gib: float
    rank_pss_mib_at_peak: float
    rank_pss_mib_max: float
    rank_rss_mib_at_peak: float
    others_pss_mib: float
    min_available_gib: float


def smaps(pid: int) -> dict[str, int] | None:
    """``Pss`` and ``Rss`` of a process in bytes (None: it ended meanwhile)."""
    try:
        lines = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
    except OSError:
        return None
    found = {}
    for line in lines:
        key, _, rest = line.partition(":")
        if key in ("Pss", "Rss"):
            found[key] = int(rest.split()[0]) * 1024
    return found


def run_processes(launcher: int) -> tuple[list[int], list[int]]:
    """(ranks, others) of the run ``launcher`` started: a rank is a child of the fork
    server (which forks them), or a process of ``suite.run.entry`` (the ranks a node's
    torchrun agent starts under ``--network emulated``); the others are the launcher, the
    server, the agents and their helpers."""
    tree = children()
    ranks, others, todo = [], [], [(launcher, False)]
    while todo:
        pid, forked = todo.pop()
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        # a rank torchrun started (--network emulated); the agent's own command names it too
        spawned = b"suite.run.entry" in cmdline and b"torch.distributed.run" not in cmdline
        (ranks if forked or spawned else others).append(pid)
        server = b"multiprocessing.forkserver" in cmdline
        todo += [(kid, server and not forked) for kid in tree.get(pid, [])]
    return ranks, others


def available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def measure(ranks: int, args) -> Measured:
    """One run of ``ranks`` ranks, sampled until it ends."""
    out = Path(tempfile.mkdtemp(prefix="rank-memory-"))
    gpn = min(args.gpus_per_node, ranks)
    command = [sys.executable, "-m", "suite.cli", "run", "--method", args.method,
               "--workload", args.workload, "--dataset", args.dataset, "--gpus", str(ranks),
               "--gpus-per-node", str(gpn), "--iterations", str(args.iterations),
               "--eval-every", "100000", "--results-dir", str(out)]
    if args.method.startswith(("prunex", "localsgd", "gmp", "prune")):
        command += ["--local-steps", "2"]
    if args.network == "emulated":
        command += ["--network", "emulated", "--inter-bw", args.inter_bw]
    if args.dataset == "synthetic":
        command += ["--synthetic-size", f"{max(256, 16 * ranks)},64", "--batch-size", "8"]
    env = {**os.environ, "PRUNEX_PROGRESS": "0"}
    started = time.perf_counter()
    log = (out / "bench.log").open("w+")  # a file, never a pipe: 64 ranks' lines would fill
    proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    peak, at_peak, samples, rank_max, lowest = 0, (0, 0, 0), 0, 0, available()
    others_peak = 0
    while proc.poll() is None:
        rank_pids, other_pids = run_processes(proc.pid)
        read = [m for m in map(smaps, rank_pids) if m]
        others = sum(m["Pss"] for m in map(smaps, other_pids) if m)
        if read:
            samples += 1
            total = sum(m["Pss"] for m in read)
            rank_max = max(rank_max, max(m["Pss"] for m in read))
            if total > peak:
                rss = sum(m["Rss"] for m in read) / len(read)
                peak, at_peak = total, (len(read), total / len(read), rss)
            others_peak = max(others_peak, others)
        lowest = min(lowest, available())
        time.sleep(args.interval)
    proc.wait()
    wall = time.perf_counter() - started
    err = (out / "bench.log").read_text(errors="replace")
    try:
        summary = json.loads((only_run(out) / "summary.json").read_text())
        status = summary.get(schema.STATUS, "?")
    except (OSError, ValueError):
        last = err.strip().splitlines()[-1][:120] if err.strip() else proc.returncode
        status = f"no run ({last})"
    if proc.returncode != 0 and status == schema.Status.OK:
        status = f"exit {proc.returncode}"
    return Measured(ranks, gpn, args.method, args.workload, args.dataset, status,
                    round(wall, 1), samples, round(peak / 2**30, 2),
                    round(at_peak[1] / MIB, 1), round(rank_max / MIB, 1),
                    round(at_peak[2] / MIB, 1), round(others_peak / MIB, 1),
                    round(lowest / 2**30, 2))


def table(rows: list[Measured]) -> str:
    head = ("| ranks | nodes x ranks | method | data | status | wall s | samples | peak ranks' "
            "PSS GiB | PSS per rank MiB (at peak) | max rank PSS MiB | RSS per rank MiB | "
            "launcher + fork server PSS MiB | lowest MemAvailable GiB |\n"
            "|---:|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    body = [f"| {r.ranks} | {r.ranks // r.gpus_per_node} x {r.gpus_per_node} | {r.method} | "
            f"{r.workload} on {r.dataset} | {r.status} | {r.wall_seconds} | {r.samples} | "
            f"{r.peak_ranks_pss_gib} | {r.rank_pss_mib_at_peak} | {r.rank_pss_mib_max} | "
            f"{r.rank_rss_mib_at_peak} | {r.others_pss_mib} | {r.min_available_gib} |"
            for r in rows]
    return "\n".join([head, *body])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="8,16,32,64", help="rank counts, comma-separated")
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--method", default="prunex")
    parser.add_argument("--workload", default="cnn-fmnist")
    parser.add_argument("--dataset", default="fmnist")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--network", default="direct", choices=("direct", "emulated"),
                        help="emulated: nodes in namespaces, each rank started by its node's "
                        "torchrun agent (not forked from the fork server)")
    parser.add_argument("--inter-bw", default="1gbit", help="the emulated links' rate")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between samples")
    parser.add_argument("--json", default=None, help="also write the rows here")
    parser.add_argument("--smoke", action="store_true", help="2 ranks, synthetic data")
    args = parser.parse_args(argv)
    if args.smoke:
        smoke_defaults(args, SMOKE, argv)
    rows = []
    for ranks in (int(n) for n in str(args.ranks).split(",") if n):
        rows.append(measure(ranks, args))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in rows], indent=2) + "\n")
    return 0 if all(r.status == schema.Status.OK for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
