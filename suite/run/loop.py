"""The training loop of one rank: iterations, the ranks' agreement, evaluations, row flushes,
checkpoints and stops, and finishing the run folder.

``TrainingLoop`` runs the iterations; after each it decides whether this is a point where
the ranks must agree (``Point``); at such a point it settles the agreement
(``suite.run.agreement``), then evaluates, shows progress, checkpoints or flushes, and stops,
in that order, so a checkpoint holds every row before it. Collectives issued here for
bookkeeping (the agreement, test accuracy) are not part of any method's communication and are
not recorded as traffic.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from tqdm import tqdm

from suite.cluster.watchdog import barrier, store_client, watched
from suite.config import RunConfig
from suite.errors import BenchError
from suite.plugins.method import StepResult
from suite.results import schema
from suite.results.finish import finish_folder
from suite.results.folder import RunFolder
from suite.run.agreement import Agreement, NonFiniteLoss, Settled
from suite.run.checkpoint import (
    checkpoint_root,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from suite.run.livelog import TensorBoardLog
from suite.run.setup import Run, restart_count, setup
from suite.run.stopping import StopRequest

__all__ = ["AGREED_STOPS", "AgreedInterruption", "LoopResult", "NonFiniteLoss", "train"]


class AgreedInterruption(BenchError):
    """A signal asked the run to stop; every rank stopped after the same iteration (the
    launcher reports it as suite.errors.RunInterrupted)."""


AGREED_STOPS = (NonFiniteLoss, AgreedInterruption)

#: a rank writes its new rows to the run folder at the end of an iteration once this many
#: seconds have passed since its last write (``PRUNEX_FLUSH_SECONDS`` overrides): a SIGKILL
#: loses at most these last seconds of rows
FLUSH_SECONDS = float(os.environ.get("PRUNEX_FLUSH_SECONDS", "5"))
#: fault injection for tests of resume: every rank stops after this iteration count as if a
#: SIGTERM had reached it (checkpointing first when checkpointing is on), at no race with
#: how fast the run goes (``PRUNEX_STOP_AFTER_ITERATION``; unset: never)
STOP_AFTER_ITERATION = int(os.environ.get("PRUNEX_STOP_AFTER_ITERATION", "0")) or None


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
    config: RunConfig, device: torch.device, folder: RunFolder, recorder, stop: StopRequest
) -> None:
    """Set up, continue from the latest checkpoint when resuming or restarted, train, finish."""
    run = setup(config, device, folder, recorder, stop)
    result = LoopResult()
    found = latest_checkpoint(folder.path) if (config.resume or restart_count()) else None
    if found is not None:
        result = restore(run, load_checkpoint(found[1], node=run.node))
    run.attempt = {schema.RESTARTS: restart_count(),
                   schema.RESUMED_AT_ITERATION: result.done or None}
    TrainingLoop(run, result)()
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


@dataclass(frozen=True)
class Point:
    """What is due after an iteration; any of it makes the ranks agree first."""

    finished: bool  # the last iteration, or the method converged
    evaluating: bool
    scheduled_checkpoint: bool  # --checkpoint-every
    agreement_due: bool  # the agreement's own interval

    @property
    def agree(self) -> bool:
        return self.finished or self.evaluating or self.scheduled_checkpoint or self.agreement_due


class TrainingLoop:
    """Iterations ``result.done`` .. the end (or convergence); ``result`` is updated in place."""

    def __init__(self, run: Run, result: LoopResult):
        self.run, self.result = run, result
        self.agreement = Agreement(run.device)
        self.progress = progress_bar(run)
        self.live = TensorBoardLog(run.folder.path, result.done) if live_logging(run) else None
        self.wall_start = time.perf_counter() - result.wall_seconds
        # this attempt's first iteration and the method's own one-off iterations: marked in
        # the table, left out of the summary's means (suite.results.schema.ONE_OFF)
        self.one_offs = {result.done, *run.method.one_off_iterations(result.done)}
        self.last_checkpoint = time.monotonic()
        self.accuracy: float | None = None

    def __call__(self) -> None:
        try:
            for iteration in range(self.result.done, self.run.iterations):
                row, samples = self.iterate(iteration)
                point = self.point()
                if not point.agree:
                    self.flush_if_due()
                    continue
                self.after_agreement(point, row, samples)
                if self.result.converged:
                    break
        finally:
            self.close()
        self.result.wall_seconds = time.perf_counter() - self.wall_start

    # -- one iteration ------------------------------------------------------------------------
    def iterate(self, iteration: int) -> tuple[dict, int]:
        """One step of the method, recorded; returns its row and its samples."""
        run, result = self.run, self.result
        run.recorder.begin_iteration(iteration)
        if run.wire is not None:
            run.wire.start()
        done = run.method.step(iteration)
        check_step_result(run.config.method, done)
        wire = run.wire.stop() if run.wire is not None else {}
        loss = float(done.loss)
        row = run.recorder.end_iteration(**wire, **{
            schema.LOSS: loss,
            schema.SAMPLES: int(done.samples),
            schema.EPOCH: run.loader.step / run.loader.steps_per_epoch,
            schema.ONE_OFF: iteration in self.one_offs,
        })
        result.train_seconds += row[schema.T_ITERATION]
        result.done = iteration + 1
        result.converged = bool(done.converged)  # collective: the same on every rank
        self.agreement.add(row, loss)
        return row, int(done.samples)

    def point(self) -> Point:
        result, run = self.result, self.run
        every = run.config.checkpoint_every
        return Point(
            finished=result.converged or result.done == run.iterations,
            evaluating=result.done in run.eval_points or result.converged,
            scheduled_checkpoint=every is not None and result.done % every == 0,
            agreement_due=self.agreement.due or result.done == STOP_AFTER_ITERATION,
        )

    # -- what follows an agreement ------------------------------------------------------------
    def after_agreement(self, point: Point, row: dict, samples: int) -> None:
        agreed = self.settle()
        if point.evaluating:
            self.evaluate(row, agreed.iterations[-1].mean_loss)
        self.show_progress(row, samples, agreed)
        self.checkpoint_or_flush(point, agreed)
        if agreed.stop and not point.finished:
            checkpointing = self.checkpointing
            raise AgreedInterruption(interruption_message(self.run, self.result, checkpointing))

    def settle(self) -> Settled:
        minutes = self.run.config.checkpoint_minutes
        timed_due = minutes is not None and time.monotonic() - self.last_checkpoint >= 60 * minutes
        agreed = self.agreement.settle(stop=self.stop_requested, checkpoint_due=timed_due)
        for settled in agreed.iterations:
            self.result.inter_bytes += settled.inter_bytes
            self.result.intra_bytes += settled.intra_bytes
            if self.live is not None:
                self.live.iteration(settled.row, settled.mean_loss, settled.inter_bytes,
                                    settled.intra_bytes)
        if self.live is not None:
            self.live.layers(self.run.recorder.layers)
        return agreed

    def evaluate(self, row: dict, mean_loss: float) -> None:
        run, result = self.run, self.result
        started = time.perf_counter()
        accuracy, test_loss = run.evaluate(run.method.eval_model())
        result.evaluation_seconds += time.perf_counter() - started
        target = run.config.target_accuracy
        if result.time_to_target is None and target is not None and accuracy >= target:
            result.time_to_target = result.train_seconds
        iteration = row[schema.ITERATION]
        if dist.get_rank() == 0:
            run.recorder.add_eval(**{
                schema.ITERATION: iteration,
                schema.EPOCH: row[schema.EPOCH],
                schema.ACCURACY: accuracy,
                schema.TEST_LOSS: test_loss,
                schema.TRAIN_LOSS: mean_loss,
                schema.TRAIN_SECONDS: result.train_seconds,
                schema.WALL_SECONDS: time.perf_counter() - self.wall_start,
                schema.INTER_NODE_BYTES: result.inter_bytes,
                schema.INTRA_NODE_BYTES: result.intra_bytes,
            })
        if self.live is not None:
            self.live.evaluation(iteration, accuracy, test_loss)
        self.accuracy = accuracy

    def show_progress(self, row: dict, samples: int, agreed: Settled) -> None:
        if self.progress is None:
            return
        rate = samples * dist.get_world_size() / max(row[schema.T_ITERATION], 1e-9)
        post = {"loss": f"{agreed.iterations[-1].mean_loss:.3f}", "samples/s": f"{rate:.0f}"}
        if self.accuracy is not None:
            post["acc"] = f"{self.accuracy:.4f}"
        self.progress.set_postfix(post, refresh=False)
        self.progress.update(len(agreed.iterations))

    @property
    def stop_requested(self) -> bool:
        injected = STOP_AFTER_ITERATION is not None and self.result.done >= STOP_AFTER_ITERATION
        return self.run.stop.requested or injected

    @property
    def checkpointing(self) -> bool:
        config = self.run.config
        return config.checkpoint_every is not None or config.checkpoint_minutes is not None

    def checkpoint_or_flush(self, point: Point, agreed: Settled) -> None:
        due = agreed.checkpoint_due or point.scheduled_checkpoint
        if self.checkpointing and not point.finished and (due or agreed.stop):
            self.result.wall_seconds = time.perf_counter() - self.wall_start
            checkpoint(self.run, self.result)
            self.last_checkpoint = time.monotonic()
        else:
            self.flush_if_due()

    def flush_if_due(self) -> None:
        if self.run.recorder.flush_due(FLUSH_SECONDS):
            with self.run.stop.held():
                self.run.folder.flush_rows(self.run.recorder)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.close()
        if self.live is not None:
            self.live.close()


def check_step_result(method: str, done) -> None:
    """A method's ``step`` must return a ``StepResult``; anything else is one line naming the
    method and what it returned, not an AttributeError from inside the loop."""

    if not isinstance(done, StepResult):
        raise BenchError(
            f"method {method!r}: step() returned {type(done).__name__} ({done!r:.60}), not a "
            "suite.api.StepResult(loss, samples, converged=False)"
        )


def checkpoint(run: Run, result: LoopResult) -> None:
    """Flush the rows so far, then save (collective); signals wait until both are whole."""
    with run.stop.held():
        run.folder.flush_rows(run.recorder)
        stats = save_checkpoint(
            run.folder.path, result.done, rank_state(run, result), node=run.node
        )
    run.checkpoints.append(stats)


def progress_bar(run: Run):
    if dist.get_rank() != 0 or os.environ.get("PRUNEX_PROGRESS", "1") == "0":
        return None

    return tqdm(total=run.iterations, desc=run.config.method, unit="it", dynamic_ncols=True)


def live_logging(run: Run) -> bool:
    """Rank 0 writes the live log (``--tensorboard``)."""
    return run.config.tensorboard and dist.get_rank() == 0


def interruption_message(run: Run, result: LoopResult, checkpointed: bool) -> str:
    if run.stop.requested:
        how = f"interrupted by {run.stop.name}"
    elif STOP_AFTER_ITERATION is not None and result.done >= STOP_AFTER_ITERATION:
        how = "interrupted by PRUNEX_STOP_AFTER_ITERATION"
    else:
        how = "interrupted by a peer"
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
        run.folder.merge_parts()
        with run.stop.held():
            finish_folder(
                run.folder,
                config=run.config,
                manifest=run.manifest,
                artifacts={"model.pt": final_model.state_dict(), **run.method.artifacts()},
                iterations_done=result.done,
                wall_seconds=result.wall_seconds,
                time_to_target=result.time_to_target,
                converged=result.converged,
                extra=summary_extra(run, result),
                attempt_start=(run.attempt or {}).get(schema.RESUMED_AT_ITERATION) or 0,
            )
        shutil.rmtree(checkpoint_root(run.folder.path), ignore_errors=True)
    wait_for_rank0(run)


def summary_extra(run: Run, result: LoopResult) -> dict:
    """What the summary holds beyond the folder's tables: attempts, setup and warm-up,
    evaluation time, throughput, the method's facts and warnings, checkpoints."""
    extra = {**(run.attempt or {}), schema.PROCESSES: (run.folder.summary() or {}).get(
        schema.PROCESSES)}
    extra.update(run.setup_seconds)
    extra[schema.EVALUATION_SECONDS] = result.evaluation_seconds
    if result.train_seconds > 0:  # a host-bound run shows here
        samples = run.loader.step * run.loader.batch_size
        extra[schema.SAMPLES_PER_SECOND_PER_RANK] = samples / result.train_seconds
    extra.update(run.method.summary_facts())
    warnings = [*run.method.warnings, *traffic_warnings(run, result)]
    if warnings:
        extra[schema.WARNINGS] = warnings
    if run.checkpoints:
        extra.update({
            schema.CHECKPOINTS_WRITTEN: len(run.checkpoints),
            schema.CHECKPOINT_SECONDS_MEAN: sum(c["seconds"] for c in run.checkpoints)
            / len(run.checkpoints),
            schema.CHECKPOINT_BYTES: run.checkpoints[-1]["bytes"],
        })
    return extra


def traffic_warnings(run: Run, result: LoopResult) -> list[str]:
    """A run of several ranks whose method recorded no traffic at all most likely talks to
    the other ranks past the communicator (``torch.distributed`` directly): its bytes and
    communication times are then missing from every table. Said on stderr and in the
    summary."""
    if dist.get_world_size() < 2 or result.done == 0 or result.inter_bytes + result.intra_bytes:
        return []
    line = (f"{run.config.method} recorded no traffic on {dist.get_world_size()} ranks: a method "
            "must issue its collectives through ctx.comm (suite.api.Communicator), or its bytes "
            "and communication time are not recorded")
    print(f"warning: {line}", file=sys.stderr, flush=True)
    return [line]


#: seconds rank 0 may take to merge one rank's rows and write the summary, beyond
#: --collective-timeout (the other ranks wait that long for it, watched)
MERGE_SECONDS_PER_RANK = 2.0


def wait_for_rank0(run: Run) -> None:
    """The other ranks wait until rank 0 has merged every rank's rows and written the summary,
    through the job's store (a collective would time out at ``--collective-timeout`` while
    rank 0 merges 64 ranks' parts); the wait is watched with a timeout that grows with the
    ranks rank 0 merges. Then one barrier, which all reach at once, keeps rank 0 (which may
    host the store) alive until every rank has seen it done."""
    timeout = run.config.collective_timeout + MERGE_SECONDS_PER_RANK * dist.get_world_size()
    store = store_client(timeout)
    if store is not None:
        key = f"finished/{run.folder.path.name}"
        with watched("wait", "world (rank 0 merges the rows)", timeout=timeout):
            if dist.get_rank() == 0:
                store.set(key, "1")
            else:
                store.wait([key], timedelta(seconds=timeout))
    barrier("the run finished")
