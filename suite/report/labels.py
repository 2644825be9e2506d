"""What a figure calls a configuration, computed once per configuration, and what a figure's
runs share, said once in its caption.

A run's display parts (method, options, GPUs, budget, setting, machine class) depend only on a
few of its columns, so they are computed once per distinct value of those (``DISPLAY_KEYS``: a
groupby over the result set), not once per run, and never once per pair of runs. A label is the
display without the parts every run of the figure shares (the GPU count of a one-size
comparison says nothing), with the workload where there are several, and the recipe (lr,
batch, dataset) where two configurations would otherwise share a label. Runs of different
machine classes or budgets are never one configuration: where a figure holds several, every
label names its own (``figure_context`` says what is shared).
"""

from __future__ import annotations

import json
import math

import pandas as pd

from suite.report.style import method_style, options_text
from suite.results import schema
from suite.results.resultset import (
    BATCH_SIZE,
    DEVICE,
    LR,
    MACHINE_CLASS,
    SETTING,
    SHOWN_OPTIONS,
    column,
)

#: what a run's display parts depend on (not its identity: suite.results.catalogue)
DISPLAY_KEYS = [schema.METHOD, SHOWN_OPTIONS, schema.GPUS, DEVICE, SETTING, MACHINE_CLASS,
            schema.EPOCHS]
#: the display parts, in the order a label joins them
PARTS = ("method", "options", "ranks", "budget", "machine", "setting")
#: the parts left out of a label when every run of the figure shares them
SHAREABLE = ("ranks", "budget", "machine", "setting")
#: the runs frame's column of each run's label (suite.report.load adds it)
LABEL = "label"


def gpu_kind(setting: str, device, machine: str) -> str:
    """What a run's GPUs were: ``simulated GPUs (profile v100-ib100)``, ``CUDA GPUs
    (cuda-nccl-h100-sm90)`` or ``CPU ranks standing in for GPUs (gloo)``."""
    if str(setting).startswith("sim"):
        return f"simulated GPUs (profile {str(setting).removeprefix('sim ')})"
    if str(device).startswith("cuda"):
        return f"CUDA GPUs ({machine})" if machine and machine != "-" else "CUDA GPUs"
    return "CPU ranks standing in for GPUs (gloo)"


def budget_words(epochs) -> str:
    """A training budget as words: ``1 epoch``, ``0.1 epoch``, ``2 epochs``."""
    if epochs is None or (isinstance(epochs, float) and math.isnan(epochs)):
        return "budget unknown"
    value = round(float(epochs), 3)
    return f"{value:g} epoch" + ("s" if value > 1 else "")


def setting_suffix(setting: str) -> str:
    """Where the run's times come from, unless a plain run: `` (sim PROFILE)`` or
    `` (emulated RATE)``. Runs of different settings never share a line or a label."""
    return "" if setting == "real" else f" ({setting})"


def machine_part(setting: str, machine) -> str:
    """The machine class a label may name: none for a simulated run (its setting names the
    profile) or one recorded without a class (``-``)."""
    if str(setting).startswith("sim") or machine in (None, "-"):
        return ""
    return str(machine)


def display_parts(method: str, shown_options: str, gpus, device, setting: str,
                  machine=None, epochs=None) -> dict[str, str]:
    """The pieces of a figure label: method, options (``shown_options``: sorted JSON),
    GPUs, budget, machine class, setting."""
    return {
        schema.METHOD: method_style(method).name,
        schema.OPTIONS: options_text(json.loads(shown_options)),
        # GPUs whatever they ran on (--gpus names them so); the caption says what they were
        "ranks": f"{gpus} GPUs",
        "budget": budget_words(epochs),
        "machine": machine_part(setting, machine),
        "setting": setting_suffix(setting),
    }


def parts_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per run (``runs``' index) its display parts (``PARTS`` columns), computed once per
    distinct ``DISPLAY_KEYS``."""
    if runs.empty:
        return pd.DataFrame({part: pd.Series(dtype=object) for part in PARTS}, index=runs.index)
    keys = pd.DataFrame({key: column(runs, key) for key in DISPLAY_KEYS}, index=runs.index)
    keys[schema.EPOCHS] = [None if e is None else round(float(e), 3) for e in keys[schema.EPOCHS]]
    groups = keys.groupby(DISPLAY_KEYS, dropna=False, sort=False)
    firsts = groups.head(1)
    per_group = pd.DataFrame(
        [display_parts(*(row[k] for k in DISPLAY_KEYS)) for _, row in firsts.iterrows()],
        columns=list(PARTS), dtype=object,
    )
    return per_group.iloc[groups.ngroup().to_numpy()].set_index(runs.index)


def shared_parts(parts: pd.DataFrame) -> set[str]:
    """The shareable parts every run of ``parts`` has alike (an empty machine class, a
    simulated run's, matches any)."""
    shared = {key for key in SHAREABLE if parts[key].nunique(dropna=False) == 1}
    if parts["machine"][parts["machine"] != ""].nunique() <= 1:
        shared.add("machine")
    return shared


def label_table(runs: pd.DataFrame, parts: pd.DataFrame | None = None,
                faceted: tuple[str, ...] = ()) -> pd.Series:
    """Per run (``runs``' index) the label of its configuration: repeats share it, and two
    configurations never do (the recipe values that differ are added where needed). What
    the runs share is judged over ``runs``: a figure of a subset labels that subset.
    ``parts``: ``parts_table`` of ``runs``, when already computed; ``faceted``: parts a
    figure shows as its panels' titles instead (``budget``, ``machine``), so one legend
    serves every panel."""
    if runs.empty:
        return pd.Series(dtype=object, index=runs.index)
    parts = parts_table(runs) if parts is None else parts
    shared = shared_parts(parts) | set(faceted)
    shown = [p for p in PARTS[:-1] if p not in shared]
    columns = [parts[p] for p in shown]
    workloads = column(runs, schema.WORKLOAD)
    if workloads.nunique(dropna=False) > 1:
        columns.append(workloads)
    suffix = parts["setting"] if "setting" not in shared else [""] * len(runs)
    base = [", ".join(p for p in pieces if p) + setting
            for *pieces, setting in zip(*columns, suffix)]
    recipe = pd.DataFrame({
        schema.LR: [f"lr {v:g}" if isinstance(v, float | int) else f"lr {v}"
               for v in column(runs, LR)],
        "batch": [f"batch {v}" for v in column(runs, BATCH_SIZE)],
        schema.DATASET: [str(v) for v in column(runs, schema.DATASET)],
    }, index=runs.index, dtype=object)  # as the labels: pandas 3's str columns refuse "+" with them
    labels = pd.Series(base, index=runs.index, dtype=object)
    groups = recipe.groupby(labels.to_numpy(), sort=False)
    for part in recipe.columns:  # only what tells the configurations of one label apart
        differs = groups[part].transform("nunique").to_numpy() > 1
        labels[differs] = labels[differs] + ", " + recipe.loc[differs, part]
    return labels


def line_table(runs: pd.DataFrame, parts: pd.DataFrame | None = None) -> pd.Series:
    """Per run the line it belongs to in a scaling plot: method, options, machine class
    where the runs hold several, setting (and the workload where there are several), not the
    GPU count, nor the budget: the plot compares seconds per epoch, which a budget does not
    change, and a sweep of ``--iterations`` gives each GPU count a budget of its own.
    ``parts``: as in label_table."""
    parts = parts_table(runs) if parts is None else parts
    extra = [] if "machine" in shared_parts(parts) else ["machine"]
    workloads = column(runs, schema.WORKLOAD)
    several = workloads.nunique(dropna=False) > 1
    pieces = zip(parts[schema.METHOD], parts[schema.OPTIONS], *(parts[p] for p in extra))
    return pd.Series(
        [", ".join(p for p in piece if p) + setting + (f", {workload}" if several else "")
         for piece, setting, workload in zip(pieces, parts["setting"], workloads)],
        index=runs.index, dtype=object)


def layout_words(gpus, nodes) -> str:
    """``4 GPUs as 2 nodes x 2``; ``8 GPUs on one node``."""
    try:
        gpus, nodes = int(gpus), int(nodes)
    except (TypeError, ValueError):
        return f"{gpus} GPUs"
    if nodes <= 1:
        return f"{gpus} GPUs on one node"
    return f"{gpus} GPUs as {nodes} nodes x {gpus // nodes}"


def _layout_context(runs: pd.DataFrame, on_axis: tuple[str, ...]) -> tuple[str | None, bool]:
    """What a figure's caption says of its runs' GPUs and their layout: the layout they all
    share, else the GPUs per node if they share that (a scaling figure); and whether the GPU
    count differs between runs and is not drawn on an axis, so the labels must say it.

    Returns:
        (the caption's piece, or None for none; whether "GPUs" goes with what varies).
    """
    layouts = {(g, n) for g, n in zip(column(runs, schema.GPUS), column(runs, schema.NODES))}
    if len(layouts) == 1:
        return layout_words(*layouts.pop()), False
    per_node = {int(g) // max(1, int(n or 1)) for g, n in layouts if g is not None}
    piece = f"{per_node.pop()} GPUs per node" if len(per_node) == 1 else None
    return piece, "GPUs" not in on_axis


def figure_context(runs: pd.DataFrame, on_axis: tuple[str, ...] = (),
                   faceted: tuple[str, ...] = ()) -> str:
    """What every run of a figure shares, for its title and caption: workload, GPUs and
    their layout (or the GPUs per node of a scaling figure), what the GPUs were, budget and
    machine class; what differs is in the labels, and said so here, unless the figure draws
    it on an axis (``on_axis``: ``("GPUs",)`` for a scaling figure) or names it in its
    panels' titles (``faceted``: ``workload``, ``budget``, ``setting``, ``machine``).

    Examples:
        ```python
        figure_context(runs.runs)
        # "cnn-fmnist; 4 GPUs as 2 nodes x 2; CPU ranks standing in for GPUs (gloo);
        #  0.1 epoch; cpu-gloo-amd25-avx512-t1"
        ```
    """
    if runs.empty:
        return ""
    pieces, varies, titled = [], [], []

    def shared(values: list[str], words: str, facet: str) -> None:
        if len(values) == 1:
            pieces.append(values[0])
        elif len(values) > 1:
            (titled if facet in faceted else varies).append(words)

    shared(sorted({str(w) for w in column(runs, schema.WORKLOAD)}), "workload", "workload")
    layout, gpus_vary = _layout_context(runs, on_axis)
    if layout is not None:
        pieces.append(layout)
    if gpus_vary:
        varies.append("GPUs")
    machines = column(runs, MACHINE_CLASS)
    kinds = sorted({gpu_kind(s, d, m) for s, d, m in zip(column(runs, SETTING),
                                                         column(runs, DEVICE), machines)})
    shared(kinds, "GPU kind", "setting")
    shared(sorted({budget_words(e) for e in column(runs, schema.EPOCHS)}), "budget", "budget")
    classes = sorted({machine_part(s, m) for s, m in zip(column(runs, SETTING), machines)}
                     - {""})
    if len(classes) == 1 and len(kinds) > 1:
        pieces.append(f"real runs on {classes[0]}")
    else:
        shared(classes, "machine class", "machine")
    if titled:
        pieces.append(f"{', '.join(titled)}: in each panel's title")
    if varies:
        pieces.append(f"{', '.join(varies)}: in each label")
    return "; ".join(pieces)


def several_of(runs: pd.DataFrame) -> dict[str, list[str]]:
    """The machine classes and budgets of a set of runs, where it holds more than one of
    either (what a report keeps apart and says so)."""
    classes = sorted({m for s, m in zip(column(runs, SETTING), column(runs, MACHINE_CLASS))
                      if machine_part(s, m)})
    epochs = {None if e is None else round(float(e), 3) for e in column(runs, schema.EPOCHS)}
    budgets = [budget_words(e) for e in sorted(epochs, key=lambda e: (e is None, e or 0))]
    found = {}
    if len(classes) > 1:
        found["machine classes"] = classes
    if len(budgets) > 1:
        found["budgets"] = budgets
    return found

