"""The paper's strong scaling of ResNet-152 from 8 to 64 V100s beside `bench sim`'s, under each
shipped V100 profile, and what the difference is made of.

The paper (sec. 5.4, fig. 9) measured speedups over 8 GPUs of 6.75x for PruneX (84.4 %
efficiency), 5.81x for DDP (72.7 %) and 3.71x for Top-K on 64 V100s; its fig. 7 put DDP's
communication at ~0.50 s per iteration on 64 GPUs and PruneX's at ~0.10 s. For each shipped
V100 profile (``v100-ib100``: published specs at line rate; ``v100-paper-fig7``: the same with
the inter-node bandwidth fig. 7's DDP latency implies) this runs ``bench sim --method
prunex,ddp,topk --gpus 8,16,32,64 --workload resnet152-cifar10`` for four epochs at the
paper's batch (128 per GPU), PruneX at a fixed H = 6 local steps per round (one local epoch
of a 64-GPU shard; the paper scales at one schedule, where the default H, one local epoch,
would run another at each count), and writes one Markdown table: the speedups and
efficiencies side by side; per method, the simulated seconds per iteration at 64 GPUs by
phase and the extra seconds per iteration at 64 GPUs the simulator would need to give the
paper's speedup (solved from the simulated epoch times: T64' = T8 / speedup, spread over the
64-GPU epochs' iterations), as the phase the paper names as the cause and the phase that
grows most with the GPU count would have to carry it; and fig. 7's communication per
iteration beside the simulator's. No profile is tuned to the paper's numbers.

    python benchmarks/paper_scaling.py                  # 2 x 12 simulations: 10-16 min here
    python benchmarks/paper_scaling.py --tabulate-only  # the table again from the runs
    python benchmarks/paper_scaling.py --smoke          # cnn-fmnist, 8 and 16 GPUs, 2 steps

The table goes to ``benchmarks/measured/paper_scaling.md`` (``--smoke``: into its folder),
keeping the notes below its ``NOTES`` line; the simulations' run folders to ``--out``
(default ``results/paper-scaling``), one folder per profile (``bench report`` draws them).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from runs import bench, finished_runs, output_folder

from suite.api import phases, schema

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TABLE = REPO / "benchmarks" / "measured" / "paper_scaling.md"
PROFILES = ("v100-ib100", "v100-paper-fig7")
METHODS = ("prunex", "ddp", "topk")
#: the paper's speedups over 8 GPUs on 64 (sec. 5.4, fig. 9) and the efficiencies it states
#: (Top-K's it does not: 3.71 / 8)
PAPER_SPEEDUP_64 = {"prunex": 6.75, "ddp": 5.81, "topk": 3.71}
PAPER_EFFICIENCY_64 = {"prunex": 84.4, "ddp": 72.7, "topk": 46.4}
#: the paper's communication seconds per iteration on 64 GPUs (sec. 5.3.2, fig. 7)
PAPER_COMM_64 = {"prunex": 0.10, "ddp": 0.50}
#: the phase the paper names as what limits each method's scaling (sec. 5.3.3 and 5.4)
PAPER_CAUSE = {
    "prunex": ("inter_allreduce", "the inter-node all-reduce, 68.4 % of its communication "
               "(fig. 8)"),
    "ddp": ("allreduce", "dense gradient synchronization on the inter-node links"),
    "topk": ("compress", "the computational overhead of sorting (selecting the top 1 %)"),
}
#: what follows this line in the table's file is kept when the table is written again
NOTES = "<!-- notes: kept as they are when paper_scaling.py writes the table again -->"
#: four epochs: PruneX's 64-GPU cell is then four rounds (one epoch would be a single round,
#: its masks' freeze and the replay's first-call costs inside it), while the replay's cost
#: stays that of the first rounds (every later one is priced as a replayed one)
FULL = ["--workload", "resnet152-cifar10", "--gpus", "8,16,32,64", "--epochs", "4",
        "--local-steps", "6"]
#: --smoke: the smallest grid that takes every path (cnn-fmnist, 8 and 16 GPUs, 2 steps)
SMOKE = ["--workload", "cnn-fmnist", "--dataset", "synthetic", "--batch-size", "8",
         "--gpus", "8,16", "--iterations", "2", "--local-steps", "1"]


@dataclass
class Cell:
    """One simulation: its epoch time, iterations per epoch, and the leader's (node 0's)
    seconds per iteration by phase and in all (the critical path; the followers skip the
    leaders' collectives)."""

    method: str
    gpus: int
    epoch_seconds: float
    iterations_per_epoch: float
    iteration_seconds: float
    phase_seconds: dict[str, float]
    every_iteration: set[str]  # the phases each iteration ran (not a one-off's alone)


def read_cell(folder: Path, summary: dict) -> Cell:
    """A simulation's cell from its run folder: every iteration of node 0's leader, one-offs
    (PruneX's freeze) included, as its training time includes them."""
    rows = pd.read_parquet(folder / "iterations.parquet")
    leader = rows[rows[schema.RANK] == 0]
    count = len(leader)
    per_phase = {column.removeprefix(schema.PHASE_PREFIX): float(leader[column].fillna(0).sum())
                 / count for column in schema.phase_columns(leader.columns)}
    every = {column.removeprefix(schema.PHASE_PREFIX)
             for column in schema.phase_columns(leader.columns) if leader[column].notna().all()}
    epochs = summary[schema.EPOCHS]
    return Cell(summary[schema.METHOD], summary[schema.GPUS],
                summary[schema.TRAIN_SECONDS] / epochs, count / epochs,
                float(leader[schema.T_ITERATION].mean()), per_phase, every)


def read_cells(out: Path) -> dict[str, dict[tuple[str, int], Cell]]:
    """profile -> (method, GPUs) -> cell, from the run folders under ``out/<profile>``."""
    found: dict[str, dict[tuple[str, int], Cell]] = {}
    for profile in PROFILES:
        cells = found.setdefault(profile, {})
        for folder, summary, _ in finished_runs(out / profile):
            cell = read_cell(folder, summary)
            cells[(cell.method, cell.gpus)] = cell
    return found


def communication(cell: Cell) -> float:
    """The leader's seconds per iteration in collectives (the phases the report counts as
    communication), as booked: before DDP's overlap hides part of them."""
    return sum(s for p, s in cell.phase_seconds.items()
               if p in phases.PHASES and phases.PHASES[p].communication)


def speedup(cells: dict, method: str, gpus: int) -> float:
    """Epoch time on the method's fewest GPUs over its epoch time on ``gpus``."""
    return cells[(method, min(g for m, g in cells if m == method))].epoch_seconds / \
        cells[(method, gpus)].epoch_seconds


def needed_extra(cells: dict, method: str, gpus: int) -> float:
    """Seconds per iteration the ``gpus`` cell would need on top of its simulated ones for
    the method to scale with the paper's efficiency over the fewest GPUs (at 64 GPUs: the
    paper's speedup)."""
    base = min(g for m, g in cells if m == method)
    efficiency = PAPER_SPEEDUP_64[method] / 8
    target = cells[(method, base)].epoch_seconds / (efficiency * gpus / base)
    cell = cells[(method, gpus)]
    return (target - cell.epoch_seconds) / cell.iterations_per_epoch


def speedup_table(found: dict, gpus: list[int]) -> list[str]:
    top = gpus[-1]
    lines = ["| method | paper, 8 -> 64 | " + " | ".join(
        f"`{p}`, 8 -> {', '.join(map(str, gpus[1:]))}" for p in PROFILES) + " |",
        "|---|---:|" + "---:|" * len(PROFILES)]
    for method in METHODS:
        paper = PAPER_SPEEDUP_64[method]
        row = [f"| {method} | {paper:.2f}x ({PAPER_EFFICIENCY_64[method]:.1f} %)"]
        for profile in PROFILES:
            cells = found[profile]
            each = [f"{speedup(cells, method, g):.2f}x" for g in gpus[1:]]
            efficiency = speedup(cells, method, top) / (top / gpus[0])
            row.append(f"{', '.join(each)} ({100 * efficiency:.1f} % at {top})")
        lines.append(" | ".join(row) + " |")
    return lines


def secs(value: float) -> str:
    """Seconds to the millisecond, a rounding error's minus sign dropped."""
    return f"{0.0 if abs(value) < 5e-4 else value:.3f}"


def breakdown(cell: Cell) -> str:
    """``total = compute + comm + host + wait - hidden`` of one iteration."""
    seconds = cell.phase_seconds
    compute = seconds.get(phases.LOCAL_COMPUTE, 0.0)
    wait = seconds.get(phases.STRAGGLER_WAIT, 0.0)
    comm = communication(cell)
    host = sum(seconds.values()) - compute - wait - comm
    hidden = sum(seconds.values()) - cell.iteration_seconds
    return (f"{secs(cell.iteration_seconds)} = {secs(compute)} + {secs(comm)} + {secs(host)} "
            f"+ {secs(wait)} - {secs(hidden)}")


def carrying(phase: str, now: float, extra: float) -> str:
    """``phase: now -> now + extra (ratio)``."""
    ratio = f"{(now + extra) / now:.1f}x" if now > 0 else "from nothing"
    return f"`{phase}`: {secs(now)} -> {secs(now + extra)} s ({ratio})"


def growing_most(cells: dict, method: str, top: int) -> tuple[str, float, float]:
    """Of the phases every iteration runs at both ends (a one-off, PruneX's freeze, is spread
    over fewer iterations at more GPUs), the one whose seconds per iteration grow most from
    the fewest GPUs to ``top`` (what a scaling loss can be made of), and its seconds at both
    ends."""
    small, large = cells[(method, min(g for m, g in cells if m == method))], cells[(method, top)]
    phase = max(small.every_iteration & large.every_iteration,
                key=lambda p: large.phase_seconds[p] - small.phase_seconds[p])
    return phase, small.phase_seconds[phase], large.phase_seconds[phase]


def difference_table(found: dict, top: int) -> list[str]:
    """Per profile and method: the top cell's seconds per iteration (compute, communication,
    host-timed work, the wait for the slowest rank, what the overlap hid), what the paper's
    speedup needs on top, and how much that is of the phase the paper names and of the phase
    that grows most with the GPU count."""
    lines = [f"| profile | method | s/iteration at {top}: compute + comm + host + wait - "
             "hidden | the paper's speedup needs | the phase the paper names: simulated -> "
             f"needed | the phase that grows most, 8 -> {top}: simulated at 8 / at {top} -> "
             "needed |", "|---|---|---|---:|---|---|"]
    for profile in PROFILES:
        cells = found[profile]
        for method in METHODS:
            cell = cells[(method, top)]
            extra = needed_extra(cells, method, top)
            named, _ = PAPER_CAUSE[method]
            grows, at_base, at_top = growing_most(cells, method, top)
            lines.append(
                f"| `{profile}` | {method} | {breakdown(cell)} | {extra:+.3f} s "
                f"({100 * extra / cell.iteration_seconds:+.0f} %) | "
                f"{carrying(named, cell.phase_seconds.get(named, 0.0), extra)} | "
                f"{secs(at_base)} / {carrying(grows, at_top, extra)} |")
    return lines


def fig7_table(found: dict, top: int) -> list[str]:
    lines = ["| method | paper's fig. 7 at 64 | " + " | ".join(f"`{p}` at {top}"
                                                               for p in PROFILES) + " |",
             "|---|---:|" + "---:|" * len(PROFILES)]
    for method, paper in PAPER_COMM_64.items():
        cells = [f"{communication(found[p][(method, top)]):.3f} s" for p in PROFILES]
        lines.append(f"| {method} | {paper:.2f} s | " + " | ".join(cells) + " |")
    return lines


def commit() -> str:
    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, text=True,
                          capture_output=True)
    return proc.stdout.strip() or "-"


def write_table(found: dict, grid: list[str], argv: list[str], output: Path,
                load: str, bandwidths: str) -> str:
    gpus = sorted({g for cells in found.values() for _, g in cells})
    top = gpus[-1]
    causes = "; ".join(f"{m}: {why}" for m, (_, why) in PAPER_CAUSE.items())
    rounds = grid[grid.index("--local-steps") + 1]
    text = "\n".join([
        "# The paper's strong scaling (ResNet-152, 8 -> 64 V100s) beside the simulator's",
        "",
        f"`{' '.join(['python benchmarks/paper_scaling.py', *argv])}` at commit {commit()} on "
        f"{platform.node()} ({os.cpu_count()} CPUs, Python {platform.python_version()}), "
        f"{time.strftime('%Y-%m-%d %H:%M')}, load average {load} at the start. Each profile: "
        f"`bench sim --method {','.join(METHODS)} --profile PROFILE {' '.join(grid)} "
        f"--replay 1`, this host's memory bandwidth (it scales the host-timed phases) measured "
        f"by the first and fixed for the second ({bandwidths}). PruneX at a "
        f"fixed H = {rounds} local steps per round (its iteration is "
        f"a round of {rounds} steps; DDP's and Top-K's one step). The paper's numbers: sec. "
        "5.4 and fig. 9 (speedups), sec. 5.3.2 and fig. 7 (communication per iteration). No "
        "profile is tuned to them.",
        "",
        "## Speedup over 8 GPUs (efficiency at the largest count)",
        "",
        *speedup_table(found, gpus),
        "",
        f"## What the difference is made of, at {top} GPUs",
        "",
        "Seconds per iteration of node 0's leader (the critical path) by kind of phase: "
        "compute, communication (every collective), host-timed work (projection, packing, "
        "compression, ...), the wait for the slowest rank, and what DDP's buckets hide behind "
        f"the backward pass. *Needs*: the seconds per iteration the {top}-GPU simulation "
        "would have to cost on top of its own for the method to reach the paper's speedup "
        "(efficiency), from the simulated epoch times; then a phase as simulated and as it "
        "would have to be if it carried all of that (exposed, not hidden): the one the paper "
        f"names as the cause ({causes}), and the one whose seconds per iteration grow most "
        f"from 8 to {top} GPUs in the simulation.",
        "",
        *difference_table(found, top),
        "",
        f"## Communication per iteration at {top} GPUs beside fig. 7",
        "",
        "Every collective phase of the leader's iteration, as booked (DDP's before the overlap "
        "hides part of it; the paper's fig. 7 plots the same latency).",
        "",
        *fig7_table(found, top),
        "",
    ])
    output.parent.mkdir(parents=True, exist_ok=True)
    kept = output.read_text().partition(NOTES)[2] if output.exists() else ""
    output.write_text(text + (f"\n{NOTES}{kept}" if kept else ""))
    return text


def host_bandwidth(folder: Path) -> float | None:
    """This host's memory bandwidth a simulation under ``folder`` priced its host-timed phases
    with (its manifest's), None where none finished."""
    for _, _, manifest in finished_runs(folder):
        return manifest[schema.SIMULATION][schema.HOST_MEMORY_BANDWIDTH]
    return None


def simulate(out: Path, grid: list[str]) -> None:
    """One ``bench sim`` per profile into ``out/<profile>``; the later ones price the
    host-timed phases with the host bandwidth the first measured (as
    ``PRUNEX_HOST_MEMORY_BANDWIDTH``), so the profiles differ in their numbers alone (two
    measurements on this shared machine were 10 and 15 GB/s apart)."""
    env: dict[str, str] = {}
    for profile in PROFILES:
        print(f"bench sim on {profile} ...", file=sys.stderr, flush=True)
        bench("sim", "--method", ",".join(METHODS), "--profile", profile, *grid,
              "--replay", "1", "--results-dir", str(out / profile), env=env)
        measured = host_bandwidth(out / profile)
        if measured is not None and not env:
            env["PRUNEX_HOST_MEMORY_BANDWIDTH"] = repr(measured)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None, help="the simulations' results folder "
                        "(default: results/paper-scaling; --smoke: a temporary folder)")
    parser.add_argument("-o", "--output", default=None,
                        help=f"the Markdown table (default: {DEFAULT_TABLE.relative_to(REPO)};"
                        " --smoke: in the results folder)")
    parser.add_argument("--tabulate-only", action="store_true",
                        help="no simulation: the table from the run folders under --out")
    parser.add_argument("--smoke", action="store_true", help="cnn-fmnist, 8 and 16 GPUs, "
                        "2 iterations of one local step, on both profiles")
    args = parser.parse_args()
    out = output_folder(args.out, "results/paper-scaling", args.smoke, "paper-scaling")
    output = Path(args.output) if args.output else (
        out / "paper_scaling.md" if args.smoke else DEFAULT_TABLE)
    grid = SMOKE if args.smoke else FULL
    load = f"{os.getloadavg()[0]:.2f}"
    if not args.tabulate_only:
        simulate(out, grid)
    found = read_cells(out)
    missing = [f"{p} {m} {g}" for p in PROFILES for m in METHODS
               for g in (8, 16 if args.smoke else 64) if (m, g) not in found[p]]
    if missing:
        raise SystemExit(f"no finished simulation under {out} for: {', '.join(missing)}")
    bandwidths = ", ".join(f"`{p}` {(host_bandwidth(out / p) or 0) / 1e9:.1f} GB/s"
                           for p in PROFILES)
    print(write_table(found, grid, sys.argv[1:], output, load, bandwidths), end="")
    print(json.dumps({"table": str(output)}), file=sys.stderr)


if __name__ == "__main__":
    main()
