"""Simulator vs emulated cluster: predicted and measured time per iteration and per phase.

For each layout (2 nodes x 2 ranks, 4 nodes x 1 rank) and link rate (200 Mbit, 1 Gbit):
calibrate a CPU profile on the emulated cluster (`bench calibrate --network emulated`); then,
for each of prunex, prunex-flat, ddp and topk, re-time the compute on the same ranks
(`--compute-only`) right before and right after the method runs for real (`bench run
--network emulated`), simulate the same run with the mean of the two (`bench sim`), and
print predicted vs measured
seconds per iteration (slowest rank, first iteration dropped: DDP rebuilds its buckets there)
and per phase (mean over ranks).

The per-phase table compares phases as each side books them (``PHASE_NOTE`` says how).

Compute is re-timed next to each run because this machine's speed drifts by 10-25% over
minutes (4 ranks share 2 cores of a VM); a profile calibrated a few minutes earlier carries
that drift into the comparison, and the speed during the run lies between the two bracketing
calibrations more often than at either end. Needs root and iproute2; takes ~40 minutes on 2
cores. Run it alone: anything else on the CPU changes the measured times.

    python benchmarks/validate_sim.py --out benchmarks/results/validation
    python benchmarks/validate_sim.py --smoke    # prunex, 2 nodes x 1 rank at 1 Gbit, 3 rounds

``--hosts 8`` validates at the mission's scale instead: for each rate, ``tools/cluster-up 8
--inter-bw RATE --cpus 8`` (8 SLURM hosts in network namespaces, their links shaped as
``--network emulated`` shapes them), then per layout (8 x 1, 2, 4 and 8 ranks: 8 to 64) a
profile calibrated on those hosts (``bench calibrate --launcher slurm``), each method run
for real (``bench run --launcher slurm``) and simulated with that profile. Compute is not
re-timed around each run there (a 64-rank re-timing is a job of its own); the layout's
calibration, minutes before, stands for it. Needs root; about 90 minutes on 2 cores, and
memory for the calibration: its ranks are interpreters of their own (srun starts one per
rank, about 0.95 GB each), so a 24 GiB machine calibrates 8 and 16 ranks (``--layouts
8x2,8x1``) and was OOM-killed at 32.

    python benchmarks/validate_sim.py --hosts 8 --out benchmarks/results/validation-hosts

``--layouts``, ``--rates`` and ``--methods`` pick part of the grid (``--tabulate-only`` reads
the cells they name); ``--links-from PROFILE`` takes the links from a profile (e.g. the
shipped ``cpu-2x2-1gbit``) instead of calibrating them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import subprocess
import time
from pathlib import Path

import pandas as pd
from runs import bench, only_run, output_folder, smoke_defaults

from suite.api import schema

LAYOUTS = {"2x2": (4, 2), "4x1": (4, 1)}  # nodes x ranks per node: (ranks, ranks per node)
RATES = ("200mbit", "1gbit")
METHODS = {
    "prunex": ["--local-steps", "8", "--iterations", "9"],
    "prunex-flat": ["--local-steps", "8", "--iterations", "9"],
    "ddp": ["--iterations", "60"],
    "topk": ["--iterations", "60"],
}
#: --hosts: 8 hosts of 1, 2, 4 and 8 ranks; 8x2 first, whose intra-node link 8x1 borrows
HOST_LAYOUTS = ("8x2", "8x4", "8x8", "8x1")
#: --hosts: shorter runs (a 64-rank step shares 2 cores with 63 others)
HOST_METHODS = {
    "prunex": ["--local-steps", "4", "--iterations", "4"],
    "prunex-flat": ["--local-steps", "4", "--iterations", "4"],
    "ddp": ["--iterations", "12"],
    "topk": ["--iterations", "12"],
}
#: --hosts: the calibration's buffer sizes and compute steps
HOST_CALIBRATION = ["--sizes", "4096,262144,4194304,16777216", "--steps", "10",
                    "--block-repeats", "2"]
REPO = Path(__file__).resolve().parent.parent
#: how compute is re-timed next to each run
RETIME = ["--steps", "10", "--sync-blocks", "1,2,4,8"]
#: --smoke: one cell, 3 rounds of 2 local steps on small synthetic data, 2 nodes of 1 rank
#: at 1 Gbit, the links of the shipped profile of that rate; flags given with it win
SMOKE = {"layouts": "2x1", "rates": "1gbit", "methods": "prunex", "links_from": "cpu-2x2-{rate}"}
SMOKE_METHODS = {"prunex": ["--local-steps", "2", "--iterations", "3"]}
SMOKE_RUN = ["--dataset", "synthetic", "--synthetic-size", "256,64"]
SMOKE_RETIME = ["--steps", "2", "--sync-blocks", "1,2", "--block-repeats", "1"]
PHASE_NOTE = """A real collective also holds the wait for the slowest rank (the first one after
the local steps absorbs the ranks' drift), which the simulator books apart as `straggler_wait`;
so the like-for-like row is `sync`, every collective phase plus that wait. DDP's real
`local_compute` includes the part of its bucket all-reduces that backward does not hide (the
simulator's is compute alone, the exposure is in its iteration total)."""
COLLECTIVES = ("intra_allreduce", "mask_sync", "inter_allreduce", "broadcast", "intra_allgather",
               "allreduce", "allgather")


def timings(folder: Path) -> dict[str, float]:
    rows = pd.read_parquet(folder / "iterations.parquet")
    rows = rows[rows[schema.ITERATION] > 0]
    out = {"iteration": float(rows.groupby(schema.ITERATION)[schema.T_ITERATION].max().mean())}
    for column in schema.phase_columns(rows.columns):
        out[column.removeprefix(schema.PHASE_PREFIX)] = float(rows[column].fillna(0.0).mean())
    out["sync"] = sum(out.get(p, 0.0) for p in (*COLLECTIVES, "straggler_wait"))
    return out


def average_compute(before: Path, after: Path, out: Path) -> None:
    """``before`` with every compute number replaced by its mean with ``after``'s."""
    first, second = (json.loads(p.read_text()) for p in (before, after))
    one, two = first["compute"], second["compute"]
    for key in ("backward_fraction", "overlap_efficiency"):
        one[key] = (one[key] + two[key]) / 2
    for name, step in one["steps"].items():
        other = two["steps"][name]
        for key in ("seconds", "forward_s", "backward_s", "optimizer_s", "jitter_s"):
            step[key] = (step[key] + other[key]) / 2
        for key in ("sync_wait_s", "block_step_s"):
            step[key] = [[k, (x + y) / 2] for (k, x), (_, y) in zip(step[key], other[key])]
        step["source"] = f"mean of calibrations before and after the run; {step['source']}"
    out.write_text(json.dumps(first, indent=1))


def layout_ranks(layout: str) -> tuple[int, int]:
    """``NxP`` (N nodes of P ranks) as (ranks, ranks per node)."""
    if layout in LAYOUTS:
        return LAYOUTS[layout]
    nodes, per_node = (int(n) for n in layout.split("x"))
    return nodes * per_node, per_node


def measure(out: Path, grid: dict, smoke: bool = False) -> None:
    """Calibrate, run and simulate every cell into ``out/runs/<layout>-<rate>/<method>``."""
    retime_steps = SMOKE_RETIME if smoke else RETIME
    run_only = SMOKE_RUN if smoke else []
    for rate in grid["rates"]:
        for layout in grid["layouts"]:
            gpus, per_node = layout_ranks(layout)
            emulated = ["--network", "emulated", "--inter-bw", rate, "--gpus", str(gpus),
                        "--gpus-per-node", str(per_node)]
            if grid["links_from"]:
                links = grid["links_from"].format(rate=rate)
            else:
                links = out / "profiles" / f"cpu-{layout}-{rate}.json"
                calibrate = ["calibrate", *emulated, "--name", links.stem, "-o", str(links),
                             "--sizes", "4096,65536,1048576,4194304,16777216",
                             "--steps", "40"]
                if per_node == 1:  # no intra-node link to measure: take the 2x2 one
                    calibrate += ["--links-from", str(out / "profiles" / f"cpu-2x2-{rate}.json")]
                bench(*calibrate)
            for method in grid["methods"]:
                extra = (SMOKE_METHODS if smoke else METHODS)[method]
                cell = out / "runs" / f"{layout}-{rate}" / method
                shutil.rmtree(cell, ignore_errors=True)
                profile = cell / "profile.json"
                retime = ["calibrate", *emulated, "--compute-only", "--links-from", str(links),
                          *retime_steps, "--name",
                          f"{Path(str(links)).stem}-{method}"]
                common = ["--method", method, "--workload", "cnn-fmnist", "--gpus", str(gpus),
                          "--gpus-per-node", str(per_node), *extra]
                bench(*retime, "-o", str(cell / "before.json"))
                bench("run", *common, *run_only, "--network", "emulated", "--inter-bw", rate,
                      "--eval-every", "1000", "--results-dir", str(cell / "real"))
                bench(*retime, "-o", str(cell / "after.json"))
                average_compute(cell / "before.json", cell / "after.json", profile)
                bench("sim", *common, "--profile", str(profile), "--replay", "1000",
                      "--results-dir", str(cell / "sim"))
                measured = timings(only_run(cell / "real"))["iteration"]
                predicted = timings(only_run(cell / "sim"))["iteration"]
                print(f"{layout} {rate} {method}: measured {measured:.3f} s, "
                      f"predicted {predicted:.3f} s", flush=True)


@contextlib.contextmanager
def hosts_up(hosts: int, rate: str, cpus: int):
    """``tools/cluster-up hosts --inter-bw rate --cpus cpus`` for the block; down after it."""
    subprocess.run([REPO / "tools" / "cluster-down"], capture_output=True)
    up = subprocess.run([REPO / "tools" / "cluster-up", str(hosts), "--inter-bw", rate,
                         "--cpus", str(cpus)], capture_output=True, text=True)
    if up.returncode != 0:
        raise SystemExit(f"tools/cluster-up failed: {up.stderr.strip()}")
    print(up.stdout.strip(), flush=True)
    try:
        yield
    finally:
        subprocess.run([REPO / "tools" / "cluster-down"], capture_output=True)


def wait_for_queue(limit: float = 1800) -> None:
    """Until SLURM's queue is empty (a ``bench run --launcher slurm`` returns once submitted)."""
    end = time.monotonic() + limit
    while subprocess.run(["squeue", "-h"], capture_output=True, text=True).stdout.strip():
        if time.monotonic() > end:
            raise SystemExit(f"SLURM jobs still queued after {limit:.0f} s")
        time.sleep(2)


def donor(profiles: Path, rate: str) -> str:
    """A profile calibrated on the hosts at ``rate`` with 2+ ranks a host (this pass's or an
    earlier one's), whose intra-node link a layout of 1 rank a host borrows."""
    for path in sorted(profiles.glob(f"hosts-*-{rate}.json")):
        if layout_ranks(path.stem.split("-")[1])[1] > 1:
            return str(path)
    raise SystemExit(f"no profile of 2+ ranks a host at {rate} under {profiles}: put such a "
                     "layout before 8x1, or give --links-from")


def measure_on_hosts(out: Path, grid: dict, hosts: int) -> None:
    """Calibrate on the hosts, run and simulate every cell into
    ``out/runs/<layout>-<rate>/<method>`` (``--hosts``)."""
    layouts = [layout_ranks(layout) + (layout,) for layout in grid["layouts"]]
    if any(gpus // per_node > hosts for gpus, per_node, _ in layouts):
        raise SystemExit(f"a layout needs more than the {hosts} hosts")
    cpus = max(per_node for _, per_node, _ in layouts)
    for rate in grid["rates"]:
        with hosts_up(hosts, rate, cpus):
            profiles = out / "profiles"
            for gpus, per_node, layout in layouts:
                shape = ["--gpus", str(gpus), "--gpus-per-node", str(per_node)]
                links = profiles / f"hosts-{layout}-{rate}.json"
                calibrate = ["calibrate", "--launcher", "slurm", *shape, "--device", "cpu",
                             "--workload", "cnn-fmnist", "--name", links.stem, "-o",
                             str(links), *HOST_CALIBRATION]
                if per_node == 1:  # no intra-node link to measure: another layout's
                    calibrate += ["--links-from", grid["links_from"] or donor(profiles, rate)]
                profiles.mkdir(parents=True, exist_ok=True)
                started = time.monotonic()
                bench(*calibrate)
                print(f"{layout} {rate}: calibrated in {time.monotonic() - started:.0f} s",
                      flush=True)
                for method in grid["methods"]:
                    cell = out / "runs" / f"{layout}-{rate}" / method
                    shutil.rmtree(cell, ignore_errors=True)
                    common = ["--method", method, "--workload", "cnn-fmnist", *shape,
                              *HOST_METHODS[method]]
                    started = time.monotonic()
                    bench("run", *common, "--launcher", "slurm", "--device", "cpu",
                          "--slurm-cpus-per-task", str(per_node), "--eval-every", "1000",
                          "--results-dir", str(cell / "real"))
                    wait_for_queue()
                    real = only_run(cell / "real")
                    status = json.loads((real / "summary.json").read_text())[schema.STATUS]
                    if status != schema.Status.OK:
                        raise SystemExit(f"{real}: {status}")
                    bench("sim", *common, "--profile", str(links), "--replay", "1000",
                          "--results-dir", str(cell / "sim"))
                    measured = timings(real)["iteration"]
                    predicted = timings(only_run(cell / "sim"))["iteration"]
                    print(f"{layout} {rate} {method}: measured {measured:.3f} s, predicted "
                          f"{predicted:.3f} s ({time.monotonic() - started:.0f} s)", flush=True)


def same_order(per_iteration: pd.DataFrame) -> pd.DataFrame:
    """Per layout and rate: whether the methods rank the same by measured and by predicted
    seconds per iteration."""
    rows = []
    for (layout, rate), cell in per_iteration.groupby(["layout", "rate"], sort=False):
        measured = list(cell.sort_values("measured_ms")[schema.METHOD])
        predicted = list(cell.sort_values("predicted_ms")[schema.METHOD])
        rows.append({"layout": layout, "rate": rate, "measured order": " < ".join(measured),
                     "predicted order": " < ".join(predicted),
                     "same": "yes" if measured == predicted else "no"})
    return pd.DataFrame(rows)


def tabulate(out: Path, grid: dict) -> None:
    """validation.csv and validation.md from the cells' run folders under ``out/runs``."""
    records = []
    for rate in grid["rates"]:
        for layout in grid["layouts"]:
            for method in grid["methods"]:
                cell = out / "runs" / f"{layout}-{rate}" / method
                if not (cell / "real").is_dir() or not (cell / "sim").is_dir():
                    continue
                measured = timings(only_run(cell / "real"))
                predicted = timings(only_run(cell / "sim"))
                for phase in sorted(measured.keys() | predicted.keys()):
                    records.append(
                        {
                            "layout": layout,
                            "rate": rate,
                            schema.METHOD: method,
                            "phase": phase,
                            "measured_ms": 1e3 * measured.get(phase, float("nan")),
                            "predicted_ms": 1e3 * predicted.get(phase, 0.0),
                        }
                    )
    if not records:
        raise SystemExit(f"no measured cells under {out / 'runs'}")
    table = pd.DataFrame(records)
    table["error_%"] = 100 * (table.predicted_ms - table.measured_ms) / table.measured_ms
    table.to_csv(out / "validation.csv", index=False)
    per_iteration = table[table.phase == "iteration"].drop(columns="phase")
    phases = table[table.phase != "iteration"]
    order = same_order(per_iteration)
    text = ["## Time per iteration", per_iteration.to_markdown(index=False, floatfmt=".1f"),
            "", "## The methods' order by time", order.to_markdown(index=False),
            "", "## Per phase (mean over ranks)", "", PHASE_NOTE, "",
            phases.to_markdown(index=False, floatfmt=".1f")]
    (out / "validation.md").write_text("\n".join(text) + "\n")
    print("\n".join(text))
    worst = per_iteration["error_%"].abs().max()
    within = int((per_iteration["error_%"].abs() <= 15).sum())
    print(json.dumps({"worst_iteration_error_%": round(float(worst), 1),
                      "cells_within_15%": f"{within}/{len(per_iteration)}",
                      "same_order": f"{int((order.same == 'yes').sum())}/{len(order)}"}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="default: benchmarks/results/validation")
    parser.add_argument(
        "--tabulate-only", action="store_true", help="rebuild the tables from the cells on disk"
    )
    parser.add_argument("--layouts", default=None,
                        help="comma list of NxP: N nodes of P ranks (default: 2x2,4x1; "
                        "with --hosts: 8x2,8x4,8x8,8x1)")
    parser.add_argument("--hosts", type=int, default=None,
                        help="validate on this many SLURM hosts of tools/cluster-up (needs "
                        "root) instead of the local launcher's emulated nodes")
    parser.add_argument("--rates", default=",".join(RATES), help="comma list of link rates")
    parser.add_argument("--methods", default=",".join(METHODS), help="comma list")
    parser.add_argument("--links-from", default=None,
                        help="take the links from this profile (name or file; {rate} is "
                        "replaced by the rate) instead of calibrating them")
    parser.add_argument("--smoke", action="store_true",
                        help="prunex alone on 2 nodes x 1 rank at 1gbit with the shipped "
                        "profile's links, 3 rounds on small synthetic data, compute re-timed "
                        "briefly; into a temporary folder")
    args = parser.parse_args()
    if args.smoke:
        smoke_defaults(args, SMOKE)
    layouts = args.layouts or ",".join(HOST_LAYOUTS if args.hosts else LAYOUTS)
    grid = {"layouts": layouts.split(","), "rates": args.rates.split(","),
            "methods": args.methods.split(","), "links_from": args.links_from}
    known = SMOKE_METHODS if args.smoke else METHODS
    unknown = set(grid["methods"]) - set(known)
    if unknown:
        parser.error(f"unknown method(s) {sorted(unknown)}; known: {', '.join(known)}")
    out = output_folder(args.out, "benchmarks/results/validation", args.smoke, "validate-sim")
    if args.tabulate_only:
        pass
    elif args.hosts:
        measure_on_hosts(out, grid, args.hosts)
    else:
        measure(out, grid, smoke=args.smoke)
    tabulate(out, grid)


if __name__ == "__main__":
    main()
