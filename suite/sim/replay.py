"""Simulated runs: a method's own step code, with collectives priced instead of issued.

One process plays global rank 0 (node 0's leader) of an N-rank job on ``gpus_per_node``-rank
nodes. The method is built exactly as in a real run, from the workload's real model (so every
buffer has its real size), and its ``step`` runs unchanged; what differs is underneath it:

* ``SimCommunicator`` (``pricing``) prices each collective with the alpha-beta models of
  ``suite.sim.costmodel`` on the profile's links, attributes its bytes with the real
  communicator's ring model, and hands back what N identical replicas would get (a SUM is the
  tensor times n, a gather n copies), so the method's math and control flow stay valid;
* ``SimLoader`` (``standins``) has the real shard's steps per epoch but yields tiny
  stand-in batches (4x4 images), because only the shapes of parameters and gradients matter to
  the schedule;
* ``SimRecorder`` (``pricing``) charges each local step the profile's compute time
  (measured or estimated); lets collectives issued during the backward pass (DDP's bucket
  hooks) hide behind it as a pipeline does (bucket i is ready when the backward pass has
  produced its share of the gradients, one bucket is on the wire at a time, and only what ends
  after the backward pass shows), as far as the profile's measured overlap efficiency allows;
  scales the host-measured time of the methods' own elementwise phases (projection, pack,
  compress, ...: this thread's CPU seconds, which another process cannot lengthen) by host /
  device memory bandwidth; and adds ``straggler_wait``, the profile's
  expected wait for the slowest rank at a synchronization after this iteration's local steps.

Every other rank issues the same collectives on its own groups (SPMD) except the leaders-only
ones, so its bytes are the leader's event log re-attributed with that rank's topology. At
least the first ``replay`` iterations run for real, and every one after them until the
schedule repeats (the same samples and bytes three times, the masks frozen where a method has
them, no one-off such as PruneX's freeze); later ones are priced as the replayed iteration of
median time with that schedule (the first replayed one, which pays first-call costs, aside),
and any of other local steps (a cut last round) is replayed. The samples priced equal the
samples trained, or the simulation ends in one line.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
import torch.distributed as dist

from suite.errors import BenchError
from suite.plugins.registry import METHODS
from suite.processes import single_threaded
from suite.results import schema
from suite.results.finish import finish_folder
from suite.results.folder import RunFolder, write_table
from suite.results.summary import RunOutcome
from suite.run.build import build_method, check_steps_taken, make_manifest
from suite.run.plan import RunPlan
from suite.sim.measure import memory_bandwidth
from suite.sim.pricing import SimCommunicator, SimRecorder, host_work_seconds, rank_rows
from suite.sim.profile import Profile
from suite.sim.standins import SimLoader, ensure_single_process_group, sim_topology

DEFAULT_REPLAY = 10


@dataclass
class Borrowed:
    """Accuracy a simulated run takes from a named real run."""

    run_id: str
    final_accuracy: float | None
    best_accuracy: float | None


def borrowed_accuracy(run_dir: str | None) -> Borrowed | None:
    if run_dir is None:
        return None
    summary = RunFolder(run_dir).summary()
    if summary is None or summary.get(schema.STATUS) != schema.Status.OK:
        raise BenchError(f"--accuracy-from {run_dir}: not a finished run folder (no ok summary)")
    if summary.get(schema.SIMULATED):
        raise BenchError(f"--accuracy-from {run_dir}: a simulated run has no accuracy to lend")
    return Borrowed(
        summary.get(schema.RUN_ID, Path(run_dir).name),
        summary.get(schema.FINAL_ACCURACY),
        summary.get(schema.BEST_ACCURACY),
    )


def check_simulable(method: str) -> None:
    reason = METHODS.get(method).not_simulable
    if reason is not None:
        raise BenchError(f"the simulator cannot replay {method}: {reason}")


@single_threaded
def simulate_run(
    plan: RunPlan,
    profile: Profile,
    *,
    replay: int = DEFAULT_REPLAY,
    accuracy: Borrowed | None = None,
    host_memory_bandwidth: float | None = None,
    progress: Callable[[str], None] | None = None,
) -> Path:
    """Simulate the plan (one method, one GPU count, its node size given) and write its run
    folder; ``progress`` is told each replayed iteration (its local steps and seconds here)
    and the pricing."""
    config, recipe = plan.config, plan.recipe
    say = progress or (lambda line: None)
    check_simulable(config.method)
    step_seconds, step_source = profile.step_seconds(config.workload, recipe.batch_size)
    host_bw = host_memory_bandwidth or memory_bandwidth(torch.device("cpu"),
                                                        clock=host_work_seconds)

    device = torch.device("cpu")
    topology, loader, recorder, comm = _sim_stack(plan, profile, device, step_seconds, host_bw)
    ctx, method, iterations, steps = build_method(
        plan, topology=topology, comm=comm, recorder=recorder, loader=loader, device=device,
    )

    rows, replays = _replay_iterations(
        config, ctx, method, loader=loader, recorder=recorder, comm=comm,
        iterations=iterations, steps=steps, replay=replay, say=say,
    )
    check_samples_priced(rows, ctx.budget_steps * loader.batch_size, config.method)

    folder = RunFolder(Path(config.results_dir) / plan.run_id)
    folder.path.mkdir(parents=True, exist_ok=True)
    replayed = len(replays)
    stationary = replayed == iterations or settled(replays, None)
    manifest = make_manifest(
        plan, ctx, method, iterations=iterations, steps_per_iteration=steps,
        device="simulated", backend="simulated",
        topology={  # a simulated cluster has no hosts
            **{k: v for k, v in topology.describe().items() if k != "hostnames"},
            schema.EMULATED_NODES: False,
        },
        simulated=True,
        simulation={
            schema.PROFILE: profile.raw,
            schema.STEP_SECONDS: step_seconds,
            schema.STEP_SECONDS_SOURCE: step_source,
            schema.HOST_MEMORY_BANDWIDTH: host_bw,
            schema.REPLAYED_ITERATIONS: replayed,
            schema.STATIONARY_AFTER_REPLAY: stationary,
            schema.ACCURACY_FROM: accuracy.run_id if accuracy else None,
        },
    )
    folder.write_manifest(manifest)
    _write_tables_and_finish(
        folder, config, manifest, method, rows=rows, recorder=recorder,
        iterations=iterations, accuracy=accuracy,
    )
    return folder.path


def _sim_stack(
    plan: RunPlan, profile: Profile, device: torch.device, step_seconds: float, host_bw: float
):
    """The simulated job underneath the method, in the order a real run builds its own: the
    single-process group, rank 0's topology, the stand-in loader, the pricing recorder and
    the pricing communicator; split out of ``simulate_run`` to keep the run's outline
    readable.

    Args:
        device: where the stand-in tensors live (the CPU).
        step_seconds: the profile's compute seconds per local step of this workload.
        host_bw: this host's memory bandwidth, which scales the host-timed phases.

    Returns:
        (topology, loader, recorder, communicator).
    """
    config, recipe = plan.config, plan.recipe
    ensure_single_process_group()
    topology = sim_topology(config.gpus, config.gpus_per_node, rank=0, pg=dist.group.WORLD)
    loader = SimLoader(plan.spec, plan.train_samples, config.gpus, recipe.batch_size,
                       config.seed)
    recorder = SimRecorder(
        0,
        device,
        loader,
        step_seconds=step_seconds,
        backward_fraction=profile.backward_fraction,
        overlap_efficiency=profile.overlap_efficiency,
        host_scale=host_bw / profile.memory_bandwidth,
        sync_wait=lambda steps: profile.sync_wait(
            config.workload, recipe.batch_size, steps, config.gpus
        ),
    )
    comm = SimCommunicator(topology, recorder, device, profile)
    return topology, loader, recorder, comm


def _write_tables_and_finish(
    folder: RunFolder,
    config,
    manifest: dict,
    method,
    *,
    rows: list[dict],
    recorder: SimRecorder,
    iterations: int,
    accuracy: Borrowed | None,
) -> None:
    """Write the simulated run's tables and its summary once the manifest is written; the
    run's wall time is the sum of its priced iterations (the slowest rank of each), and its
    accuracy, where any, is borrowed from the real run named by ``--accuracy-from``."""
    frame = _frame(rows)
    write_table(folder.path / "iterations.parquet", frame)
    if recorder.layers:
        write_table(folder.path / "layers.parquet", recorder.layers)
    extra = method.summary_facts()
    if accuracy is not None:  # borrowed from the real run named by --accuracy-from
        extra.update(
            final_accuracy=accuracy.final_accuracy,
            best_accuracy=accuracy.best_accuracy,
            accuracy_from=accuracy.run_id,
        )
    wall = float(frame.groupby(schema.ITERATION)[schema.T_ITERATION].max().sum())
    finish_folder(folder, RunOutcome(config, manifest, iterations, wall),
                  method.artifacts(),  # masks.pt: what the replay's masks were
                  extra=extra, evaluated=False)


def _replay_iterations(
    config,
    ctx,
    method,
    *,
    loader: SimLoader,
    recorder: SimRecorder,
    comm: SimCommunicator,
    iterations: int,
    steps: int,
    replay: int,
    say: Callable[[str], None],
) -> tuple[list[dict], list[list[dict]]]:
    """Run the method's own steps for the iterations that must be replayed (the first
    ``replay``, and each until the schedule settles) and price every other as the typical
    replayed one, advancing the loader as the real run's would.

    Args:
        config: the run's configuration (its method, GPUs and node size).
        ctx: the built method's context (its budget of steps).
        method: the built method, whose ``step`` runs unchanged.
        iterations: the run's iterations, each of ``steps`` local steps (a cut last one
            fewer).
        say: told each replayed iteration and when pricing takes over.

    Returns:
        (every rank's rows of every iteration, the replayed iterations' rows in order).
    """
    rows: list[dict] = []
    replays: list[list[dict]] = []  # the replayed iterations' rows, in order
    started = time.perf_counter()
    for it in range(iterations):
        planned = min(steps, ctx.budget_steps - it * steps)  # a cut last round is shorter
        epoch = min((it + 1) * steps, ctx.budget_steps) / loader.steps_per_epoch
        if it < replay or not replays or not settled(replays, planned * loader.batch_size):
            recorder.begin_iteration(it)
            comm.events.clear()
            before = loader.step
            done = method.step(it)
            check_steps_taken(config.method, it, loader.step - before,
                              min(steps, ctx.budget_steps - before), steps)
            leader = recorder.end_iteration(
                loss=math.nan,  # the stand-in batches' loss means nothing
                samples=recorder.steps_this_iteration * loader.batch_size,
                epoch=epoch,
                one_off=bool(done.one_off),  # PruneX's freeze: its host-timed decision
            )
            replays.append(rank_rows(leader, comm.events, config.gpus, config.gpus_per_node))
            taken = recorder.steps_this_iteration
            say(f"replayed iteration {it + 1}/{iterations} ({taken} local "
                f"step{'s' if taken != 1 else ''}) in {time.perf_counter() - started:.1f} s")
            started = time.perf_counter()
            if it + 1 < iterations and it + 1 >= replay and settled(replays, None):
                say(f"pricing iterations {it + 2}-{iterations} as the last replayed one "
                    "(its schedule repeats), any of other local steps replayed")
            rows.extend(replays[-1])
        else:  # the same schedule as the last replayed iteration: priced as such a one
            loader.step += planned  # where the run's loader would stand
            rows.extend(dict(row, iteration=it, epoch=epoch) for row in typical(replays))
    return rows, replays


#: replayed iterations of one schedule before later ones are priced as their median: the
#: host-timed phases (compression, packing) vary by a few ms from one iteration to the next
SAMPLES_OF_A_SCHEDULE = 3


def same_schedule(a: list[dict], b: list[dict]) -> bool:
    """Whether two iterations' rows (every rank's) trained the same samples and moved the
    same bytes inside and across nodes."""
    return all(x[schema.SAMPLES] == y[schema.SAMPLES]
               and x[schema.BYTES_INTER] == y[schema.BYTES_INTER]
               and x[schema.BYTES_INTRA] == y[schema.BYTES_INTRA] for x, y in zip(a, b))


def settled(replays: list[list[dict]], samples: int | None) -> bool:
    """Whether an iteration that trains ``samples`` per rank (None: any) can be priced as the
    last replayed one: it trains as many, the method's masks are frozen (where it has
    any), the last paid no one-off (PruneX's freeze) and the last ``SAMPLES_OF_A_SCHEDULE``
    replayed iterations moved the same bytes (the schedule repeats).
    Anything else is replayed: a cut last round, the rounds up to and after a freeze."""
    last = replays[-1]
    if samples is not None and last[0][schema.SAMPLES] != samples:
        return False
    if (len(replays) < SAMPLES_OF_A_SCHEDULE or last[-1].get(schema.FROZEN, True) is False
            or last[0][schema.ONE_OFF]):
        return False
    return all(same_schedule(before, last) for before in replays[-SAMPLES_OF_A_SCHEDULE:-1])


def typical(replays: list[list[dict]]) -> list[dict]:
    """Of the replayed iterations with the last one's schedule (its samples and bytes, no
    one-off), the one of median time: the host-timed phases (compression, packing) vary from
    one iteration to the next here, and one sample's noise would be priced into every
    iteration after the replay."""
    last = replays[-1]
    warm = replays[1:] or replays  # the first replayed iteration pays first-call costs
    same = [rows for rows in warm if not rows[0][schema.ONE_OFF] and same_schedule(rows, last)]
    same.sort(key=lambda rows: rows[0][schema.T_ITERATION])
    return same[(len(same) - 1) // 2] if same else last


def check_samples_priced(rows: list[dict], trained: int, method: str) -> None:
    """The simulation's invariant: the samples its iterations price are the samples the
    run's budget trains, per rank (a round priced as another would break it)."""
    priced = sum(row[schema.SAMPLES] for row in rows if row[schema.RANK] == 0)
    if priced != trained:
        raise BenchError(f"simulating {method}: {priced} samples per rank priced, {trained} "
                         "trained; the simulator priced a round as another (a bug: report it)")


def _frame(rows: list[dict]):

    return pd.DataFrame(rows).sort_values([schema.ITERATION, schema.RANK], kind="stable")
