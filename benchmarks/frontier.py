"""The accuracy-per-byte frontier of PruneX (both readings of its post-freeze phase) against
the pruning baselines and dense local SGD, at several keep fractions.

An *arm* is a method with fixed flags (``prunex (sgd)`` is prunex with ``--after-freeze
sgd``). Every arm and keep gets the same treatment as in fair_comparison.py: the workload's
recipe and shared cosine schedule, BN recalibration before evaluation, a small lr sweep on
seed 0, and the best lr on the other seeds. Nothing is tuned more for one arm than another.

    python benchmarks/frontier.py                                   # the issue's whole grid
    python benchmarks/frontier.py --arms "prunex (sgd)" --keeps 0.5  # one cell of it
    python benchmarks/frontier.py --smoke          # that cell, tiny, in a temporary folder

Cells already recorded are skipped (``bench sweep``), so an interrupted measurement goes on
where it stopped. Writes ``frontier.md`` (accuracy mean +- 95 % interval and inter-node MB per
epoch, with each cell's lr) beside the results and renders the report of the best runs (fig.
12: accuracy against inter-node bytes, with the Pareto frontier).
"""

from __future__ import annotations

import argparse
import re
import shutil
from pathlib import Path

import pandas as pd
from runs import SMOKE_DATA, bench, mean_pm, output_folder, run_table, smoke_defaults, sweep

from suite.api import mean_ci

#: arm label -> the flags that make it
ARMS = {
    "prunex (admm)": ["--method", "prunex", "--after-freeze", "admm"],
    "prunex (sgd)": ["--method", "prunex", "--after-freeze", "sgd"],
    "prunex (sgd; freeze 0.1 ep)": ["--method", "prunex", "--after-freeze", "sgd",
                                    "--freeze-epoch", "0.1"],
    "prunex (sgd; freeze 0.25 ep)": ["--method", "prunex", "--after-freeze", "sgd",
                                     "--freeze-epoch", "0.25"],
    "gmp-hier": ["--method", "gmp-hier"],
    "prune-retrain": ["--method", "prune-retrain"],
    "localsgd-hier": ["--method", "localsgd-hier"],
}
#: arms whose keep does not matter (dense): run at one keep only
DENSE = {"localsgd-hier"}
#: the freeze arms are asked at keep 0.5 only
KEEP_05_ONLY = {"prunex (sgd; freeze 0.1 ep)", "prunex (sgd; freeze 0.25 ep)"}
#: --smoke: one cell at the smallest real configuration (2 rounds of 1 local step on 2
#: ranks, synthetic data); flags given with it win
SMOKE = {"arms": "prunex (sgd)", "keeps": "0.5", "epochs": "0.25", "lrs": "0.05", "seeds": "0",
         "gpus": "2", "gpus_per_node": "1"}


def slug(label: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", label.lower()).strip("-")


def build_parser() -> argparse.ArgumentParser:
    """The grid's flags; any flag not named here goes on to every ``bench sweep``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", default=",".join(ARMS), help="comma list of arm labels")
    parser.add_argument("--keeps", default="0.3,0.5,0.7")
    parser.add_argument("--workload", default="cnn-fmnist")
    parser.add_argument("--epochs", default="1")
    parser.add_argument("--lrs", default="0.025,0.05,0.1")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--gpus", default="4")
    parser.add_argument("--gpus-per-node", default="2")
    parser.add_argument("--results-dir", default=None, help="default: results/frontier")
    parser.add_argument("--smoke", action="store_true",
                        help="one cell (prunex (sgd), keep 0.5) at 2 ranks, 2 rounds on "
                        "synthetic data, into a temporary folder")
    return parser


def arm_keeps(label: str, keeps: list[str]) -> list[str]:
    """The keeps an arm is measured at: a dense arm at the first only (its keep changes
    nothing), the freeze arms at 0.5 only, any other at each of ``keeps``."""
    if label in DENSE:
        keeps = keeps[:1]
    elif label in KEEP_05_ONLY:
        keeps = [k for k in keeps if float(k) == 0.5]
    return keeps


def measure_cell(label: str, keep: str, cell: Path, common: list[str], lrs: list[str],
                 seeds: list[str]) -> dict | None:
    """One arm at one keep, as every cell is treated: the lr sweep on the first seed, then
    the best lr on the other seeds (runs already in ``cell`` are skipped by bench sweep).

    Args:
        cell: the cell's folder (``lr_sweep/`` and ``seeds/`` under it).
        common: the flags every cell shares (workload, layout, budget, passed-on flags).

    Returns:
        The cell's row of frontier.md (with its run folders under ``runs``), or None where
        the lr sweep recorded no run.
    """
    flags = [*ARMS[label], *common]
    if label not in DENSE:
        flags += ["--channel-keep", keep]
    for lr in lrs:
        sweep(*flags, "--lr", lr, "--seed", seeds[0], "--results-dir",
              str(cell / "lr_sweep"))
    swept = run_table(cell / "lr_sweep")
    if swept.empty:
        return None
    best = swept.loc[swept.accuracy.idxmax()]
    if len(seeds) > 1:
        sweep(*flags, "--lr", str(best.lr), "--seed", ",".join(seeds[1:]),
              "--results-dir", str(cell / "seeds"))
    runs = pd.concat([swept[swept.lr == best.lr], run_table(cell / "seeds")])
    mean, half, n = mean_ci(runs.accuracy)
    accuracy = mean_pm(mean, half, 2)
    return {"arm": label, "keep": "dense" if label in DENSE else keep,
            "lr (best of sweep)": best.lr, "seeds": n,
            "final accuracy %": accuracy,
            "inter-node MB/epoch": round(runs.inter_MB_per_epoch.mean(), 2),
            "masks froze after round": runs.frozen_at_round.dropna().tolist() or "",
            "lr sweep (seed 0)": ", ".join(f"{r.lr:g}: {r.accuracy:.2f}"
                                            for r in swept.itertuples()),
            "runs": list(runs.run)}


def write_frontier(root: Path, rows: list[dict]) -> None:
    """Print the cells' table and write it to ``root/frontier.md`` (the run folders left
    out: they are for the report)."""
    table = pd.DataFrame(rows)
    text = table.drop(columns="runs").to_markdown(index=False)
    print(text)
    (root / "frontier.md").write_text(text + "\n")


def report_best(root: Path, rows: list[dict]) -> None:
    """Copy each cell's runs at its best lr into ``root/best`` (afresh) and render their
    report into ``root/report``, so the report sees every arm and keep at its best lr."""
    chosen = root / "best"  # the report sees every arm and keep at its best lr
    shutil.rmtree(chosen, ignore_errors=True)
    for row in rows:
        for run in row["runs"]:
            shutil.copytree(run, chosen / f"{slug(row['arm'])}-k{row['keep']}-{Path(run).name}")
    if rows:
        bench("report", str(chosen), "-o", str(root / "report"))


def main() -> None:
    parser = build_parser()
    args, passed_on = parser.parse_known_args()  # any other flag goes to every bench sweep
    if args.smoke:
        smoke_defaults(args, SMOKE)
        passed_on = [*SMOKE_DATA, "--local-steps", "1", *passed_on]
    root = output_folder(args.results_dir, "results/frontier", args.smoke, "frontier")
    seeds = args.seeds.split(",")
    common = ["--workload", args.workload, "--gpus", args.gpus, "--gpus-per-node",
              args.gpus_per_node, "--epochs", args.epochs, "--bn-recalibrate", "8",
              "--eval-every", "100000", *passed_on]
    unknown = [a for a in args.arms.split(",") if a not in ARMS]
    if unknown:
        parser.error(f"unknown arm(s) {unknown}; known: {', '.join(ARMS)}")
    rows = []
    for label in args.arms.split(","):
        for keep in arm_keeps(label, args.keeps.split(",")):
            row = measure_cell(label, keep, root / slug(label) / f"keep{keep}", common,
                               args.lrs.split(","), seeds)
            if row is not None:
                rows.append(row)
    write_frontier(root, rows)
    report_best(root, rows)


if __name__ == "__main__":
    main()
