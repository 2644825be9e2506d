"""The exact checks a GPU class's reference passes before it is recorded (tools/gpu/plan's
reference step): numbers it must repeat whatever its kernels, so that a wrong one fails the
recording instead of becoming the class's truth for every later nightly.

- Bytes follow the plan, not the kernels: each method's inter-node bytes equal the portable
  CPU class's (``reference/cpu-gloo-portable-t1``; the two CPU classes' are equal for all
  11 methods, whose kernels differ).
- One seed judges a class only where the same seed repeats itself: a second seed-0 run
  (the twin) of ddp and prunex ends with the model, the training losses and the final
  numbers of the first, bit for bit.
"""

from __future__ import annotations

from pathlib import Path

import torch

from suite.api import schema
from suite.results.view import RunView, run_folders

#: the methods run twice: the dense baseline and the method under study
TWIN_METHODS = ("ddp", "prunex")
#: what a twin's summary must repeat exactly (beside its model and its losses)
TWIN_SUMMARY = (schema.FINAL_TRAIN_LOSS, schema.FINAL_ACCURACY, schema.INTER_NODE_BYTES_TOTAL,
                schema.INTRA_NODE_BYTES_TOTAL, schema.ITERATIONS)


def finished(results: Path) -> dict[tuple[str, int], RunView]:
    """(method, seed) -> the run that ended ok, of every run under ``results``."""
    runs = {}
    for folder in run_folders(results):
        view = RunView.read(folder)
        if view.status == schema.Status.OK:
            runs[(view.method, int(view.summary.get(schema.SEED, 0)))] = view
    return runs


def bytes_differences(recorded: Path, portable: Path) -> list[str]:
    """``topk: 5848681 inter-node bytes, the portable class 5848680``: each run under
    ``recorded`` whose inter-node bytes are not those of the same method and seed in the
    ``portable`` reference (a method or seed the portable class lacks is not judged)."""
    expected = finished(portable)
    found = []
    for key, view in sorted(finished(recorded).items()):
        if key not in expected:
            continue
        sent = view.summary.get(schema.INTER_NODE_BYTES_TOTAL)
        want = expected[key].summary.get(schema.INTER_NODE_BYTES_TOTAL)
        if sent != want:
            found.append(f"{key[0]} (seed {key[1]}): {sent} inter-node bytes, the portable "
                         f"class {want}")
    return found


def twin_differences(recorded: Path, twin: Path,
                     methods: tuple[str, ...] = TWIN_METHODS) -> list[str]:
    """What the seed-0 twins under ``twin`` do not repeat of the runs under ``recorded``
    (their models' keys, the first iteration whose losses differ, summary values); a twin
    missing is a finding too. Empty: one seed judges the class."""
    first, second = finished(recorded), finished(twin)
    found = []
    for method in methods:
        if (method, 0) not in first or (method, 0) not in second:
            found.append(f"{method}: no finished seed-0 run to compare with its twin")
            continue
        a, b = first[(method, 0)], second[(method, 0)]
        found += [f"{method}: the twin's {item}" for item in
                  [*model_differences(a.folder, b.folder), *loss_differences(a, b),
                   *[f"{key} is {b.summary.get(key)!r}, not {a.summary.get(key)!r}"
                     for key in TWIN_SUMMARY if a.summary.get(key) != b.summary.get(key)]]]
        warned = a.summary.get(schema.NONDETERMINISTIC_OPS)
        if warned and any(f.startswith(f"{method}:") for f in found):
            found.append(f"{method}: ops without a deterministic kernel: {warned}")
    return found


def model_differences(first: Path, second: Path) -> list[str]:
    """``model differs at features.0.weight, ...``: the keys of two runs' ``model.pt`` whose
    tensors are not equal bit for bit (one line; empty when every tensor is)."""
    a, b = (torch.load(Path(f) / "model.pt", map_location="cpu", weights_only=True)
            for f in (first, second))
    keys = sorted(k for k in a.keys() | b.keys()
                  if k not in a or k not in b or not torch.equal(a[k], b[k]))
    if not keys:
        return []
    shown = ", ".join(keys[:3]) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")
    return [f"model differs at {shown}"]


def loss_differences(first: RunView, second: RunView) -> list[str]:
    """``training loss differs from iteration 3``: the first iteration where two runs' rows
    (every rank's) differ in loss (empty when every row is equal)."""
    columns = [schema.ITERATION, schema.RANK, schema.LOSS]
    tables = [view.table("iterations") for view in (first, second)]
    if any(table is None for table in tables):
        return ["iterations table is missing or damaged"]
    a, b = (table[columns].sort_values(columns[:2]).reset_index(drop=True) for table in tables)
    if a.equals(b):
        return []
    if len(a) != len(b):
        return [f"training losses have {len(b)} rows, not {len(a)}"]
    apart = a[(a != b).any(axis=1)]
    return [f"training loss differs from iteration {int(apart[schema.ITERATION].iloc[0])}"]
