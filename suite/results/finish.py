"""The one way a run folder is finished, by real ranks (rank 0, after the rows are merged)
and by the simulator alike: artifacts saved, the summary computed from the folder's own
tables and written last, so a folder with an ``ok`` summary is whole."""

from __future__ import annotations

import torch

from suite.config import RunConfig
from suite.results import schema
from suite.results.folder import RunFolder, write_torch
from suite.results.summary import summarize


def finish_folder(
    folder: RunFolder,
    *,
    config: RunConfig,
    manifest: dict,
    artifacts: dict[str, object],
    iterations_done: int,
    wall_seconds: float,
    time_to_target: float | None,
    converged: bool,
    extra: dict | None = None,
    evaluated: bool = True,
    attempt_start: int | None = None,
) -> dict:
    """Save ``artifacts`` (file name -> object for torch.save, as CPU tensors), summarize the
    folder's iterations and evaluations (none for a simulated run, ``evaluated`` False), add
    ``extra`` and write ``summary.json``; returns it. ``attempt_start``: the finishing
    attempt's first iteration (``summarize``)."""
    for name, obj in artifacts.items():
        write_torch(folder.path / name, on_cpu(obj))
    summary = summarize(
        config=config,
        manifest=manifest,
        dataset=manifest[schema.CONFIG][schema.DATASET],
        iterations_done=iterations_done,
        iterations=folder.table("iterations"),
        evals=folder.table("evals") if evaluated else None,
        wall_seconds=wall_seconds,
        time_to_target=time_to_target,
        converged=converged,
        attempt_start=attempt_start,
    )
    summary.update(extra or {})
    folder.write_summary(summary)
    return summary


def on_cpu(obj):
    """``obj`` with every tensor in it moved to the CPU, so a GPU run's folder loads on a
    machine without one (nested dicts, lists and tuples, as artifacts are)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        moved = type(obj)((key, on_cpu(value)) for key, value in obj.items())
        if hasattr(obj, "_metadata"):  # a module's state_dict keeps its version records
            moved._metadata = obj._metadata
        return moved
    if isinstance(obj, (list, tuple)):
        return type(obj)(on_cpu(value) for value in obj)
    return obj
