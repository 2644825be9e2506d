"""Which ranks share a node, and the process groups built from that once per run.

Nodes are discovered from the job (hostnames gathered over the world group, which covers
torchrun, SLURM and plain multi-host launches alike) or emulated on one machine with
``--gpus-per-node``. Ranks of a node must be contiguous, as torchrun and SLURM place them;
the ring model of the communicator relies on that ordering.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass, field

import torch.distributed as dist

from suite.cluster.ranks import collective_timeout
from suite.cluster.watchdog import watched
from suite.errors import BenchError
from suite.results import schema


@dataclass(frozen=True)
class CommGroup:
    """A process group plus the global ranks in it, in group-rank (ring) order: what every
    ``Communicator`` call takes.

    Attributes:
        name: ``world``, ``intra``, ``inter``, ``peers`` or a method's own.
        ranks: its global ranks, in ring order.
        pg: the torch process group.
    """

    name: str
    ranks: tuple[int, ...]
    pg: object = field(compare=False, repr=False)

    @property
    def size(self) -> int:
        """How many ranks the group holds (the communicator counts no bytes on a group of
        one)."""
        return len(self.ranks)

    def position(self, rank: int) -> int:
        """Global ``rank``'s place in the ring order (its group rank): where its ring
        successor and a broadcast's chain start are read from. Raises ValueError when
        ``rank`` is not in the group."""
        return self.ranks.index(rank)


def check_layout(gpus: int, gpus_per_node: int) -> int:
    """Validate an N-ranks-on-G-per-node layout and return the node count."""
    if gpus < 1:
        raise BenchError(f"--gpus must be at least 1, got {gpus}")
    if gpus_per_node < 1:
        raise BenchError(f"--gpus-per-node must be at least 1, got {gpus_per_node}")
    if gpus % gpus_per_node:
        raise BenchError(
            f"--gpus {gpus} is not divisible by --gpus-per-node {gpus_per_node}; "
            f"use a multiple of {gpus_per_node}"
        )
    return gpus // gpus_per_node


@dataclass
class Topology:
    """Which ranks share a node, and the groups built from that once per run: ``world``,
    ``intra`` (this rank's node), ``inter`` (the node leaders; None on followers), ``peers``
    (this local rank on every node, made on first use).

    Examples:
        ```python
        topo = ctx.topology
        if topo.is_leader and topo.inter is not None:
            ctx.comm.all_reduce(buffer, topo.inter, phase=phases.INTER_ALLREDUCE)
        ctx.comm.broadcast(buffer, topo.intra, src=topo.intra.ranks[0], phase=phases.BROADCAST)
        ```
    """

    rank: int
    world_size: int
    gpus_per_node: int
    num_nodes: int
    emulated: bool
    node_ranks: list[list[int]]
    world: CommGroup
    intra: CommGroup  # this rank's node
    inter: CommGroup | None  # node leaders; None on followers
    hostnames: list[str]
    #: how a process group is made (collective over the world for a real one)
    new_group: Callable[[list[int]], object] | None = field(default=None, repr=False)
    _peers: CommGroup | None = field(default=None, repr=False)

    @property
    def peers(self) -> CommGroup:
        """The ranks with this rank's local rank on every node (``--leader-mode sharded``).
        Made on first use, by every rank at the same point (a real group is collective over
        the world): a run that does not shard never builds these world-spanning groups."""
        if self._peers is None:
            peer_ranks = [[ranks[i] for ranks in self.node_ranks]
                          for i in range(self.gpus_per_node)]
            pgs = [self.new_group(ranks) for ranks in peer_ranks]
            local = self.local_rank
            self._peers = CommGroup("peers", tuple(peer_ranks[local]), pgs[local])
        return self._peers

    @property
    def node(self) -> int:
        """This rank's node, counted from 0."""
        return self.node_of(self.rank)

    @property
    def local_rank(self) -> int:
        """This rank's place within its node (0: the leader); it picks the ``peers`` group
        the rank is in."""
        return self.rank % self.gpus_per_node

    @property
    def leaders(self) -> list[int]:
        """Each node's first global rank, in node order: the ranks of ``inter``."""
        return [ranks[0] for ranks in self.node_ranks]

    @property
    def is_leader(self) -> bool:
        """Whether this rank is its node's leader, the one that exchanges between nodes
        (``inter`` is None on every other rank)."""
        return self.local_rank == 0

    def node_of(self, rank: int) -> int:
        """The node of global ``rank`` (a node's ranks are contiguous): how the communicator
        tells whether a ring edge crosses nodes."""
        return rank // self.gpus_per_node

    def describe(self) -> dict:
        """The manifest's ``topology`` (its keys: suite.results.schema)."""
        return {
            schema.WORLD_SIZE: self.world_size,
            schema.NUM_NODES: self.num_nodes,
            schema.GPUS_PER_NODE: self.gpus_per_node,
            schema.EMULATED_NODES: self.emulated,
            schema.NODE_RANKS: self.node_ranks,
            schema.LEADERS: self.leaders,
            schema.HOSTNAMES: sorted(set(self.hostnames)),
            # the hosts the ranks ran on, in rank order, and whether the node size matched them
            schema.HOSTS: [host for host, _ in host_blocks(self.hostnames)],
            schema.RANKS_PER_HOST: ranks_per_host(self.hostnames),
            schema.GPUS_PER_NODE_MATCHES_HOSTS: (
                ranks_per_host(self.hostnames) == self.gpus_per_node),
        }


def host_blocks(hostnames: list[str]) -> list[tuple[str, int]]:
    """(host, ranks) for each run of equal hostnames, in rank order."""
    blocks: list[tuple[str, int]] = []
    for host in hostnames:
        if blocks and blocks[-1][0] == host:
            blocks[-1] = (host, blocks[-1][1] + 1)
        else:
            blocks.append((host, 1))
    return blocks


def ranks_per_host(hostnames: list[str]) -> int | None:
    """Ranks per host when the hosts hold equal contiguous blocks, else None."""
    blocks = host_blocks(hostnames)
    sizes = {n for _, n in blocks}
    if len(sizes) != 1 or len({h for h, _ in blocks}) != len(blocks):
        return None
    return sizes.pop()


def discover_gpus_per_node(hostnames: list[str]) -> int:
    """Ranks per host, from the gathered hostnames; hosts must hold equal contiguous blocks."""
    found = ranks_per_host(hostnames)
    if found is None:
        raise BenchError(
            "ranks are not placed as equal contiguous blocks per host "
            f"({host_blocks(hostnames)}); launch the same number of ranks on every node"
        )
    return found


def build_topology(gpus_per_node: int | None) -> Topology:
    """Collective: every rank must call this, in the same order, after init_process_group."""
    rank, world = dist.get_rank(), dist.get_world_size()
    hostnames: list[str | None] = [None] * world
    # all_gather_object reads its result back: the wait ends when the collective completes
    with watched("all_gather_object", "world (hostnames, for the topology)"):
        dist.all_gather_object(hostnames, socket.gethostname())
    per_host = ranks_per_host([str(h) for h in hostnames])
    gpn = gpus_per_node if gpus_per_node is not None else discover_gpus_per_node(hostnames)
    # --gpus-per-node emulates nodes where it does not match the real hosts (one machine)
    emulated = gpn != per_host
    with watched("new_group", "world (the topology's groups)"):  # every rank makes each one
        return lay_out(
            rank, world, gpn,
            world_pg=dist.group.WORLD,
            new_group=lambda ranks: dist.new_group(ranks, timeout=collective_timeout()),
            emulated=emulated,
            hostnames=[str(h) for h in hostnames],
        )


def lay_out(
    rank: int,
    world: int,
    gpus_per_node: int,
    *,
    world_pg: object,
    new_group: Callable[[list[int]], object],
    emulated: bool,
    hostnames: list[str],
) -> Topology:
    """``rank``'s topology of ``world`` ranks in contiguous nodes of ``gpus_per_node``: the
    one layout of real runs and the simulator. ``new_group`` gives each group's process
    group; a real one is collective over the world, so every rank creates every group, in
    this order: each node's, the leaders' (each local rank's peers on first use)."""
    num_nodes = check_layout(world, gpus_per_node)
    node_ranks = [list(range(n * gpus_per_node, (n + 1) * gpus_per_node)) for n in range(num_nodes)]
    node, local = divmod(rank, gpus_per_node)
    intra = [new_group(ranks) for ranks in node_ranks][node]
    leaders = [ranks[0] for ranks in node_ranks]
    leaders_pg = new_group(leaders)
    return Topology(
        rank=rank,
        world_size=world,
        gpus_per_node=gpus_per_node,
        num_nodes=num_nodes,
        emulated=emulated,
        node_ranks=node_ranks,
        world=CommGroup("world", tuple(range(world)), world_pg),
        intra=CommGroup("intra", tuple(node_ranks[node]), intra),
        inter=CommGroup("inter", tuple(leaders), leaders_pg) if local == 0 else None,
        hostnames=hostnames,
        new_group=new_group,
    )
