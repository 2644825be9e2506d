"""``bench calibrate``: measure this hardware and write a simulator profile.

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
import os
import platform
import socket
import statistics
import tempfile
import time
from functools import cache
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from suite.errors import BenchError
from suite.ranks import join_process_group, local_launch_config
from suite.recorder import synchronize
from suite.sim.costmodel import Link, ring_allreduce
from suite.sim.profile import link_from

DEFAULT_SIZES = (2**12, 2**16, 2**20, 2**22, 2**24)  # bytes
DEFAULT_BLOCK_STEPS = (1, 2, 4, 8, 16, 32)  # local steps between synchronizations


def workload_dataset(workload: str) -> str:
    from suite.registry import WORKLOADS, load_builtins

    load_builtins()
    return WORKLOADS.get(workload).factory().dataset


@cache
def training_data(dataset: str, data_dir: str | None):
    """The dataset's real train split (as a run loads it), or, where it cannot be loaded
    here, random inputs of its shape; and a line saying which."""
    from workloads.base import TensorData
    from workloads.datasets import dataset_spec, load_data

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
    from suite.registry import WORKLOADS, load_builtins
    from workloads.datasets import dataset_spec
    from workloads.sharding import ShardedLoader

    load_builtins()
    wl = WORKLOADS.get(workload).factory()
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


def block_statistics(block_steps: list[int], repeats: int, seconds: list[list[float]]):
    """Seconds per step (mean over ranks and blocks, per step taken), the measured wait for
    the slowest rank, [[k, mean over blocks of (max - mean over ranks)], ...], and the mean
    seconds per step of each block size, [[k, seconds], ...]."""
    table = np.asarray(seconds, dtype=float).reshape(len(block_steps), repeats, -1)
    per_step = table.mean(axis=2).sum() / (repeats * sum(block_steps))
    waits = (table.max(axis=2) - table.mean(axis=2)).mean(axis=1)
    by_size = table.mean(axis=(1, 2)) / np.asarray(block_steps)
    return (
        float(per_step),
        [[k, float(w)] for k, w in zip(block_steps, waits)],
        [[k, float(t)] for k, t in zip(block_steps, by_size)],
    )


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


def memory_bandwidth(device: torch.device, megabytes: int = 256, repeats: int = 5) -> float:
    """Bytes/s of a large device copy (read + write), the best of ``repeats``."""
    src = torch.ones(megabytes * 2**20 // 4, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats + 1):
        synchronize(device)
        start = time.perf_counter()
        dst.copy_(src)
        synchronize(device)
        best = min(best, time.perf_counter() - start)
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
    """One rank's part (elastic_launch target and ``python -m suite.calibrate`` entry)."""
    from suite.topology import build_topology

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
            )  # fmt: skip
            comm = together = float("nan")
            if topo.world_size > 1:
                comm, together = overlap_timings(
                    workload, plan["batch_size"], device, topo.world.pg, plan["steps"],
                    plan["warmup"], data_dir,
                )  # fmt: skip
            result["data"][workload] = training_data(workload_dataset(workload), data_dir)[1]
            mine = torch.tensor(
                [fwd, bwd, opt, comm, together, jitter], dtype=torch.float64, device=device
            )
            dist.all_reduce(mine, op=dist.ReduceOp.MAX)  # the slowest rank paces a step
            result["compute"][workload] = mine.tolist()
            result["blocks"][workload] = blocks
        result["memory_bandwidth"] = memory_bandwidth(device)
        for name in ("intra", "inter", "world"):
            group = {"intra": topo.intra, "inter": topo.inter, "world": topo.world}[name]
            if plan["compute_only"]:  # links come from --links-from
                result["links"][name] = {"n": 0, "times": []}
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
            result["links"][name] = {"n": group.size if group else 0, "times": rows}
        if topo.rank == 0:
            Path(out_path).write_text(json.dumps(result))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def shaped_burst(plan: dict) -> int:
    """Bytes the inter-node links' shapers let through unpaced (0: not emulated)."""
    return plan.get("network", {}).get("burst_bytes", 0)


def refill_seconds(plan: dict) -> float:
    """Quiet time before each timed collective: twice what an emulated link's shapers take
    to refill their bucket (0 on unshaped links)."""
    burst = shaped_burst(plan)
    return 2 * 8 * burst / plan["network"]["inter_bw_bits_per_s"] if burst else 0.0


def fit_ring(times: list[list[float]], n: int, burst: float = 0.0) -> tuple[Link, float]:
    """alpha and bandwidth of the ring all-reduce formula ``T = 2(n-1) alpha + max(0, L -
    burst) / B`` (L = 2(n-1)/n S, the bytes each rank sends), fitted to (size, seconds) pairs
    by least squares on relative error; ``burst``: a shaped link's bucket, known from its
    qdisc. Returns the link and the worst relative residual."""
    sizes = np.array([s for s, t in times if np.isfinite(t)], dtype=float)
    secs = np.array([t for s, t in times if np.isfinite(t)], dtype=float)
    paced = np.maximum(2 * (n - 1) / n * sizes - burst, 0.0)
    if len(np.unique(paced)) < 2:
        raise BenchError(
            f"need at least two buffer sizes, one beyond the link's {burst:.0f}-byte burst, "
            "to fit a link (--sizes)"
        )
    slope, intercept = np.polyfit(paced, secs, 1, w=1 / secs)
    if slope <= 0:
        raise BenchError(
            f"all-reduce times over {n} ranks do not grow with size ({times}); measure larger "
            "buffers (--sizes) or more repeats (--repeats)"
        )
    alpha = max(float(intercept), 0.0) / (2 * (n - 1))
    link = Link(alpha, 1 / float(slope), burst)
    predicted = np.array([ring_allreduce(s, n, link) for s in sizes])
    return link, float(np.max(np.abs(predicted - secs) / secs))


def build_profile(
    raw: dict,
    plan: dict,
    *,
    name: str,
    description: str,
    command: str,
    links_from: dict | None = None,
) -> dict:
    """The profile JSON from the ranks' raw measurements; links that cannot be measured with
    this layout (one node, or one rank per node) are taken from ``links_from``."""
    stamp = time.strftime("%Y-%m-%d")
    device = raw.get("device_name") or plan["device"]
    where = f"`{command}` on {raw['hostname']} ({device}, torch {raw.get('torch', '?')}), {stamp}"
    links = {}
    for link_name in ("intra", "inter"):
        entry = raw["links"][link_name]
        if entry["n"] < 2:
            if links_from is None:
                raise BenchError(
                    f"cannot measure {link_name}-node links with {plan['gpus']} ranks at "
                    f"{plan['gpus_per_node']} per node (need 2+ nodes of 2+ ranks); give "
                    "--links-from PROFILE to take them from a published profile"
                )
            links[link_name] = dict(links_from["links"][link_name])
            links[link_name]["source"] = (
                f"from profile {links_from['name']!r}: " + links[link_name]["source"]
            )
            continue
        burst = shaped_burst(plan) if link_name == "inter" else 0
        link, worst = fit_ring(entry["times"], entry["n"], burst)
        links[link_name] = {
            "alpha_s": link.alpha,
            "bandwidth_Bps": link.bandwidth,
            "source": f"measured: fit of all-reduce times over {entry['n']} ranks, worst "
            f"relative residual {worst:.1%}; {where}",
            "measurements": entry["times"],
        }
        if burst:
            links[link_name]["burst_bytes"] = burst
            links[link_name]["source"] += (
                f"; burst_bytes: the shapers' token bucket ({plan['network']['qdisc']}), "
                "each collective timed after it refilled"
            )
    steps = {}
    backward, overlap = [], []
    for workload, (fwd, bwd, opt, comm, together, jitter) in raw["compute"].items():
        total = fwd + bwd + opt
        backward.append(bwd / total)
        if comm == comm:  # measured: the share of min(comm, backward) that was hidden
            hidden = (total + comm - together) / min(comm, bwd)
            overlap.append(min(1.0, max(0.0, hidden)))
        per_step, waits, by_size = block_statistics(
            plan["block_steps"], plan["block_repeats"], raw["blocks"][workload]
        )
        steps[f"{workload}@{plan['batch_size']}"] = {
            "seconds": per_step,
            "forward_s": fwd,
            "backward_s": bwd,
            "optimizer_s": opt,
            "jitter_s": jitter,
            "sync_wait_s": waits,
            "sync_wait_ranks": plan["gpus"],
            "block_step_s": by_size,
            "source": f"measured: mean over {plan['gpus']} ranks and {plan['block_repeats']} "
            f"round-started blocks of each of {plan['block_steps']} steps; forward/backward/"
            f"optimizer split from {plan['steps']} free-running steps (slowest rank); "
            f"sync_wait_s: mean (slowest - mean rank) per block size; inputs: "
            f"{raw.get('data', {}).get(workload, 'random stand-in inputs')}; {where}",
        }
    return {
        "name": name,
        "description": description,
        "gpus_per_node": (links_from or {}).get("gpus_per_node", plan["gpus_per_node"])
        if plan["gpus"] == 1
        else plan["gpus_per_node"],
        "links": links,
        "memory_bandwidth": {
            "bandwidth_Bps": raw["memory_bandwidth"],
            "source": f"measured: 256 MiB device copy, read + write; {where}",
        },
        "compute": {
            "backward_fraction": float(np.mean(backward)),
            "backward_fraction_source": "measured: backward / step time, mean over workloads",
            "overlap_efficiency": float(np.mean(overlap)) if overlap else 1.0,
            "overlap_efficiency_source": (
                "measured: (step + all-reduce - both at once) / min(all-reduce, backward), "
                "all-reduce of the gradient size over the world during backward"
                if overlap
                else "not measurable with one rank; assumed 1 (full overlap)"
            ),
            "steps": steps,
        },
        "world_check": raw["links"]["world"],
        "network": plan.get("network", {"mode": "loopback"}),
    }


def world_check(profile: dict, gpus: int) -> list[tuple[int, float, float]]:
    """(size, measured, predicted) for the flat world all-reduce, priced like the simulator
    prices DDP's: a ring paced by the inter-node link."""
    inter = link_from(profile["links"]["inter"])
    return [
        (int(size), seconds, ring_allreduce(size, gpus, inter))
        for size, seconds in profile["world_check"]["times"]
        if seconds == seconds  # NaN: not measurable with this layout
    ]


def calibration_plan(
    *,
    workloads: list[str],
    batch_size: int,
    gpus: int,
    gpus_per_node: int,
    device: str,
    sizes: list[int] | None = None,
    steps: int = 20,
    warmup: int = 3,
    repeats: int = 5,
    block_steps: list[int] | None = None,
    block_repeats: int = 5,
    compute_only: bool = False,
    data_dir: str | None = None,
) -> dict:
    return {
        "workloads": workloads,
        "batch_size": batch_size,
        "gpus": gpus,
        "gpus_per_node": gpus_per_node,
        "device": device,
        "sizes": list(sizes or DEFAULT_SIZES),
        "steps": steps,
        "warmup": warmup,
        "repeats": repeats,
        "block_steps": list(block_steps or DEFAULT_BLOCK_STEPS),
        "block_repeats": block_repeats,
        "compute_only": compute_only,
        "data_dir": data_dir,
    }


def run_local(plan: dict, out_path: Path) -> None:
    """Run the calibration ranks on this machine through torch's elastic launcher."""
    from torch.distributed.launcher.api import elastic_launch

    from suite.launch import quiet_launcher_logs

    if plan["device"] == "cpu":
        os.environ["OMP_NUM_THREADS"] = "1"
    quiet_launcher_logs()
    with tempfile.TemporaryDirectory(prefix="prunex-launch-") as logs:
        launch = local_launch_config(plan["gpus"], f"calibrate-{os.getpid()}", log_dir=logs)
        elastic_launch(launch, calibration_rank)(json.dumps(plan), str(out_path))


def run_emulated(plan: dict, out_path: Path, inter_bw: str | None) -> None:
    """Run the calibration ranks in emulated nodes whose links are shaped to ``inter_bw``."""
    from suite.netemu import emulated_cluster, parse_rate, run_module_in_cluster

    if inter_bw is None:
        raise BenchError("--network emulated needs --inter-bw, e.g. 1gbit or 200mbit")
    if plan["device"] != "cpu":
        raise BenchError("--network emulated calibrates CPU ranks (gloo); use --device cpu")
    rate = parse_rate(inter_bw)
    nodes = plan["gpus"] // plan["gpus_per_node"]
    plan_file = out_path.with_suffix(".plan.json")
    with emulated_cluster(nodes, rate, f"calibrate-{out_path.name}") as cluster:
        plan["network"] = {**cluster.describe(), "inter_bw": inter_bw}
        plan_file.write_text(json.dumps(plan))
        code = run_module_in_cluster(
            cluster, plan["gpus_per_node"], "suite.calibrate", [str(plan_file), str(out_path)],
            out_path.parent / "calibrate-logs",
        )  # fmt: skip
    plan_file.unlink()
    if code or not out_path.exists():
        raise BenchError(f"calibration ranks failed; see {out_path.parent / 'calibrate-logs'}")


def calibrate_to_file(flags: dict, *, echo) -> Path:
    """``bench calibrate``: plan, measure (here or on emulated links), write the profile and
    print its headline numbers; returns the profile's path."""
    import shlex
    import sys

    from suite.registry import WORKLOADS, load_builtins
    from suite.sim.profile import load_profile
    from suite.topology import check_layout

    load_builtins()
    workloads = [w for w in flags["workload"].split(",") if w]
    for w in workloads:
        WORKLOADS.get(w)
    batch = flags["batch_size"] or WORKLOADS.get(workloads[0]).factory().recipe.batch_size
    gpus = flags["gpus"]
    gpus_per_node = flags["gpus_per_node"] or max(1, gpus // 2)
    check_layout(gpus, gpus_per_node)
    device = flags["device"]
    if device == "auto":
        device = "cuda" if torch.cuda.device_count() >= gpus else "cpu"
    name = (
        flags["name"] or f"{socket.gethostname()}-{device}-{gpus // gpus_per_node}x{gpus_per_node}"
    )
    if flags["compute_only"] and not flags["links_from"]:
        raise BenchError("--compute-only takes the links from --links-from PROFILE; give it")
    plan = calibration_plan(
        workloads=workloads,
        batch_size=batch,
        gpus=gpus,
        gpus_per_node=gpus_per_node,
        device=device,
        sizes=flags["sizes"],
        steps=flags["steps"],
        repeats=flags["repeats"],
        block_steps=flags["sync_blocks"],
        block_repeats=flags["block_repeats"],
        compute_only=flags["compute_only"],
        data_dir=flags["data_dir"],
    )
    links_from = load_profile(flags["links_from"]).raw if flags["links_from"] else None
    output = Path(flags["output"] or f"profiles/{name}.json")
    output.parent.mkdir(parents=True, exist_ok=True)
    raw_path = output.with_suffix(".raw.json")
    if flags["network"] == "emulated":
        run_emulated(plan, raw_path, flags["inter_bw"])
    else:
        run_local(plan, raw_path)
    raw = json.loads(raw_path.read_text())
    profile = build_profile(
        raw,
        plan,
        name=name,
        description=flags["description"] or f"bench calibrate on {raw['hostname']}",
        command=shlex.join(["bench", *sys.argv[1:]]),
        links_from=links_from,
    )
    output.write_text(json.dumps(profile, indent=2) + "\n")
    raw_path.unlink()
    for link in ("intra", "inter"):
        entry = profile["links"][link]
        echo(
            f"{link:<6} alpha {entry['alpha_s'] * 1e6:9.1f} us   "
            f"bandwidth {entry['bandwidth_Bps'] * 8 / 1e9:8.3f} Gbit/s"
        )
    for key, entry in profile["compute"]["steps"].items():
        echo(f"step   {key:<28} {entry['seconds'] * 1e3:9.2f} ms")
    echo(f"memory {profile['memory_bandwidth']['bandwidth_Bps'] / 1e9:9.2f} GB/s")
    for size, measured, predicted in world_check(profile, gpus):
        echo(
            f"world all-reduce {size:>9} B: measured {measured * 1e3:8.2f} ms, "
            f"model {predicted * 1e3:8.2f} ms"
        )
    echo(f"profile: {output}")
    return output


if __name__ == "__main__":  # a rank under torchrun (emulated network namespaces)
    import sys

    calibration_rank(Path(sys.argv[1]).read_text(), sys.argv[2])
