"""What checkpointing costs: seconds per checkpoint and bytes on disk.

(a) Measured runs: cnn-fmnist on Fashion-MNIST, 2 nodes x 2 CPU ranks, each method with and
    without ``--checkpoint-every``; the summary's ``checkpoint_seconds_mean`` and
    ``checkpoint_bytes`` (all ranks together), and the wall-time overhead per checkpoint.
(b) ResNet-152 (CIFAR-10 head) at 64 ranks: one rank's PruneX state saved through the same
    code path (``suite.run.checkpoint.save_checkpoint`` in a one-rank gloo group); every rank of a
    64-rank run holds a state of the same size, so the checkpoint is 64 times the bytes. The
    seconds are this machine's disk for one rank; on a cluster the ranks write in parallel.

    python benchmarks/checkpoint_cost.py --out /tmp/ckpt
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from benchmarks.runs import bench, only_run

METHODS = ("prunex", "ddp", "topk", "localsgd-hier")
RUN = ["--workload", "cnn-fmnist", "--gpus", "4", "--gpus-per-node", "2", "--iterations", "8",
       "--eval-every", "8"]  # fmt: skip


def measured_runs(out: Path, methods: list[str]) -> list[dict]:
    rows = []
    for method in methods:
        walls = {}
        for every in (None, 2):
            folder = out / f"{method}-{every or 'none'}"
            extra = ["--checkpoint-every", str(every)] if every else []
            bench("run", "--method", method, *RUN, *extra, "--results-dir", str(folder))
            walls[every] = json.loads((only_run(folder) / "summary.json").read_text())
        saved = walls[2]
        rows.append({
            "method": method,
            "checkpoints": saved["checkpoints_written"],
            "seconds_per_checkpoint": round(saved["checkpoint_seconds_mean"], 3),
            "MB_on_disk": round(saved["checkpoint_bytes"] / 1e6, 2),
            "wall_s_without": round(walls[None]["wall_seconds"], 2),
            "wall_s_with": round(saved["wall_seconds"], 2),
        })  # fmt: skip
    return rows


def resnet152_rank_state() -> dict:
    """One rank's PruneX checkpoint of resnet152-cifar10, saved by the suite's own code."""
    import torch
    import torch.distributed as dist

    from suite.cluster.comm import Communicator
    from suite.cluster.recorder import Recorder
    from suite.cluster.topology import build_topology
    from suite.config import RunConfig
    from suite.data.datasets import dataset_spec
    from suite.data.sharding import ShardedLoader
    from suite.data.workload import TensorData
    from suite.plugins.method import RunContext
    from suite.plugins.registry import METHODS as REGISTRY
    from suite.run.build import method_settings, resolve_workload
    from suite.run.checkpoint import save_checkpoint

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    dist.init_process_group("gloo", rank=0, world_size=1)
    config = RunConfig(method="prunex", workload="resnet152-cifar10", gpus=1)
    workload, recipe, _ = resolve_workload(config)
    spec = dataset_spec("cifar10")
    torch.manual_seed(0)
    model = workload.build_model(spec)
    data = TensorData(torch.zeros(64, 3, 32, 32), torch.zeros(64, dtype=torch.long))
    topo = build_topology(1)
    device = torch.device("cpu")
    recorder = Recorder(0, device)
    loader = ShardedLoader(data, 0, 1, recipe.batch_size, 0)
    ctx = RunContext(config, topo, Communicator(topo, recorder, device), recorder, workload,
                     recipe, model, loader, device, method_settings(config), spec=spec)  # fmt: skip
    method = REGISTRY.get("prunex").factory(ctx)
    method.step(0)  # momentum buffers exist from the first step on
    state = {"method": method.state_dict(), "loader": loader.state_dict(),
             "rng": {"torch": torch.get_rng_state()}, "loop": {}}  # fmt: skip
    with tempfile.TemporaryDirectory() as run_dir:
        stats = save_checkpoint(Path(run_dir), 1, state, node=0)
    dist.destroy_process_group()
    params = sum(p.numel() for p in model.parameters())
    shared = shared_bytes(state)
    own = stats["bytes"] - shared["node"] - shared["world"]
    total = 64 * own + 16 * shared["node"] + shared["world"]  # 16 nodes of 4, as the paper's
    return {"model": "resnet152-cifar10", "parameters": params,
            "seconds_one_rank": round(stats["seconds"], 2),
            "MB_one_rank_alone": round(stats["bytes"] / 1e6, 1),
            "MB_rank_own": round(own / 1e6, 1), "MB_node_shared": round(shared["node"] / 1e6, 1),
            "MB_world_shared": round(shared["world"] / 1e6, 1),
            "GB_at_64_ranks_16_nodes": round(total / 1e9, 2)}  # fmt: skip


def shared_bytes(state: dict) -> dict:
    """Bytes of the state filed as shared by node and by world (stored once per scope)."""
    from suite.run.checkpoint import split_state

    _, tensors = split_state(state)
    sizes = {"node": 0, "world": 0}
    for path, tensor in tensors.items():
        for scope in sizes:
            if f"/shared_{scope}/" in path:
                sizes[scope] += tensor.numel() * tensor.element_size()
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--skip-runs", action="store_true", help="only part (b)")
    parser.add_argument("--methods", default=",".join(METHODS), help="part (a)'s methods")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"resnet152_64_ranks": resnet152_rank_state()}
    print(json.dumps(result["resnet152_64_ranks"]))
    if not args.skip_runs:
        result["cnn_fmnist_2x2"] = measured_runs(args.out, args.methods.split(","))
        for row in result["cnn_fmnist_2x2"]:
            print(json.dumps(row))
    (args.out / "checkpoint_cost.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
