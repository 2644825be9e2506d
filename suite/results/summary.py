"""summary.json from the merged tables: the numbers ``bench compare`` and reports use."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from suite.config import RunConfig
from suite.results import schema
from suite.results.schema import Status


def steady(iterations: pd.DataFrame) -> pd.DataFrame:
    """The rows whose time holds no one-off cost (``one_off`` False): what the means are
    taken over; all of them where none is marked steady (a run of one-off iterations only,
    or recorded before the column existed)."""
    if schema.ONE_OFF not in iterations:
        return iterations
    kept = iterations[~iterations[schema.ONE_OFF].fillna(False).astype(bool)]
    return kept if len(kept) else iterations


def phase_means(iterations: pd.DataFrame) -> dict[str, float]:
    """Phase -> mean seconds per steady iteration, averaged over ranks (the paper's fig. 8);
    a phase no steady iteration ran (one paid only in one-off iterations, e.g. PruneX's
    freeze) is left out: ``one_off_seconds`` has it."""
    iterations = steady(iterations)
    cols = [c for c in schema.phase_columns(iterations.columns) if iterations[c].notna().any()]
    prefix = len(schema.PHASE_PREFIX)
    return {c[prefix:]: float(iterations[c].fillna(0.0).mean()) for c in cols}


def one_off_seconds(iterations: pd.DataFrame) -> dict[str, float]:
    """Phase -> seconds the one-off iterations took in it beyond a steady iteration's mean,
    each rank's rows summed, then averaged over ranks; phases the one-offs did not exceed are
    left out (e.g. ``{"freeze": 0.21, "local_compute": 0.05}``)."""
    if schema.ONE_OFF not in iterations or schema.RANK not in iterations:
        return {}
    marked = iterations[schema.ONE_OFF].fillna(False).astype(bool)
    if not marked.any() or marked.all():
        return {}
    cols = schema.phase_columns(iterations.columns)
    means = iterations.loc[~marked, cols].fillna(0.0).mean()
    extra = (iterations.loc[marked, cols].fillna(0.0) - means).clip(lower=0.0)
    per_rank = extra.groupby(iterations.loc[marked, schema.RANK]).sum().mean()
    prefix = len(schema.PHASE_PREFIX)
    return {c[prefix:]: float(v) for c, v in per_rank.items() if v > 0}


def final_train_loss(iterations: pd.DataFrame) -> float | None:
    """The mean training loss over the last half of the iterations (at least one), the
    ranks' losses averaged per iteration; None without a loss column."""
    if schema.LOSS not in iterations or iterations.empty:
        return None
    per_iteration = iterations.groupby(schema.ITERATION)[schema.LOSS].mean()
    tail = per_iteration.iloc[len(per_iteration) // 2 :]
    return float(tail.mean())


def final_train_losses(rows: pd.DataFrame, by: str) -> dict:
    """``final_train_loss`` of every run in ``rows`` (the iterations and losses of many
    runs, each run's rows together, ``by`` naming the run) in one groupby: run -> its loss,
    the same number as ``final_train_loss`` of the run's own rows."""
    if schema.LOSS not in rows or rows.empty:
        return {}
    per_iteration = rows.groupby([by, schema.ITERATION])[schema.LOSS].mean()
    runs = per_iteration.index.get_level_values(0).to_numpy()
    values = per_iteration.to_numpy()
    starts = np.flatnonzero(np.r_[True, runs[1:] != runs[:-1]])
    ends = [*starts[1:], len(runs)]
    return {runs[a]: float(pd.Series(values[a + (b - a) // 2 : b]).mean())
            for a, b in zip(starts, ends)}


@dataclass(frozen=True)
class RunOutcome:
    """What the ranks know of a finished run beyond its folder's tables: the summary's
    inputs (``summarize``), which ``suite.results.finish.finish_folder`` passes on.

    Attributes:
        config: the run's configuration.
        manifest: its manifest (topology, budget, recipe, run id).
        iterations_done: the iterations it finished.
        wall_seconds: its wall time.
        time_to_target: seconds to the target accuracy (None: not reached, or none set).
        converged: whether it stopped at the target.
        attempt_start: the first iteration of the attempt that finished (where a resumed or
            restarted run continued), whose time is ``first_iteration_seconds``; None: the
            table's first.
    """

    config: RunConfig
    manifest: dict
    iterations_done: int
    wall_seconds: float
    time_to_target: float | None = None
    converged: bool = False
    attempt_start: int | None = None


def summarize(
    run: RunOutcome, iterations: pd.DataFrame | None, evals: pd.DataFrame | None
) -> dict:
    """summary.json's numbers for a finished run (status ``ok``), from ``run`` and its
    merged tables (``evals`` None: not evaluated, a simulated run)."""
    config, manifest, iterations_done = run.config, run.manifest, run.iterations_done
    topo = manifest[schema.TOPOLOGY]
    budget = manifest.get(schema.BUDGET) or {}
    local_steps = iterations_done * manifest[schema.STEPS_PER_ITERATION]
    if budget:  # the last round of a round-based method may be cut short
        local_steps = min(local_steps, budget[schema.LOCAL_STEPS_PER_RANK])
    batch = budget.get(schema.BATCH_SIZE, manifest[schema.RECIPE][schema.BATCH_SIZE])
    summary = {
        schema.FORMAT_VERSION_KEY: schema.FORMAT_VERSION,
        schema.RUN_ID: manifest[schema.RUN_ID],
        schema.STATUS: Status.OK,
        schema.ERROR: None,
        schema.METHOD: config.method,
        schema.WORKLOAD: config.workload,
        schema.DATASET: manifest[schema.CONFIG][schema.DATASET],
        schema.GPUS: topo[schema.WORLD_SIZE],
        schema.NODES: topo[schema.NUM_NODES],
        schema.GPUS_PER_NODE: topo[schema.GPUS_PER_NODE],
        schema.ITERATIONS: iterations_done,
        schema.STEPS_PER_ITERATION: manifest[schema.STEPS_PER_ITERATION],
        schema.EXCHANGE_EVERY: manifest.get(schema.EXCHANGE_EVERY),  # None: recorded before
        schema.EPOCHS: local_steps / manifest[schema.STEPS_PER_EPOCH],
        schema.SAMPLES_PER_RANK: local_steps * batch,
        schema.FINAL_ACCURACY: None,
        schema.BEST_ACCURACY: None,
        schema.TARGET_ACCURACY: config.target_accuracy,
        schema.TIME_TO_TARGET_SECONDS: run.time_to_target,
        schema.WALL_SECONDS: run.wall_seconds,
        schema.CONVERGED: run.converged,
        schema.OPTIONS: config.options,
        schema.SEED: config.seed,
        schema.SIMULATED: bool(manifest.get(schema.SIMULATED, False)),
    }
    if iterations is not None and len(iterations):
        summary.update(iteration_numbers(iterations, iterations_done, run.attempt_start))
    if evals is not None and len(evals):
        summary[schema.FINAL_ACCURACY] = float(evals[schema.ACCURACY].iloc[-1])
        summary[schema.BEST_ACCURACY] = float(evals[schema.ACCURACY].max())
    return summary


def iteration_numbers(iterations: pd.DataFrame, iterations_done: int,
                      attempt_start: int | None) -> dict:
    """The summary's numbers read off the iterations table (not empty): bytes, train and
    per-iteration seconds, phases, one-off costs, the final loss and, where the links were
    emulated or real hosts, the bytes that crossed the wire.

    Args:
        iterations: the run's merged iterations table, at least one row.
        iterations_done: the iterations the run finished (bytes per iteration divide by it).
        attempt_start: the first iteration of the attempt that finished, or None.

    Returns:
        The keys in the order ``summarize`` writes them.
    """
    per_iter = iterations.groupby(schema.ITERATION)
    slowest = per_iter[schema.T_ITERATION].max()
    inter = float(iterations[schema.BYTES_INTER].sum())
    numbers = {
        schema.INTER_NODE_BYTES_TOTAL: inter,
        schema.INTRA_NODE_BYTES_TOTAL: float(iterations[schema.BYTES_INTRA].sum()),
        schema.INTER_NODE_BYTES_PER_ITERATION: inter / iterations_done,
        schema.TRAIN_SECONDS: float(slowest.sum()),
        # over the steady iterations: one-off costs (suite.results.schema.ONE_OFF) out
        schema.ITERATION_SECONDS: float(
            steady(iterations).groupby(schema.ITERATION)[schema.T_ITERATION].max().mean()),
        # the first of this attempt, after the untimed warm-up (suite.run.warmup)
        schema.FIRST_ITERATION_SECONDS: float(
            slowest.get(attempt_start, slowest.iloc[0]) if attempt_start is not None
            else slowest.iloc[0]),
        schema.PHASE_SECONDS: phase_means(iterations),
        schema.ONE_OFF_SECONDS: one_off_seconds(iterations),
        schema.FINAL_TRAIN_LOSS: final_train_loss(iterations),
    }
    if schema.WIRE_TX_BYTES in iterations.columns:  # emulated links, hosts: what crossed
        wire = float(iterations[schema.WIRE_TX_BYTES].sum())
        numbers.update({
            schema.WIRE_INTER_BYTES_TOTAL: wire,
            schema.WIRE_TO_ALGORITHMIC_RATIO: wire / inter if inter else None,
        })
        if schema.WIRE_TX_FRAMES in iterations.columns and inter:
            frames = float(iterations[schema.WIRE_TX_FRAMES].sum())
            payload = wire - schema.WIRE_FRAME_HEADER_BYTES * frames
            numbers[schema.WIRE_PAYLOAD_TO_ALGORITHMIC_RATIO] = payload / inter
    return numbers
