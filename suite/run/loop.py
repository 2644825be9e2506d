"""The training loop of one rank: iterations, the agreement of the ranks,
evaluations, row flushes, checkpoints and stops, and finishing the run folder.

Collectives issued here for bookkeeping (loss/NaN agreement, test accuracy) are not part of
any method's communication and are not recorded as traffic.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from suite.cluster.recorder import Recorder
from suite.cluster.watchdog import POSITION, barrier
from suite.errors import BenchError
from suite.results.finish import finish_folder
from suite.results.folder import RunFolder
from suite.run.checkpoint import (
    checkpoint_root,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from suite.run.config import RunConfig
from suite.run.livelog import TensorBoardLog
from suite.run.setup import Run, restart_count, setup
from suite.run.stopping import StopRequest


class NonFiniteLoss(BenchError):
    """Every rank stops after the same iteration (agreed in :meth:`Agreement.settle`)."""


class AgreedInterruption(BenchError):
    """A signal asked the run to stop; every rank stopped after the same iteration (the
    launcher reports it as suite.errors.RunInterrupted)."""


AGREED_STOPS = (NonFiniteLoss, AgreedInterruption)


#: a rank writes its new rows to the run folder at the end of an iteration once this many
#: seconds have passed since its last write (``PRUNEX_FLUSH_SECONDS`` overrides): a SIGKILL
#: loses at most these last seconds of rows
FLUSH_SECONDS = float(os.environ.get("PRUNEX_FLUSH_SECONDS", "5"))


@dataclass
class LoopResult:
    """The training loop's counters: what a checkpoint must carry to continue exactly."""

    done: int = 0
    train_seconds: float = 0.0
    wall_seconds: float = 0.0
    time_to_target: float | None = None
    converged: bool = False
    inter_bytes: float = 0.0
    intra_bytes: float = 0.0
    evaluation_seconds: float = 0.0  # of wall_seconds, spent evaluating


def train(
    config: RunConfig, device: torch.device, folder: RunFolder, recorder: Recorder,
    stop: StopRequest,
) -> None:  # fmt: skip
    run = setup(config, device, folder, recorder, stop)
    result = LoopResult()
    found = latest_checkpoint(folder.path) if (config.resume or restart_count()) else None
    if found is not None:
        result = restore(run, load_checkpoint(found[1], node=run.node))
    run.attempt = {"restarts": restart_count(), "resumed_at_iteration": result.done or None}
    training_loop(run, result)
    finish(run, result)


def rank_state(run: Run, result: LoopResult) -> dict:
    """Everything this rank needs to continue exactly from here."""
    rng = {"torch": torch.get_rng_state()}
    if run.device.type == "cuda":
        rng["cuda"] = torch.cuda.get_rng_state(run.device)
    return {
        "method": run.method.state_dict(),
        "loader": run.loader.state_dict(),
        "rng": rng,
        "loop": asdict(result),
    }


def restore(run: Run, state: dict) -> LoopResult:
    run.method.load_state_dict(state["method"])
    run.loader.load_state_dict(state["loader"])
    torch.set_rng_state(state["rng"]["torch"])
    if "cuda" in state["rng"]:
        torch.cuda.set_rng_state(state["rng"]["cuda"], run.device)
    return LoopResult(**state["loop"])


def checkpoint(run: Run, result: LoopResult) -> None:
    """Flush the rows so far, then save (collective); signals wait until both are whole."""
    with run.stop.held():
        run.folder.flush_rows(run.recorder)
        stats = save_checkpoint(
            run.folder.path, result.done, rank_state(run, result), node=run.node
        )
    run.checkpoints.append(stats)


#: the ranks agree at most this often, in seconds of training (``PRUNEX_AGREE_SECONDS``
#: overrides), and always before an evaluation, a checkpoint and the last iteration: each
#: agreement is a synchronization point, which on a GPU costs tens of microseconds but on
#: oversubscribed CPU ranks a scheduler time slice (6-8 ms per iteration, measured on
#: cnn-fmnist with 4 ranks on 2 cores, when the ranks agreed every iteration)
AGREE_SECONDS = float(os.environ.get("PRUNEX_AGREE_SECONDS", "1"))
#: the most iterations between two agreements; the interval at most doubles from one to the next
MAX_AGREE_INTERVAL = 64


@dataclass
class SettledIteration:
    row: dict  # this rank's row
    mean_loss: float  # over all ranks
    inter_bytes: float  # summed over all ranks
    intra_bytes: float


@dataclass
class Settled:
    iterations: list[SettledIteration]
    stop: bool  # a rank was asked to stop
    checkpoint_due: bool  # rank 0's clock says a timed checkpoint is due


class Agreement:
    """What the ranks must agree on, batched: mean losses, NaN, stop requests, timed
    checkpoints and each iteration's traffic over all ranks, in one small world all-reduce
    every ``interval`` iterations (so every rank stops or saves after the same iteration and
    nothing recorded is lost).

    The interval follows rank 0's seconds per iteration, carried in the all-reduce (the other
    ranks add zeros, so every rank reads the same bits and picks the same next interval)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.pending: list[tuple[dict, float]] = []  # (row, loss) of each iteration
        self.interval = 1
        self.since = time.perf_counter()

    def add(self, row: dict, loss: float) -> None:
        self.pending.append((row, loss))

    @property
    def due(self) -> bool:
        return len(self.pending) >= self.interval

    def settle(self, *, stop: bool, checkpoint_due: bool) -> Settled:
        pending, self.pending = self.pending, []
        seconds = (time.perf_counter() - self.since) / len(pending)
        head = [seconds if dist.get_rank() == 0 else 0.0, float(stop), float(checkpoint_due)]
        for row, loss in pending:
            finite = math.isfinite(loss)
            head += [loss if finite else 0.0, 0.0 if finite else 1.0, row["bytes_inter"],
                     row["bytes_intra"]]  # fmt: skip
        stats = torch.tensor(head, dtype=torch.float64, device=self.device)
        POSITION.issued("all_reduce", "world (the ranks' agreement)", ())
        dist.all_reduce(stats)
        values = stats.tolist()  # waits for it (NCCL too)
        POSITION.at(phase="iteration end")
        rank0_seconds, stops, dues = values[:3]
        per_iteration = [values[3 + 4 * i : 7 + 4 * i] for i in range(len(pending))]
        for (row, _), (_, nonfinite, _, _) in zip(pending, per_iteration, strict=True):
            if nonfinite:
                raise NonFiniteLoss(
                    f"non-finite loss at iteration {row['iteration']} on {int(nonfinite)} rank(s); "
                    "lower --lr or check the data"
                )
        wanted = int(AGREE_SECONDS / rank0_seconds) if rank0_seconds > 0 else MAX_AGREE_INTERVAL
        self.interval = max(1, min(wanted, 2 * self.interval, MAX_AGREE_INTERVAL))
        self.since = time.perf_counter()
        world = dist.get_world_size()
        return Settled(
            [SettledIteration(row, loss_sum / world, inter, intra)
             for (row, _), (loss_sum, _, inter, intra) in zip(pending, per_iteration)],
            stops > 0,
            dues > 0,
        )  # fmt: skip


def progress_bar(run: Run):
    if dist.get_rank() != 0 or os.environ.get("PRUNEX_PROGRESS", "1") == "0":
        return None
    from tqdm import tqdm

    return tqdm(total=run.iterations, desc=run.config.method, unit="it", dynamic_ncols=True)


def training_loop(run: Run, result: LoopResult) -> None:
    """Iterations ``result.done`` .. the end (or convergence); ``result`` is updated in place.

    Every few iterations (:class:`Agreement`) the ranks agree on the losses, on stop requests
    and on timed checkpoints; then come the evaluation, the row flush, the checkpoint and the
    stop, in that order, so a checkpoint holds every row before it."""
    config, recorder, loader, method = run.config, run.recorder, run.loader, run.method
    accuracy = None
    progress = progress_bar(run)
    live = TensorBoardLog(run.folder.path, result.done) if live_logging(run) else None
    wall_start = time.perf_counter() - result.wall_seconds
    last_checkpoint = time.monotonic()
    agreement = Agreement(run.device)
    try:
        for it in range(result.done, run.iterations):
            recorder.begin_iteration(it)
            if run.wire is not None:
                run.wire.start()
            done = method.step(it)
            wire = run.wire.stop() if run.wire is not None else {}
            loss = float(done.loss)
            row = recorder.end_iteration(
                **wire,
                loss=loss,
                samples=int(done.samples),
                epoch=loader.step / loader.steps_per_epoch,
            )
            result.train_seconds += row["t_iteration"]
            result.done = it + 1
            result.converged = bool(done.converged)  # collective: the same on every rank
            finished = result.converged or result.done == run.iterations
            evaluating = result.done in run.eval_points or result.converged
            every = config.checkpoint_every
            scheduled_checkpoint = every is not None and result.done % every == 0
            agreement.add(row, loss)
            if not (agreement.due or finished or evaluating or scheduled_checkpoint):
                if recorder.flush_due(FLUSH_SECONDS):
                    with run.stop.held():
                        run.folder.flush_rows(recorder)
                continue
            minutes = config.checkpoint_minutes
            timed_due = minutes is not None and time.monotonic() - last_checkpoint >= 60 * minutes
            agreed = agreement.settle(stop=run.stop.requested, checkpoint_due=timed_due)
            for settled in agreed.iterations:
                result.inter_bytes += settled.inter_bytes
                result.intra_bytes += settled.intra_bytes
                if live is not None:
                    live.iteration(settled.row, settled.mean_loss, settled.inter_bytes,
                                   settled.intra_bytes)  # fmt: skip
            mean_loss = agreed.iterations[-1].mean_loss
            if live is not None:
                live.layers(recorder.layers)
            if evaluating:
                evaluation_started = time.perf_counter()
                accuracy, test_loss = run.evaluate(method.eval_model())
                result.evaluation_seconds += time.perf_counter() - evaluation_started
                target = config.target_accuracy
                if result.time_to_target is None and target is not None and accuracy >= target:
                    result.time_to_target = result.train_seconds
                if dist.get_rank() == 0:
                    recorder.add_eval(
                        iteration=it,
                        epoch=row["epoch"],
                        accuracy=accuracy,
                        test_loss=test_loss,
                        train_loss=mean_loss,
                        train_seconds=result.train_seconds,
                        wall_seconds=time.perf_counter() - wall_start,
                        inter_node_bytes=result.inter_bytes,
                        intra_node_bytes=result.intra_bytes,
                    )
                if live is not None:
                    live.evaluation(it, accuracy, test_loss)
            if progress is not None:
                rate = int(done.samples) * dist.get_world_size() / max(row["t_iteration"], 1e-9)
                post = {"loss": f"{mean_loss:.3f}", "samples/s": f"{rate:.0f}"}
                if accuracy is not None:
                    post["acc"] = f"{accuracy:.4f}"
                progress.set_postfix(post, refresh=False)
                progress.update(len(agreed.iterations))
            checkpointing = every is not None or minutes is not None
            due = agreed.checkpoint_due or scheduled_checkpoint
            if checkpointing and not finished and (due or agreed.stop):
                result.wall_seconds = time.perf_counter() - wall_start
                checkpoint(run, result)
                last_checkpoint = time.monotonic()
            elif recorder.flush_due(FLUSH_SECONDS):
                with run.stop.held():
                    run.folder.flush_rows(recorder)
            if agreed.stop and not finished:
                raise AgreedInterruption(interruption_message(run, result, checkpointing))
            if result.converged:
                break
    finally:
        if progress is not None:
            progress.close()
        if live is not None:
            live.close()
    result.wall_seconds = time.perf_counter() - wall_start


def live_logging(run: Run) -> bool:
    """Rank 0 writes the live log (``--tensorboard``)."""
    return run.config.tensorboard and dist.get_rank() == 0


def interruption_message(run: Run, result: LoopResult, checkpointed: bool) -> str:
    how = f"interrupted by {run.stop.name if run.stop.requested else 'a peer'}"
    where = f"after iteration {result.done} of {run.iterations}"
    if checkpointed:
        return f"{how} {where}; continue with: bench run --resume {run.folder.path}"
    return f"{how} {where} (no checkpoint: use --checkpoint-every to make runs resumable)"


def finish(run: Run, result: LoopResult) -> None:
    """Merge every rank's rows, save the evaluated model and artifacts, write the summary.
    The checkpoints go: a finished run has nothing left to continue."""
    final_model = run.method.eval_model()  # collective for some methods: every rank calls it
    with run.stop.held():
        run.folder.flush_rows(run.recorder)
    barrier("rows flushed")
    if dist.get_rank() == 0:
        folder = run.folder
        folder.merge_parts()
        extra = {**(run.attempt or {}), "processes": (folder.summary() or {}).get("processes")}
        extra.update(run.setup_seconds, evaluation_seconds=result.evaluation_seconds)
        if result.train_seconds > 0:  # a host-bound run shows here
            samples = run.loader.step * run.loader.batch_size
            extra["samples_per_second_per_rank"] = samples / result.train_seconds
        extra.update(run.method.summary_facts())
        if run.method.warnings:
            extra["warnings"] = list(run.method.warnings)
        if run.checkpoints:
            extra.update(
                checkpoints_written=len(run.checkpoints),
                checkpoint_seconds_mean=sum(c["seconds"] for c in run.checkpoints)
                / len(run.checkpoints),
                checkpoint_bytes=run.checkpoints[-1]["bytes"],
            )
        with run.stop.held():
            finish_folder(
                folder,
                config=run.config,
                manifest=run.manifest,
                artifacts={"model.pt": final_model.state_dict(), **run.method.artifacts()},
                iterations_done=result.done,
                wall_seconds=result.wall_seconds,
                time_to_target=result.time_to_target,
                converged=result.converged,
                extra=extra,
            )
        shutil.rmtree(checkpoint_root(folder.path), ignore_errors=True)
    dist.barrier()  # not watched: the others wait for rank 0's merge and summary
