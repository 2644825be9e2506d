"""One function per figure of the paper's evaluation, each drawn from run folders only; a
method's own figures (PruneX's residuals and penalties) are the method's, declared at its
registration and drawn after these (suite.report.kit), and what the figures compute before
they draw is suite.report.figure_data's.

A function is given the result set read once (suite.report.load: the runs' frame with their
labels, and the table columns figures draw) and returns a ``Figure`` (files written, the table
it plots, the run ids it used) or a ``Skipped`` with the reason its data is missing; it never
raises for missing data. Its data are frame operations over all runs at once (a groupby per
table, never a pass per run), so a figure of 10,000 runs costs what one of 100 does plus the
rows. Repeats of a configuration (runs that differ only in the seed) are always drawn as their
mean with a 95 % interval, never as separate points; colours, markers, sizes and fonts come
from ``suite.report.style``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from suite.cluster.phases import phase_color  # noqa: E402
from suite.report.figure_data import (  # noqa: E402
    comm_seconds_per_step,
    epoch_seconds,
    exported_gflops,
    facet_rows,
    faceted_labels,
    in_legend_order,
    keeps_of,
    label_keeps,
    mask_panels,
    once_paid,
    pareto_front,
    read_masks,
    repeats_reduced,
    short_name,
    sorted_by_method_and_keep,
    studied,
    sums_per_run,
)
from suite.report.labels import (  # noqa: E402
    figure_context,
    label_table,
    line_table,
)
from suite.report.load import FINAL_DENSITY, parts_of  # noqa: E402
from suite.report.style import (  # noqa: E402
    bars_in_range,
    box_look,
    context_title,
    dodge,
    draws_data,  # noqa: F401 (a drawn axis's check, read as figures.draws_data)
    hide_if_empty,
    legend_outside,
    log_scale,
    paper_figure,
    pareto_marker,
    save,
    series_styles,
    spread,
)
from suite.report.tables import ACCURACY_PCT  # noqa: E402
from suite.results import schema  # noqa: E402
from suite.results.resultset import (  # noqa: E402
    OVERLAPPED_PHASES,
    RUN_INDEX,
    VIEW,
    ResultSet,
    column,
)
from suite.results.stats import mean_ci  # noqa: E402


@dataclass
class Figure:
    """A figure drawn: its files (PNG first), the table it plots, the runs it drew, what
    they share (``context``: workload, GPUs and layout, budget; its title and the start of
    its caption) and a note on how to read it."""

    name: str
    title: str
    files: list[Path]
    table: pd.DataFrame
    run_ids: list[str]
    note: str = ""
    context: str = ""


@dataclass
class Skipped:
    name: str
    title: str
    reason: str


def finish(fig, runs: ResultSet, run_ids, out: Path, name: str, title: str,
           on_axis: tuple[str, ...] = (), faceted: tuple[str, ...] = (),
           lead: str = "") -> tuple[list[Path], str]:
    """Title the figure with what it plots (``title``: a PNG alone is no puzzle) and, below,
    what the runs it drew share (``figure_context``; ``on_axis`` and ``faceted``: what it
    draws on an axis or names in its panels' titles instead; ``lead``: said first, e.g. the
    one configuration drawn) and save it; returns its files and that context."""
    ids = {i for joined in run_ids for i in str(joined).split(",")}
    frame = runs.runs
    context = figure_context(frame[frame[schema.RUN_ID].isin(ids)], on_axis, tuple(faceted))
    context = "; ".join(part for part in (lead, context) if part)
    context_title(fig, context, title)
    return save(fig, out, name), context


def scaling_points(runs_frame: pd.DataFrame) -> pd.DataFrame:
    """Each line's (workload, series, method) median training seconds per epoch at each GPU
    count, with its runs and local steps per round (empty: no run has time and epochs)."""
    rows = []
    for line, method, workload, gpus, epochs, train, run_id, h in zip(
        line_table(runs_frame, parts_of(runs_frame)), runs_frame[schema.METHOD],
        runs_frame[schema.WORKLOAD], runs_frame[schema.GPUS], column(runs_frame, schema.EPOCHS),
        column(runs_frame, schema.TRAIN_SECONDS), runs_frame[schema.RUN_ID],
        column(runs_frame, schema.STEPS_PER_ITERATION),
    ):
        seconds = epoch_seconds(epochs, train)
        if seconds:
            rows.append({"series": line, schema.METHOD: method, schema.WORKLOAD: workload,
                         schema.GPUS: gpus, "epoch_seconds": seconds, schema.RUN_ID: run_id,
                         "h": float("nan") if h is None else float(h)})
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    return frame.groupby([schema.WORKLOAD, "series", schema.METHOD, schema.GPUS],
                         as_index=False).agg(
        epoch_seconds=("epoch_seconds", "median"), run_id=(schema.RUN_ID, ",".join),
        h=("h", "max"),
    )


def scaling_lines(runs_frame: pd.DataFrame, frame: pd.DataFrame) -> pd.DataFrame:
    """The lines of at least two GPU counts, named among the runs drawn (what they all share
    is said once, in the title), with speedup and efficiency over each line's fewest GPUs."""
    lines = frame.groupby([schema.WORKLOAD, "series"]).filter(lambda g: g.gpus.nunique() >= 2)
    if lines.empty:
        return lines
    ids = {i for joined in lines.run_id for i in joined.split(",")}
    drawn = runs_frame[runs_frame[schema.RUN_ID].isin(ids)]
    names = dict(zip(line_table(runs_frame, parts_of(runs_frame))[drawn.index],
                     line_table(drawn, parts_of(drawn))))
    lines = lines.assign(series=lines.series.map(names))
    base = lines.loc[lines.groupby([schema.WORKLOAD, "series"]).gpus.idxmin()]
    base = base.set_index(["workload", "series"])[["gpus", "epoch_seconds"]]
    lines = lines.join(base, on=["workload", "series"], suffixes=("", "_base"))
    lines["speedup"] = lines.epoch_seconds_base / lines.epoch_seconds
    lines["efficiency"] = lines.speedup / (lines.gpus / lines.gpus_base)
    return lines


def label_rounds(ax, line: pd.DataFrame, color) -> None:
    """H (local steps per round) at each point of a line whose rounds change with the GPU
    count: its curve mixes schedules, and says so."""
    for x, y, h in zip(line.gpus, line.efficiency, line.h):
        ax.annotate(f"H={h:g}", (x, y), xytext=(0, 5), textcoords="offset points",
                    ha="center", fontsize=5, color=color)


def scaling(runs: ResultSet, out: Path, width: str | None = None) -> Figure | Skipped:
    """Fig. 9: speedup and parallel efficiency vs GPUs on log-log axes, relative to each
    line's smallest configuration, from training seconds per epoch (median over repeats).
    Lines that start at one point (every line's speedup is 1 there) are spread sideways by a
    few points so that none hides another."""
    name, title = "fig09_scaling", "Strong scaling: speedup and parallel efficiency"
    runs_frame = runs.runs
    frame = scaling_points(runs_frame)
    if frame.empty:
        return Skipped(name, title, "no run has training time and epochs")
    lines = scaling_lines(runs_frame, frame)
    if lines.empty:
        return Skipped(name, title, "every method has runs at one GPU count only; need two")
    styles = series_styles(zip(lines.series, lines.method))
    ticks = sorted(lines.gpus.unique())
    bases = sorted(lines.gpus_base.unique())
    over = f"over {bases[0]} GPUs" if len(bases) == 1 else "over each line's fewest GPUs"
    with paper_figure(width or "two", ncols=2, ratio=0.75) as (fig, axes):
        speed, efficiency = axes[0]
        speed.plot(ticks, [g / min(ticks) for g in ticks], color="k", lw=0.8, ls=(0, (1, 1)),
                   label="ideal")
        efficiency.axhline(1.0, color="k", lw=0.8, ls=(0, (1, 1)))
        drawn, changing = [], []
        for series, line in lines.groupby("series", sort=False):
            line = line.sort_values(schema.GPUS)
            drawn.append(speed.plot(line.gpus, line.speedup, label=series, ms=4,
                                    **styles[series]))
            drawn.append(efficiency.plot(line.gpus, line.efficiency, ms=4, **styles[series]))
            if line.h.nunique() > 1:  # rounds that change with the GPU count: say so at each
                changing.append(series)
                label_rounds(efficiency, line, styles[series].get("color"))
        speed.set_yscale("log", base=2)
        for ax, label in ((speed, f"speedup {over} (log scale)"),
                          (efficiency, "parallel efficiency")):
            ax.set_xscale("log", base=2)
            ax.set_xticks(ticks, [str(g) for g in ticks])
            ax.minorticks_off()
            ax.set_xlabel("GPUs (log scale)")
            ax.set_ylabel(label)
        for ax, artists in ((speed, drawn[0::2]), (efficiency, drawn[1::2])):
            spread(ax, artists)
        legend_outside(fig, axes, ncol=2)
        files, context = finish(fig, runs, lines.run_id, out, name, title, on_axis=("GPUs",))
    ids = sorted({i for ids in lines.run_id for i in ids.split(",")})
    table = lines[["workload", "series", "gpus", "epoch_seconds", "speedup", "efficiency"]]
    note = (f"speedup {over}, from training seconds per epoch; lines that share a point are "
            "drawn a few points apart")
    if changing:
        note += (f"; {', '.join(changing)}: H (local steps per round) changes with the GPU "
                 "count, so the curve mixes schedules (labelled at each point; --local-steps "
                 "fixes it)")
    return Figure(name, title, files, table, ids, note, context)


def pareto(runs: ResultSet, out: Path, width: str | None = None) -> Figure | Skipped:
    """Fig. 12: final accuracy vs the inter-node traffic spent to reach it, and vs the
    density of the pruned layers, with the Pareto frontier; a row of panels per workload,
    budget and machine class where the runs hold several (a frontier never mixes them). A
    configuration of one run is a marker, one of repeats its mean with the 95 % interval;
    markers that share a point are spread sideways."""
    name, title = "fig12_pareto", "Accuracy vs inter-node traffic and density (Pareto)"
    frame = runs.runs
    dense_gflops = {view.summary[schema.WORKLOAD]: view.export["dense"]["flops"] / 1e9
                    for view in frame[VIEW] if view.export}
    frame = frame[[a is not None for a in column(frame, schema.FINAL_ACCURACY)]]
    if frame.empty:
        return Skipped(name, title, "no run has an accuracy (simulated runs carry none)")
    varying, rows = facet_rows(frame)
    facet = pd.Series("", index=frame.index, dtype=object)
    label = pd.Series("", index=frame.index, dtype=object)
    for row_title, index, labels in rows:
        facet[index] = row_title or str(frame.loc[index[0], schema.WORKLOAD])
        label[index] = labels
    per_run = pd.DataFrame({
        "facet": facet, "label": label, schema.METHOD: frame[schema.METHOD],
        schema.DENSITY: frame[FINAL_DENSITY].astype(float),
        ACCURACY_PCT: 100 * column(frame, schema.FINAL_ACCURACY).astype(float),
        "inter_gb": [(b or 0) / 1e9 for b in column(frame, schema.INTER_NODE_BYTES_TOTAL)],
        "gflops": [exported_gflops(view, density, dense_gflops)
                   for view, density in zip(frame[VIEW], frame[FINAL_DENSITY])],
        schema.RUN_ID: frame[schema.RUN_ID],
        "keep": keeps_of(frame),
    }).reset_index(drop=True)
    keys = ["facet", "label", "method"]
    reduced = repeats_reduced(per_run, keys, ACCURACY_PCT)
    means = per_run.groupby(keys[:-1])[["inter_gb", "density", "gflops"]].mean()
    reduced = reduced.join(means, on=keys[:-1])
    keeps = dict(zip(per_run.label, per_run.keep))
    reduced = sorted_by_method_and_keep(reduced, keeps)  # the legend's and the table's order
    styles = series_styles(zip(reduced.label, reduced.method), keeps)
    panels = [("inter_gb", "inter-node traffic to the end (GB)"),
              ("density", "density of the pruned layers")]
    if reduced.gflops.notna().any():  # `bench export` ran: the deployed model's cost too
        panels.append(("gflops", "GFLOPs per image of the exported model"))
    titles = list(dict.fromkeys(per_run.facet))
    grid = paper_figure(width or "two", nrows=len(titles), ncols=len(panels), ratio=0.8)
    with grid as (fig, axes):
        for row, row_title in zip(axes, titles):
            part = reduced[reduced.facet == row_title].reset_index(drop=True)
            for ax, (x, xlabel) in zip(row, panels):
                shown = part[part[x].notna()].reset_index(drop=True)
                markers = [(pareto_marker(ax, point, x, styles[point.label]), point[x],
                            point.accuracy_pct) for _, point in shown.iterrows()]
                front = shown.iloc[pareto_front(shown[x], shown.accuracy_pct)]
                ax.step(front[x], front.accuracy_pct, where="post", color="k", lw=0.6, alpha=0.6,
                        label="Pareto frontier")
                ax.set_xlabel(xlabel)
                ax.set_ylabel("test accuracy (%)")
                if ax is row[0]:  # one title per row, over its panels
                    ax.set_title(row_title, loc="left")
                if x == "inter_gb" and len(shown) and (shown.inter_gb > 0).all() and \
                        shown.inter_gb.max() > 10 * shown.inter_gb.min():
                    log_scale(ax)
                if not hide_if_empty(ax):
                    dodge(ax, markers)
        legend_outside(fig, axes, ncol=2)
        files, context = finish(fig, runs, per_run.run_id, out, name, title,
                                faceted=(*varying, "workload"))
    return Figure(name, title, files, reduced, sorted(per_run.run_id),
                  "a marker per configuration: one run, or the mean of its repeats with the "
                  "95 % interval; markers that share a point are drawn a few points apart; "
                  "frontier: no other point has less traffic (or density, or exported GFLOPs) "
                  "and more accuracy", context)


def time_to_accuracy(runs: ResultSet, out: Path, width: str | None = None) -> Figure | Skipped:
    """Fig. 5: test accuracy vs training time and vs cumulative inter-node traffic, a row of
    panels per workload, budget and machine class where the runs hold several; repeats as
    their mean curve with the 95 % band; curves that end at one point drawn apart."""
    name, title = "fig05_time_to_accuracy", "Accuracy vs training time and inter-node GB"
    evals = runs.table("evals")
    real = np.array([not s for s in column(runs.runs, schema.SIMULATED)], dtype=bool)
    evals = evals[real[evals[RUN_INDEX].to_numpy()]] if len(evals) else evals
    if evals.empty:
        return Skipped(name, title, "no real run has evaluations")
    owner = evals[RUN_INDEX].to_numpy()
    drawn = runs.runs.iloc[np.unique(owner)]  # what the panels hold is judged among these
    varying, rows = facet_rows(drawn)
    facet = pd.Series("", index=runs.runs.index, dtype=object)
    label = pd.Series("", index=runs.runs.index, dtype=object)
    for row_title, index, labels in rows:
        facet[index], label[index] = row_title, labels
    frame = evals.drop(columns=RUN_INDEX).reset_index(drop=True).assign(
        run=label.to_numpy()[owner], facet=facet.to_numpy()[owner],
        method=runs.runs[schema.METHOD].to_numpy()[owner],
        run_id=runs.runs[schema.RUN_ID].to_numpy()[owner])
    frame = frame.assign(**{ACCURACY_PCT: 100 * frame.accuracy},
                         inter_gb=frame.inter_node_bytes / 1e9)
    keeps = label_keeps(runs.runs, label.to_numpy(), np.unique(owner))
    styles = series_styles(zip(frame.run, frame.method), keeps)
    titles = [row_title for row_title, _, _ in rows]
    with paper_figure(width or "two", nrows=len(titles), ncols=2, ratio=0.75) as (fig, axes):
        for row, row_title in zip(axes, titles):
            part = frame[frame.facet == row_title]
            ends: dict[int, list] = {0: [], 1: []}  # per panel: (artists, last x, last y)
            for label_text in in_legend_order(zip(part.run, part.method), keeps):
                curve = part[part.run == label_text]
                points = curve.groupby(schema.ITERATION).agg(
                    train_seconds=(schema.TRAIN_SECONDS, "mean"), inter_gb=("inter_gb", "mean"),
                    accuracy=("accuracy_pct", "mean"),
                    spread=("accuracy_pct", lambda a: mean_ci(a)[1]),
                )
                band = points.spread.fillna(0)
                low = (points.accuracy - band).clip(0, 100)
                high = (points.accuracy + band).clip(0, 100)
                for panel, (ax, x) in enumerate(zip(row, (schema.TRAIN_SECONDS, "inter_gb"))):
                    artists = ax.plot(points[x], points.accuracy, ms=3, label=label_text,
                                      **styles[label_text])
                    artists.append(ax.fill_between(points[x], low, high, alpha=0.2, lw=0,
                                                   color=styles[label_text]["color"]))
                    ends[panel].append((artists, points[x].iloc[-1], points.accuracy.iloc[-1]))
            row[0].set_xlabel("training time (s)")
            row[1].set_xlabel("cumulative inter-node traffic (GB)")
            if (part.inter_gb > 0).any():
                log_scale(row[1])
            row[0].set_title(row_title, loc="left")  # one title per row, over its panels
            for panel, ax in enumerate(row):
                ax.set_ylabel("test accuracy (%)")
                dodge(ax, ends[panel])  # curves that end at one point, drawn apart
        legend_outside(fig, axes, ncol=2)
        files, context = finish(fig, runs, frame.run_id.unique(), out, name, title, faceted=varying)
    table = frame[[schema.RUN_ID, "run", "iteration", "epoch", schema.TRAIN_SECONDS, "inter_gb",
                   "accuracy", ACCURACY_PCT]]
    note = "repeats of a configuration: mean per evaluation, band the 95 % interval"
    return Figure(name, title, files, table, sorted(frame.run_id.unique()), note, context)


def comm_latency(runs: ResultSet, out: Path, width: str | None = None) -> Figure | Skipped:
    """Fig. 7: communication seconds per local step (an iteration's, slowest GPU, over its
    local steps), as box plots over iterations and repeats: step- and round-based methods
    on one axis; a panel per workload, budget, setting and machine class where the runs
    hold several."""
    name, title = "fig07_comm_latency", "Communication time per local step"
    per_step = comm_seconds_per_step(runs)
    if per_step.empty:
        return Skipped(name, title, "no run recorded communication phases")
    owner = per_step[RUN_INDEX].to_numpy()
    varying, titles, facet, label = faceted_labels(runs, owner)
    frame = pd.DataFrame({schema.ITERATION: per_step[schema.ITERATION].to_numpy(),
                          "comm_ms": 1e3 * per_step["per_step"].to_numpy(),
                          "facet": facet[owner], "run": label[owner],
                          schema.METHOD: runs.runs[schema.METHOD].to_numpy()[owner],
                          schema.RUN_ID: runs.runs[schema.RUN_ID].to_numpy()[owner]})
    keeps = label_keeps(runs.runs, label, np.unique(owner))
    styles = series_styles(zip(frame.run, frame.method), keeps)
    orders = {row_title: in_legend_order(zip(part.run, part.method), keeps)[::-1]  # top down
              for row_title, part in ((t, frame[frame.facet == t]) for t in titles)}
    heights = [0.3 * len(orders[row_title]) + 0.6 for row_title in titles]
    with paper_figure(width or "two", nrows=len(titles), heights=heights) as (fig, axes):
        for ax, row_title in zip(axes[:, 0], titles):
            part, order = frame[frame.facet == row_title], orders[row_title]
            boxes = ax.boxplot([part.comm_ms[part.run == r] for r in order],
                               orientation="horizontal", patch_artist=True, widths=0.6,
                               showfliers=True, flierprops={"ms": 2},
                               medianprops={"color": "k"})
            for patch, box_label in zip(boxes["boxes"], order):
                patch.set(**box_look(styles[box_label]))
            ax.set_yticks(range(1, len(order) + 1), order)
            ax.set_xlabel("communication per local step (ms)")
            ax.set_title(row_title)
            positive = part.comm_ms[part.comm_ms > 0]
            if len(positive) and positive.max() > 100 * positive.min():
                log_scale(ax)
        files, context = finish(fig, runs, frame.run_id.unique(), out, name, title, faceted=varying)
    table = frame.groupby(["facet", "run", schema.RUN_ID], as_index=False).comm_ms.agg(
        ["mean", "median", "std", "max"]
    )
    return Figure(name, title, files, table, sorted(frame.run_id.unique()),
                  "box: iterations (and repeats) of a configuration; one iteration's time on its "
                  "slowest GPU over its local steps (DDP: 1; PruneX, local SGD: H)", context)


def phase_row(ax, row_title: str, part: pd.DataFrame, part_stacked: pd.DataFrame,
              ends: pd.Series, halves: pd.Series, overlapped: set) -> None:
    """One panel row of fig. 8: each run's phases stacked in order, the phases that overlap
    local_compute hatched inside it, the total's interval, the axis wide enough for both."""
    y = range(len(part))
    left = pd.Series(0.0, index=part.index)
    for phase in part.columns:
        if not (part[phase] > 0).any():
            continue
        ax.barh(y, part_stacked[phase], left=left, color=phase_color(phase), height=0.7,
                label=phase.replace("_", " "))
        left += part_stacked[phase]
    for (row_key, bar_label), phase in sorted(overlapped):
        if row_key == row_title:
            ax.barh(part.index.get_loc(bar_label), part.loc[bar_label, phase], left=0,
                    height=0.3, color=phase_color(phase), hatch="////", edgecolor="white",
                    lw=0, label=f"{phase.replace('_', ' ')}, overlapped")
    ax.errorbar(ends, y, xerr=halves, fmt="none", ecolor="k", capsize=2, lw=0.8)
    ax.set_yticks(list(y), list(part.index))
    ax.set_xlabel("seconds per local step")
    ax.set_title(row_title)
    # an overlapped phase longer than the compute it hides behind ends past its bar
    hidden = [part.loc[bar_label, phase] for (row_key, bar_label), phase in overlapped
              if row_key == row_title]
    bars_in_range(ax, [e + (0 if pd.isna(h) else h) for e, h in zip(ends, halves)] + hidden)


def phase_breakdown(runs: ResultSet, out: Path, width: str | None = None) -> Figure | Skipped:
    """Fig. 8: mean seconds per local step in each phase (mean over GPUs and repeats),
    stacked in the order they run; phases that overlap local_compute (DDP's all-reduce
    during backward) are drawn hatched inside it, not stacked on top; a panel per workload,
    budget, setting and machine class where the runs hold several."""
    name, title = "fig08_phase_breakdown", "Phase breakdown per local step"
    frame = runs.runs
    timed = [i for i, phases in enumerate(column(frame, schema.PHASE_SECONDS)) if phases]
    if not timed:
        return Skipped(name, title, "no run recorded phase timings")
    varying, titles, facet, label = faceted_labels(runs, timed)
    rows, overlapped = [], set()
    for i in timed:
        phases = frame[schema.PHASE_SECONDS].iat[i]
        steps = column(frame, schema.STEPS_PER_ITERATION).iat[i] or 1
        key = (facet[i], label[i])
        rows.append({"facet": facet[i], "run": label[i], schema.RUN_ID: frame[schema.RUN_ID].iat[i],
                     **{k: v / steps for k, v in phases.items()}})
        overlapped |= {(key, p) for p in frame[OVERLAPPED_PHASES].iat[i] if p in phases}
    per_run = pd.DataFrame(rows).fillna(0.0).set_index(["facet", "run"])
    # repeats share a bar, none is dropped
    ids = per_run.groupby(level=["facet", "run"], sort=False).run_id.agg(",".join)
    means = per_run.drop(columns=schema.RUN_ID).groupby(level=["facet", "run"], sort=False).mean()
    means = means[means.sum().sort_values(ascending=False).index]
    keeps = label_keeps(frame, label, timed)
    methods = dict(zip(label[timed], column(frame, schema.METHOD).to_numpy()[timed]))
    ranked = {run: n for n, run in enumerate(in_legend_order(methods.items(), keeps)[::-1])}
    means = means.iloc[sorted(range(len(means)), key=lambda i: (
        titles.index(means.index[i][0]), ranked[means.index[i][1]]))]  # legend order, top down
    stacked = means.copy()
    for key, phase in overlapped:
        stacked.loc[key, phase] = 0.0
    totals = stacked.sum(axis=1)
    repeats = per_run.drop(columns=schema.RUN_ID)
    spread = pd.Series([mean_ci(repeats.loc[[key]].sum(axis=1) - sum(
        repeats.loc[[key], p] for k, p in overlapped if k == key))[1] for key in means.index],
        index=means.index)
    counts = [len(means.loc[row_title]) for row_title in titles]
    heights = [0.3 * n + 0.6 for n in counts]
    heights[-1] += 0.4
    with paper_figure(width or "two", nrows=len(titles), heights=heights) as (fig, axes):
        for ax, row_title in zip(axes[:, 0], titles):
            phase_row(ax, row_title, means.loc[row_title], stacked.loc[row_title],
                      totals.loc[row_title], spread.loc[row_title], overlapped)
        legend_outside(fig, axes, ncol=4)
        files, context = finish(fig, runs, ids, out, name, title, faceted=varying)
    table = means.assign(run_id=ids).reset_index()
    table = table.iloc[sorted(range(len(table)), key=lambda i: (  # the legend's order
        titles.index(table.facet.iat[i]), -ranked[table.run.iat[i]]))]
    run_ids = sorted(i for joined in ids for i in joined.split(","))
    note = (
        "an iteration's steady phases over its local steps, mean over GPUs and repeats (error "
        "bar: 95 % interval of the total); hatched: communication that overlaps local compute "
        "(DDP's bucket all-reduce during backward), drawn inside it, not stacked"
        + once_paid(frame, timed, label)
    )
    return Figure(name, title, files, table, run_ids, note, context)


def message_volume(runs: ResultSet, out: Path, width: str | None = None) -> Figure | Skipped:
    """Fig. 6: inter-node traffic per epoch (mean and 95 % interval over repeats), and per
    local step over training, so step- and round-based methods compare; a row of panels
    per workload, budget, setting and machine class where the runs hold several."""
    name, title = "fig06_inter_node_volume", "Inter-node message size and volume"
    rows = runs.table("iterations")
    recorded = runs.columns.get(schema.ITERATIONS, pd.Series(dtype=object))
    has_bytes = np.array([schema.BYTES_INTER in (c or ()) for c in recorded], dtype=bool)
    rows = rows[has_bytes[rows[RUN_INDEX].to_numpy()]] if len(rows) else rows
    if rows.empty:
        return Skipped(name, title, "no run recorded inter-node bytes")
    per_iter = rows.groupby([RUN_INDEX, schema.ITERATION]).agg(
        inter=(schema.BYTES_INTER, "sum"), epoch=(schema.EPOCH, "max")).reset_index()
    runs_frame = runs.runs
    owner = per_iter[RUN_INDEX].to_numpy()
    varying, titles, facet, labels = faceted_labels(runs, owner)
    steps = np.array([s or 1 for s in column(runs_frame, schema.STEPS_PER_ITERATION)],
                     dtype=object)
    methods = runs_frame[schema.METHOD].to_numpy()
    frame = pd.DataFrame({schema.EPOCH: per_iter.epoch, "facet": facet[owner], "run": labels[owner],
                          schema.METHOD: methods[owner],
                          "mb_per_step": per_iter.inter / 1e6 / steps[owner].astype(float)})
    inter = sums_per_run(per_iter.inter, per_iter[RUN_INDEX])
    epochs = column(runs_frame, schema.EPOCHS)
    per_run = pd.DataFrame([
        {"facet": facet[i], "run": labels[i], schema.METHOD: methods[i],
         schema.RUN_ID: runs_frame[schema.RUN_ID].iat[i], "inter_gb_total": total / 1e9,
         "inter_gb_per_epoch": total / 1e9 / (epochs.iat[i] or math.nan)}
        for i, total in inter.items()
    ])
    total = repeats_reduced(per_run, ["facet", "run", "method"], "inter_gb_per_epoch")
    keeps = label_keeps(runs_frame, labels, np.unique(owner))
    styles = series_styles(zip(total.run, total.method), keeps)
    counts = [int((total.facet == row_title).sum()) for row_title in titles]
    # tall enough for the right panel's rotated y-label, however few bars on the left
    heights = [max(2.2, 0.27 * n + 0.7) for n in counts]
    with paper_figure(width or "two", nrows=len(titles), ncols=2,
                      heights=heights) as (fig, axes):
        for (bars, steps_ax), row_title in zip(axes, titles):
            part = total[total.facet == row_title].sort_values("inter_gb_per_epoch")
            part = part.reset_index(drop=True)
            values = part.inter_gb_per_epoch
            half = part.inter_gb_per_epoch_ci95.fillna(0.0)
            # a log axis where the volumes span decades and none is zero (a bar of 0 has
            # no place on it); its bars start at the axis' left end, not at 0
            logarithmic = bool((values > 0).all() and values.max() > 100 * values.min())
            left = values.min() / 2 if logarithmic else 0.0
            bars.barh(part.index, values - left, left=left, xerr=half.where(half > 0),
                      color=[styles[r]["color"] for r in part.run], height=0.7)
            bars.set_yticks(part.index, part.run)
            bars.set_xlabel("inter-node GB/epoch")
            bars.set_title(row_title, loc="left")  # one title per row, over both panels
            if logarithmic:
                bars.set_xscale("log")
            bars_in_range(bars, values + half)
            curves = frame[frame.facet == row_title]
            for curve_label in in_legend_order(zip(curves.run, curves.method), keeps):
                curve = curves[curves.run == curve_label]
                mean = curve.groupby(schema.EPOCH).mb_per_step.mean()
                steps_ax.plot(mean.index, mean.values, ms=3, markevery=max(1, len(mean) // 6),
                              label=curve_label, **styles[curve_label])
            steps_ax.set_xlabel("epoch")
            steps_ax.set_ylabel("inter-node MB per local step")
            if (curves.mb_per_step > 0).any():
                log_scale(steps_ax, "y")
            hide_if_empty(steps_ax)
        legend_outside(fig, axes, ncol=2)
        files, context = finish(fig, runs, per_run.run_id, out, name, title, faceted=varying)
    return Figure(name, title, files, total, sorted(per_run.run_id),
                  "bytes are the ring's algorithmic volume summed over GPUs", context)


def masks(runs: ResultSet, out: Path, shown: int = 4, width: str | None = None) -> Figure | Skipped:
    """Fig. 13: the learned structured masks: the largest conv layers' filter x channel masks,
    and a ViT's kept heads and MLP neurons per block."""
    name, title = "fig13_masks", "Learned structured masks (filters x channels, heads, neurons)"
    views = runs.runs[VIEW]
    candidates = [i for i, view in enumerate(views) if (view.folder / "masks.pt").exists()
                  and not view.summary.get(schema.SIMULATED)]  # a replay's masks: stand-ins
    if not candidates:
        return Skipped(name, title, "no trained run folder has masks.pt (PruneX runs save it)")
    saved, position = None, None
    # the masks of the methods a report studies first (those that declare figures of their
    # own: PruneX's, the paper's figure), then those of the other pruning methods
    learned = sorted(candidates, key=lambda i: (not studied(views.iat[i].method),
                                                -views.iat[i].summary[schema.GPUS]))
    for position in learned:
        saved = read_masks(views.iat[position])
        if saved is not None:
            break
    run = views.iat[position]
    if saved is None:
        return Skipped(name, title, "every masks.pt is unreadable (listed above)")
    panels = mask_panels(saved, shown)
    if not panels:
        return Skipped(name, title, f"{run.run_id} pruned no conv, head or neuron")
    one_column = (width or "two") == "one" and len(panels) > 2
    grid = (2, math.ceil(len(panels) / 2)) if one_column else (1, len(panels))
    with paper_figure(width or "two", nrows=grid[0], ncols=grid[1], ratio=1.0,
                      stack=False) as (fig, axes):
        rows = []
        for ax in axes.flat[len(panels) :]:
            ax.set_visible(False)
        for ax, (layer, keep, xlabel, ylabel) in zip(axes.flat, panels):
            ax.imshow(keep.numpy(), cmap="gray_r", aspect="auto", interpolation="nearest",
                      vmin=0, vmax=1)
            density = float(keep.mean())
            ax.set_title(f"{short_name(layer)}\ndensity {density:.2f}", fontsize=6)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.grid(False)
            rows.append({schema.LAYER: layer, "shape": tuple(keep.shape), schema.DENSITY: density})
        for colour, what in (("black", "kept"), ("white", "pruned")):  # the key, below
            axes.flat[0].add_patch(Rectangle((0, 0), 0, 0, facecolor=colour, edgecolor="black",
                                             lw=0.5, label=what))
        legend_outside(fig, axes, ncol=2)
        files, context = finish(fig, runs, [run.run_id], out, name, title,
                                lead=label_table(runs.runs.iloc[[position]]).iat[0])
    return Figure(name, title, files, pd.DataFrame(rows), [run.run_id], "black: kept",
                  context)


#: the suite's figures, in the report's order; the registered methods' own figures follow
#: them (suite.report.kit), then ``CLOSING``
FIGURES = (scaling, pareto, time_to_accuracy, comm_latency, phase_breakdown, message_volume)
#: the figures that close a report, after the methods' own
CLOSING = (masks,)
