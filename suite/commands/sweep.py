"""``bench sweep``: a grid of runs into one results directory, resumable.

Cells are the product of workloads, methods, GPU counts, seeds and the values of every method
option given as a list, except that an option fans out only the methods that declare it
(``--channel-keep 0.3,0.5`` with ``--method prunex,ddp`` is two prunex cells and one ddp
cell). A cell's run id is derived from its full configuration, so re-running the same
sweep skips cells whose folder says ``ok``, resumes a cell whose folder has a checkpoint, and
moves any other failed or interrupted cell's folder aside (``<id>.failed-<n>``) and runs it
again. A cell's folder in use (another sweep's live cell, a rank of it still running) is
never touched: the preflight refuses the sweep, and a cell found in use later fails untouched.
An interrupted sweep stops, writes ``sweep.json`` and its table, and exits non-zero.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path

from tqdm import tqdm

from suite.config import RunConfig
from suite.errors import BenchError, RunInterrupted
from suite.plugins.registry import METHODS
from suite.results import schema
from suite.results.folder import RunFolder, id_part, write_json
from suite.results.lock import release, take
from suite.results.schema import Status
from suite.run.checkpoint import latest_checkpoint
from suite.run.plan import RunPlan

#: RunConfig fields that decide how a run survives, not what it computes: not part of a
#: cell's id, so sweeps recorded before they existed keep their ids
RELIABILITY_FIELDS = (
    "checkpoint_every", "checkpoint_minutes", "resume", "overwrite", "max_restarts",
    "collective_timeout",
)


class CellStatus(StrEnum):
    """Where a sweep's cell stands (sweep.json's ``status``): a run's own, as it ended,
    beside the sweep's own words for a cell not yet run, run or left as already done."""

    PENDING = "pending"
    DONE = "done"
    SKIPPED = "skipped"
    FAILED = Status.FAILED.value
    INTERRUPTED = Status.INTERRUPTED.value


@dataclass
class Cell:
    config: RunConfig  # as the sweep made it (its id is a hash of it)
    status: CellStatus = CellStatus.PENDING
    reason: str = ""
    plan: RunPlan | None = None  # resolved before the sweep starts, launched as it is

    @property
    def run_id(self) -> str:
        return str(self.config.run_id)


def cell_facts(cell: Cell) -> str:
    """``accuracy 86.23 %, training 30.5 s, inter-node 0.795 MB`` of a finished cell."""
    if cell.status not in (CellStatus.DONE, CellStatus.SKIPPED):
        return ""
    try:
        summary = RunFolder(Path(cell.config.results_dir) / cell.run_id).summary() or {}
    except (OSError, ValueError):  # a folder damaged since: its status line says enough
        return ""
    return run_facts(summary)


def run_facts(summary: dict, *, wall: bool = False) -> str:
    """A finished run's accuracy (in percent), training (and ``wall``) time and inter-node
    bytes, as ``bench run`` and ``bench sweep`` end with them."""
    parts = []
    if summary.get(schema.FINAL_ACCURACY) is not None:
        parts.append(f"accuracy {100 * summary[schema.FINAL_ACCURACY]:.2f} %")
    for key, word in ((schema.WALL_SECONDS, "wall"), (schema.TRAIN_SECONDS, "training")):
        if summary.get(key) is not None and (wall or key == schema.TRAIN_SECONDS):
            parts.append(f"{word} {summary[key]:.1f} s")
    if summary.get(schema.INTER_NODE_BYTES_TOTAL) is not None:
        parts.append(f"inter-node {summary[schema.INTER_NODE_BYTES_TOTAL] / 1e6:.3g} MB")
    return ", ".join(parts)


def cell_id(config: RunConfig) -> str:
    """``<method>-<workload>-<gpus>g-<hash of what the run computes>``: the same configuration
    (a method option at its declared default spelled out or left out) is the same cell."""
    described = json.loads(config.to_json())
    declared = METHODS.defaults(config.method) or {}
    described[schema.OPTIONS] = {k: v for k, v in described[schema.OPTIONS].items()
                            if k not in declared or v != declared[k]}
    for added in ("deterministic", "image_size"):  # at their defaults, cells named before
        if not described.get(added):  # the flag keep their ids
            described.pop(added, None)
    # what only changes where a run is written or how it is watched leaves the cell as it is
    for volatile in (schema.RUN_ID, "results_dir", "launcher", "tag", "tensorboard",
                     *RELIABILITY_FIELDS):
        described.pop(volatile, None)
    digest = hashlib.sha1(json.dumps(described, sort_keys=True).encode()).hexdigest()[:8]
    return f"{config.method}-{id_part(config.workload)}-{config.gpus}g-{digest}"


def expand(
    base: RunConfig,
    workloads: list[str],
    methods: list[str],
    gpus: list[int],
    seeds: list[int],
    option_values: dict[str, list],
) -> list[Cell]:
    """The grid's cells, in a stable order (workload, method, GPUs, seeds, options)."""
    cells, seen = [], set()
    for workload, method in itertools.product(workloads, methods):
        mine = {k: v for k, v in option_values.items() if method in METHODS.readers(k)}
        keys = sorted(mine)
        for n, seed, values in itertools.product(
            gpus, seeds, itertools.product(*(mine[k] for k in keys))
        ):
            options = {**base.options, **dict(zip(keys, values))}
            config = replace(
                base, workload=workload, method=method, gpus=n, seed=seed, options=options,
                run_id=None,
            )
            config = replace(config, run_id=cell_id(config))
            if config.run_id not in seen:
                seen.add(config.run_id)
                cells.append(Cell(config))
    return cells


def prepare(cell: Cell, results_dir: Path, *, force: bool = False) -> bool:
    """True when the cell must run; a finished one is skipped, one with a checkpoint is
    resumed from it, any other broken one moved aside. ``force``: every cell runs afresh,
    replacing its folder (re-recording a reference set). An existing folder is taken first
    (``suite.results.lock.take``), and held for the cell's run: one still in use (another
    sweep's cell, a rank still running) is neither touched nor moved.

    Raises:
        BenchError: the cell's folder is in use (its run goes on, untouched).
    """
    folder = RunFolder(results_dir / cell.run_id)
    start(cell, resume=False, overwrite=force)
    if not folder.path.exists():
        return True
    take(folder.path)
    if force:
        return True
    summary = None
    try:
        summary = folder.summary()
    except (OSError, ValueError):
        pass
    if summary and summary.get(schema.STATUS) == Status.OK:
        release(folder.path)
        cell.status, cell.reason = CellStatus.SKIPPED, "already done"
        return False
    if latest_checkpoint(folder.path) is not None and folder.has_manifest:
        start(cell, resume=True, overwrite=False)
        return True
    n = 1
    while folder.path.with_name(f"{cell.run_id}.failed-{n}").exists():
        n += 1
    aside = folder.path.with_name(f"{cell.run_id}.failed-{n}")
    folder.path.rename(aside)
    release(aside)  # the owner file went with it; the cell's run takes the new folder
    return True


def start(cell: Cell, *, resume: bool, overwrite: bool) -> None:
    """How this start of the cell treats its folder, in its configuration and its plan."""
    cell.config = replace(cell.config, resume=resume, overwrite=overwrite)
    if cell.plan is not None:
        cell.plan = cell.plan.restarted(resume=resume, overwrite=overwrite)


def run_cells(cells: list[Cell], results_dir: Path, launch, *, force: bool = False) -> None:
    """Run every pending cell with ``launch(plan)``; failures are recorded, not raised."""

    os.environ.setdefault("PRUNEX_PROGRESS", "0")  # one bar: over cells
    results_dir.mkdir(parents=True, exist_ok=True)
    try:
        with tqdm(cells, desc="sweep", unit="cell", dynamic_ncols=True) as bar:
            for cell in bar:
                bar.set_postfix_str(cell.run_id)
                run_cell(cell, results_dir, launch, force=force)
                write_record(cells, results_dir)
    finally:
        write_record(cells, results_dir)


def run_cell(cell: Cell, results_dir: Path, launch, *, force: bool) -> None:
    """Prepare and run one cell, its status and reason recorded (a folder in use: failed,
    left as it is).

    Raises:
        RunInterrupted: the cell was stopped; the sweep stops with it.
    """
    try:
        if not prepare(cell, results_dir, force=force):
            return
        launch(cell.plan)
        cell.status = CellStatus.DONE
    except RunInterrupted as exc:  # the sweep stops with it; a rerun resumes
        cell.status, cell.reason = CellStatus.INTERRUPTED, str(exc)
        raise
    except BenchError as exc:
        cell.status, cell.reason = CellStatus.FAILED, str(exc)
    finally:  # a cell's launch gives its folder up; one refused before it never held it
        release(results_dir / cell.run_id)


def write_record(cells: list[Cell], results_dir: Path) -> None:
    write_json(
        results_dir / "sweep.json",
        {
            "cells": [
                {
                    schema.RUN_ID: c.run_id,
                    schema.WORKLOAD: c.config.workload,
                    schema.METHOD: c.config.method,
                    schema.GPUS: c.config.gpus,
                    schema.OPTIONS: c.config.options,
                    schema.SEED: c.config.seed,
                    schema.STATUS: c.status,
                    "reason": c.reason,
                }
                for c in cells
            ]
        },
    )


def summary_lines(cells: list[Cell]) -> list[str]:
    """Where every cell stands, a line each (finished ones with their accuracy, training
    time and inter-node bytes), then the counts."""
    width = max(len(c.run_id) for c in cells)
    lines = [f"{c.run_id:<{width}}  {c.status:<8} {c.reason or cell_facts(c)}".rstrip()
             for c in cells]
    counts = {s: sum(c.status == s for c in cells) for s in (
        CellStatus.DONE, CellStatus.SKIPPED, CellStatus.FAILED, CellStatus.INTERRUPTED,
        CellStatus.PENDING)}
    lines.append(", ".join(f"{n} {s}" for s, n in counts.items()))
    return lines
