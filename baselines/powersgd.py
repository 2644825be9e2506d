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

from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState, powerSGD_hook

from baselines.ddp import CommHook, DDPMethod, DDPSettings, timed_hook
from suite.api import (
    AT_LEAST_1,
    METHODS,
    CommGroup,
    Communicator,
    Look,
    RunContext,
    RunView,
    at_least,
    nbytes,
    option,
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
        world = ctx.topology.world
        self.powersgd = PowerSGDState(
            process_group=world.pg,
            matrix_approximation_rank=ctx.settings.powersgd_rank,
            start_powerSGD_iter=ctx.settings.start_powersgd_iter,
            use_error_feedback=True,
            warm_start=True,
            random_seed=ctx.config.seed,  # the same on every rank: Q starts identical
        )
        super().__init__(ctx, recorded_powersgd_hook(ctx.comm, world), self.powersgd)

    def one_off_iterations(self, first: int) -> set[int]:
        """DDP's, and the first compressed step: it classifies the buckets' tensors and
        allocates P, Q and the error feedback (from ``--start-powersgd-iter`` on)."""
        return {*super().one_off_iterations(first),
                max(first, self.powersgd.start_powerSGD_iter)}

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

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        saved, device = state["powersgd"], self.ctx.device
        self.powersgd.iter = int(saved["iter"])
        for target, key in ((self.powersgd.error_dict, "error"),
                            (self.powersgd.p_memory_dict, "p"),
                            (self.powersgd.q_memory_dict, "q")):
            target.clear()
            target.update({k: v.to(device) for k, v in saved[key].items()})


@METHODS.register(
    "powersgd",
    "DDP with torch's PowerSGD hook: rank-2 (--powersgd-rank) P/Q all-reduces with error "
    "feedback and warm start, vanilla all-reduce before --start-powersgd-iter (10)",
    settings=PowerSGDSettings,
    look=Look("PowerSGD", "#56B4E9", "D"),
    activity=lambda run: compresses_after_start(run),
)
def make_powersgd(ctx: RunContext) -> PowerSGD:
    return PowerSGD(ctx)


def compresses_after_start(run: RunView) -> list[str]:
    """From --start-powersgd-iter on, well under half of DDP's bytes (rank-r factors)."""
    start = int(run.settings.get("start_powersgd_iter", 10))
    if run.summary.get("iterations", 0) <= start:
        return [f"ran {run.summary.get('iterations')} iterations, never past its vanilla "
                f"all-reduce warm-up (--start-powersgd-iter {start})"]
    return sends_fraction_of_dense(run, 1e-6, 0.5, "PowerSGD after its start iteration",
                                   after_iteration=start)
