"""``bench sweep``: a grid of runs into one results directory, resumable.

Cells are the product of workloads, methods, GPU counts, seeds and the values of every method
option given as a list, except that an option fans out only the methods that declare it
(``--channel-keep 0.3,0.5`` with ``--method prunex,ddp`` is two prunex cells and one ddp
cell). A cell's run id is derived from its full configuration, so re-running the same
sweep skips cells whose folder says ``ok``, resumes a cell whose folder has a checkpoint, and
moves any other failed or interrupted cell's folder aside (``<id>.failed-<n>``) and runs it
again. An interrupted sweep stops, writes ``sweep.json`` and its table, and exits non-zero.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from dataclasses import dataclass, replace
from pathlib import Path

from tqdm import tqdm

from suite.config import RunConfig
from suite.errors import BenchError, RunInterrupted
from suite.plugins.registry import METHODS
from suite.results import schema
from suite.results.folder import RunFolder, id_part, write_json
from suite.run.checkpoint import latest_checkpoint
from suite.run.plan import RunPlan

#: RunConfig fields that decide how a run survives, not what it computes: not part of a
#: cell's id, so sweeps recorded before they existed keep their ids
RELIABILITY_FIELDS = (
    "checkpoint_every", "checkpoint_minutes", "resume", "overwrite", "max_restarts",
    "collective_timeout",
)


@dataclass
class Cell:
    config: RunConfig  # as the sweep made it (its id is a hash of it)
    status: str = "pending"  # pending | done | skipped | failed | interrupted
    reason: str = ""
    plan: RunPlan | None = None  # resolved before the sweep starts, launched as it is

    @property
    def run_id(self) -> str:
        return str(self.config.run_id)


def cell_facts(cell: Cell) -> str:
    """``accuracy 86.23 %, training 30.5 s, inter-node 0.795 MB`` of a finished cell."""
    if cell.status not in ("done", "skipped"):
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
    replacing its folder (re-recording a reference set)."""
    folder = RunFolder(results_dir / cell.run_id)
    start(cell, resume=False, overwrite=force)
    if not folder.path.exists() or force:
        return True
    summary = None
    try:
        summary = folder.summary()
    except (OSError, ValueError):
        pass
    if summary and summary.get(schema.STATUS) == "ok":
        cell.status, cell.reason = "skipped", "already done"
        return False
    if latest_checkpoint(folder.path) is not None and folder.has_manifest:
        start(cell, resume=True, overwrite=False)
        return True
    n = 1
    while folder.path.with_name(f"{cell.run_id}.failed-{n}").exists():
        n += 1
    folder.path.rename(folder.path.with_name(f"{cell.run_id}.failed-{n}"))
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
                if not prepare(cell, results_dir, force=force):
                    continue
                try:
                    launch(cell.plan)
                    cell.status = "done"
                except RunInterrupted as exc:  # the sweep stops with it; a rerun resumes
                    cell.status, cell.reason = "interrupted", str(exc)
                    raise
                except BenchError as exc:
                    cell.status, cell.reason = "failed", str(exc)
                write_record(cells, results_dir)
    finally:
        write_record(cells, results_dir)


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
    counts = {
        s: sum(c.status == s for c in cells)
        for s in ("done", "skipped", "failed", "interrupted", "pending")
    }
    lines.append(", ".join(f"{n} {s}" for s, n in counts.items()))
    return lines
