"""Is PruneX's accuracy gap the price of its sparsity, or of ADMM? The capacity control.

For every PruneX run in a results folder (by default the best-lr runs of
``benchmarks/fair_comparison.py``), two runs with the same workload, ranks, seed, lr, schedule
and sample budget, on the same hierarchical local-SGD optimizer (``prune-retrain``):

  masks-from   trained from round 0 on that PruneX run's final masks (``--masks-from``):
               the capacity of the architecture PruneX found, without ADMM
  all-ones     ``--prune-at 1``: never pruned, the dense control of the same optimizer

If masks-from reaches PruneX's accuracy, the sparse network is as good as ADMM makes it and
any gap to all-ones is capacity; if it beats PruneX, ADMM costs accuracy at this budget.

    python benchmarks/capacity_control.py                         # after fair_comparison.py
    python benchmarks/capacity_control.py --prunex-runs results/x --results-dir results/cap
    python benchmarks/capacity_control.py --smoke      # tiny: a PruneX run of its own if needed

Prints (and writes ``capacity_control.md`` beside the results) accuracy mean +- 95 % interval
per arm. Cells already recorded are skipped (``bench sweep``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd
from runs import SMOKE_DATA, SMOKE_RANKS, bench, finished_runs, mean_pm, output_folder, sweep

from suite.api import mean_ci


def same_setting(manifest: dict) -> list[str]:
    """The flags that repeat a PruneX run's workload, ranks, recipe, round length and keep
    targets (its seed aside)."""
    config, recipe = manifest["config"], manifest["recipe"]
    flags = ["--workload", config["workload"], "--gpus", str(config["gpus"]),
             "--gpus-per-node", str(config["gpus_per_node"]),
             "--epochs", str(config["epochs"] or recipe["epochs"]), "--lr", str(recipe["lr"]),
             "--lr-schedule", recipe["lr_schedule"], "--warmup-epochs",
             str(recipe["warmup_epochs"]), "--batch-size", str(recipe["batch_size"]),
             "--bn-recalibrate", str(config.get("bn_recalibrate", 0)),
             "--device", config.get("device", "auto"), "--eval-every", "100000"]
    if config.get("dataset"):
        flags += ["--dataset", config["dataset"]]
    if config.get("dataset") == "synthetic" and config.get("synthetic_size"):
        flags += ["--synthetic-size", ",".join(map(str, config["synthetic_size"]))]
    settings = manifest.get("method_settings", {})
    for key in ("filter_keep", "channel_keep", "shape_keep", "local_steps", "local_epochs"):
        if settings.get(key) is not None:
            flags += [f"--{key.replace('_', '-')}", str(settings[key])]
    return flags


def final_density(folder: Path) -> float:
    """The structured density of the run's last round."""
    return pd.read_parquet(folder / "iterations.parquet").density.dropna().iloc[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prunex-runs", default=None,
                        help="default: results/fair_comparison/best")
    parser.add_argument("--results-dir", default=None, help="default: results/capacity_control")
    parser.add_argument("--smoke", action="store_true",
                        help="the smallest real configuration (synthetic data, 2 ranks, 2 "
                        "rounds) into a temporary folder; without --prunex-runs, one tiny "
                        "PruneX run of its own first")
    args = parser.parse_args()
    root = output_folder(args.results_dir, "results/capacity_control", args.smoke, "capacity")
    if args.prunex_runs is None:
        args.prunex_runs = str(root / "prunex") if args.smoke else "results/fair_comparison/best"
        if args.smoke and not any(finished_runs(Path(args.prunex_runs), "prunex")):
            bench("run", "--method", "prunex", *SMOKE_DATA, *SMOKE_RANKS, "--epochs", "0.25",
                  "--local-steps", "1", "--eval-every", "100000",
                  "--results-dir", args.prunex_runs)
    prunex = list(finished_runs(Path(args.prunex_runs), "prunex"))
    if not prunex:
        sys.exit(f"no finished prunex run under {args.prunex_runs}: run fair_comparison.py first")
    rows = []
    for folder, summary, manifest in prunex:
        flags = [*same_setting(manifest), "--seed", str(summary["seed"])]
        arms = {"masks-from": ["--masks-from", str(folder)], "all-ones": ["--prune-at", "1"]}
        rows.append({"arm": "prunex (z)", "seed": summary["seed"],
                     "accuracy": 100 * summary["final_accuracy"],
                     "density": final_density(folder)})
        for arm, extra in arms.items():
            out = root / arm
            sweep("--method", "prune-retrain", *flags, *extra, "--results-dir", str(out))
            for run, s, m in finished_runs(out, "prune-retrain"):
                same_lr = m["recipe"]["lr"] == manifest["recipe"]["lr"]
                if s["seed"] == summary["seed"] and same_lr:
                    rows.append({"arm": arm, "seed": s["seed"],
                                 "accuracy": 100 * s["final_accuracy"],
                                 "density": final_density(run)})
    table = []
    frame = pd.DataFrame(rows).drop_duplicates(["arm", "seed"])
    for arm, group in frame.groupby("arm", sort=False):
        mean, half, n = mean_ci(group.accuracy)
        table.append({"arm": arm, "seeds": n,
                      "final accuracy %": mean_pm(mean, half, 2),
                      "density": round(group.density.mean(), 3)})
    setting = " ".join(same_setting(prunex[0][2]))  # every prunex run's, seeds aside
    text = f"{pd.DataFrame(table).to_markdown(index=False)}\n\nsetting: {setting}\n"
    print(text)
    root.mkdir(parents=True, exist_ok=True)
    (root / "capacity_control.md").write_text(text)


if __name__ == "__main__":
    main()
