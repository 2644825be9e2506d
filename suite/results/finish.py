"""The one way a run folder is finished, by real ranks (rank 0, after the rows are merged)
and by the simulator alike: artifacts saved, the summary computed from the folder's own
tables and written last, so a folder with an ``ok`` summary is whole."""

from __future__ import annotations

import torch

from suite.results.folder import RunFolder, write_torch
from suite.results.summary import RunOutcome, summarize


def finish_folder(folder: RunFolder, run: RunOutcome, artifacts: dict[str, object], *,
                  extra: dict | None = None, evaluated: bool = True) -> dict:
    """Save ``artifacts`` (file name -> object for torch.save, as CPU tensors), summarize the
    folder's iterations and evaluations (none for a simulated run, ``evaluated`` False) with
    what the ranks know of the ``run``, add ``extra`` and write ``summary.json``; returns
    it."""
    for name, obj in artifacts.items():
        write_torch(folder.path / name, on_cpu(obj))
    summary = summarize(run, folder.table("iterations"),
                        folder.table("evals") if evaluated else None)
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
