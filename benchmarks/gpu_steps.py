"""A short measurement of every method on a GPU machine: resnet18-cifar10 on synthetic data,
seconds per local step by phase, iteration 0 against the rest, samples per second per rank,
setup seconds, and PruneX's overhead ratio over localsgd-hier (benchmarks/prunex_overhead.py).

Layouts (``--layout``): ``nccl``, one rank per visible GPU on NCCL (the real thing, one rank
if there is one GPU), and ``shared``, 2 nodes x 2 ranks sharing the GPUs round-robin (gloo:
collectives through the host, timings not representative of a cluster, but every
hierarchical path runs). ``nox -s gpu -- --part 3`` and ``--part 4`` run one layout each and
write the markdown to benchmarks/measured/.

    python benchmarks/gpu_steps.py --layout nccl -o benchmarks/measured/gpu_steps_h100_nccl.md
    python benchmarks/gpu_steps.py --smoke    # prunex and localsgd-hier, 2 iterations, NCCL
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import pandas as pd
import torch
from prunex_overhead import PRUNEX_WORK, overhead_ratio
from runs import finished_runs, smoke_defaults, sweep

from suite.api import schema

ALL_METHODS = (
    "prunex,prunex-flat,ddp,ddp-bf16,ddp-fp16,powersgd,topk,topk-hier,localsgd-hier,"
    "gmp-hier,prune-retrain"
)
#: --smoke: the overhead ratio's two methods, 2 iterations on small synthetic data, NCCL
#: layout; flags given with it win
SMOKE = {"methods": "prunex,localsgd-hier", "iterations": "2", "layout": "nccl"}
SMOKE_DATA = ["--synthetic-size", "256,64", "--batch-size", "16"]


#: the table's column of each run's rank count (what bytes could move between)
RANKS = "ranks"
#: seconds one layout's sweep may take before it is stopped (its rows kept, the part failed)
SWEEP_TIMEOUT = 420


def describe(root: Path) -> pd.DataFrame:
    """One row per run: status, backend, times; ``later`` means leave out the one-off
    iterations (each attempt's first, DDP's bucket rebuild, PowerSGD's first compressed step),
    as the summary's means do; what ``problems`` judges (bytes per iteration, the longest
    phase against its iteration)."""
    rows = []
    for path in sorted(root.rglob("summary.json")):
        run = path.parent
        summary = json.loads(path.read_text())
        manifest = json.loads((run / "manifest.json").read_text())
        if summary.get(schema.STATUS) != schema.Status.OK:
            rows.append({schema.METHOD: summary[schema.METHOD],
                         schema.STATUS: summary.get(schema.STATUS),
                         schema.ERROR: summary.get(schema.ERROR, "failed")})
            continue
        table = pd.read_parquet(run / "iterations.parquet")
        steps = manifest[schema.STEPS_PER_ITERATION]
        later = table[~table[schema.ONE_OFF].astype(bool)] if schema.ONE_OFF in table else \
            table[table[schema.ITERATION] > 0]
        moved = (table.get(schema.BYTES_INTRA, 0) + table.get(schema.BYTES_INTER, 0)).groupby(
            table[schema.ITERATION]).sum()
        phases = schema.phase_columns(table)
        seconds = table[schema.T_ITERATION]
        longest = (table[phases].max(axis=1) / seconds).max() if phases else 0.0
        first = seconds[table[schema.ITERATION] == 0].mean()
        row = {
            schema.METHOD: summary[schema.METHOD],
            schema.STATUS: summary[schema.STATUS],
            schema.BACKEND: manifest[schema.BACKEND],
            RANKS: summary[schema.GPUS],
            # None where no byte moved: nothing to compare (one rank has no peer to send to)
            "bytes min / max": moved.min() / moved.max() if moved.max() else None,
            "longest phase / iteration": longest,
            "warm-up s": summary.get(schema.WARMUP_SECONDS),
            "iteration 0 s": first,
            "later iterations s": later[schema.T_ITERATION].mean(),
            "iteration 0 / median": first / later[schema.T_ITERATION].median(),
            "s per local step": later[schema.T_ITERATION].mean() / steps,
            "samples/s per rank": summary.get(schema.SAMPLES_PER_SECOND_PER_RANK),
            "setup s": summary.get(schema.SETUP_SECONDS),
            "connect s": summary.get(schema.CONNECT_SECONDS),
        }
        for column in sorted(schema.phase_columns(later)):
            row[f"{column.removeprefix(schema.PHASE_PREFIX)} s/step"] = later[column].mean() / steps
        rows.append(row)
    return pd.DataFrame(rows)


def problems(table: pd.DataFrame, methods: list[str], layout: str) -> list[str]:
    """What makes a layout's measurement wrong rather than slow: a method missing or failed,
    the NCCL layout on another backend, PowerSGD never compressing (every iteration moved as
    many bytes, or none where ranks had peers), a phase longer than its iteration (a span
    that did not end). Compression is judged only where bytes could move: one rank (part 3
    on a one-GPU machine) sends none, which is no finding."""
    found = []
    seen = set(table[schema.METHOD]) if schema.METHOD in table else set()
    found += [f"{m}: no run" for m in methods if m not in seen]
    for row in table.to_dict("records"):
        method = row[schema.METHOD]
        if row.get(schema.STATUS) != schema.Status.OK:
            found.append(f"{method}: {row.get(schema.STATUS)}: {row.get(schema.ERROR)}")
            continue
        if layout == "nccl" and row[schema.BACKEND] != "nccl":
            found.append(f"{method}: ran on {row[schema.BACKEND]}, not NCCL")
        if method == "powersgd":
            found += compression_problems(row)
        if row["longest phase / iteration"] > 1.01:
            found.append(f"{method}: a phase lasted {row['longest phase / iteration']:.2f}x its "
                         "iteration")
    return found


def compression_problems(row: dict) -> list[str]:
    """PowerSGD's finding in one row of ``describe``: none on one rank (no peer, no byte),
    "moved no byte" on several, "never compressed" where every iteration moved as many."""
    ratio = row["bytes min / max"]
    if row[RANKS] <= 1:
        return []
    if ratio is None or pd.isna(ratio):
        return [f"powersgd: moved no byte on {row[RANKS]} ranks"]
    if ratio > 0.9:
        return ["powersgd: never compressed (every iteration moved the dense bytes)"]
    return []


def check_recorded(root: Path, methods: list[str], layout: str) -> None:
    """The part's checks on a sweep already recorded in ``root`` (a part's table re-judged,
    or a planted fault shown to fail): its rows, then exit 1 with the findings."""
    if layout not in ("nccl", "shared"):
        raise SystemExit("--check-results judges one layout: --layout nccl or shared")
    table = describe(root)
    print(table.to_markdown(index=False, floatfmt=".4g") if len(table) else "no run")
    found = problems(table, methods, layout)
    if found:
        raise SystemExit(f"{len(found)} check(s) failed: {'; '.join(found)}")
    print("every method ran and ended ok, as the layout says")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="resnet18-cifar10")
    parser.add_argument("--iterations", default="6")
    parser.add_argument("--methods", default=ALL_METHODS)
    parser.add_argument("--layout", choices=["nccl", "shared", "both"], default="both")
    parser.add_argument("-o", "--output", default=None)
    parser.add_argument("--smoke", action="store_true",
                        help="prunex and localsgd-hier, 2 iterations on small synthetic data, "
                        "one rank per GPU")
    parser.add_argument("--check-results", metavar="DIR", default=None,
                        help="no measuring: the checks of --layout (nccl or shared) on the "
                        "runs already in DIR (exit 1 on any finding)")
    args = parser.parse_args()
    if args.smoke:
        smoke_defaults(args, SMOKE)
    if args.check_results:
        check_recorded(Path(args.check_results), args.methods.split(","), args.layout)
    else:
        measure(args)


def common_flags(args) -> list[str]:
    """The ``bench sweep`` flags every layout shares: synthetic data on CUDA, no evaluation
    inside the short run, and PowerSGD compressing early enough to be measured (the smoke
    run's small data added under ``--smoke``)."""
    return [
        "--workload",
        args.workload,
        "--dataset",
        "synthetic",
        "--device",
        "cuda",
        "--iterations",
        args.iterations,
        "--local-steps",
        "4",
        "--eval-every",
        "100000",
        # PowerSGD compresses within the run (its default starts at iteration 10)
        "--start-powersgd-iter",
        "2",
        *(SMOKE_DATA if args.smoke else []),
    ]


def layout_flags(layout: str, gpus: int) -> dict[str, list[str]]:
    """{section title: its ``--gpus`` flags} of each layout ``--layout`` asks for, NCCL
    first: the order the sections are measured and written in."""
    layouts = {}
    if layout in ("nccl", "both"):
        layouts[f"{gpus} rank(s), one per GPU (NCCL)"] = ["--gpus", str(gpus)]
    if layout in ("shared", "both"):
        layouts["2 nodes x 2 ranks sharing the GPUs (gloo)"] = ["--gpus", "4", "--gpus-per-node",
                                                                "2"]
    return layouts


def measure(args) -> None:
    """Every method of ``args.methods`` in each layout asked for, on this machine's GPUs:
    the tables, their checks and PruneX's overhead ratio (exit 1 on any finding)."""
    gpus = torch.cuda.device_count()
    if not gpus:
        raise SystemExit("no CUDA device: this measurement is for a GPU machine")
    common = common_flags(args)
    layouts = layout_flags(args.layout, gpus)
    name = torch.cuda.get_device_name(0)
    sections = [f"# Every method on {name} x {gpus}", "",
                f"`{' '.join(common)}`; seconds are means over ranks and iterations "
                "after the first; phases overlap where the method overlaps them (DDP).",
                f"PruneX's work phases: {', '.join(PRUNEX_WORK)}.", ""]
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        for (title, layout), kind in zip(layouts.items(), [k for k in ("nccl", "shared")
                                                          if args.layout in (k, "both")]):
            root = Path(tmp) / str(len(sections))
            code = sweep("--method", args.methods, *common, *layout, "--results-dir",
                         str(root), timeout=SWEEP_TIMEOUT)
            table = describe(root)
            found = problems(table, args.methods.split(","), kind)
            if code == 124:
                found.insert(0, f"the sweep ran past {SWEEP_TIMEOUT} s and was stopped")
            failed += found
            sections += [f"## {title}", "", table.to_markdown(index=False, floatfmt=".4g")
                         if len(table) else "no run", ""]
            sections += ["Checks: " + ("; ".join(found) if found else "every method ran and "
                                       "ended ok, as the layout says"), ""]
            runs = {summary[schema.METHOD]: run for run, summary, _ in finished_runs(root)}
            if {"prunex", "localsgd-hier"} <= set(runs):
                ratio = overhead_ratio(runs["prunex"], runs["localsgd-hier"])
                sections += [f"PruneX overhead ratio over localsgd-hier: **{ratio:.3f}**", ""]
    text = "\n".join(sections)
    print(text)
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(text + "\n")
    if failed:
        raise SystemExit(f"{len(failed)} check(s) failed: {'; '.join(failed)}")


if __name__ == "__main__":
    main()
