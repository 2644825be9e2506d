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

from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState, powerSGD_hook

from baselines.ddp import CommHook, DDPMethod, timed_hook
from suite.comm import Communicator, nbytes
from suite.errors import BenchError
from suite.method import RunContext
from suite.registry import METHODS
from suite.topology import CommGroup

DEFAULT_RANK = 2
DEFAULT_START_ITER = 10


def recorded_powersgd_hook(comm: Communicator, group: CommGroup) -> CommHook:
    """Torch's ``powerSGD_hook``, with each of its all-reduces accounted on ``group``."""
    timed = timed_hook(powerSGD_hook, comm.recorder)

    def hook(state: PowerSGDState, bucket):
        if state.iter < state.start_powerSGD_iter:  # torch's own test for a vanilla all-reduce
            comm.account("all_reduce", group, nbytes(bucket.buffer()))
            return timed(state, bucket)
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
        rank = int(ctx.option("powersgd_rank", DEFAULT_RANK))
        start = int(ctx.option("start_powersgd_iter", DEFAULT_START_ITER))
        if rank < 1:
            raise BenchError(f"--powersgd-rank must be at least 1, got {rank}")
        if start < 2:
            raise BenchError(
                f"--start-powersgd-iter must be at least 2 with error feedback, got {start}"
            )
        world = ctx.topology.world
        self.powersgd = PowerSGDState(
            process_group=world.pg,
            matrix_approximation_rank=rank,
            start_powerSGD_iter=start,
            use_error_feedback=True,
            warm_start=True,
            random_seed=ctx.config.seed,  # the same on every rank: Q starts identical
        )
        super().__init__(ctx, recorded_powersgd_hook(ctx.comm, world), self.powersgd)

    def state_dict(self) -> dict:
        state = self.powersgd
        return {
            **super().state_dict(),
            "powersgd": {
                "iter": state.iter,
                "error": state.error_dict,
                "p": state.p_memory_dict,
                "q": state.q_memory_dict,
            },
        }


@METHODS.register(
    "powersgd",
    "DDP with torch's PowerSGD hook: rank-2 (--powersgd-rank) P/Q all-reduces with error "
    "feedback and warm start, vanilla all-reduce before --start-powersgd-iter (10)",
)
def make_powersgd(ctx: RunContext) -> PowerSGD:
    return PowerSGD(ctx)
