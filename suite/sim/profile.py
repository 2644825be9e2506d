"""Hardware profiles: the numbers the simulator prices a run with, and where each came from.

A profile is a JSON file (``suite/sim/profiles/<name>.json`` ships with the suite; ``bench
calibrate`` writes new ones). Every number carries a ``source``: a measurement (command, date,
machine) or a published spec (document, table). Keys:

* ``gpus_per_node``: the node size the profile describes (the default for ``bench sim``);
* ``links.intra`` / ``links.inter``: ``alpha_s`` (per-message latency) and ``bandwidth_Bps``
  (per rank for intra, per network interface for inter), ``burst_bytes`` where a token-bucket
  shaper paces the link (emulated links; absent or 0 on real fabrics), and
  ``links.inter.rails``, the interfaces per node (1; 8 on rail-optimized nodes with a NIC per
  GPU);
* ``memory_bandwidth_Bps``: device memory bandwidth, used to price the methods' elementwise
  phases (projection, pack, unpack, dual update, compress) that a replay measures on the host;
* ``compute``: seconds per local step (forward, backward, optimizer) measured per
  ``workload@batch``, else estimated from the model's FLOPs and ``achieved_flops``; and
  ``backward_fraction``, the share of a step that DDP can overlap with its bucket all-reduces,
  and ``overlap_efficiency``, how much of that overlap the hardware delivers (measured; CPU
  ranks sharing cores with gloo's threads hide far less than GPUs with NCCL); per workload,
  ``sync_wait_s``, the measured wait for the slowest rank at a synchronization after k local
  steps (``[[k, seconds], ...]``, measured with ``sync_wait_ranks`` ranks), else
  ``jitter_s``, the standard deviation of a step, from which that wait is derived for
  independent normal steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from statistics import NormalDist
from typing import Annotated

import torch
from pydantic import Field

from suite.data.datasets import dataset_spec
from suite.errors import BenchError
from suite.plugins.registry import WORKLOADS
from suite.results.records import DamagedFile, Name, Ranks, Text, read_record, record
from suite.sim.costmodel import Link

PROFILE_DIR = Path(__file__).with_name("profiles")


@dataclass
class Profile:
    name: str
    description: str
    gpus_per_node: int
    intra: Link
    inter: Link
    memory_bandwidth: float
    rails: int = 1  # network interfaces per node (multi-rail nodes: one NIC per GPU)
    backward_fraction: float = 2 / 3
    overlap_efficiency: float = 1.0  # share of min(comm, backward) that really hides
    achieved_flops: float | None = None
    steps: dict[str, float] = field(default_factory=dict)  # "workload@batch" -> seconds
    jitter: dict[str, float] = field(default_factory=dict)  # "workload@batch" -> step std
    sync_waits: dict[str, tuple[int, list[tuple[int, float]]]] = field(default_factory=dict)
    raw: dict = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, data: dict) -> Profile:
        try:
            links = data["links"]
            compute = data.get("compute", {})
            return cls(
                name=data["name"],
                description=data.get("description", ""),
                gpus_per_node=int(data["gpus_per_node"]),
                intra=link_from(links["intra"]),
                inter=link_from(links["inter"]),
                memory_bandwidth=float(data["memory_bandwidth"]["bandwidth_Bps"]),
                rails=int(links["inter"].get("rails", 1)),
                backward_fraction=float(compute.get("backward_fraction", 2 / 3)),
                overlap_efficiency=float(compute.get("overlap_efficiency", 1.0)),
                achieved_flops=(
                    float(compute["achieved_flops"]["value"])
                    if "achieved_flops" in compute
                    else None
                ),
                steps={k: float(v["seconds"]) for k, v in compute.get("steps", {}).items()},
                jitter={
                    k: float(v.get("jitter_s", 0.0)) for k, v in compute.get("steps", {}).items()
                },
                sync_waits={
                    k: (
                        int(v["sync_wait_ranks"]),
                        [(int(n), float(w)) for n, w in v["sync_wait_s"]],
                    )
                    for k, v in compute.get("steps", {}).items()
                    if v.get("sync_wait_s")
                },
                raw=data,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise BenchError(f"profile {data.get('name', '?')!r} is malformed: {exc!r}") from None

    def sync_wait(self, workload: str, batch_size: int, steps: int, ranks: int) -> float:
        """Expected wait for the slowest of ``ranks`` ranks at a synchronization ``steps``
        local steps after the last one (0 where nothing was measured).

        From the measured curve: interpolated linearly in log k / log wait (extrapolated
        along its end segments) and scaled from the measured rank count to ``ranks`` by
        E[max of n normals]. Else from the step deviation, for independent normal steps:
        jitter * sqrt(k) * E[max of n normals]."""
        key = f"{workload}@{batch_size}"
        if steps < 1 or ranks < 2:
            return 0.0
        if key in self.sync_waits:
            measured_ranks, curve = self.sync_waits[key]
            scale = expected_max_of_normals(ranks) / expected_max_of_normals(measured_ranks)
            return scale * log_log_interpolate(curve, steps)
        return self.jitter.get(key, 0.0) * math.sqrt(steps) * expected_max_of_normals(ranks)

    def step_seconds(self, workload: str, batch_size: int) -> tuple[float, str]:
        """Seconds of one local step, and how the number was obtained."""
        key = f"{workload}@{batch_size}"
        if key in self.steps:
            return self.steps[key], f"measured ({key})"
        if self.achieved_flops:
            flops = training_flops(workload, batch_size)
            return flops / self.achieved_flops, (
                f"estimated: {flops / 1e9:.1f} GFLOP per step (torch.utils.flop_counter) / "
                f"{self.achieved_flops / 1e12:.2f} TFLOP/s achieved"
            )
        known = ", ".join(sorted(self.steps)) or "none"
        raise BenchError(
            f"profile {self.name!r} has no compute time for {key} (measured: {known}) and no "
            f"achieved_flops; run `bench calibrate --workload {workload} --batch-size "
            f"{batch_size}` on that hardware"
        )


def log_log_interpolate(curve: list[tuple[int, float]], x: float) -> float:
    """y(x) through the points of ``curve``, linear in log-log, extended by its end slopes."""
    points = sorted((k, w) for k, w in curve if k > 0 and w > 0)
    if not points:
        return 0.0
    if len(points) == 1:
        return points[0][1]
    logs = [(math.log(k), math.log(w)) for k, w in points]
    lx = math.log(x)
    i = next((i for i in range(1, len(logs) - 1) if lx < logs[i][0]), len(logs) - 1)
    (x0, y0), (x1, y1) = logs[i - 1], logs[i]
    return math.exp(y0 + (y1 - y0) * (lx - x0) / (x1 - x0))


@cache
def expected_max_of_normals(n: int, points: int = 4001) -> float:
    """E[max of n standard normals] = integral of x n phi(x) Phi(x)^(n-1) (0 for one rank)."""
    if n < 2:
        return 0.0
    normal, step = NormalDist(), 16 / (points - 1)
    xs = (-8 + i * step for i in range(points))
    return sum(x * n * normal.pdf(x) * normal.cdf(x) ** (n - 1) * step for x in xs)


Bandwidth = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Latency = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Share = Annotated[float, Field(ge=0, le=1)]
Curve = Annotated[list[Annotated[list[float], Field(min_length=2, max_length=2)]],
                  Field(max_length=10_000)]
LinkEntry = record("LinkEntry", {"alpha_s": Latency, "bandwidth_Bps": Bandwidth,
                                 "burst_bytes": Latency, "rails": Ranks},
                   required=("alpha_s", "bandwidth_Bps"))
StepEntry = record("StepEntry", {"seconds": Bandwidth, "jitter_s": Latency,
                                 "sync_wait_s": Curve, "sync_wait_ranks": Ranks},
                   required=("seconds",))
#: a profile file: what ``Profile.from_dict`` reads, each number of its kind and range
ProfileFile = record("ProfileFile", {
    "name": Name, "description": Text, "gpus_per_node": Ranks,
    "links": record("Links", {"intra": LinkEntry, "inter": LinkEntry},
                    required=("intra", "inter")),
    "memory_bandwidth": record("MemoryBandwidth", {"bandwidth_Bps": Bandwidth},
                               required=("bandwidth_Bps",)),
    "compute": record("Compute", {
        "backward_fraction": Share, "overlap_efficiency": Share,
        "achieved_flops": record("AchievedFlops", {"value": Bandwidth}, required=("value",)),
        "steps": dict[Name, StepEntry]}),
}, required=("name", "gpus_per_node", "links", "memory_bandwidth"))


def link_from(entry: dict) -> Link:
    return Link(
        float(entry["alpha_s"]), float(entry["bandwidth_Bps"]), float(entry.get("burst_bytes", 0))
    )


def load_profile(name_or_path: str) -> Profile:
    """A shipped profile by name (``bench sim --list-profiles``) or a JSON file path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PROFILE_DIR / f"{name_or_path}.json"
    if not path.exists():
        known = ", ".join(shipped_profiles())
        raise BenchError(f"no profile {name_or_path!r}; shipped: {known}, or give a JSON path")
    try:
        data = read_record(path, ProfileFile, what="profile")
    except DamagedFile as exc:
        raise BenchError(f"profile {exc}") from None
    return Profile.from_dict(data)


def shipped_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.json"))


@cache
def training_flops(workload: str, batch_size: int) -> float:
    """FLOPs of one training step (forward + backward) of the workload's real model at its
    dataset's input size, counted by torch.utils.flop_counter on the meta device."""
    # lazy: torch.utils.flop_counter costs ~0.2 s to import; only this path needs it
    from torch.utils.flop_counter import FlopCounterMode


    wl = WORKLOADS.build(workload)
    spec = dataset_spec(wl.dataset)
    with torch.device("meta"):
        model = wl.build_model(spec)
        x = torch.empty(batch_size, spec.in_chans, spec.image_size, spec.image_size)
    counter = FlopCounterMode(display=False)
    with counter:
        model(x).sum().backward()
    return float(counter.get_total_flops())
