"""PruneX on CNN families it was not tuned on, judged over seeds: keep 1.0 against local SGD
at the same exchange schedule, keep 0.5 against gradual magnitude pruning.

Each family is a timm model created as a user would for Fashion-MNIST (the ``*-fmnist``
workloads of ResNet-10-T, RegNetX, EfficientNet-B0, GhostNet, a ConvNeXt and ConvMixer-64/4),
trained with the workload's recipe (batch 32 per rank, lr 0.05) on 4 ranks as 2 nodes x 2 for
half an epoch, evaluated once at the end. Every arm runs with its defaults, so PruneX and
local SGD average the node every 4 local steps and cross nodes once per round of H steps
alike. Each cell is a ``bench sweep`` over the seeds, so an interrupted measurement goes on
where it stopped.

    python benchmarks/families.py                                  # every family, 3 seeds
    python benchmarks/families.py --workloads convnext-fmnist --seeds 0
    python benchmarks/families.py --smoke           # one tiny cell per arm, temporary folder
    python benchmarks/families.py --table-only      # the table of what is recorded so far

Writes ``families.md`` beside the results: per family and arm the final accuracy (mean +- 95 %
Student t interval over the seeds) and inter-node MB per epoch, and the paired gaps (per-seed
differences, mean +- 95 % interval): PruneX keep 1.0 - localsgd-hier, and PruneX keep 0.5 -
gmp-hier. A gap is a mean over seeds; a family's verdict says whether the keep-1.0 gap lies
within 3 points, or PruneX is ahead or behind by more.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pandas as pd
from runs import SMOKE_DATA, mean_pm, output_folder, run_table, smoke_defaults, sweep

from suite.api import mean_ci

FAMILIES = ("resnet10t-fmnist,regnetx-fmnist,efficientnet-fmnist,ghostnet-fmnist,"
            "convnext-fmnist,convmixer-fmnist")
#: arm label -> the flags that make it
ARMS = {
    "prunex keep 1.0": ["--method", "prunex", "--channel-keep", "1.0"],
    "localsgd-hier": ["--method", "localsgd-hier"],
    "prunex keep 0.5": ["--method", "prunex", "--channel-keep", "0.5"],
    "gmp-hier keep 0.5": ["--method", "gmp-hier", "--channel-keep", "0.5"],
}
#: (arm, baseline): the paired gaps the table reports, and the one the verdict judges
GAPS = (("prunex keep 1.0", "localsgd-hier"), ("prunex keep 0.5", "gmp-hier keep 0.5"))
WITHIN_POINTS = 3.0
#: --smoke: every arm once at the smallest real configuration (2 ranks, synthetic data, the
#: small CNN); flags given with it win
SMOKE = {"workloads": "cnn-fmnist", "seeds": "0", "epochs": "0.25", "gpus": "2",
         "gpus_per_node": "1"}


def slug(label: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", label.lower()).strip("-")


def verdict_words(gap: float) -> str:
    """What a keep-1.0 gap says: within WITHIN_POINTS of local SGD, ahead of it by more, or
    (the failure the benchmark exists for) behind it by more."""
    if abs(gap) <= WITHIN_POINTS:
        return f"within {WITHIN_POINTS:g} points"
    return (f"ahead by more than {WITHIN_POINTS:g} points" if gap > 0
            else f"NOT within {WITHIN_POINTS:g} points: behind")


def paired_gap(table: pd.DataFrame, arm: str, baseline: str) -> tuple[float, float, int]:
    """Mean and 95 % half-width of arm - baseline over the seeds both finished."""
    a = table[table.arm == arm].set_index("seed").accuracy
    b = table[table.arm == baseline].set_index("seed").accuracy
    return mean_ci((a - b).dropna())


def family_section(root: Path, workload: str, arms: list[str]) -> str:
    """One family's part of ``families.md`` from the runs recorded so far: each arm's final
    accuracy over its seeds ("-" where none finished), then the paired gaps with the verdict
    on the first, so a partial measurement still reads.

    Args:
        root: the results folder, one ``<workload>/<arm slug>`` folder per cell.
        workload: the family's workload.
        arms: the arm labels asked for, in order.
    """
    tables = [run_table(root / workload / slug(arm)).assign(arm=arm) for arm in arms
              if (root / workload / slug(arm)).is_dir()]
    table = pd.concat(tables) if tables else pd.DataFrame()
    rows = []
    for arm in arms:
        runs = table[table.arm == arm] if len(table) else table
        mean, half, n = mean_ci(runs.accuracy) if len(runs) else (float("nan"),) * 2 + (0,)
        rows.append({"arm": arm, "seeds": n, "final accuracy %": mean_pm(mean, half, 2),
                     "inter-node MB/epoch": round(runs.inter_MB_per_epoch.mean(), 2)
                     if len(runs) else "-",
                     "exchange (intra / inter)": ", ".join(sorted(set(runs.exchange)))
                     if len(runs) else "-"})
    lines = [f"### {workload}", "", pd.DataFrame(rows).to_markdown(index=False), ""]
    for arm, baseline in GAPS:
        if arm in arms and baseline in arms and len(table):
            mean, half, n = paired_gap(table, arm, baseline)
            verdict = ""
            if (arm, baseline) == GAPS[0] and n:
                verdict = f" ({verdict_words(mean)})"
            lines.append(f"- {arm} - {baseline}: {mean_pm(mean, half, 2)} points over "
                         f"{n} seed(s){verdict}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=FAMILIES)
    parser.add_argument("--arms", default=",".join(ARMS), help="comma list of arm labels")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--epochs", default="0.5")
    parser.add_argument("--gpus", default="4")
    parser.add_argument("--gpus-per-node", default="2")
    parser.add_argument("--results-dir", default=None, help="default: results/families")
    parser.add_argument("--table-only", action="store_true",
                        help="write the table from the runs already recorded; run nothing")
    parser.add_argument("--smoke", action="store_true",
                        help="every arm once on 2 ranks and synthetic data, temporary folder")
    args, passed_on = parser.parse_known_args()  # any other flag goes to every bench sweep
    if args.smoke:
        smoke_defaults(args, SMOKE)
        passed_on = [*SMOKE_DATA, "--local-steps", "2", "--intra-average-period", "1",
                     *passed_on]
    root = output_folder(args.results_dir, "results/families", args.smoke, "families")
    arms = [a for a in args.arms.split(",") if a]
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        parser.error(f"unknown arm(s) {unknown}; known: {', '.join(ARMS)}")
    workloads = [w for w in args.workloads.split(",") if w]
    common = ["--gpus", args.gpus, "--gpus-per-node", args.gpus_per_node, "--epochs",
              args.epochs, "--seed", args.seeds, "--eval-every", "100000", *passed_on]
    for workload in workloads if not args.table_only else ():
        for arm in arms:
            sweep(*ARMS[arm], "--workload", workload, *common,
                  "--results-dir", str(root / workload / slug(arm)))

    sections = []
    for workload in workloads:
        sections.append(family_section(root, workload, arms))
    text = (f"Final accuracy on {args.gpus} ranks ({args.gpus_per_node} per node), "
            f"{args.epochs} epoch, seeds {args.seeds}; mean +- 95 % interval.\n\n"
            + "\n\n".join(sections) + "\n")
    print(text)
    Path(root).mkdir(parents=True, exist_ok=True)
    (Path(root) / "families.md").write_text(text)


if __name__ == "__main__":
    main()
