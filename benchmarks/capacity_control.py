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

from suite.api import flag_of, mean_ci, schema


def same_setting(manifest: dict) -> list[str]:
    """The flags that repeat a PruneX run's workload, ranks, recipe, round length and keep
    targets (its seed aside)."""
    config, recipe = manifest[schema.CONFIG], manifest[schema.RECIPE]
    flags = ["--workload", config[schema.WORKLOAD], "--gpus", str(config[schema.GPUS]),
             "--gpus-per-node", str(config[schema.GPUS_PER_NODE]),
             "--epochs", str(config[schema.EPOCHS] or recipe[schema.EPOCHS]),
             "--lr", str(recipe[schema.LR]), "--lr-schedule", recipe[schema.LR_SCHEDULE],
             "--warmup-epochs", str(recipe[schema.WARMUP_EPOCHS]),
             "--batch-size", str(recipe[schema.BATCH_SIZE]),
             "--bn-recalibrate", str(config.get("bn_recalibrate", 0)),
             "--device", config.get(schema.DEVICE, "auto"), "--eval-every", "100000"]
    if config.get(schema.DATASET):
        flags += ["--dataset", config[schema.DATASET]]
    if config.get(schema.DATASET) == "synthetic" and config.get("synthetic_size"):
        flags += ["--synthetic-size", ",".join(map(str, config["synthetic_size"]))]
    settings = manifest.get(schema.METHOD_SETTINGS, {})
    for key in ("filter_keep", "channel_keep", "shape_keep", "local_steps", "local_epochs"):
        if settings.get(key) is not None:
            flags += [flag_of(key), str(settings[key])]
    return flags


def final_density(folder: Path) -> float:
    """The structured density of the run's last round."""
    return pd.read_parquet(folder / "iterations.parquet")[schema.DENSITY].dropna().iloc[-1]


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
        flags = [*same_setting(manifest), "--seed", str(summary[schema.SEED])]
        arms = {"masks-from": ["--masks-from", str(folder)], "all-ones": ["--prune-at", "1"]}
        rows.append({"arm": "prunex (z)", schema.SEED: summary[schema.SEED],
                     "accuracy": 100 * summary[schema.FINAL_ACCURACY],
                     "density": final_density(folder)})
        for arm, extra in arms.items():
            out = root / arm
            sweep("--method", "prune-retrain", *flags, *extra, "--results-dir", str(out))
            for run, s, m in finished_runs(out, "prune-retrain"):
                same_lr = m[schema.RECIPE][schema.LR] == manifest[schema.RECIPE][schema.LR]
                if s[schema.SEED] == summary[schema.SEED] and same_lr:
                    rows.append({"arm": arm, schema.SEED: s[schema.SEED],
                                 "accuracy": 100 * s[schema.FINAL_ACCURACY],
                                 "density": final_density(run)})
    table = []
    frame = pd.DataFrame(rows).drop_duplicates(["arm", schema.SEED])
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
