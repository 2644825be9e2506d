"""The instrumentation tax: what the suite's recording costs a DDP step.

A bare torch DDP training loop (the workload's model, the rank's shard of the same data and
batches, the recipe's SGD, torch's default all-reduce, no recording) against ``bench run
--method ddp`` on the same model, data, batch, seed and process-group layout, alternated
``--repeats`` times in one sitting so drift of the machine falls on both. Seconds per step:

* bare: the loop's wall clock over its steps, measured on rank 0 after a barrier;
* suite: the run's training loop wall clock (iterations, the per-iteration agreement of
  the ranks, row flushes) less its evaluations, over its steps (``summary.json``).

The bare loop builds the model and reads the data through ``suite.api`` (``WORKLOADS``,
``DATASETS``) and draws each rank's batches as a run does (one fixed shard per rank from a
permutation every rank computes from the seed, reshuffled within the shard each epoch, crop
and flip where the data asks for them; synthetic data generated as ``--dataset synthetic``
generates it), by the rules written out below; tests/test_benchmarks.py checks that they
draw the same tensors as a run.

    python benchmarks/instrumentation_tax.py                  # cnn-fmnist, 4 ranks, 2 per node
    python benchmarks/instrumentation_tax.py --steps 200 --repeats 5
    python benchmarks/instrumentation_tax.py --smoke          # 2 ranks, 2 steps, synthetic data

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
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from runs import bench, only_run, smoke_defaults
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel

from suite.api import DATASETS, WORKLOADS, DatasetSpec, TensorData, schema

#: --smoke: 2 ranks as 2 nodes, 2 steps, once, on small synthetic data; flags given win
SMOKE = {"gpus": 2, "gpus_per_node": 1, "steps": 2, "repeats": 1, "dataset": "synthetic",
         "synthetic_size": "256,64"}
#: what ``--dataset synthetic`` is shaped like (the suite's default for it)
SYNTHETIC = DatasetSpec("synthetic", in_chans=3, image_size=32, num_classes=10)


# -- the data and batches of a run, as a user would write them (suite/data/ does the same) --
def synthetic(spec: DatasetSpec, seed: int, sizes: tuple[int, int]) -> TensorData:
    """``--dataset synthetic``'s train split: each class a fixed smooth random pattern plus
    pixel noise."""
    g = torch.Generator().manual_seed(seed)
    coarse = torch.randn(spec.num_classes, spec.in_chans, 4, 4, generator=g)
    size = (spec.image_size, spec.image_size)
    means = F.interpolate(coarse, size=size, mode="bilinear", align_corners=False)
    labels = torch.randint(0, spec.num_classes, (sizes[0],), generator=g)
    return TensorData(means[labels] + torch.randn(sizes[0], spec.in_chans, *size, generator=g),
                      labels)


def seeded_generator(*key: int) -> torch.Generator:
    """A torch generator for (seed, rank, epoch), mixed by numpy's SeedSequence."""
    state = np.random.SeedSequence(list(key)).generate_state(1, np.uint64)[0]
    return torch.Generator().manual_seed(int(state))


def shard_batches(data: TensorData, rank: int, world: int, batch_size: int, seed: int):
    """Endless (images, labels) batches of this rank's shard: a fixed disjoint shard from a
    permutation of the train set by ``seed``, reshuffled within the shard each epoch by
    (seed, rank, epoch), CIFAR-10's random crop (pad 4) and flip where ``data.augment``."""
    shard_size = len(data) // world
    batch_size = min(batch_size, shard_size)
    shard = torch.randperm(len(data), generator=seeded_generator(seed))
    shard = shard[rank * shard_size : (rank + 1) * shard_size]
    steps_per_epoch = shard_size // batch_size
    epoch = 0
    while True:
        generator = seeded_generator(seed, rank, epoch)
        order = shard[torch.randperm(shard_size, generator=generator)]
        for position in range(steps_per_epoch):
            index = order[position * batch_size : (position + 1) * batch_size]
            images = data.images[index]
            if data.augment:
                images = crop_flip(images, generator)
            yield images, data.labels[index]
        epoch += 1


def crop_flip(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Random crop after zero padding by 4 and horizontal flip with probability 1/2."""
    n, c, h, w = images.shape
    padded = F.pad(images, (4, 4, 4, 4))
    dy = torch.randint(0, 9, (n, 1), generator=generator)
    dx = torch.randint(0, 9, (n, 1), generator=generator)
    flip = torch.rand(n, 1, generator=generator) < 0.5
    rows = dy + torch.arange(h)
    cols = dx + torch.where(flip, torch.arange(w - 1, -1, -1), torch.arange(w))
    return padded[torch.arange(n).view(n, 1, 1, 1), torch.arange(c).view(1, c, 1, 1),
                  rows.view(n, 1, h, 1), cols.view(n, 1, 1, w)]


def train_data(args) -> tuple[TensorData, DatasetSpec]:
    if args.dataset == "synthetic":
        sizes = tuple(int(n) for n in args.synthetic_size.split(","))
        return synthetic(SYNTHETIC, args.seed, sizes), replace(SYNTHETIC)
    dataset = DATASETS.get(args.dataset)
    train, _ = dataset.load(args.data_dir, False)
    return train, replace(dataset.spec)


def bare_rank(rank: int, world: int, port: int, args, out: str) -> None:
    """One rank of the bare loop: what a user who wrote DDP by hand would run."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank % args.gpus_per_node),
                      LOCAL_WORLD_SIZE=str(args.gpus_per_node))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    per_node = args.gpus_per_node  # the same groups exist as in a suite run: each node's,
    nodes = [list(range(n, n + per_node)) for n in range(0, world, per_node)]
    for ranks in nodes:
        dist.new_group(ranks)
    dist.new_group([ranks[0] for ranks in nodes])  # and the leaders'
    workload = WORKLOADS.get(args.workload).factory()
    recipe = workload.recipe
    train, spec = train_data(args)
    torch.manual_seed(args.seed)
    model = DistributedDataParallel(workload.build_model(spec))
    optimizer = torch.optim.SGD(model.parameters(), lr=recipe.lr, momentum=recipe.momentum,
                                weight_decay=recipe.weight_decay)
    loss_fn = nn.CrossEntropyLoss()
    batches = shard_batches(train, rank, world, recipe.batch_size, args.seed)
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
    sizes = ["--synthetic-size", args.synthetic_size] if args.dataset == "synthetic" else []
    bench("run", "--method", "ddp", "--workload", args.workload, "--dataset", args.dataset,
          "--data-dir", args.data_dir, *sizes, "--gpus", str(args.gpus), "--gpus-per-node",
          str(args.gpus_per_node), "--iterations", str(args.steps), "--seed", str(args.seed),
          "--device", "cpu", "--eval-every", "100000", "--results-dir", str(results))
    summary = json.loads((only_run(results) / "summary.json").read_text())
    return (summary[schema.WALL_SECONDS] - summary[schema.EVALUATION_SECONDS]) / args.steps


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
    parser.add_argument("--synthetic-size", default="4096,1024",
                        help="TRAIN,TEST samples of --dataset synthetic")
    parser.add_argument("-o", "--output", default=None, help="also write the table here")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="2 ranks as 2 nodes, 2 steps, once, on small synthetic data",
    )
    args = parser.parse_args()
    if args.smoke:
        smoke_defaults(args, SMOKE)
    if args.dataset is None:
        args.dataset = WORKLOADS.get(args.workload).factory().dataset
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            rows.append(("bare torch DDP", repeat, bare(args)))
            rows.append(("bench run --method ddp", repeat, suite(args, Path(tmp) / str(repeat))))
            print(f"repeat {repeat}: bare {rows[-2][2]:.5f} s/step, suite {rows[-1][2]:.5f}",
                  file=sys.stderr, flush=True)
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
