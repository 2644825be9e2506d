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

import shutil
import sys
import time
from dataclasses import asdict, dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from tqdm import tqdm

from suite.cluster.audit import AUDIT
from suite.cluster.watchdog import STORE_TALLY, barrier, store_client, watched
from suite.environment import env_flag, env_int, number
from suite.errors import BenchError
from suite.plugins.method import StepResult
from suite.results import schema
from suite.results.finish import finish_folder
from suite.results.folder import RunFolder
from suite.results.runner import load_over, own_pids, sample
from suite.results.summary import RunOutcome
from suite.run.agreement import Agreement, NonFiniteLoss, Settled
from suite.run.build import check_steps_taken
from suite.run.checkpoint import (
    checkpoint_root,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from suite.run.determinism import NONDETERMINISTIC
from suite.run.livelog import TensorBoardLog
from suite.run.plan import RunPlan
from suite.run.setup import Run, restart_count, setup
from suite.run.stopping import StopRequest

__all__ = [
    "AGREED_STOPS", "AgreedInterruption", "HiddenTraffic", "LoopResult", "NonFiniteLoss",
    "train",
]


class AgreedInterruption(BenchError):
    """A signal asked the run to stop; every rank stopped after the same iteration (the
    launcher reports it as suite.errors.RunInterrupted)."""


class HiddenTraffic(BenchError):
    """The method issued collectives across nodes past ``ctx.comm``: every rank stops after
    the same agreement, the run fails in one line."""


AGREED_STOPS = (NonFiniteLoss, AgreedInterruption, HiddenTraffic)

#: bytes issued past ctx.comm that are tolerated, as a share of what the communicator
#: declared on the same groups: DDP's reducer syncs its bucket layout once (a broadcast of a
#: few hundred bytes, issued inside an iteration by torch, not by the method)
HIDDEN_SHARE = 0.01
#: and in bytes over the run, below which nothing is said
HIDDEN_FLOOR_BYTES = 4096



def flush_seconds() -> float:
    """A rank writes its new rows to the run folder at the end of an iteration once this
    many seconds have passed since its last write (5; ``PRUNEX_FLUSH_SECONDS``): a SIGKILL
    loses at most these last seconds of rows."""
    return number("PRUNEX_FLUSH_SECONDS")


def stop_after_iteration() -> int | None:
    """Fault injection for tests of resume: every rank stops after this iteration count as
    if a SIGTERM had reached it (checkpointing first when checkpointing is on), at no race
    with how fast the run goes (``PRUNEX_STOP_AFTER_ITERATION``; unset: never)."""
    return env_int("PRUNEX_STOP_AFTER_ITERATION", 0, minimum=0) or None


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
    #: input bytes issued past ctx.comm on groups that span nodes / inside one node, and what
    #: the communicator declared on the groups that span nodes (suite.cluster.audit)
    hidden_inter_bytes: float = 0.0
    hidden_intra_bytes: float = 0.0
    declared_inter_bytes: float = 0.0


def train(
    plan: RunPlan, device: torch.device, folder: RunFolder, recorder, stop: StopRequest
) -> None:
    """Set up, continue from the latest checkpoint when resuming or restarted, train, finish."""
    run = setup(plan, device, folder, recorder, stop)
    result = LoopResult()
    found = latest_checkpoint(folder.path) if (plan.config.resume or restart_count()) else None
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
        self.progress = progress_bar(run, result.done)
        self.live = TensorBoardLog(run.folder.path, result.done) if live_logging(run) else None
        self.wall_start = time.perf_counter() - result.wall_seconds
        # this attempt's first iteration and the method's own one-off iterations: marked in
        # the table, left out of the summary's means (suite.results.schema.ONE_OFF)
        self.one_offs = {result.done, *run.method.one_off_iterations(result.done)}
        self.last_checkpoint = time.monotonic()
        self.accuracy: float | None = None
        self.hidden_groups: set[str] = set()  # this rank's groups with hidden collectives
        self.flush_seconds, self.stop_after = flush_seconds(), stop_after_iteration()

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
        before = run.loader.step
        with AUDIT.during_step():
            done = run.method.step(iteration)
        hidden = AUDIT.take()
        check_step_result(run.config.method, done)
        check_steps_taken(run.config.method, iteration, run.loader.step - before,
                          scheduled_steps(run, before), run.steps_per_iteration)
        wire = run.wire.stop() if run.wire is not None else {}
        loss = float(done.loss)
        row = run.recorder.end_iteration(**wire, **{
            schema.LOSS: loss,
            schema.SAMPLES: int(done.samples),
            schema.EPOCH: run.loader.step / run.loader.steps_per_epoch,
            schema.ONE_OFF: iteration in self.one_offs or bool(done.one_off),
            schema.STORE_OPS: STORE_TALLY.take(),
        })
        result.train_seconds += row[schema.T_ITERATION]
        result.done = iteration + 1
        result.converged = bool(done.converged)  # collective: the same on every rank
        self.agreement.add(row, loss, hidden)
        return row, int(done.samples)

    def point(self) -> Point:
        result, run = self.result, self.run
        every = run.config.checkpoint_every
        return Point(
            finished=result.converged or result.done == run.iterations,
            evaluating=result.done in run.eval_points or result.converged,
            scheduled_checkpoint=every is not None and result.done % every == 0,
            agreement_due=self.agreement.due or result.done == self.stop_after,
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
            self.result.hidden_inter_bytes += settled.hidden.crossing
            self.result.hidden_intra_bytes += settled.hidden.local
            self.result.declared_inter_bytes += settled.hidden.declared_crossing
            self.hidden_groups.update(settled.hidden.groups)
            if self.live is not None:
                self.live.iteration(settled.row, settled.mean_loss, settled.inter_bytes,
                                    settled.intra_bytes)
        if self.live is not None:
            self.live.layers(self.run.recorder.layers)
        check_hidden_traffic(self.run, self.result, self.hidden_groups)
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
            post["acc"] = f"{100 * self.accuracy:.2f} %"
        self.progress.set_postfix(post, refresh=False)
        self.progress.update(len(agreed.iterations))

    @property
    def stop_requested(self) -> bool:
        injected = self.stop_after is not None and self.result.done >= self.stop_after
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
        if self.run.recorder.flush_due(self.flush_seconds):
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


def hidden_beyond_tolerance(hidden: float, declared: float) -> bool:
    """Whether bytes issued past ctx.comm are more than incidental (see HIDDEN_SHARE)."""
    return hidden > max(HIDDEN_FLOOR_BYTES, HIDDEN_SHARE * declared)


def check_hidden_traffic(run: Run, result: LoopResult, groups: set[str]) -> None:
    """Fail the run, on every rank after the same agreement, once its method has issued
    more than incidental bytes across nodes past ctx.comm: they are in no table, and the run
    would read as one that moved less than it did."""
    if not hidden_beyond_tolerance(result.hidden_inter_bytes, result.declared_inter_bytes):
        return
    where = ", ".join(sorted(groups)) or "groups of other ranks"
    raise HiddenTraffic(
        f"method {run.config.method!r} issued {result.hidden_inter_bytes / 1e6:.3g} MB of "
        f"collectives on groups that span nodes ({where}) past ctx.comm in its first "
        f"{result.done} iteration(s): they are recorded nowhere; issue them through ctx.comm "
        "(suite.api.Communicator), or declare what torch issues for the method with "
        "ctx.comm.account(...)"
    )


def scheduled_steps(run: Run, taken_before: int) -> int:
    """Local steps the next iteration must take: a whole iteration, or what is left of the
    budget (a round-based method's last round is cut to fit)."""
    budget = run.plan.schedule.budget_steps(run.steps_per_iteration)
    return max(1, min(run.steps_per_iteration, budget - taken_before))


def checkpoint(run: Run, result: LoopResult) -> None:
    """Flush the rows so far, then save (collective); signals wait until both are whole."""
    with run.stop.held():
        run.folder.flush_rows(run.recorder)
        stats = save_checkpoint(
            run.folder.path, result.done, rank_state(run, result), node=run.node
        )
    run.checkpoints.append(stats)


def progress_bar(run: Run, done: int):
    """Rank 0's bar of the run's iterations, from where a resumed run continues (``done``)."""
    if dist.get_rank() != 0 or not env_flag("PRUNEX_PROGRESS", default=True):
        return None
    return tqdm(total=run.iterations, initial=done, desc=run.config.method, unit="it",
                dynamic_ncols=True)


def live_logging(run: Run) -> bool:
    """Rank 0 writes the live log (``--tensorboard``)."""
    return run.config.tensorboard and dist.get_rank() == 0


def interruption_message(run: Run, result: LoopResult, checkpointed: bool) -> str:
    if run.stop.requested:
        how = f"interrupted by {run.stop.name}"
    elif (stop := stop_after_iteration()) is not None and result.done >= stop:
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
        processes = (run.folder.summary() or {}).get(schema.PROCESSES)
        run.manifest[schema.RUNNER_LOAD] = load_over(run.runner_start,
                                                     sample(own_pids(processes)))
        run.folder.write_manifest(run.manifest)
        with run.stop.held():
            outcome = RunOutcome(
                run.config, run.manifest, result.done, result.wall_seconds,
                result.time_to_target, result.converged,
                attempt_start=(run.attempt or {}).get(schema.RESUMED_AT_ITERATION) or 0)
            finish_folder(
                run.folder, outcome,
                {"model.pt": final_model.state_dict(), **run.method.artifacts()},
                extra=summary_extra(run, result))
        shutil.rmtree(checkpoint_root(run.folder.path), ignore_errors=True)
    wait_for_rank0(run)


def summary_extra(run: Run, result: LoopResult) -> dict:
    """What the summary holds beyond the folder's tables: attempts, setup and warm-up,
    evaluation time, throughput, the method's facts and warnings, checkpoints."""
    recorded = run.folder.summary() or {}
    # the processes and attempts stay: a late row of an earlier attempt is refused by them
    extra = {**(run.attempt or {}), schema.PROCESSES: recorded.get(schema.PROCESSES),
             schema.ATTEMPTS: recorded.get(schema.ATTEMPTS)}
    extra.update(run.setup_seconds)
    extra[schema.EVALUATION_SECONDS] = result.evaluation_seconds
    if result.train_seconds > 0:  # a host-bound run shows here
        samples = run.loader.step * run.loader.batch_size
        extra[schema.SAMPLES_PER_SECOND_PER_RANK] = samples / result.train_seconds
    extra.update(run.method.summary_facts())
    audited = AUDIT.supported  # None: this torch cannot say what went past ctx.comm
    extra[schema.HIDDEN_INTER_NODE_BYTES] = result.hidden_inter_bytes if audited else None
    extra[schema.HIDDEN_INTRA_NODE_BYTES] = result.hidden_intra_bytes if audited else None
    if run.config.deterministic:
        extra[schema.NONDETERMINISTIC_OPS] = list(NONDETERMINISTIC.seen)
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
    """What says a method's traffic went past the communicator (``torch.distributed``
    directly), so its bytes and communication times are missing from every table: no
    traffic at all on several ranks, collectives inside a node that only the audit saw, or
    intra-node traffic and no inter-node bytes on several nodes (``bench compare`` does not
    rank such a run). Said on stderr and in the summary."""
    method, ranks, nodes = run.config.method, dist.get_world_size(), run.topology.num_nodes
    lines = []
    if result.done and ranks > 1 and not result.inter_bytes + result.intra_bytes:
        lines.append(f"{method} recorded no traffic on {ranks} ranks: a method must issue its "
                     "collectives through ctx.comm (suite.api.Communicator), or its bytes and "
                     "communication time are not recorded")
    elif result.done and nodes > 1 and result.intra_bytes and not result.inter_bytes:
        lines.append(f"{method} recorded intra-node traffic but no inter-node bytes on {nodes} "
                     "nodes: its inter-node collectives went past ctx.comm, or it never "
                     "crossed nodes; bench compare will not rank this run")
    if hidden_beyond_tolerance(result.hidden_intra_bytes, result.intra_bytes):
        lines.append(f"{method} issued {result.hidden_intra_bytes / 1e6:.3g} MB of collectives "
                     "inside nodes past ctx.comm: they are not in bytes_intra")
    for line in lines:
        print(f"warning: {line}", file=sys.stderr, flush=True)
    return lines


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
            STORE_TALLY.add()  # after the last row: counted in no iteration's
            if dist.get_rank() == 0:
                store.set(key, "1")
            else:
                store.wait([key], timedelta(seconds=timeout))
    barrier("the run finished")
