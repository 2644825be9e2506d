"""The one door to torch.distributed collectives for every method.

Each call is timed and its algorithmic bytes are attributed to the link they cross. The
model is the ring, in group-rank order, counted at the sender (see README, "Byte
accounting"):

* all-reduce of S bytes over n ranks: every rank sends 2(n-1)/n * S to its ring successor;
* all-gather of a p-byte piece per rank: every rank sends (n-1) * p to its successor;
* broadcast of S bytes: a pipelined chain from the root; every rank but the last sends S;

and a rank's bytes count as ``inter`` when its successor lives on another node, else
``intra``. Summed over ranks this is the volume crossing node boundaries, e.g. a flat ring
over M nodes moves M * 2(n-1)/n * S bytes across them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from suite import compat
from suite.cluster.audit import AUDIT
from suite.cluster.phases import known_phase
from suite.cluster.recorder import Recorder, synchronize
from suite.cluster.topology import CommGroup, Topology
from suite.cluster.watchdog import POSITION, watched


def nbytes(tensor: torch.Tensor) -> int:
    """Bytes of ``tensor``'s elements.

    Args:
        tensor: any tensor.

    Returns:
        ``numel * element_size``.
    """
    return tensor.numel() * tensor.element_size()


def flatten(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """One contiguous copy of ``tensors``, so a single collective carries them all.

    Args:
        tensors: tensors of one dtype and device.

    Returns:
        A 1-D tensor holding them in order.

    Examples:
        ```python
        flat = ctx.comm.all_reduce(flatten(grads), ctx.topology.world, phase=phases.ALLREDUCE)
        unflatten_into(grads, flat.div_(ctx.topology.world_size))
        ```
    """
    return _flatten_dense_tensors(list(tensors))


def unflatten(flat: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Views of ``flat`` shaped like ``like`` (the inverse of ``flatten``).

    Args:
        flat: a buffer made by ``flatten``.
        like: the tensors it was made from (their shapes).

    Returns:
        One view per tensor of ``like``.
    """
    return list(_unflatten_dense_tensors(flat, list(like)))


def unflatten_into(tensors: Sequence[torch.Tensor], flat: torch.Tensor) -> None:
    """Copy ``flat`` back into ``tensors`` (in place).

    Args:
        tensors: the tensors ``flat`` was made from.
        flat: a buffer made by ``flatten`` (e.g. after a collective).
    """
    for target, value in zip(tensors, unflatten(flat, tensors)):
        target.copy_(value)


class Communicator:
    """The one door to collectives for every method (``ctx.comm``): each call is timed
    under ``phase`` and its algorithmic bytes are attributed to the link they cross (the ring
    model of the run-folders page). ``phase`` must be a known phase.

    Examples:
        ```python
        ctx.comm.all_reduce(flat, ctx.topology.intra, phase=phases.INTRA_ALLREDUCE)
        gathered = ctx.comm.all_gather(values, ctx.topology.world, phase=phases.ALLGATHER)
        ```
    """

    def __init__(self, topology: Topology, recorder: Recorder, device: torch.device):
        self.topology = topology
        self.recorder = recorder
        self.device = device

    # -- accounting -------------------------------------------------------------------
    def link_to_successor(self, group: CommGroup, start: int = 0) -> tuple[str, bool]:
        """Link class of this rank's outgoing ring edge, and whether it is the chain's end.

        ``start`` is the group position where a chain (broadcast) begins.
        """
        rank = self.topology.rank
        pos = group.position(rank)
        successor = group.ranks[(pos + 1) % group.size]
        last_in_chain = (pos + 1) % group.size == start
        same = self.topology.node_of(successor) == self.topology.node_of(rank)
        return ("intra" if same else "inter"), last_in_chain

    def _account(self, group: CommGroup, sent_bytes: float) -> None:
        if group.size < 2 or sent_bytes == 0:
            return
        link, _ = self.link_to_successor(group)
        self.recorder.add_bytes(link, sent_bytes)

    def account(
        self, kind: str, group: CommGroup, size: int, *, src: int | None = None,
        phase: str | None = None,
    ) -> None:
        """Attribute a collective issued outside this class (e.g. by a torch DDP comm hook
        such as PowerSGD) by the same ring model. ``size``: bytes of the all-reduced or broadcast
        buffer, or one rank's all-gather piece; ``phase``, when given, must be a known phase
        (a typo fails here, at its first use). The watchdog learns the collective here, and
        the audit of collectives issued past the communicator (suite.cluster.audit) that it
        was declared: a collective neither issued nor declared here fails a multi-node run."""
        if phase is not None:
            known_phase(phase)
        AUDIT.declare(group.pg, size)  # what the audit subtracts from the group's collectives
        n = group.size
        if n > 1:
            POSITION.issued(kind, group.name, group.ranks)
        if kind == "all_reduce":
            self._account(group, 2 * (n - 1) / n * size)
        elif kind == "all_gather":
            self._account(group, (n - 1) * size)
        elif kind == "broadcast":
            assert src is not None, "broadcast needs its root"
            start = group.position(src)
            link, last = self.link_to_successor(group, start)
            if n > 1 and not last:
                self.recorder.add_bytes(link, size)
        else:
            raise ValueError(f"unknown collective kind {kind!r}")

    def _timed(self, phase: str, fn) -> None:
        """A blocking collective: on CUDA torch makes the current stream wait for it, so the
        end mark recorded on that stream falls after its completion."""
        begin = self.recorder.mark()
        fn()
        self.recorder.add_span(phase, begin, self.recorder.mark())

    @contextmanager
    def watching(self, collective: str, what: str) -> Iterator[None]:
        """A block that issues collectives of the world past this communicator (a torch
        constructor's: DDP checks the parameters' shapes and broadcasts rank 0's state),
        known to the rank's watchdog until they have completed (the block ends with a
        synchronize). Setup, not an iteration's traffic: no bytes are recorded.

        Args:
            collective: the kind the block issues (``broadcast``, ``all_gather``, ...).
            what: what it is for, for a stall's report.

        Examples:
            ```python
            with ctx.comm.watching("broadcast", "DDP's construction"):
                model = DistributedDataParallel(ctx.model, process_group=ctx.topology.world.pg)
            ```
        """
        world = self.topology.world
        with watched(collective, f"{world.name} ({what})", world.ranks):
            yield
            synchronize(self.device)

    # -- collectives ------------------------------------------------------------------
    def all_reduce(
        self, tensor: torch.Tensor, group: CommGroup, *, phase: str, op=dist.ReduceOp.SUM
    ) -> torch.Tensor:
        """Reduce ``tensor`` in place over ``group`` (a method's one way to sum or average
        across ranks), its bytes counted on the links the group spans and its time under
        ``phase``.

        Args:
            tensor: the contiguous tensor to reduce; it holds the result.
            group: the topology's group (``world``, ``intra``, ``inter``, ``peers``).
            phase: the declared phase its time goes to (``suite.cluster.phases``).
            op: the reduction (SUM by default).

        Returns:
            ``tensor``.
        """
        self.account("all_reduce", group, nbytes(tensor), phase=phase)
        if group.size > 1:
            self._timed(phase, lambda: dist.all_reduce(tensor, op=op, group=group.pg))
        return tensor

    def all_reduce_into(
        self,
        tensors: Sequence[torch.Tensor],
        group: CommGroup,
        *,
        phase: str,
        divide_before: int = 1,
        divide_after: int = 1,
    ) -> None:
        """SUM all-reduce of ``tensors`` as one flat buffer, written back into them. Copying
        into and out of the buffer counts toward ``phase``, as the collective does (a
        model-sized copy each way). The buffer is divided by ``divide_before`` before the
        collective and by ``divide_after`` after it (a mean, where the caller wants one)."""
        with self.recorder.phase(phase):
            flat = flatten(tensors)
            if divide_before != 1:
                flat.div_(divide_before)
        self.all_reduce(flat, group, phase=phase)
        with self.recorder.phase(phase):
            if divide_after != 1:
                flat.div_(divide_after)
            unflatten_into(tensors, flat)

    def all_reduce_async(
        self, tensor: torch.Tensor, group: CommGroup, *, phase: str
    ) -> torch.futures.Future:
        """SUM all-reduce that returns a future (for DDP comm hooks, which overlap backward).

        The recorded time spans the launch to the completion: with gloo the callback runs
        when the work is done; with NCCL torch runs it at once, on a stream that waits for
        the collective, so the end mark (a CUDA event there) falls after its completion.
        """
        self.account("all_reduce", group, nbytes(tensor), phase=phase)
        recorder = self.recorder
        begin = recorder.mark()
        work = dist.all_reduce(tensor, group=group.pg, async_op=True)

        def done(fut):
            recorder.add_span(phase, begin, recorder.mark())
            return fut.value()[0]

        return work.get_future().then(done)

    def all_gather(self, tensor: torch.Tensor, group: CommGroup, *, phase: str) -> torch.Tensor:
        """Gather equal-shaped pieces from every rank into one (n, *shape) tensor."""
        n = group.size
        flat = tensor.contiguous().view(-1)
        out = torch.empty(n * flat.numel(), dtype=tensor.dtype, device=tensor.device)
        self.account("all_gather", group, nbytes(tensor), phase=phase)
        if n > 1 and flat.is_cuda and dist.get_backend(group.pg) == "gloo":
            # shared GPUs (see suite.cluster.ranks.backend_for): gloo gathers host tensors only
            host = torch.empty(n * flat.numel(), dtype=tensor.dtype)
            self._timed(phase, lambda: compat.all_gather_single(host, flat.cpu(), group.pg))
            out.copy_(host)
        elif n > 1:
            self._timed(phase, lambda: compat.all_gather_single(out, flat, group.pg))
        else:
            out.copy_(flat)
        return out.view(n, *tensor.shape)

    def broadcast(
        self, tensor: torch.Tensor, group: CommGroup, *, src: int, phase: str
    ) -> torch.Tensor:
        """Broadcast from global rank ``src`` (a member of ``group``), in place.

        Args:
            tensor: the root's data; on every other rank, overwritten with it.
            group: the ranks taking part.
            src: the root's global rank.
            phase: what the time is recorded under.

        Returns:
            ``tensor`` itself (filled on every rank), so a call can be chained.
        """
        self.account("broadcast", group, nbytes(tensor), src=src, phase=phase)
        if group.size > 1:
            self._timed(phase, lambda: dist.broadcast(tensor, src=src, group=group.pg))
        return tensor
