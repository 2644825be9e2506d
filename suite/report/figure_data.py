"""What the report's figures compute before they draw: facets, keeps and their order, the
Pareto front, per-run sums, communication seconds per local step, a run's masks read from its
folder; frame operations over all runs at once, kept apart from the drawing
(suite.report.figures) so each is read and tested on its own.
"""

from __future__ import annotations

import json
import math
import textwrap

import numpy as np
import pandas as pd
import torch

from suite.plugins.registry import METHODS
from suite.report.labels import budget_words, label_table, machine_part
from suite.report.load import is_comm_column, parts_of
from suite.report.style import keep_of, method_then_keep
from suite.results import schema
from suite.results.resultset import (
    MACHINE_CLASS,
    RUN_INDEX,
    SETTING,
    SHOWN_OPTIONS,
    ResultSet,
    column,
)
from suite.results.stats import mean_ci
from suite.results.view import RunView, first_line


def epoch_seconds(epochs, train_seconds) -> float | None:
    """Training seconds per epoch (None without both)."""
    if not epochs or train_seconds is None:
        return None
    return train_seconds / epochs


def facet_rows(frame: pd.DataFrame) -> tuple[tuple[str, ...], list[tuple[str, pd.Index,
                                                                         pd.Series]]]:
    """Rows of panels that keep apart what must not share an axis: workloads, budgets,
    settings (real, an emulated link, a simulated profile) and machine classes, where the
    runs of ``frame`` hold several of one. Returns which of those vary (``workload``,
    ``budget``, ``setting``, ``machine``) and, per row, its title (what its runs share of
    them), its runs (``frame``'s index) and their labels, named among themselves (the row's
    title and the figure's say the rest)."""
    keys = pd.DataFrame({
        schema.WORKLOAD: [str(w) for w in column(frame, schema.WORKLOAD)],
        "budget": [budget_words(e) for e in column(frame, schema.EPOCHS)],
        "setting": [str(s) for s in column(frame, SETTING)],
        "machine": [machine_part(s, m) for s, m in zip(column(frame, SETTING),
                                                        column(frame, MACHINE_CLASS))],
    }, index=frame.index)
    varying = tuple(k for k in keys if keys[k][keys[k] != ""].nunique() > 1)
    if not varying:
        return (), [("", frame.index, label_table(frame, parts_of(frame)))]
    rows = []
    for values, group in keys.groupby(list(varying), sort=True):
        values = values if isinstance(values, tuple) else (values,)
        runs = frame.loc[group.index]
        rows.append((", ".join(v for v in values if v and v != "real") or "real", group.index,
                     label_table(runs, parts_of(runs))))
    return varying, rows


def faceted_labels(runs: ResultSet, positions) -> tuple[tuple[str, ...], list[str],
                                                        np.ndarray, np.ndarray]:
    """``facet_rows`` of the runs at ``positions`` (those a figure draws): which facets vary,
    the rows' titles in order, and per run of ``runs`` (by position) its row's title and its
    label ("" for runs not drawn)."""
    frame = runs.runs.iloc[sorted(set(int(p) for p in positions))]
    varying, rows = facet_rows(frame)
    facet = np.full(len(runs.runs), "", dtype=object)
    label = np.full(len(runs.runs), "", dtype=object)
    for row_title, index, labels in rows:
        facet[index.to_numpy()] = row_title
        label[index.to_numpy()] = labels.to_numpy()
    return varying, [row_title for row_title, _, _ in rows], facet, label


def sums_per_run(values: pd.Series, run_index: pd.Series) -> dict[int, float]:
    """run index -> the sum of its ``values`` (each run's rows contiguous, in order), summed
    as ``Series.sum`` sums one run's rows, so the numbers equal those of a pass per run."""
    index = run_index.to_numpy()
    array = values.to_numpy(dtype=float)
    starts = np.flatnonzero(np.r_[True, index[1:] != index[:-1]]) if len(index) else []
    ends = [*starts[1:], len(index)]
    return {int(index[a]): float(np.nansum(array[a:b])) for a, b in zip(starts, ends)}


def pareto_front(x: pd.Series, y: pd.Series) -> list[int]:
    """Positions of the points no other point beats on both axes (smaller x, larger y),
    in increasing x."""
    front, best = [], -math.inf
    for i in sorted(range(len(x)), key=lambda i: (x.iloc[i], -y.iloc[i])):
        if y.iloc[i] > best:
            front.append(i)
            best = y.iloc[i]
    return front


def label_keeps(runs_frame: pd.DataFrame, labels, positions) -> dict[str, tuple]:
    """label -> its runs' keeps (``keep_of``), for the runs at ``positions`` of ``runs_frame``
    labelled ``labels[position]``: what ``series_styles`` fills markers by."""
    keeps = keeps_of(runs_frame)
    return {labels[i]: keeps[i] for i in positions}


def keeps_of(runs_frame: pd.DataFrame) -> list[tuple]:
    """Each run's keeps (``keep_of``) as its label names them: the default keep too (PruneX's
    channel keep 0.5 left out of the command is 0.5, not none)."""
    return [keep_of(json.loads(shown)) for shown in column(runs_frame, SHOWN_OPTIONS)]


def in_legend_order(pairs, keeps: dict[str, tuple]) -> list[str]:
    """The labels of ``(label, method)`` pairs by method name, then keep, then as they came."""
    seen = list(dict.fromkeys(pairs))  # sorted() is stable: ties stay as they came
    return [label for label, method in
            sorted(seen, key=lambda pair: method_then_keep(pair[1], keeps.get(pair[0], ())))]


def sorted_by_method_and_keep(frame: pd.DataFrame, keeps: dict[str, tuple]) -> pd.DataFrame:
    """Rows by facet (as they came), method (its name), then keep, then as they were: a
    legend and a table read in keep order within each method, whatever order the runs came
    in."""
    facets = {f: n for n, f in enumerate(dict.fromkeys(frame["facet"]))} if "facet" in frame \
        else {}
    rows = list(zip(frame.get("facet", [None] * len(frame)), frame[schema.METHOD], frame.label))
    order = sorted(range(len(frame)), key=lambda i: (
        facets.get(rows[i][0], 0), method_then_keep(rows[i][1], keeps.get(rows[i][2], ()))))
    return frame.iloc[order].reset_index(drop=True)


def exported_gflops(run: RunView, density: float, dense_gflops: dict[str, float]) -> float:
    """GFLOPs per image of the model a run deploys: its ``bench export``, or for a dense
    method (final ``density`` 1) the dense model's (from any export of the workload); NaN
    otherwise."""
    if run.export:
        return run.export["exported"]["flops"] / 1e9
    if density == 1.0 and not (run.folder / "masks.pt").exists():
        return dense_gflops.get(run.summary[schema.WORKLOAD], math.nan)
    return math.nan


def repeats_reduced(frame: pd.DataFrame, keys: list[str], value: str) -> pd.DataFrame:
    """Rows of equal ``keys`` (repeats of a configuration) as one: the mean of ``value``,
    its 95 % half-width (``value_ci95``), the repeat count and every run id."""
    rows = []
    for key, group in frame.groupby(keys, sort=False):
        mean, half, n = mean_ci(group[value])
        rows.append({**dict(zip(keys, key)), value: mean, f"{value}_ci95": half, "repeats": n,
                     schema.RUN_ID: ",".join(group.run_id)})
    return pd.DataFrame(rows)


def comm_seconds_per_step(runs: ResultSet) -> pd.DataFrame:
    """Per run and iteration (``RUN_INDEX``, ``iteration``, ``per_step``): the slowest rank's
    communication seconds over the iteration's local steps. A row's communication is the sum
    of its run's own communication columns, in its file's order (runs that recorded the same
    columns are summed together), so every number is that of the run alone."""
    rows = runs.table("iterations")
    recorded = runs.columns.get(schema.ITERATIONS, pd.Series(dtype=object))
    signatures: dict[tuple, list[int]] = {}
    for position, columns in enumerate(recorded):
        comm = tuple(c for c in columns or () if is_comm_column(c))
        if comm:
            signatures.setdefault(comm, []).append(position)
    steps = pd.Series([s or 1 for s in column(runs.runs, schema.STEPS_PER_ITERATION)],
                      index=runs.runs.index)
    parts = []
    for comm, positions in signatures.items():
        part = rows[rows[RUN_INDEX].isin(positions)]
        seconds = part[list(comm)].fillna(0).sum(axis=1)
        slowest = seconds.groupby([part[RUN_INDEX], part[schema.ITERATION]]).max()
        parts.append(slowest.rename("per_step").reset_index())
    if not parts:
        return pd.DataFrame(columns=[RUN_INDEX, schema.ITERATION, "per_step"])
    frame = pd.concat(parts, ignore_index=True).sort_values(RUN_INDEX, kind="stable")
    frame["per_step"] = frame["per_step"] / steps.to_numpy()[frame[RUN_INDEX].to_numpy()]
    return frame.reset_index(drop=True)


def once_paid(frame: pd.DataFrame, timed: list[int], label: list[str]) -> str:
    """The note's account of the phases a run paid only in one-off iterations (PruneX's
    freeze), which the steady bars leave out: ``; paid once per run, not in the bars: PruneX
    : freeze 0.14 s``, seconds per run, mean over repeats; empty where there are none."""
    found: dict[tuple[str, str], list[float]] = {}
    for i in timed:
        steady = column(frame, schema.PHASE_SECONDS).iat[i] or {}
        once = column(frame, schema.ONE_OFF_SECONDS).iat[i]
        for phase, seconds in (once if isinstance(once, dict) else {}).items():
            if not steady.get(phase):  # no steady iteration ran it
                found.setdefault((label[i], phase), []).append(float(seconds))
    if not found:
        return ""
    return "; paid once per run, not in the bars: " + ", ".join(
        f"{run}: {phase.replace('_', ' ')} {np.mean(values):.3g} s"
        for (run, phase), values in sorted(found.items()))


def read_masks(run: RunView) -> dict | None:
    """A run's masks.pt as {layer: {"dense": tensor, ...}, group: {"units": tensor}}, or None
    (noted on the run)."""
    path = run.folder / "masks.pt"
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
        if isinstance(saved, dict) and all(
            torch.is_tensor(m.get("dense", m.get("units"))) for m in saved.values()
        ):
            return saved
        run.unreadable.append(f"{path}: not a mapping of layers to masks")
    except Exception as exc:  # unpickling fails in many ways; each means a damaged file
        run.unreadable.append(f"{path}: {type(exc).__name__}: {first_line(exc)}")
    return None


def mask_panels(saved: dict, shown: int) -> list[tuple[str, torch.Tensor, str, str]]:
    """(title, 2-D keep grid, x label, y label) of each panel: the largest conv layers'
    filter x channel masks (the stem, which reads the image's 1-3 channels, left out when
    there are others; convs that prune nothing left out when heads or neurons are pruned),
    then one grid of blocks x heads and one of blocks x neurons."""
    convs = {k: m["dense"].float() for k, m in saved.items() if "dense" in m}
    units: dict[str, list[tuple[str, torch.Tensor]]] = {}
    for key, m in saved.items():
        if "units" in m:
            block, _, kind = key.partition("#")
            units.setdefault(kind, []).append((block, m["units"].float()))
    if units:
        convs = {k: d for k, d in convs.items() if float(d.mean()) < 1.0}
    ordered = sorted(convs.items(), key=lambda kv: kv[1].numel(), reverse=True)
    inner = [(k, d) for k, d in ordered if d.dim() < 2 or d.shape[1] > 3]
    panels = [(k, d.flatten(2).amax(-1) if d.dim() == 4 else d, "input channel", "output filter")
              for k, d in (inner or ordered)[: max(0, shown - len(units))]]
    for kind, rows in units.items():
        width = max(r.numel() for _, r in rows)
        grid = torch.zeros(len(rows), width)
        for i, (_, r) in enumerate(rows):
            grid[i, : r.numel()] = r
        panels.append((f"{kind} of {len(rows)} blocks", grid, kind[:-1], "block"))
    return panels


def short_name(layer: str, width: int = 22) -> str:
    """A layer name that fits a panel's title: wrapped at its dots."""
    return "\n".join(textwrap.wrap(layer.replace(".", ". "), width)).replace(". ", ".")


def studied(method: str) -> bool:
    """Whether ``method`` declares figures of its own (the method a report studies)."""
    entry = METHODS.find(method)
    return entry is not None and bool(entry.figures)
