"""Collectives issued past ``ctx.comm``, caught where torch issues them.

The communicator records the bytes of every collective a method issues through it, or
declares with ``Communicator.account`` (torch's PowerSGD hook issues its own). A method that
calls ``torch.distributed`` itself (``dist.all_reduce(t, group=topo.inter.pg)``) moves bytes
no table shows, and in a benchmark of communication that mistake reads as the best result.

torch's ``ProcessGroup.register_pre_hook`` (c10d) is called for every collective issued on a
group, from Python or from C++ (DDP's reducer, a comm hook's futures), before any backend sees
it, with the collective's input tensors. The audit hooks every process group of the run (the
topology's, the method's own, and any other the rank holds when a step starts), counts the
input bytes of what each group issues while the method's ``step`` runs, and subtracts what the
communicator declared on that group: what is left went past ``ctx.comm``. Groups whose ranks
span nodes are kept apart: their hidden bytes are inter-node traffic nobody recorded, which
fails the run (``suite.run.loop``); hidden bytes inside a node are a warning. Collectives of
the runner's own bookkeeping (agreement, evaluation, checkpoints) run outside ``step`` and are
not counted.

Where torch has no such hook (older releases), the audit is off (``supported`` False) and the
cruder checks remain: a multi-node run that records intra-node traffic and no inter-node bytes
warns, and ``bench compare`` refuses to rank it.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch.distributed as dist

__all__ = ["AUDIT", "CollectiveAudit", "HiddenBytes"]

_hook_ids = itertools.count(4300)


@dataclass
class _Watched:
    """One process group under audit."""

    name: str
    crosses_nodes: bool
    pg: object = field(repr=False)
    hook_id: int = 0
    issued: int = 0  # input bytes of the collectives issued during steps
    declared: int = 0  # bytes the communicator declared for it during steps
    collectives: int = 0  # collectives issued during steps


@dataclass(frozen=True)
class HiddenBytes:
    """What went past the communicator since the last look.

    Attributes:
        crossing: input bytes issued outside ``ctx.comm`` on groups that span nodes.
        local: the same, on groups inside one node.
        declared_crossing: input bytes the communicator declared on groups that span nodes.
        groups: the names of the groups with hidden bytes, with their collectives.
    """

    crossing: float = 0.0
    local: float = 0.0
    declared_crossing: float = 0.0
    groups: tuple[str, ...] = ()


def supported() -> bool:
    """Whether this torch calls a Python hook before each collective of a process group."""
    return hasattr(getattr(dist, "ProcessGroup", None), "register_pre_hook")


class CollectiveAudit:
    """Per rank: the collectives issued on each process group during a method's steps,
    against what the communicator declared (``AUDIT``, reset per run)."""

    def __init__(self):
        self.supported = supported()
        self.active = False
        self._watched: dict[int, _Watched] = {}
        self._node_of: Callable[[int], int] | None = None

    def reset(self, node_of: Callable[[int], int]) -> None:
        """Forget the previous run's groups; ``node_of(rank)`` tells which groups span nodes."""
        for watched in self._watched.values():
            with contextlib.suppress(Exception):  # a group already destroyed
                watched.pg.unregister_pre_hook(watched.hook_id)
        self._watched = {}
        self._node_of = node_of
        self.active = False

    def watch(self, pg, name: str) -> None:
        """Hook ``pg`` (this rank must be a member); a group already watched is left as is."""
        if not self.supported or pg is None or id(pg) in self._watched or self._node_of is None:
            return
        try:
            ranks = dist.get_process_group_ranks(pg)
        except (RuntimeError, ValueError):  # not a group of this rank
            return
        watched = _Watched(name, len({self._node_of(r) for r in ranks}) > 1, pg,
                           next(_hook_ids))

        def before(args, watched=watched) -> None:
            if self.active:
                watched.issued += sum(t.numel() * t.element_size() for t in args.input_tensors)
                watched.collectives += 1

        pg.register_pre_hook(watched.hook_id, before)
        self._watched[id(pg)] = watched

    def watch_all(self) -> None:
        """Every process group this rank holds that is not watched yet (a method may make
        groups of its own without listing them in ``process_groups``)."""
        if not self.supported:
            return
        held = getattr(getattr(dist.distributed_c10d, "_world", None), "pg_map", {})
        for pg in list(held):
            if id(pg) not in self._watched:
                self.watch(pg, "a group of the method's own")

    def declare(self, pg, nbytes: float) -> None:
        """The communicator's word for a collective on ``pg`` of ``nbytes`` input bytes."""
        watched = self._watched.get(id(pg))
        if self.active and watched is not None:
            watched.declared += int(nbytes)

    @contextlib.contextmanager
    def during_step(self) -> Iterator[None]:
        """Count what is issued while the method's ``step`` runs."""
        self.watch_all()
        self.active = True
        try:
            yield
        finally:
            self.active = False

    def take(self) -> HiddenBytes:
        """What went past the communicator since the last call (the counters restart)."""
        crossing = local = declared_crossing = 0
        groups = []
        for watched in self._watched.values():
            hidden = max(0, watched.issued - watched.declared)
            if watched.crosses_nodes:
                crossing += hidden
                declared_crossing += watched.declared
            else:
                local += hidden
            if hidden:
                groups.append(watched.name)
            watched.issued = watched.declared = watched.collectives = 0
        return HiddenBytes(float(crossing), float(local), float(declared_crossing),
                           tuple(groups))


AUDIT = CollectiveAudit()
"""This rank's audit: the runner resets it per run; the communicator declares to it."""
