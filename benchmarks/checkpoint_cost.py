"""What checkpointing costs: seconds per checkpoint and bytes on disk.

(a) Measured runs: cnn-fmnist on Fashion-MNIST, 2 nodes x 2 CPU ranks, each method with and
    without ``--checkpoint-every``; the summary's ``checkpoint_seconds_mean`` and
    ``checkpoint_bytes`` (all ranks together), and the wall-time overhead per checkpoint.
(b) ResNet-152 (CIFAR-10 head) at 64 ranks: one rank's PruneX state, checkpointed by ``bench
    run --checkpoint-every 1`` on one rank after one local step (synthetic data of CIFAR-10's
    shape): seconds and bytes from that run's summary; the same run stopped after the step
    (``PRUNEX_STOP_AFTER_ITERATION=1``) keeps its checkpoint, whose tensors are filed per rank,
    per node (``node0/...``) or once for the world (``world/...``). Every rank of a 64-rank
    run holds a state of the same size, so the checkpoint is 64 times a rank's own bytes plus
    the node's shared state per node and the world's once. The seconds are this machine's
    disk for one rank; on a cluster the ranks write in parallel.

    python benchmarks/checkpoint_cost.py --out /tmp/ckpt
    python benchmarks/checkpoint_cost.py --smoke --out /tmp/ckpt  # tiny: cnn-fmnist, prunex
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from runs import SMOKE_DATA, bench, only_run, output_folder
from torch.distributed.checkpoint import FileSystemReader

from suite.api import schema

METHODS = ("prunex", "ddp", "topk", "localsgd-hier")
RUN = ["--workload", "cnn-fmnist", "--gpus", "4", "--gpus-per-node", "2", "--iterations", "8",
       "--eval-every", "8"]
#: --smoke's part (a): one rank on synthetic data, a checkpoint after iteration 1 of 2
SMOKE_RUN = ["--workload", "cnn-fmnist", *SMOKE_DATA, "--gpus", "1", "--gpus-per-node", "1",
             "--iterations", "2", "--local-steps", "1", "--eval-every", "2"]
#: part (b)'s run: one rank, one local step, a checkpoint after it; the data only has to fit
#: the model (synthetic images are CIFAR-10's shape), the state is the same for any batch
RANK_STATE = ["--method", "prunex", "--gpus", "1", "--gpus-per-node", "1", "--dataset",
              "synthetic", "--synthetic-size", "64,16", "--batch-size", "8", "--local-steps", "1",
              "--iterations", "2", "--checkpoint-every", "1", "--eval-every", "100000"]


def measured_runs(out: Path, methods: list[str], run: list[str], every: int) -> list[dict]:
    rows = []
    for method in methods:
        walls = {}
        for each in (None, every):
            folder = out / f"{method}-{each or 'none'}"
            extra = ["--checkpoint-every", str(each)] if each else []
            bench("run", "--method", method, *run, *extra, "--results-dir", str(folder))
            walls[each] = json.loads((only_run(folder) / "summary.json").read_text())
        saved = walls[every]
        rows.append({
            schema.METHOD: method,
            "checkpoints": saved[schema.CHECKPOINTS_WRITTEN],
            "seconds_per_checkpoint": round(saved[schema.CHECKPOINT_SECONDS_MEAN], 3),
            "MB_on_disk": round(saved[schema.CHECKPOINT_BYTES] / 1e6, 2),
            "wall_s_without": round(walls[None][schema.WALL_SECONDS], 2),
            "wall_s_with": round(saved[schema.WALL_SECONDS], 2),
        })
    return rows


def rank_state(workload: str) -> dict:
    """One rank's PruneX checkpoint of ``workload``, written by ``bench run`` on one rank:
    seconds and bytes from a finished run's summary, the split of its tensors by scope from
    the checkpoint a stopped run leaves (a finished run removes its checkpoints)."""
    with tempfile.TemporaryDirectory() as tmp:
        finished, stopped = Path(tmp) / "finished", Path(tmp) / "stopped"
        bench("run", *RANK_STATE, "--workload", workload, "--results-dir", str(finished))
        summary = json.loads((only_run(finished) / "summary.json").read_text())
        manifest = json.loads((only_run(finished) / "manifest.json").read_text())
        # stopped after iteration 1 as if interrupted: it checkpoints there and keeps it
        bench("run", *RANK_STATE, "--workload", workload, "--results-dir", str(stopped),
              ok=(1,), env={"PRUNEX_STOP_AFTER_ITERATION": "1"})
        latest = only_run(stopped) / "checkpoints" / "latest.json"
        if not latest.exists():
            raise SystemExit(f"{only_run(stopped)}: the stopped run left no checkpoint")
        folder = latest.parent / json.loads(latest.read_text())["folder"]
        on_disk = sum(f.stat().st_size for f in folder.iterdir())
        scopes = bytes_by_scope(folder)
    own = on_disk - scopes["node"] - scopes["world"]
    total = 64 * own + 16 * scopes["node"] + scopes["world"]  # 16 nodes of 4, as the paper's
    return {"model": workload, schema.PARAMETERS: manifest[schema.PARAMETERS],
            "seconds_one_rank": round(summary[schema.CHECKPOINT_SECONDS_MEAN], 2),
            "MB_one_rank_alone": round(summary[schema.CHECKPOINT_BYTES] / 1e6, 1),
            "MB_rank_own": round(own / 1e6, 1), "MB_node_shared": round(scopes["node"] / 1e6, 1),
            "MB_world_shared": round(scopes["world"] / 1e6, 1),
            "GB_at_64_ranks_16_nodes": round(total / 1e9, 2)}


def bytes_by_scope(folder: Path) -> dict[str, int]:
    """Bytes of the checkpoint's tensors stored once per node (``node<i>/...``) and once for
    the world (``world/...``), read from its PyTorch Distributed Checkpoint metadata."""
    sizes = {"node": 0, "world": 0}
    for key, meta in FileSystemReader(folder).read_metadata().state_dict_metadata.items():
        scope = "world" if key.startswith("world/") else "node" if key.startswith("node") else None
        if scope and hasattr(meta, "size"):
            sizes[scope] += meta.size.numel() * meta.properties.dtype.itemsize
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="required without --smoke")
    parser.add_argument("--skip-runs", action="store_true", help="only part (b)")
    parser.add_argument("--methods", default=None,
                        help=f"part (a)'s methods (default: {','.join(METHODS)})")
    parser.add_argument("--large-workload", default=None,
                        help="part (b)'s model (default: resnet152-cifar10)")
    parser.add_argument("--smoke", action="store_true",
                        help="the smallest real configuration: part (b) on cnn-fmnist, part "
                        "(a) for prunex on one rank and synthetic data")
    args = parser.parse_args()
    if args.out is None and not args.smoke:
        parser.error("--out is required")
    out = output_folder(args.out, "", args.smoke, "checkpoint-cost")
    out.mkdir(parents=True, exist_ok=True)
    large = args.large_workload or ("cnn-fmnist" if args.smoke else "resnet152-cifar10")
    # the keys name the measurement's default configuration, whatever the flags
    result = {"resnet152_64_ranks": rank_state(large)}
    print(json.dumps(result["resnet152_64_ranks"]))
    if not args.skip_runs:
        methods = (args.methods or ("prunex" if args.smoke else ",".join(METHODS))).split(",")
        run, every = (SMOKE_RUN, 1) if args.smoke else (RUN, 2)
        result["cnn_fmnist_2x2"] = measured_runs(out, methods, run, every)
        for row in result["cnn_fmnist_2x2"]:
            print(json.dumps(row))
    (out / "checkpoint_cost.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
