"""Inter-node bytes per PruneX round, before (``--pack dense-masks``) and after (``--pack
live``) live-weight packing, next to the live-weight limit, for the paper's three models.

Each cell is a ``bench sim`` of PruneX on 8 GPUs (2 nodes x 4), so the bytes come from the
method's own step code, masks agreed by OR between the nodes. The ratio is the leaders'
packed buffer of the last round over that of a dense run (``--channel-keep 1``).

The live-weight limit is counted here independently of suite/structured/liveness.py, by the rule of
issue 14 written out for timm's residual blocks and read off the run's own ``masks.pt``:
inside a block, conv j's filters live only where conv j+1 keeps the channel and conv j+1's
inputs only where conv j's filters live; BN entries go with their filters; the last conv of a
block and the downsample write the residual stream, which stays whole; stem and fc as masked.

    python benchmarks/live_weights.py [--models resnet18,resnet152,wrn50_2] [-o DIR]
    python benchmarks/live_weights.py --smoke     # resnet18, channel 0.5, into a temp folder
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pandas as pd
import torch
from runs import bench, only_run, output_folder, smoke_defaults

from suite.api import DATASETS, WORKLOADS, StructuredMask, schema

KEEPS = {
    "channel 0.5": ["--channel-keep", "0.5"],
    "filter+channel 0.5": ["--filter-keep", "0.5", "--channel-keep", "0.5"],
}
#: --smoke: one model and one keep (three simulations); flags given with it win
SMOKE = {"models": "resnet18", "keeps": "channel 0.5"}
SIM = ["--gpus", "8", "--gpus-per-node", "4", "--iterations", "2", "--replay", "2",
       "--local-steps", "1", "--batch-size", "8"]


def last_round(run: Path) -> dict:
    rows = pd.read_parquet(run / "iterations.parquet")
    last = rows[rows[schema.ITERATION] == rows[schema.ITERATION].max()]
    return {
        "packed": float(last[schema.PACKED_BYTES].iloc[0]),
        "inter": float(last[schema.BYTES_INTER].sum()),
    }


def simulate(workload: str, pack: str, keep: list[str], out: Path) -> Path:
    folder = out / f"{workload}-{pack}-{'_'.join(keep).replace('--', '')}"
    if not folder.is_dir():
        bench("sim", "--method", "prunex", "--workload", workload, *SIM, "--pack", pack,
              *keep, "--results-dir", str(folder))
    return only_run(folder)


def live_limit(model: torch.nn.Module, masks: dict[str, StructuredMask]) -> int:
    """Elements a leader must send at least: the rule of the module docstring."""
    modules = dict(model.named_modules())

    def kept(name):
        mask = masks.get(f"{name}.weight")
        conv = modules[name]
        f = torch.zeros(conv.out_channels, dtype=bool)
        c = torch.zeros(conv.in_channels, dtype=bool)
        f[slice(None) if mask is None else mask.kept_filters()] = True
        c[slice(None) if mask is None else mask.kept_channels()] = True
        return f, c

    total = 0
    counted = set()
    for name, block in model.named_modules():
        convs = [f"{name}.conv{j}" for j in (1, 2, 3) if hasattr(block, f"conv{j}")]
        if len(convs) < 2 or not hasattr(block, "bn1"):
            continue  # not a residual block
        sets = [list(kept(c)) for c in convs]
        for j in range(len(convs) - 1):  # filters die with the next conv's pruned channels
            sets[j][0] &= sets[j + 1][1]
            sets[j + 1][1] &= sets[j][0]
        for j, conv in enumerate(convs):
            f, c = sets[j]
            k = math.prod(modules[conv].kernel_size)
            total += int(f.sum()) * int(c.sum()) * k + 4 * int(f.sum())  # + BN w, b, mean, var
            counted |= {conv, f"{name}.bn{j + 1}"}
    for name, module in modules.items():  # stem, downsample, fc and their BN: as masked
        if name in counted or not any(True for _ in module.parameters(recurse=False)):
            continue
        if isinstance(module, torch.nn.Conv2d):
            f, c = kept(name)
            total += int(f.sum()) * int(c.sum()) * math.prod(module.kernel_size)
        else:
            total += sum(p.numel() for p in module.parameters(recurse=False))
            total += sum(b.numel() for b in module.buffers(recurse=False) if b.is_floating_point())
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet18,resnet152,wrn50_2")
    parser.add_argument("--keeps", default=",".join(KEEPS), help="comma list of keep labels")
    parser.add_argument("-o", "--output", default=None, help="default: results/live_weights")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="resnet18 at channel keep 0.5 alone, into a temporary folder",
    )
    args = parser.parse_args()
    if args.smoke:
        smoke_defaults(args, SMOKE)
    unknown = set(args.keeps.split(",")) - set(KEEPS)
    if unknown:
        parser.error(f"unknown keep(s) {sorted(unknown)}; known: {', '.join(KEEPS)}")
    out = output_folder(args.output, "results/live_weights", args.smoke, "live-weights")
    rows = []
    for model_name in args.models.split(","):
        workload = f"{model_name}-cifar10"
        dense = last_round(simulate(workload, "dense-masks", ["--channel-keep", "1"], out))
        torch.manual_seed(0)
        model = WORKLOADS.get(workload).factory().build_model(DATASETS.get("cifar10").spec)
        for label in args.keeps.split(","):
            keep = KEEPS[label]
            before = last_round(simulate(workload, "dense-masks", keep, out))
            run = simulate(workload, "live", keep, out)
            after = last_round(run)
            saved = torch.load(run / "masks.pt", map_location="cpu", weights_only=True)
            masks = {n: StructuredMask.from_state(m) for n, m in saved.items()}
            rows.append({
                "model": model_name, "keep": label,
                "before (dense-masks)": before["packed"] / dense["packed"],
                "after (live)": after["packed"] / dense["packed"],
                "live limit": 4 * live_limit(model, masks) / dense["packed"],
                "inter bytes/round before": before["inter"] / dense["inter"],
                "inter bytes/round after": after["inter"] / dense["inter"],
                "dense MB/round": dense["packed"] / 1e6,
            })
    table = pd.DataFrame(rows)
    print(table.to_markdown(index=False, floatfmt=".3f"))
    (out / "table.md").write_text(table.to_markdown(index=False, floatfmt=".3f") + "\n")


if __name__ == "__main__":
    main()
