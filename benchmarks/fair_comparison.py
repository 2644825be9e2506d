"""At equal accuracy, how much less does PruneX send between nodes than the alternatives?

Every method runs the same workload, ranks, epochs and shared lr schedule (the recipe's
cosine with warmup), evaluated the same way (BN statistics recalibrated on the same training
batches). PruneX and hierarchical local SGD run at one exchange schedule: the model averaged
inside a node every ``--intra-average-period`` local steps (4) and across nodes once per round
of ``--local-steps`` H; the table's exchange column says each method's (local steps between
exchanges inside a node / across nodes), so a pairing at unequal schedules shows. Each
method gets the same small lr sweep on seed 0; its best lr by final accuracy then runs the
remaining seeds. No method is tuned more than another.

    python benchmarks/fair_comparison.py                      # the issue's full setting
    python benchmarks/fair_comparison.py --epochs 0.5 --seeds 0,1 --methods prunex,ddp
    python benchmarks/fair_comparison.py --workload resnet18-fmnist --methods localsgd-hier,prunex \
        --lrs 0.05 --seeds 0 --epochs 0.1 --local-steps 4 --warmup-epochs 0.01
    python benchmarks/fair_comparison.py --smoke              # prunex alone, tiny, in a temp folder

Flags the script does not know (``--local-steps 4``) go to every ``bench sweep`` as they are.

Prints (and writes ``fair_comparison.md`` beside the results) the table of final accuracy
mean +- 95 % interval and inter-node MB per epoch, with the lr each method used; then renders
the report (fig. 5: accuracy vs cumulative inter-node bytes). A cell already recorded is
skipped (``bench sweep``), so an interrupted measurement continues where it stopped.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import pandas as pd
from runs import SMOKE_DATA, bench, mean_pm, output_folder, run_table, smoke_defaults, sweep

from suite.api import mean_ci

METHODS = "ddp,localsgd-hier,prunex,prunex-flat,gmp-hier,prune-retrain,topk,powersgd"
#: --smoke: the smallest real configuration (2 rounds of 1 local step on 2 ranks, synthetic
#: data); flags given with it win
SMOKE = {"methods": "prunex", "gpus": "2", "gpus_per_node": "1", "epochs": "0.25",
         "lrs": "0.05", "seeds": "0", "device": "cpu"}


def accuracy_table(final: pd.DataFrame, methods: list[str], best: pd.Series) -> str:
    """The markdown table of each method that finished, in ``--methods`` order: its final
    accuracy over the seeds at its best lr (mean +- 95 % interval), with what it sent across
    nodes and its exchange schedule, so a pairing at unequal schedules shows.

    Args:
        final: the runs at each method's best lr (seed 0's from the sweep, then the others).
        methods: the methods asked for, in order.
        best: each method's best lr of the seed-0 sweep.
    """
    rows = []
    for method in [m for m in methods if m in set(final.method)]:
        group = final[final.method == method]
        mean, half, n = mean_ci(group.accuracy)
        rows.append({"method": method, "lr (best of sweep)": best[method], "seeds": n,
                     "final accuracy %": mean_pm(mean, half, 2),
                     "inter-node MB/epoch": round(group.inter_MB_per_epoch.mean(), 2),
                     "samples/rank": int(group.samples_per_rank.mean()),
                     "exchange (intra / inter)": ", ".join(sorted(set(group.exchange)))})
    return pd.DataFrame(rows).to_markdown(index=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default=METHODS)
    parser.add_argument("--workload", default="cnn-fmnist")
    parser.add_argument("--gpus", default="4")
    parser.add_argument("--gpus-per-node", default="2")
    parser.add_argument("--epochs", default="3")
    parser.add_argument("--lrs", default="0.025,0.05,0.1", help="the lr sweep, on seed 0")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--channel-keep", default="0.5")
    parser.add_argument("--bn-recalibrate", default="8")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--results-dir", default=None, help="default: results/fair_comparison")
    parser.add_argument("--smoke", action="store_true",
                        help="the smallest real configuration: prunex, 2 ranks, 2 rounds on "
                        "synthetic data, into a temporary folder")
    args, passed_on = parser.parse_known_args()  # any other flag goes to every bench sweep
    if args.smoke:
        smoke_defaults(args, SMOKE)
        passed_on = [*SMOKE_DATA, "--local-steps", "1", *passed_on]
    root = output_folder(args.results_dir, "results/fair_comparison", args.smoke, "fair")
    common = ["--workload", args.workload, "--gpus", args.gpus, "--gpus-per-node",
              args.gpus_per_node, "--epochs", args.epochs, "--channel-keep", args.channel_keep,
              "--bn-recalibrate", args.bn_recalibrate, "--device", args.device,
              "--eval-every", "100000", *passed_on]
    methods = args.methods.split(",")
    seeds = args.seeds.split(",")
    for method in methods:  # the lr sweep, seed 0
        for lr in args.lrs.split(","):
            sweep("--method", method, "--lr", lr, "--seed", seeds[0], *common,
                  "--results-dir", str(root / "lr_sweep"))
    swept = run_table(root / "lr_sweep")
    best = swept.loc[swept.groupby("method").accuracy.idxmax()].set_index("method").lr
    for method in methods:  # the other seeds at the method's best lr
        if method in best and len(seeds) > 1:
            sweep("--method", method, "--lr", str(best[method]), "--seed",
                  ",".join(seeds[1:]), *common, "--results-dir", str(root / "seeds"))
    final = pd.concat(
        [
            swept.merge(best.reset_index(), on=["method", "lr"]),
            run_table(root / "seeds"),
        ]
    )
    table = accuracy_table(final, methods, best)
    lr_table = swept.pivot_table(index="method", columns="lr", values="accuracy").round(2)
    lr_table = lr_table.reindex([m for m in methods if m in lr_table.index])
    text = f"{table}\n\nlr sweep (seed {seeds[0]}, final accuracy %):\n\n{lr_table.to_markdown()}\n"
    print(text)
    (root / "fair_comparison.md").write_text(text)
    chosen = root / "best"  # the report sees each method at its best lr only
    shutil.rmtree(chosen, ignore_errors=True)
    for run in final.run:
        shutil.copytree(run, chosen / Path(run).name)
    bench("report", str(chosen), "-o", str(root / "report"))


if __name__ == "__main__":
    main()
