"""Alpha-beta (latency-bandwidth) cost of the collectives the suite's methods issue.

A link class (intra-node or inter-node) is ``alpha`` seconds per message plus ``1/bandwidth``
seconds per byte. The formulas are the standard ones for the algorithms NCCL and gloo use for
large buffers (Thakur, Rabenseifner and Gropp, "Optimization of collective communication
operations in MPICH", IJHPCA 2005; Patarasuk and Yuan 2009 for the ring all-reduce):

* ring all-reduce of S bytes over n ranks: 2(n-1) steps of S/n each,
  ``2(n-1) alpha + 2(n-1)/n * S / B``;
* ring all-gather of a p-byte piece per rank: ``(n-1) alpha + (n-1) p / B``;
* pipelined-chain broadcast of S bytes: ``(n-1) alpha + S / B`` (the large-message limit);
* the hierarchical all-reduce (PruneX's leader pattern): intra ring all-reduce, inter ring
  all-reduce among the leaders, intra broadcast.

A ring whose ranks span nodes is paced by its slowest edge, the inter-node one (which link a
group's ring gets, and how concurrent rings share a node's interfaces, is decided by the
simulator's communicator, ``suite.sim.replay.SimCommunicator.link``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Link:
    """One link class: per-message latency (s) and per-rank bandwidth (bytes/s)."""

    alpha: float
    bandwidth: float


def ring_allreduce(size: float, n: int, link: Link) -> float:
    if n < 2 or size <= 0:
        return 0.0
    return 2 * (n - 1) * link.alpha + 2 * (n - 1) / n * size / link.bandwidth


def ring_allgather(piece: float, n: int, link: Link) -> float:
    if n < 2 or piece <= 0:
        return 0.0
    return (n - 1) * link.alpha + (n - 1) * piece / link.bandwidth


def chain_broadcast(size: float, n: int, link: Link) -> float:
    if n < 2 or size <= 0:
        return 0.0
    return (n - 1) * link.alpha + size / link.bandwidth


def hierarchical_allreduce(
    size: float, procs_per_node: int, nodes: int, intra: Link, inter: Link
) -> float:
    """Reduce inside the node, all-reduce among leaders, broadcast inside the node."""
    return (
        ring_allreduce(size, procs_per_node, intra)
        + ring_allreduce(size, nodes, inter)
        + chain_broadcast(size, procs_per_node, intra)
    )


COLLECTIVES = {
    "all_reduce": ring_allreduce,
    "all_gather": ring_allgather,
    "broadcast": chain_broadcast,
}


def collective_time(kind: str, size: float, n: int, link: Link) -> float:
    """``size``: the buffer (all-reduce, broadcast) or one rank's piece (all-gather)."""
    try:
        return COLLECTIVES[kind](size, n, link)
    except KeyError:
        raise ValueError(f"unknown collective kind {kind!r}") from None
