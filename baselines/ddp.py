"""Synchronous data parallelism: torch's DistributedDataParallel over the world group.

``ddp`` routes each gradient bucket through the suite's communicator (a hook equal to DDP's
default mean); ``ddp-bf16`` / ``ddp-fp16`` register torch's own ``bf16_compress_hook`` /
``fp16_compress_hook``, wrapped only to record them: the 16-bit buffer's bytes by the ring
model, and the span from the hook's launch to its future's completion.

DDP overlaps bucket all-reduces with the backward pass, so ``t_allreduce`` (launch to
completion of the buckets) overlaps ``t_local_compute``; ``t_iteration`` is the true step time.
The 16-bit hooks' spans include their casts, which torch chains around the all-reduce.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from suite.api import (
    METHODS,
    POSITIVE,
    CommGroup,
    Communicator,
    Look,
    Recorder,
    RunContext,
    SGDBaseline,
    StepResult,
    crosses_nodes_every_round,
    ddp_local_buffers,
    option,
    phases,
    sends_fraction_of_dense,
)

CommHook = Callable[[object, object], torch.futures.Future]


@dataclass
class DDPSettings:
    """Options of every DDP-based method (``ddp``, its 16-bit variants, ``powersgd``)."""

    bucket_cap_mb: float | None = option(
        None, "DDP gradient bucket size in MiB", check=POSITIVE, shown_default="torch's 25"
    )


def instrumented_allreduce_hook(comm: Communicator, group: CommGroup) -> CommHook:
    """A comm hook equal to DDP's default (mean of gradients), but recorded."""

    def hook(_state, bucket):
        buffer = bucket.buffer()
        buffer.div_(group.size)
        return comm.all_reduce_async(buffer, group, phase=phases.ALLREDUCE)

    return hook


def timed_hook(hook: CommHook, recorder: Recorder, phase: str = phases.ALLREDUCE) -> CommHook:
    """``hook`` with the span from its launch to its future's completion recorded, as
    ``Communicator.all_reduce_async`` records its own collectives."""

    def timed(state, bucket):
        begin = recorder.mark()

        def done(fut):
            recorder.add_span(phase, begin, recorder.mark())
            return fut.value()

        return hook(state, bucket).then(done)

    return timed


def half_precision_hook(
    comm: Communicator, group: CommGroup, torch_hook: CommHook, dtype: torch.dtype
) -> CommHook:
    """Torch's 16-bit compress hook, recorded: it all-reduces the bucket cast to ``dtype``."""
    timed = timed_hook(torch_hook, comm.recorder)

    def hook(process_group, bucket):
        comm.account("all_reduce", group, bucket.buffer().numel() * dtype.itemsize)
        return timed(process_group, bucket)

    return hook


class DDPMethod(SGDBaseline):
    """DDP over the world; ``hook`` and ``state`` replace the default recorded all-reduce."""

    overlapped_phases = (phases.ALLREDUCE,)  # the comm hook runs while backward goes on

    def __init__(self, ctx: RunContext, hook: CommHook | None = None, state: object = None):
        device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        bucket_cap_mb = ctx.settings.bucket_cap_mb
        kwargs = {"bucket_cap_mb": bucket_cap_mb} if bucket_cap_mb is not None else {}
        # the constructor checks the parameters' shapes and broadcasts rank 0's state
        with ctx.comm.watching("broadcast", "DDP's construction"):
            model = DistributedDataParallel(
                ctx.model,
                device_ids=device_ids,
                process_group=ctx.topology.world.pg,
                **ddp_local_buffers(),  # BN statistics stay local; averaged only to evaluate
                **kwargs,
            )
        self.priming = False
        model.register_comm_hook(state, self.primable(
            hook or instrumented_allreduce_hook(ctx.comm, ctx.topology.world),
            ctx.topology.world.pg))
        super().__init__(ctx, model)

    def primable(self, hook: CommHook, pg) -> CommHook:
        """``hook``, except while ``prime_buckets`` runs: then a plain all-reduce, neither
        recorded nor seen by the method's own hook state (PowerSGD's memory)."""

        def run(state, bucket):
            if self.priming:
                return default_hooks.allreduce_hook(pg, bucket)
            return hook(state, bucket)

        return run

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.prime_buckets()

    def prime_buckets(self) -> None:
        """Give a resumed run the buckets the run had before the cut. DDP starts on one bucket
        of every parameter and lays its buckets out after its first backward, in the order
        the gradients were ready: an uninterrupted run does that at iteration 1, a resumed one
        would run its first iteration on the single bucket, whose all-reduce sums each element
        in another order over 3 or more ranks (the resumed model then differs in its last
        bits). So one backward of a zero loss, in eval mode (no BN statistics move), through a
        plain all-reduce (collective on every rank, as the resume is), records that order; the
        first real iteration's forward lays the buckets out as the uninterrupted run's."""
        batch = self.ctx.loader.calibration_batches(1)[0].to(self.ctx.device)
        training = self.model.training
        self.priming = True
        try:
            self.model.eval()
            with self.ctx.comm.watching("all_reduce", "DDP's bucket layout after a resume"):
                (self.model(batch).float().sum() * 0).backward()
        finally:
            self.priming = False
            self.model.train(training)
        self.optimizer.zero_grad(set_to_none=True)

    def one_off_iterations(self, first: int) -> set[int]:
        """DDP rebuilds its buckets in the order the first backward produced gradients, once,
        in the forward of its second iteration."""
        return {first + 1}

    def step(self, iteration: int) -> StepResult:
        loss, samples = self.forward_backward()  # buckets are averaged during backward
        self.apply_update()
        return StepResult(loss, samples)


@METHODS.register(
    "ddp",
    "Dense baseline: PyTorch DDP, ring all-reduce of full fp32 gradients every step "
    "(paper sec. 5.1.4)",
    settings=DDPSettings,
    look=Look("DDP", "#000000", "^"),
    activity=crosses_nodes_every_round,
    nightly=True,
)
def make_ddp(ctx: RunContext) -> DDPMethod:
    return DDPMethod(ctx)


def make_half_precision_ddp(ctx: RunContext, torch_hook: CommHook, dtype: torch.dtype) -> DDPMethod:
    world = ctx.topology.world
    return DDPMethod(ctx, half_precision_hook(ctx.comm, world, torch_hook, dtype), world.pg)


@METHODS.register(
    "ddp-bf16",
    "DDP with torch's bf16_compress_hook: gradients cast to bfloat16 for the all-reduce "
    "(half DDP's bytes), fp32 update",
    settings=DDPSettings,
    look=Look("DDP bf16", "#777777", "v"),
    activity=lambda run: sends_fraction_of_dense(run, 0.45, 0.55, "a 16-bit hook"),
    nightly=True,
)
def make_ddp_bf16(ctx: RunContext) -> DDPMethod:
    return make_half_precision_ddp(ctx, default_hooks.bf16_compress_hook, torch.bfloat16)


@METHODS.register(
    "ddp-fp16",
    "DDP with torch's fp16_compress_hook: gradients divided by N, cast to float16 for the "
    "all-reduce (half DDP's bytes), fp32 update",
    settings=DDPSettings,
    look=Look("DDP fp16", "#777777", "<"),
    activity=lambda run: sends_fraction_of_dense(run, 0.45, 0.55, "a 16-bit hook"),
    nightly=True,
)
def make_ddp_fp16(ctx: RunContext) -> DDPMethod:
    return make_half_precision_ddp(ctx, default_hooks.fp16_compress_hook, torch.float16)
