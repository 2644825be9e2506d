"""The instrumentation tax: what the suite's recording costs a DDP step.

A bare torch DDP training loop (the workload's model, the rank's shard of the same data and
batches, the recipe's SGD, torch's default all-reduce, no recording) against ``bench run
--method ddp`` on the same model, data, batch, seed and process-group layout, alternated
``--repeats`` times in one sitting so drift of the machine falls on both. Seconds per step:

* bare: the loop's wall clock over its steps, measured on rank 0 after a barrier;
* suite: the run's training loop wall clock (iterations, the per-iteration agreement of
  the ranks, row flushes) less its evaluations, over its steps (``summary.json``).

    python benchmarks/instrumentation_tax.py                  # cnn-fmnist, 4 ranks, 2 per node
    python benchmarks/instrumentation_tax.py --steps 200 --repeats 5

Prints a markdown table and the ratio of the medians (suite over bare).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from runs import bench, only_run
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from suite.cluster.topology import build_topology
from suite.config import RunConfig
from suite.data.datasets import load_data
from suite.data.sharding import ShardedLoader
from suite.run.build import resolve_workload


def bare_rank(rank: int, world: int, port: int, args, out: str) -> None:
    """One rank of the bare loop: what a user who wrote DDP by hand would run."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank % args.gpus_per_node),
                      LOCAL_WORLD_SIZE=str(args.gpus_per_node))  # fmt: skip
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    build_topology(args.gpus_per_node)  # the same groups exist as in a suite run
    config = RunConfig(method="ddp", workload=args.workload, dataset=args.dataset,
                       data_dir=args.data_dir, seed=args.seed)  # fmt: skip
    workload, recipe, dataset = resolve_workload(config)
    train, _, spec = load_data(dataset, data_dir=args.data_dir, download=False, seed=args.seed)
    torch.manual_seed(args.seed)
    model = DistributedDataParallel(workload.build_model(spec))
    optimizer = torch.optim.SGD(model.parameters(), lr=recipe.lr, momentum=recipe.momentum,
                                weight_decay=recipe.weight_decay)  # fmt: skip
    loss_fn = nn.CrossEntropyLoss()
    batches = ShardedLoader(train, rank, world, recipe.batch_size, args.seed)
    dist.barrier()
    started = time.perf_counter()
    for _ in range(args.steps):
        x, y = next(batches)
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        optimizer.step()
    dist.barrier()
    if rank == 0:
        Path(out).write_text(str((time.perf_counter() - started) / args.steps))
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bare(args) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/seconds"
        mp.spawn(bare_rank, args=(args.gpus, free_port(), args, out), nprocs=args.gpus)
        return float(Path(out).read_text())


def suite(args, results: Path) -> float:
    results.mkdir(parents=True)
    bench("run", "--method", "ddp", "--workload", args.workload, "--dataset", args.dataset,
          "--data-dir", args.data_dir, "--gpus", str(args.gpus), "--gpus-per-node",
          str(args.gpus_per_node), "--iterations", str(args.steps), "--seed", str(args.seed),
          "--device", "cpu", "--eval-every", "100000", "--results-dir", str(results))  # fmt: skip
    summary = json.loads((only_run(results) / "summary.json").read_text())
    return (summary["wall_seconds"] - summary["evaluation_seconds"]) / args.steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="cnn-fmnist")
    parser.add_argument("--dataset", default=None)
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--gpus", type=int, default=4)
    parser.add_argument("--gpus-per-node", type=int, default=2)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-o", "--output", default=None, help="also write the table here")
    args = parser.parse_args()
    if args.dataset is None:
        _, _, args.dataset = resolve_workload(RunConfig(method="ddp", workload=args.workload))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            rows.append(("bare torch DDP", repeat, bare(args)))
            rows.append(("bench run --method ddp", repeat, suite(args, Path(tmp) / str(repeat))))
            print(f"repeat {repeat}: bare {rows[-2][2]:.5f} s/step, suite {rows[-1][2]:.5f}",
                  file=sys.stderr, flush=True)  # fmt: skip
    bare_median = statistics.median(s for who, _, s in rows if who.startswith("bare"))
    suite_median = statistics.median(s for who, _, s in rows if who.startswith("bench"))
    lines = [
        f"{args.workload} ({args.dataset}), {args.gpus} ranks, {args.gpus_per_node} per node, "
        f"{args.steps} steps per run, alternated {args.repeats} times",
        "",
        "| loop | repeat | seconds per step |",
        "|---|---|---|",
        *(f"| {who} | {repeat} | {seconds:.5f} |" for who, repeat, seconds in rows),
        "",
        f"median: bare {bare_median:.5f} s, suite {suite_median:.5f} s; "
        f"**instrumentation tax ratio {suite_median / bare_median:.3f}**",
    ]
    text = "\n".join(lines)
    print(text)
    if args.output:
        Path(args.output).write_text(text + "\n")


if __name__ == "__main__":
    main()
