"""Simulated runs: a method's own step code, with collectives priced instead of issued.

One process plays global rank 0 (node 0's leader) of an N-rank job on ``gpus_per_node``-rank
nodes. The method is built exactly as in a real run, from the workload's real model (so every
buffer has its real size), and its ``step`` runs unchanged; what differs is underneath it:

* ``SimCommunicator`` prices each collective with the alpha-beta models of
  :mod:`suite.sim.costmodel` on the profile's links, attributes its bytes with the real
  communicator's ring model, and hands back what N identical replicas would get (a SUM is the
  tensor times n, a gather n copies), so the method's math and control flow stay valid;
* ``SimLoader`` has the real shard's steps per epoch but yields tiny stand-in batches (4x4
  images), because only the shapes of parameters and gradients matter to the schedule;
* ``SimRecorder`` charges each local step the profile's compute time (measured or estimated);
  lets collectives issued during the backward pass (DDP's bucket hooks) hide behind it as a
  pipeline does (bucket i is ready when the backward pass has produced its share of the
  gradients, one bucket is on the wire at a time, and only what ends after the backward pass
  shows), as far as the profile's measured overlap efficiency allows; scales the
  host-measured time of the methods' own elementwise phases (projection, pack, compress, ...)
  by host / device memory bandwidth; and adds ``straggler_wait``, the profile's expected wait
  for the slowest rank at a synchronization after this iteration's local steps.

Every other rank issues the same collectives on its own groups (SPMD) except the leaders-only
ones, so its bytes are the leader's event log re-attributed with that rank's topology. The
first ``replay`` iterations run for real; later ones repeat the last replayed schedule, which
is stationary once PruneX's masks are frozen (the manifest says whether they were).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.distributed as dist

from suite.calibrate import memory_bandwidth
from suite.comm import Communicator, nbytes
from suite.config import RunConfig
from suite.context import build_method, make_manifest, resolve_workload
from suite.errors import BenchError
from suite.recorder import Recorder
from suite.registry import METHODS
from suite.results import RunFolder, make_run_id, write_json, write_table, write_torch
from suite.sim.costmodel import Link, collective_time
from suite.sim.profile import Profile
from suite.summary import summarize
from suite.topology import CommGroup, Topology, check_layout
from workloads.datasets import dataset_spec, split_sizes

STAND_IN_SIZE = 4  # spatial size of the stand-in images: every model here pools globally
STAND_IN_BATCH = 2  # BatchNorm in training mode needs more than one value per channel
DEFAULT_REPLAY = 10


class SimLoader:
    """The real shard's ``steps_per_epoch`` and ``batch_size``; stand-in batches."""

    def __init__(self, spec, train_samples: int, world_size: int, batch_size: int, seed: int):
        shard = train_samples // world_size
        if shard == 0:
            raise BenchError(f"{train_samples} training samples cannot fill {world_size} shards")
        self.batch_size = min(batch_size, shard)
        self.steps_per_epoch = shard // self.batch_size
        self.step = 0
        generator = torch.Generator().manual_seed(seed)
        shape = (STAND_IN_BATCH, spec.in_chans, STAND_IN_SIZE, STAND_IN_SIZE)
        self.images = torch.randn(shape, generator=generator)
        self.labels = torch.randint(spec.num_classes, (STAND_IN_BATCH,), generator=generator)

    def __iter__(self) -> SimLoader:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        self.step += 1
        return self.images, self.labels


def sim_topology(world_size: int, gpus_per_node: int, rank: int, pg=None) -> Topology:
    """The topology rank ``rank`` would build, with every group backed by ``pg``."""
    num_nodes = check_layout(world_size, gpus_per_node)
    node_ranks = [list(range(n * gpus_per_node, (n + 1) * gpus_per_node)) for n in range(num_nodes)]
    node, local = divmod(rank, gpus_per_node)
    leaders = tuple(r[0] for r in node_ranks)
    return Topology(
        rank=rank,
        world_size=world_size,
        gpus_per_node=gpus_per_node,
        num_nodes=num_nodes,
        emulated=True,
        node_ranks=node_ranks,
        world=CommGroup("world", tuple(range(world_size)), pg),
        intra=CommGroup("intra", tuple(node_ranks[node]), pg),
        inter=CommGroup("inter", leaders, pg) if local == 0 else None,
        peers=CommGroup("peers", tuple(r[local] for r in node_ranks), pg),
        hostnames=["simulated"] * world_size,
    )


@dataclass(frozen=True)
class Event:
    """One priced collective, as every rank of the job would issue it."""

    kind: str
    group: str  # world | intra | inter | peers
    size: int
    src_position: int | None
    phase: str
    seconds: float


class SimCommunicator(Communicator):
    def __init__(self, topology: Topology, recorder: Recorder, device, profile: Profile):
        super().__init__(topology, recorder, device)
        self.profile = profile
        self.events: list[Event] = []

    def link(self, group: CommGroup) -> Link:
        """The link that paces a ring over ``group``: the intra link inside a node, else the
        node's network interfaces, as many rails as the group has ranks on a node can use,
        shared by the concurrent sibling rings of sharded leaders."""
        nodes = {self.topology.node_of(r) for r in group.ranks}
        if len(nodes) == 1:
            return self.profile.intra
        inter, rails = self.profile.inter, self.profile.rails
        if group.name == "peers":  # sharded leaders: P concurrent rings share the node's rails
            procs = self.topology.gpus_per_node
            return inter.share(min(rails, procs) / procs)
        # one ring (NCCL: one channel per rail) with group.size / nodes ranks on each node
        return inter.share(min(rails, group.size // len(nodes)))

    def price(self, kind: str, group: CommGroup, size: int, *, src=None, phase: str) -> None:
        Communicator.account(self, kind, group, size, src=src)
        seconds = collective_time(kind, size, group.size, self.link(group))
        self.recorder.add_time(phase, seconds)
        position = None if src is None else group.position(src)
        self.events.append(Event(kind, group.name, size, position, phase, seconds))

    def account(self, kind: str, group: CommGroup, size: int, *, src: int | None = None) -> None:
        """Collectives issued inside torch's comm hooks (16-bit DDP, PowerSGD)."""
        self.price(kind, group, size, src=src, phase="allreduce")

    def all_reduce(self, tensor, group, *, phase, op=dist.ReduceOp.SUM):
        self.price("all_reduce", group, nbytes(tensor), phase=phase)
        if op == dist.ReduceOp.SUM:
            tensor.mul_(group.size)  # n identical replicas
        return tensor

    def all_reduce_async(self, tensor, group, *, phase):
        self.all_reduce(tensor, group, phase=phase)
        future = torch.futures.Future()
        future.set_result(tensor)
        return future

    def all_gather(self, tensor, group, *, phase):
        self.price("all_gather", group, nbytes(tensor), phase=phase)
        return tensor.unsqueeze(0).expand(group.size, *tensor.shape).clone()

    def broadcast(self, tensor, group, *, src, phase):
        self.price("broadcast", group, nbytes(tensor), src=src, phase=phase)
        return tensor


class SimRecorder(Recorder):
    """Prices an iteration: compute from the profile, collectives from the cost model."""

    def __init__(
        self,
        rank: int,
        device,
        loader: SimLoader,
        *,
        step_seconds: float,
        backward_fraction: float,
        overlap_efficiency: float,
        host_scale: float,
        sync_wait: Callable[[int], float] = lambda steps: 0.0,
    ):
        super().__init__(rank, device)
        self.loader = loader
        self.step_seconds = step_seconds
        self.backward_fraction = backward_fraction
        self.overlap_efficiency = overlap_efficiency
        self.sync_wait = sync_wait
        self.host_scale = host_scale
        self._compute_depth = 0
        self._overlappable: list[float] = []
        self._steps_at_start = 0

    def begin_iteration(self, iteration: int) -> None:
        super().begin_iteration(iteration)
        self._overlappable = []
        self._steps_at_start = self.loader.step

    @contextmanager
    def phase(self, name: str):
        if name == "local_compute":  # priced per step in iteration_seconds
            self._compute_depth += 1
            try:
                yield
            finally:
                self._compute_depth -= 1
        else:
            start = time.perf_counter()
            try:
                yield
            finally:
                self.add_time(name, (time.perf_counter() - start) * self.host_scale)

    def add_time(self, phase: str, seconds: float) -> None:
        super().add_time(phase, seconds)
        if self._compute_depth and phase != "local_compute":
            self._overlappable.append(seconds)  # issued during backward (DDP bucket hooks)

    @property
    def steps_this_iteration(self) -> int:
        return self.loader.step - self._steps_at_start

    def iteration_seconds(self) -> float:
        steps = self.steps_this_iteration
        compute = steps * self.step_seconds
        self._seconds["local_compute"] = compute
        if steps:
            self._seconds["straggler_wait"] = self.sync_wait(steps)
        backward = self.backward_fraction * self.step_seconds  # the last step's backward
        hidden = self.overlap_efficiency * pipelined_hidden(self._overlappable, backward)
        return sum(self._seconds.values()) - hidden


def pipelined_hidden(buckets: list[float], backward: float) -> float:
    """Seconds of the buckets' collectives that finish within the backward pass.

    Bucket i is ready when the backward pass has produced its share of the gradients (the
    buckets' shares in issue order, by their collective times, which are proportional to their
    bytes on one link) and starts when it is ready and the previous one is done; what ends
    after the backward pass is exposed."""
    total = sum(buckets)
    if total <= 0 or backward <= 0:
        return 0.0
    done = produced = 0.0
    for seconds in buckets:
        produced += seconds
        done = max(done, backward * produced / total) + seconds
    return max(0.0, total - max(0.0, done - backward))


def rank_rows(leader_row: dict, events: list[Event], world: int, gpus_per_node: int) -> list[dict]:
    """Every rank's row of one iteration: the leader's, with bytes and collective times
    re-derived from the event log on each rank's own groups (leaders-only ones skipped)."""
    comm_phases = {e.phase for e in events}
    rows = []
    for rank in range(world):
        topo = sim_topology(world, gpus_per_node, rank)
        recorder = Recorder(rank, torch.device("cpu"))
        accountant = Communicator(topo, recorder, torch.device("cpu"))
        recorder.begin_iteration(leader_row["iteration"])
        seconds = dict.fromkeys(comm_phases, 0.0)
        for event in events:
            group = getattr(topo, event.group)
            if group is None:
                continue  # the leaders' group: this rank is a follower
            src = None if event.src_position is None else group.ranks[event.src_position]
            accountant.account(event.kind, group, event.size, src=src)
            seconds[event.phase] += event.seconds
        counted = recorder.end_iteration()
        row = dict(leader_row, rank=rank)
        row.update(bytes_intra=counted["bytes_intra"], bytes_inter=counted["bytes_inter"])
        if rank:
            row.update({f"t_{phase}": s for phase, s in seconds.items()})
        rows.append(row)
    return rows


def ensure_single_process_group() -> None:
    """A one-rank gloo world for torch code under the methods (DDP, comm hooks)."""
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


@dataclass
class Borrowed:
    """Accuracy a simulated run takes from a named real run."""

    run_id: str
    final_accuracy: float | None
    best_accuracy: float | None


def borrowed_accuracy(run_dir: str | None) -> Borrowed | None:
    if run_dir is None:
        return None
    summary = RunFolder(run_dir).summary()
    if summary is None or summary.get("status") != "ok":
        raise BenchError(f"--accuracy-from {run_dir}: not a finished run folder (no ok summary)")
    if summary.get("simulated"):
        raise BenchError(f"--accuracy-from {run_dir}: a simulated run has no accuracy to lend")
    return Borrowed(
        summary.get("run_id", Path(run_dir).name),
        summary.get("final_accuracy"),
        summary.get("best_accuracy"),
    )


def check_simulable(method: str) -> None:
    reason = METHODS.get(method).not_simulable
    if reason is not None:
        raise BenchError(f"the simulator cannot replay {method}: {reason}")


def simulate_run(
    config: RunConfig,
    profile: Profile,
    *,
    replay: int = DEFAULT_REPLAY,
    accuracy: Borrowed | None = None,
    host_memory_bandwidth: float | None = None,
) -> Path:
    """Simulate ``config`` (one method, one GPU count) and write its run folder."""
    check_simulable(config.method)
    workload, recipe, dataset = resolve_workload(config)
    gpn = config.gpus_per_node or profile.gpus_per_node
    num_nodes = check_layout(config.gpus, gpn)
    spec = dataset_spec(dataset)
    train_samples, test_samples = split_sizes(dataset, config.synthetic_size)
    step_seconds, step_source = profile.step_seconds(config.workload, recipe.batch_size)
    host_bw = host_memory_bandwidth or memory_bandwidth(torch.device("cpu"))

    ensure_single_process_group()
    device = torch.device("cpu")
    topology = sim_topology(config.gpus, gpn, rank=0, pg=dist.group.WORLD)
    loader = SimLoader(spec, train_samples, config.gpus, recipe.batch_size, config.seed)
    recorder = SimRecorder(
        0,
        device,
        loader,
        step_seconds=step_seconds,
        backward_fraction=profile.backward_fraction,
        overlap_efficiency=profile.overlap_efficiency,
        host_scale=host_bw / profile.memory_bandwidth,
        sync_wait=lambda steps: profile.sync_wait(
            config.workload, recipe.batch_size, steps, config.gpus
        ),
    )
    comm = SimCommunicator(topology, recorder, device, profile)
    if config.run_id is None:
        config.run_id = "sim-" + make_run_id(config.method, config.workload, config.gpus)
    ctx, method, iterations = build_method(
        config, topology=topology, comm=comm, recorder=recorder, workload=workload,
        recipe=recipe, spec=spec, loader=loader, device=device,
    )  # fmt: skip

    rows: list[dict] = []
    last: list[dict] = []
    replayed = 0
    for it in range(iterations):
        local_steps = min((it + 1) * method.steps_per_iteration, ctx.budget_steps)
        epoch = local_steps / loader.steps_per_epoch
        if it < replay:
            recorder.begin_iteration(it)
            comm.events.clear()
            info = method.step(it)
            extra = {k: v for k, v in info.items() if k not in ("loss", "samples", "converged")}
            leader = recorder.end_iteration(
                loss=math.nan,  # the stand-in batches' loss means nothing
                samples=recorder.steps_this_iteration * loader.batch_size,
                epoch=epoch,
                **extra,
            )
            last = rank_rows(leader, comm.events, config.gpus, gpn)
            replayed += 1
        else:
            last = [dict(row, iteration=it, epoch=epoch) for row in last]
        rows.extend(last)

    folder = RunFolder(Path(config.results_dir) / config.run_id)
    folder.path.mkdir(parents=True, exist_ok=True)
    stationary = replayed == iterations or (
        rows[-1].get("frozen", True) is not False and _same_schedule(rows, config.gpus, replayed)
    )
    manifest = make_manifest(
        config, ctx, method, dataset=dataset, iterations=iterations,
        train_samples=train_samples, test_samples=test_samples,
        device="simulated", backend="simulated",
        topology={
            "world_size": config.gpus,
            "num_nodes": num_nodes,
            "gpus_per_node": gpn,
            "emulated_nodes": False,
            "node_ranks": topology.node_ranks,
            "leaders": topology.leaders,
        },
        simulated=True,
        simulation={
            "profile": profile.raw,
            "step_seconds": step_seconds,
            "step_seconds_source": step_source,
            "host_memory_bandwidth_Bps": host_bw,
            "replayed_iterations": replayed,
            "stationary_after_replay": stationary,
            "accuracy_from": accuracy.run_id if accuracy else None,
        },
    )  # fmt: skip
    write_json(folder.path / "manifest.json", manifest)
    frame = _frame(rows)
    write_table(folder.path / "iterations.parquet", frame)
    if recorder.layers:
        write_table(folder.path / "layers.parquet", recorder.layers)
    for name, obj in method.artifacts().items():  # masks.pt: what the replay's masks were
        write_torch(folder.path / name, obj)
    summary = summarize(
        config=config,
        manifest=manifest,
        dataset=dataset,
        iterations_done=iterations,
        iterations=frame,
        evals=None,
        wall_seconds=float(frame.groupby("iteration")["t_iteration"].max().sum()),
        time_to_target=None,
        converged=False,
    )
    if accuracy is not None:
        summary.update(
            final_accuracy=accuracy.final_accuracy,
            best_accuracy=accuracy.best_accuracy,
            accuracy_from=accuracy.run_id,
        )
    folder.write_summary(summary)
    return folder.path


def _same_schedule(rows: list[dict], world: int, replayed: int) -> bool:
    """Whether the last two replayed iterations moved the same bytes (a stationary schedule)."""
    if replayed < 2:
        return False
    end = replayed * world
    a, b = rows[end - 2 * world : end - world], rows[end - world : end]
    return all(
        x["bytes_inter"] == y["bytes_inter"] and x["bytes_intra"] == y["bytes_intra"]
        for x, y in zip(a, b)
    )


def _frame(rows: list[dict]):
    import pandas as pd

    return pd.DataFrame(rows).sort_values(["iteration", "rank"], kind="stable")


def run_simulations(
    methods: list[str],
    gpus: list[int],
    base: RunConfig,
    given: dict,
    *,
    profile: str | None,
    replay: int | None,
    accuracy_from: str | None,
    dry_run: bool = False,
    echo,
) -> list[Path]:
    """One simulated run folder per (method, GPU count); each method gets the options it
    declares. Everything is checked before the first simulation starts."""
    from suite.plan import split_options, validate
    from suite.sim.profile import load_profile

    loaded = load_profile(profile or "v100-ib100")
    accuracy = borrowed_accuracy(accuracy_from)
    if replay is not None and replay < 1:
        raise BenchError(f"--replay must be at least 1, got {replay}")
    configs = []
    for method in methods:
        check_simulable(method)
        options, ignored = split_options(method, given)
        if ignored and len(methods) == 1:
            echo(f"warning: {', '.join(ignored)} not read by {method}; ignored", err=True)
        for n in gpus:
            config = replace(base, method=method, gpus=n, options=dict(options))
            config.gpus_per_node = config.gpus_per_node or loaded.gpus_per_node
            if len(methods) * len(gpus) > 1:
                config.run_id = None
            validate(config, check_data=False)
            configs.append(config)
    if dry_run:
        for config in configs:
            echo(f"{config.method:<12} {config.gpus:>4} GPUs on {loaded.name} "
                 f"({config.gpus // config.gpus_per_node} x {config.gpus_per_node}), "
                 f"options {config.options}")  # fmt: skip
        return []
    paths = []
    for config in configs:
        path = simulate_run(config, loaded, replay=replay or DEFAULT_REPLAY, accuracy=accuracy)
        summary = json.loads((path / "summary.json").read_text())
        echo(
            f"{config.method:<12} {config.gpus:>4} GPUs  "
            f"{summary['iteration_seconds'] * 1e3:9.1f} ms/iteration  "
            f"{summary['inter_node_bytes_per_iteration'] / 1e6:9.2f} MB inter/iteration  "
            f"-> {path}"
        )
        paths.append(path)
    return paths
