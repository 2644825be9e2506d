"""Collectives and time priced instead of spent: the simulator's communicator and recorder.

``SimCommunicator`` prices each collective with the alpha-beta models of
``suite.sim.costmodel`` on the profile's links and hands back what N identical replicas
would get; ``SimRecorder`` charges each local step the profile's compute time, hides DDP's
bucket all-reduces behind the backward pass as a pipeline does, scales the host-timed
elementwise phases (the replaying thread's CPU seconds) by memory bandwidth and adds the
expected wait for the slowest rank (``suite.sim.replay`` says how the pieces fit). Every
other rank issues the same collectives on its own groups (SPMD) except the leaders-only
ones, so its bytes are the leader's event log re-attributed with that rank's topology
(``rank_rows``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist

from suite.cluster import phases
from suite.cluster.comm import Communicator, nbytes
from suite.cluster.recorder import Recorder
from suite.cluster.topology import CommGroup, Topology
from suite.results import schema
from suite.sim.costmodel import Link, collective_time
from suite.sim.profile import Profile
from suite.sim.standins import SimLoader, sim_topology


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
        self.price(kind, group, size, src=src, phase=phases.ALLREDUCE)

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


def host_work_seconds() -> float:
    """The replaying thread's CPU seconds: the clock the host-timed phases are priced on.

    A real run times a phase on a device it has to itself, so its seconds are the phase's
    work. The replay's host is shared: its wall clock also holds every slice the OS gave to
    another process (ResNet-18's Top-K compress with two busy loops on its core: 2.7x the
    quiet wall time, 1.02x the quiet CPU time, tests/sim/test_load.py), and a load that came
    and went between a sweep's cells priced Top-K at a parallel efficiency of 1.04. The
    replay runs torch on this one thread (``single_threaded``) and its phases neither sleep
    nor wait (collectives are priced, not issued), so the thread's CPU time is what the same
    work takes on an idle host. The best of repeated timings cannot replace it: a phase runs
    once per iteration and changes state (error feedback, duals), so it cannot be re-run."""
    return time.thread_time()


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
        if name == phases.LOCAL_COMPUTE:  # priced per step in iteration_seconds
            self._compute_depth += 1
            try:
                yield
            finally:
                self._compute_depth -= 1
        else:
            start = host_work_seconds()
            try:
                yield
            finally:
                self.add_time(name, (host_work_seconds() - start) * self.host_scale)

    def add_time(self, phase: str, seconds: float) -> None:
        super().add_time(phase, seconds)
        if self._compute_depth and phase != phases.LOCAL_COMPUTE:
            self._overlappable.append(seconds)  # issued during backward (DDP bucket hooks)

    @property
    def steps_this_iteration(self) -> int:
        return self.loader.step - self._steps_at_start

    def iteration_seconds(self) -> float:
        steps = self.steps_this_iteration
        compute = steps * self.step_seconds
        self._seconds[phases.LOCAL_COMPUTE] = compute
        if steps:
            self._seconds[phases.STRAGGLER_WAIT] = self.sync_wait(steps)
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
        recorder.begin_iteration(leader_row[schema.ITERATION])
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
        row.update({schema.BYTES_INTRA: counted[schema.BYTES_INTRA],
                    schema.BYTES_INTER: counted[schema.BYTES_INTER]})
        if rank:
            row.update({f"t_{phase}": s for phase, s in seconds.items()})
        rows.append(row)
    return rows
