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
simulator's communicator, ``suite.sim.pricing.SimCommunicator.link``).

A link shaped by a token bucket (the emulated links: tc tbf) lets ``burst`` bytes through at
line speed before it paces at ``bandwidth``: the bucket holds ``burst`` tokens and refills at
``bandwidth``, so L bytes sent at once leave after max(0, L - burst) / bandwidth. The bandwidth
terms above take the bytes one rank sends over the whole collective (its load on the
interface) through that rule, with the bucket full at the collective's start (the link was
idle since the last one: compute, or a collective that drained less than a refill). Real
fabrics have no such bucket: ``burst`` is 0 and the formulas are the plain ones.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Link:
    """One link class: per-message latency (s), per-rank bandwidth (bytes/s), and the bytes a
    token-bucket shaper lets through unpaced (0: not shaped)."""

    alpha: float
    bandwidth: float
    burst: float = 0.0

    def transfer(self, load: float) -> float:
        """Seconds to push ``load`` bytes through this link, starting with a full bucket."""
        return max(0.0, load - self.burst) / self.bandwidth

    def share(self, factor: float) -> Link:
        """``factor`` of this link's interfaces: their bandwidth and their shapers' buckets."""
        return Link(self.alpha, self.bandwidth * factor, self.burst * factor)


def ring_allreduce(size: float, n: int, link: Link) -> float:
    if n < 2 or size <= 0:
        return 0.0
    return 2 * (n - 1) * link.alpha + link.transfer(2 * (n - 1) / n * size)


def ring_allgather(piece: float, n: int, link: Link) -> float:
    if n < 2 or piece <= 0:
        return 0.0
    return (n - 1) * link.alpha + link.transfer((n - 1) * piece)


def chain_broadcast(size: float, n: int, link: Link) -> float:
    if n < 2 or size <= 0:
        return 0.0
    return (n - 1) * link.alpha + link.transfer(size)


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
