"""PowerSGD (Vogels et al., NeurIPS 2019) through torch's own DDP comm hook.

Torch's ``powerSGD_hook`` with error feedback and warm start. Before ``--start-powersgd-iter``
it all-reduces each bucket vanilla; from then on, per bucket, it all-reduces the tensors it
decides not to compress (vectors, and matrices where (n + m) r * min_compression_rate is not
below n m), then the concatenated P matrices, then the Q matrices, all over the world.

The bytes are read from torch's own bookkeeping, not re-derived: the per-bucket P and Q
memory in ``PowerSGDState``, and ``total_numel_after_compression``, which torch advances per
bucket by each uncompressed tensor's numel plus |P| + |Q| of each compressed one.
``t_allreduce`` spans launch to completion of each bucket's hook, so it includes the
orthogonalizations and matmuls torch chains between its all-reduces.

Defaults: rank 2, the paper's setting for ResNet-18 on CIFAR-10, where it matches full-precision
SGD's accuracy (torch's default of 1 is its suggested starting point for tuning); compression
from iteration 10: torch needs at least 2 with error feedback or warm start (DDP rebuilds its
buckets after the first iteration) and advises a vanilla warm-up, since early training is
sensitive to biased gradients; 10 keeps the benchmark's short runs mostly compressed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import (
    PowerSGDState,
    _should_compress,
    powerSGD_hook,
)

from baselines.ddp import CommHook, DDPMethod, DDPSettings, timed_hook
from suite.api import (
    AT_LEAST_1,
    METHODS,
    BenchError,
    CommGroup,
    Communicator,
    Look,
    RunContext,
    RunView,
    at_least,
    nbytes,
    option,
    schema,
    sends_fraction_of_dense,
)


@dataclass
class PowerSGDSettings(DDPSettings):
    """The two knobs of torch's ``PowerSGDState`` this benchmark exposes (rank first)."""

    powersgd_rank: int = option(2, "matrix approximation rank", check=AT_LEAST_1)
    start_powersgd_iter: int = option(
        10,
        "vanilla all-reduce before this iteration (torch needs 2 with error feedback)",
        check=at_least(2),
    )


@dataclass(frozen=True)
class Slot:
    """One parameter's place in a bucket: its gradient's offset and size in the bucket's
    flat buffer, its shape, and where its Q lies in the bucket's Q memory (None: torch does
    not compress it)."""

    name: str
    offset: int
    numel: int
    q: tuple[int, int] | None  # (start, length)
    p_length: int = 0  # n x r where torch compresses it


def bucket_slots(state: PowerSGDState, bucket, names: list[str]) -> list[Slot]:
    """Where each of ``bucket``'s parameters lies in its buffer and in its Q memory, as
    torch's ``powerSGD_hook`` lays them out: the tensors it compresses (``_should_compress``
    of each gradient as an n x m matrix), grouped by shape in the order shapes first occur,
    each group in bucket order, one m x r block each (``batch_tensors_with_same_shape`` off,
    torch's default)."""
    buffer = bucket.buffer()
    grads = bucket.gradients()
    shapes: dict[tuple, list[int]] = {}
    for i, grad in enumerate(grads):
        n = grad.shape[0] if grad.dim() else 1
        m = grad.numel() // max(n, 1)
        rank = min(n, m, state.matrix_approximation_rank)
        if _should_compress(n, m, rank, state.min_compression_rate)[0]:
            shapes.setdefault((n, m), []).append(i)
    q_at, p_length, start = {}, {}, 0
    for (n, m), members in shapes.items():
        for i in members:
            rank = min(n, m, state.matrix_approximation_rank)
            q_at[i], p_length[i] = (start, m * rank), n * rank
            start += m * rank
    base = buffer.data_ptr()
    return [Slot(name, (grad.data_ptr() - base) // grad.element_size(), grad.numel(),
                 q_at.get(i), p_length.get(i, 0))
            for i, (name, grad) in enumerate(zip(names, grads))]


class BucketMemory:
    """PowerSGD's memory (error feedback, warm-start Q) kept per parameter across a resume.
    Torch keys it by ``bucket.index()``, and DDP's layout is not the same after a resume: its
    first iteration runs on DDP's initial buckets, the rebuilt ones (those before the cut)
    come after it. So the hook notes where each parameter lies in each bucket
    (``bucket_slots``); a checkpoint saves every parameter's error and Q slices, and a
    resumed run assembles each bucket's memory from its parameters' slices when it first sees
    it, whatever the layout; P is recomputed from Q at every step and starts at zero. When
    DDP lays its buckets out again (after a resumed run's first iteration), the memory goes
    back to per-parameter slices and is assembled for the new buckets the same way (torch
    alone would add one bucket's error to another's gradients)."""

    def __init__(self, names: dict[int, str]):
        self.names = names  # id(parameter) -> its name
        self.layout: dict[int, list[Slot]] = {}  # bucket index -> its parameters' places
        self.pending: dict[str, dict] = {}  # restored per parameter, not yet handed out

    def note(self, state: PowerSGDState, bucket) -> None:
        index = bucket.index()
        names = [self.names.get(id(p), "?") for p in bucket.parameters()]
        slots = bucket_slots(state, bucket, names)
        if index in self.layout and [s.name for s in self.layout[index]] != names:
            # DDP laid its buckets out again: every bucket's memory back to its parameters'
            # slices, to be assembled anew for the buckets as they now are
            self.pending.update(self.saved(state))
            for memory in (state.error_dict, state.p_memory_dict, state.q_memory_dict):
                memory.clear()
            self.layout = {}
        self.layout[index] = slots
        if self.pending and all(s.name in self.pending for s in slots):
            self.hand_in(state, index, slots, bucket.buffer())

    def hand_in(self, state: PowerSGDState, index: int, slots: list[Slot], buffer) -> None:
        error = torch.zeros_like(buffer)
        q = torch.zeros(sum(s.q[1] for s in slots if s.q), dtype=buffer.dtype,
                        device=buffer.device)
        for slot in slots:
            saved = self.pending.pop(slot.name)
            error[slot.offset:slot.offset + slot.numel] = saved["error"].to(buffer.device)
            if slot.q:
                q[slot.q[0]:slot.q[0] + slot.q[1]] = saved["q"].to(buffer.device)
        state.error_dict[index] = error
        state.q_memory_dict[index] = q
        state.p_memory_dict[index] = torch.zeros(sum(s.p_length for s in slots),
                                                 dtype=buffer.dtype, device=buffer.device)

    def saved(self, state: PowerSGDState) -> dict[str, dict]:
        """Every parameter's error and Q slices (of the buckets that have memory), and those
        still waiting from the checkpoint this run resumed."""
        found = dict(self.pending)
        for index, slots in self.layout.items():
            if index not in state.error_dict:
                continue
            for slot in slots:
                part = {"error": state.error_dict[index][slot.offset:slot.offset + slot.numel]
                        .clone()}
                if slot.q and index in state.q_memory_dict:
                    at, length = slot.q
                    part["q"] = state.q_memory_dict[index][at:at + length].clone()
                found[slot.name] = part
        return found


def recorded_powersgd_hook(comm: Communicator, group: CommGroup,
                           memory: BucketMemory) -> CommHook:
    """Torch's ``powerSGD_hook``, with each of its all-reduces accounted on ``group`` and
    each bucket's memory kept by what it holds (``memory``).

    A compressed bucket issues three all-reduces, the last two from its futures' callbacks,
    which run when the previous one completes: with several buckets, one rank could issue
    bucket 1's first all-reduce before bucket 0's last and another after it, and the
    collectives would pair across ranks out of order (gloo aborts: "Received data size
    doesn't match expected size"; a model of two buckets, resnet18 at the default 25 MB, did).
    So each bucket's hook starts once the previous bucket's chain has completed."""
    timed = timed_hook(powerSGD_hook, comm.recorder)
    previous: list = [None]  # the last bucket's future

    def hook(state: PowerSGDState, bucket):
        if previous[0] is not None and state.iter >= state.start_powerSGD_iter:
            previous[0].wait()
        previous[0] = ordered(state, bucket)
        return previous[0]

    def ordered(state: PowerSGDState, bucket):
        if state.iter < state.start_powerSGD_iter:  # torch's own test for a vanilla all-reduce
            comm.account("all_reduce", group, nbytes(bucket.buffer()))
            return timed(state, bucket)
        memory.note(state, bucket)  # only compressed steps have memory to keep
        counted = state.total_numel_after_compression
        future = timed(state, bucket)  # classifies, allocates P and Q, launches; returns early
        p = state.p_memory_dict[bucket.index()]
        q = state.q_memory_dict[bucket.index()]
        uncompressed = state.total_numel_after_compression - counted - p.numel() - q.numel()
        comm.account("all_reduce", group, uncompressed * bucket.buffer().element_size())
        comm.account("all_reduce", group, nbytes(p))
        comm.account("all_reduce", group, nbytes(q))
        return future

    return hook


class PowerSGD(DDPMethod):
    def __init__(self, ctx: RunContext):
        world = ctx.topology.world
        self.powersgd = PowerSGDState(
            process_group=world.pg,
            matrix_approximation_rank=ctx.settings.powersgd_rank,
            start_powerSGD_iter=ctx.settings.start_powersgd_iter,
            use_error_feedback=True,
            warm_start=True,
            random_seed=ctx.config.seed,  # the same on every rank: Q starts identical
        )
        self.memory = BucketMemory({id(p): n for n, p in ctx.model.named_parameters()})
        super().__init__(ctx, recorded_powersgd_hook(ctx.comm, world, self.memory),
                         self.powersgd)

    def one_off_iterations(self, first: int) -> set[int]:
        """DDP's, and the first compressed step: it classifies the buckets' tensors and
        allocates P, Q and the error feedback (from ``--start-powersgd-iter`` on)."""
        return {*super().one_off_iterations(first),
                max(first, self.powersgd.start_powerSGD_iter)}

    def state_dict(self) -> dict:
        """The step count, the generator Q's first values come from, and each parameter's
        error feedback and Q (``BucketMemory``), by its name."""
        state = self.powersgd
        rng = state.rng.get_state()
        return {
            **super().state_dict(),
            "powersgd": {
                "iter": state.iter,
                "rng": {"keys": torch.from_numpy(rng[1].astype("int64")), "pos": int(rng[2]),
                        "has_gauss": int(rng[3]), "gauss": float(rng[4])},
                "parameters": self.memory.saved(state),
            },
        }

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        saved = state["powersgd"]
        if "parameters" not in saved:
            raise BenchError("this checkpoint keeps PowerSGD's memory by bucket index (before "
                             "it was kept per parameter), which a resumed DDP lays out anew; "
                             "start the run again")
        self.powersgd.iter = int(saved["iter"])
        rng = saved["rng"]
        self.powersgd.rng.set_state(("MT19937", rng["keys"].numpy().astype("uint32"),
                                     int(rng["pos"]),
                                     int(rng["has_gauss"]), float(rng["gauss"])))
        for memory in (self.powersgd.error_dict, self.powersgd.p_memory_dict,
                       self.powersgd.q_memory_dict):
            memory.clear()  # each bucket takes its own when the hook first sees it
        self.memory.pending = dict(saved["parameters"])


@METHODS.register(
    "powersgd",
    "DDP with torch's PowerSGD hook: rank-2 (--powersgd-rank) P/Q all-reduces with error "
    "feedback and warm start, vanilla all-reduce before --start-powersgd-iter (10)",
    settings=PowerSGDSettings,
    look=Look("PowerSGD", "#56B4E9", "D"),
    activity=lambda run: compresses_after_start(run),
    nightly=True,
)
def make_powersgd(ctx: RunContext) -> PowerSGD:
    return PowerSGD(ctx)


def compresses_after_start(run: RunView) -> list[str]:
    """From --start-powersgd-iter on, well under half of DDP's bytes (rank-r factors)."""
    start = int(run.settings.get("start_powersgd_iter", 10))
    if run.summary.get(schema.ITERATIONS, 0) <= start:
        return [f"ran {run.summary.get(schema.ITERATIONS)} iterations, never past its vanilla "
                f"all-reduce warm-up (--start-powersgd-iter {start})"]
    return sends_fraction_of_dense(run, 1e-6, 0.5, "PowerSGD after its start iteration",
                                   after_iteration=start)
