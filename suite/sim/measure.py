"""The measuring half of ``bench calibrate``: what each rank times on the hardware it runs on.

What it measures, on the ranks a real run would have (same launcher, same placement):

* compute: seconds per local step (forward, loss, backward, SGD step) of each workload's real
  model at the given per-rank batch on this rank's shard of the workload's real dataset (random
  inputs of its shape where it is not on disk; the profile says which), and the
  backward pass's share of it (what DDP can hide its bucket all-reduces behind). The step
  time comes from synchronized blocks, as a run has them: all ranks leave a model-sized
  all-reduce, take k local steps each (k = 1, 2, 4, ... 32) and are timed; the mean over
  ranks and blocks is the step time, and the mean of (slowest rank - mean rank) per block
  size is the wait for the slowest rank that a synchronization after k steps costs (CPU
  ranks sharing cores drift apart much faster than independent per-step noise would
  predict, so it is measured, not derived from a per-step deviation);
* links (unless ``--compute-only``, which takes them from ``--links-from``): all-reduce
  time over the intra-node groups (all nodes at once) and over the leaders' group, at several
  buffer sizes; alpha and bandwidth come from a least-squares fit (relative error) of the
  ring formula ``T = 2(n-1) alpha + 2(n-1)/n S / B``. A flat world all-reduce is measured too
  and printed beside the model's prediction for it, as a check;
* memory bandwidth of a large copy on the device.

The profile records every raw measurement and how each number was obtained.
"""

from __future__ import annotations

import json
import platform
import socket
import statistics
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from suite.cluster.ranks import detach_from_fork_server, join_process_group
from suite.cluster.recorder import synchronize
from suite.cluster.topology import build_topology
from suite.data.datasets import dataset_spec, load_data
from suite.data.sharding import ShardedLoader
from suite.data.workload import TensorData
from suite.errors import BenchError
from suite.plugins.registry import WORKLOADS

DEFAULT_SIZES = (2**12, 2**16, 2**20, 2**22, 2**24)  # bytes
DEFAULT_BLOCK_STEPS = (1, 2, 4, 8, 16, 32)  # local steps between synchronizations


def workload_dataset(workload: str) -> str:

    return WORKLOADS.build(workload).dataset


@cache
def training_data(dataset: str, data_dir: str | None):
    """The dataset's real train split (as a run loads it), or, where it cannot be loaded
    here, random inputs of its shape; and a line saying which."""

    try:
        train, _, _ = load_data(dataset, data_dir=data_dir)
        return train, f"{dataset} train split"
    except BenchError as exc:
        spec = dataset_spec(dataset)
        shape = (1024, spec.in_chans, spec.image_size, spec.image_size)
        data = TensorData(torch.randn(shape), torch.randint(spec.num_classes, (1024,)))
        return data, f"random stand-in inputs ({exc})"


def training_setup(workload: str, batch_size: int, device: torch.device, data_dir=None):
    """The workload's real model, its optimizer and loss, and batches drawn the way a run
    draws them: this rank's shard of the real dataset through a ShardedLoader. Real data
    matters: under 4 CPU ranks on 2 cores, random inputs made steps ~15% slower than
    Fashion-MNIST's (measured; one rank alone saw no difference)."""

    wl = WORKLOADS.build(workload)
    spec = dataset_spec(wl.dataset)
    torch.manual_seed(0)
    model = wl.build_model(spec).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, weight_decay=1e-4)
    data, _ = training_data(wl.dataset, data_dir)
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    loader = ShardedLoader(data, rank, world, batch_size, 0)
    return model, optimizer, loader, nn.CrossEntropyLoss()


def step_timings(
    workload: str, batch_size: int, device: torch.device, steps: int, warmup: int, data_dir=None
):
    """Mean seconds of (batch + forward + loss, backward, optimizer step) over ``steps``
    steps (the mean: a round lasts the sum of its steps), and the steps' standard deviation
    (ranks drift apart by it, and a collective waits for the slowest)."""
    model, optimizer, batches, loss_fn = training_setup(workload, batch_size, device, data_dir)
    samples = []
    for i in range(warmup + steps):
        synchronize(device)
        t0 = time.perf_counter()
        x, y = next(batches)
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        synchronize(device)
        t1 = time.perf_counter()
        loss.backward()
        synchronize(device)
        t2 = time.perf_counter()
        optimizer.step()
        loss.item()
        synchronize(device)
        t3 = time.perf_counter()
        if i >= warmup:
            samples.append((t1 - t0, t2 - t1, t3 - t2))
    means = [statistics.fmean(s[k] for s in samples) for k in range(3)]
    return [*means, statistics.stdev(sum(s) for s in samples)]


def synchronized_blocks(
    workload: str,
    batch_size: int,
    device,
    block_steps: list[int],
    repeats: int,
    warmup: int,
    data_dir=None,
) -> list[list[float]]:
    """Every rank's seconds for ``repeats`` blocks of k steps per k in ``block_steps``, each
    block started as a round is, when a model-sized all-reduce returns: rows (k, repeat),
    columns ranks."""
    model, optimizer, batches, loss_fn = training_setup(workload, batch_size, device, data_dir)

    def step():
        x, y = next(batches)
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        optimizer.step()

    for _ in range(warmup):
        step()
    mine = []
    model_sized = torch.ones(sum(p.numel() for p in model.parameters()), device=device)
    for k in block_steps:
        for _ in range(repeats):
            dist.all_reduce(model_sized)  # a round's end: the ranks leave it as a run's do
            synchronize(device)
            start = time.perf_counter()
            for _ in range(k):
                step()
            synchronize(device)
            mine.append(time.perf_counter() - start)
    local = torch.tensor(mine, dtype=torch.float64, device=device)
    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, local)
    return torch.stack(gathered, dim=1).tolist()


def overlap_timings(workload, batch_size, device, group, steps: int, warmup: int, data_dir=None):
    """Median seconds of an all-reduce of the model's gradient size over ``group`` alone, and
    of a training step with that all-reduce running during its backward pass (as DDP's
    bucket all-reduces do): how much communication the hardware really hides."""
    model, optimizer, batches, loss_fn = training_setup(workload, batch_size, device, data_dir)
    buffer = torch.ones(sum(p.numel() for p in model.parameters()), device=device)
    x, y = (t.to(device) for t in next(batches))
    alone, together = [], []
    for i in range(warmup + steps):
        synchronize(device)
        t0 = time.perf_counter()
        dist.all_reduce(buffer, group=group)
        synchronize(device)
        t1 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        work = dist.all_reduce(buffer, group=group, async_op=True)
        loss.backward()
        optimizer.step()
        work.wait()
        synchronize(device)
        t2 = time.perf_counter()
        if i >= warmup:
            alone.append(t1 - t0)
            together.append(t2 - t1)
    return statistics.fmean(alone), statistics.fmean(together)


def memory_bandwidth(
    device: torch.device, megabytes: int = 256, repeats: int = 5,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Bytes/s of a large device copy (read + write), the best of ``repeats``.

    Args:
        clock: what a copy is timed on: the wall clock for a device (a GPU's copy runs off
            this thread); the simulator times the host's on the replay's clock, its thread's
            CPU seconds, as it times the phases this bandwidth scales (on the wall clock, a
            busy loop sharing the core halved the best of six here).
    """
    src = torch.ones(megabytes * 2**20 // 4, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats + 1):
        synchronize(device)
        start = clock()
        dst.copy_(src)
        synchronize(device)
        best = min(best, clock() - start)
    return 2 * src.numel() * 4 / best


def time_allreduce(
    group, size: int, device, repeats: int, warmup: int = 2, idle_s: float = 0.0
) -> float:
    """Median seconds of an all-reduce of ``size`` bytes, each after ``idle_s`` of quiet (a
    shaped link's bucket refills in it, as it does during a run's compute)."""
    tensor = torch.ones(size // 4, device=device)
    times = []
    for i in range(warmup + repeats):
        time.sleep(idle_s)
        synchronize(device)
        start = time.perf_counter()
        dist.all_reduce(tensor, group=group)
        synchronize(device)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def calibration_rank(plan_json: str, out_path: str) -> None:
    """One rank's part (elastic_launch target and ``python -m suite.sim.measure`` entry)."""

    detach_from_fork_server()
    plan = json.loads(plan_json)
    device = join_process_group(plan["device"])
    cuda = device.type == "cuda"
    try:
        topo = build_topology(plan["gpus_per_node"])
        result = {
            "hostname": socket.gethostname(),
            "device_name": torch.cuda.get_device_name(device) if cuda else platform.processor(),
            "torch": torch.__version__,
            "compute": {},
            "blocks": {},
            "data": {},
            "links": {},
        }
        data_dir = plan.get("data_dir")
        for workload in plan["workloads"]:
            dist.barrier()
            fwd, bwd, opt, jitter = step_timings(
                workload, plan["batch_size"], device, plan["steps"], plan["warmup"], data_dir
            )
            blocks = synchronized_blocks(
                workload, plan["batch_size"], device, plan["block_steps"], plan["block_repeats"],
                plan["warmup"], data_dir,
            )
            comm = together = float("nan")
            if topo.world_size > 1:
                comm, together = overlap_timings(
                    workload, plan["batch_size"], device, topo.world.pg, plan["steps"],
                    plan["warmup"], data_dir,
                )
            result["data"][workload] = training_data(workload_dataset(workload), data_dir)[1]
            mine = torch.tensor(
                [fwd, bwd, opt, comm, together, jitter], dtype=torch.float64, device=device
            )
            dist.all_reduce(mine, op=dist.ReduceOp.MAX)  # the slowest rank paces a step
            result["compute"][workload] = mine.tolist()
            result["blocks"][workload] = blocks
        result["memory_bandwidth"] = memory_bandwidth(device)
        result["links"] = link_timings(plan, topo, device)
        if topo.rank == 0:
            Path(out_path).write_text(json.dumps(result))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def link_timings(plan: dict, topo, device: torch.device) -> dict:
    """All-reduce seconds per buffer size over the intra-node, leaders' and world groups, in
    that order on every rank (each size after a barrier, so the ranks issue the same
    collectives in step); NaN where this rank's group has one member, and no times at all
    under ``--compute-only`` (the links come from ``--links-from``).

    Args:
        plan: the calibration plan (sizes, repeats, and the network a shaped link refills on).
        topo: this rank's topology, whose groups are timed.
        device: where the buffers live.

    Returns:
        {name: {"n": ranks in the group, "times": [[size, seconds], ...]}}.
    """
    links = {}
    for name in ("intra", "inter", "world"):
        group = {"intra": topo.intra, "inter": topo.inter, "world": topo.world}[name]
        if plan["compute_only"]:  # links come from --links-from
            links[name] = {"n": 0, "times": []}
            continue
        rows = []
        for size in plan["sizes"]:
            dist.barrier()
            seconds = float("nan")
            if group is not None and group.size > 1:
                seconds = time_allreduce(
                    group.pg, size, device, plan["repeats"], idle_s=refill_seconds(plan)
                )
            rows.append([size, seconds])
        links[name] = {"n": group.size if group else 0, "times": rows}
    return links


def shaped_burst(plan: dict) -> int:
    """Bytes the inter-node links' shapers let through unpaced (0: not emulated)."""
    return plan.get("network", {}).get("burst_bytes", 0)


def refill_seconds(plan: dict) -> float:
    """Quiet time before each timed collective: twice what an emulated link's shapers take
    to refill their bucket (0 on unshaped links)."""
    burst = shaped_burst(plan)
    return 2 * 8 * burst / plan["network"]["inter_bw_bits_per_s"] if burst else 0.0


if __name__ == "__main__":  # a rank under torchrun (emulated network namespaces)
    import sys

    calibration_rank(Path(sys.argv[1]).read_text(), sys.argv[2])
