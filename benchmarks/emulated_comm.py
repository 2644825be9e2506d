"""Inter-node communication time per iteration on emulated nodes (the paper's fig. 7 question).

Runs prunex, prunex-flat, ddp and topk on 2 emulated nodes x 2 ranks whose links are shaped to
``--inter-bw`` (cnn-fmnist on Fashion-MNIST, rounds of 8 local steps, masks frozen from round 3
so PruneX's buffers are the retraining phase's), then reads the leaders' time in the
collectives that cross nodes, per iteration and per local step, beside the inter-node bytes
(all ranks). PruneX's inter-node collective is the leaders' all-reduce of the packed buckets
(plus the mask OR while masks move); the others' are their world collectives, whose rings
cross nodes. Times hold what a real system sees too: the first collective that crosses nodes
also waits for the later node. Needs root and iproute2; ~3 minutes. Run it alone.

    python benchmarks/emulated_comm.py --out /tmp/emulated-comm --inter-bw 200mbit
    python benchmarks/emulated_comm.py --smoke   # prunex, 2 nodes x 1 rank, synthetic data
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pandas as pd
from runs import SMOKE_DATA, bench, only_run, output_folder, smoke_defaults

from suite.api import schema

ROUNDS = ["--local-steps", "8", "--iterations", "12", "--freeze-round", "3"]
METHODS = {  # method: (extra options, phases whose collectives cross nodes)
    "prunex": (ROUNDS, ("mask_sync", "inter_allreduce")),
    "prunex-flat": (ROUNDS, ("allreduce",)),
    "ddp": (["--iterations", "60"], ("allreduce",)),
    "topk": (["--iterations", "60"], ("allgather", "allreduce")),
}
#: --smoke: PruneX alone, 3 rounds of 2 local steps, masks frozen from round 1, on 2 nodes of
#: 1 rank and synthetic data; flags given with it win
SMOKE_ROUNDS = ["--local-steps", "2", "--iterations", "3", "--freeze-round", "1"]
SMOKE = {"methods": "prunex", "gpus": "2", "gpus_per_node": "1"}


def inter_node_row(method: str, folder: Path, phases: tuple[str, ...]) -> dict:
    manifest = json.loads((folder / "manifest.json").read_text())
    steps = manifest[schema.STEPS_PER_ITERATION]
    rows = pd.read_parquet(folder / "iterations.parquet")
    steady = (rows[rows[schema.FROZEN].astype(bool)] if schema.FROZEN in rows
              else rows[rows[schema.ITERATION] > 0])
    leaders = steady[steady[schema.RANK].isin(manifest[schema.TOPOLOGY][schema.LEADERS])]
    columns = [schema.phase_column(p) for p in phases if schema.phase_column(p) in leaders]
    seconds = leaders[columns].fillna(0.0).sum(axis=1).groupby(
        leaders[schema.ITERATION]).mean().mean()
    inter_bytes = steady.groupby(schema.ITERATION)[schema.BYTES_INTER].sum().mean()
    return {
        schema.METHOD: method,
        "iterations": steady[schema.ITERATION].nunique(),
        "local_steps": steps,
        "inter_ms_per_iteration": 1e3 * seconds,
        "inter_ms_per_step": 1e3 * seconds / steps,
        "inter_MB_per_iteration": inter_bytes / 1e6,
        "inter_MB_per_step": inter_bytes / 1e6 / steps,
        schema.RUN_ID: folder.name,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="default: benchmarks/results/emulated-comm")
    parser.add_argument("--inter-bw", default="200mbit")
    parser.add_argument("--methods", default=",".join(METHODS), help="comma list")
    parser.add_argument("--gpus", default="4")
    parser.add_argument("--gpus-per-node", default="2")
    parser.add_argument("--smoke", action="store_true",
                        help="prunex alone, 3 short rounds on 2 nodes x 1 rank and synthetic "
                        "data, into a temporary folder")
    args = parser.parse_args()
    if args.smoke:
        smoke_defaults(args, SMOKE)
    out = output_folder(args.out, "benchmarks/results/emulated-comm", args.smoke, "emulated")
    unknown = set(args.methods.split(",")) - set(METHODS)
    if unknown:
        parser.error(f"unknown method(s) {sorted(unknown)}; known: {', '.join(METHODS)}")
    table = []
    for method in args.methods.split(","):
        extra, phases = METHODS[method]
        if args.smoke:
            rounds = SMOKE_ROUNDS if method.startswith("prunex") else ["--iterations", "3"]
            extra = [*rounds, *SMOKE_DATA]
        results = out / method
        shutil.rmtree(results, ignore_errors=True)
        bench("run", "--method", method, "--workload", "cnn-fmnist", "--gpus", args.gpus,
              "--gpus-per-node", args.gpus_per_node, "--network", "emulated", "--inter-bw",
              args.inter_bw, "--eval-every", "1000", "--results-dir", str(results),
              *extra)
        table.append(inter_node_row(method, only_run(results), phases))
    frame = pd.DataFrame(table)
    frame.to_csv(out / "emulated_comm.csv", index=False)
    nodes = int(args.gpus) // int(args.gpus_per_node)
    print(f"{nodes} nodes x {args.gpus_per_node} ranks, links shaped to {args.inter_bw}; "
          "leaders' inter-node collectives")
    print(frame.to_markdown(index=False, floatfmt=".3f"))


if __name__ == "__main__":
    main()
