"""One look for every figure of every report: a fixed colour and marker per method, human
labels, and paper sizes.

A method's label, colour and marker are what it declared at registration (the built-ins:
Okabe & Ito's colour-blind-safe set, plus Tol's wine and grey), so PruneX has the same colour
in every figure and for any subset of runs, and a plugin brings its own; a phase's colour is
declared with the phase (`suite.cluster.phases`). Sizes and fonts come from
``tueplots`` (ICML's 3.25 in column and 6.75 in page width, sans-serif, no LaTeX needed),
with every text at 7 pt or more at print size. Every figure is saved as PDF (vector, for the
paper), SVG and PNG (300 dpi, for reports).
"""

from __future__ import annotations

import math
import textwrap
import zlib
from contextlib import contextmanager
from pathlib import Path

import matplotlib.pyplot as plt
import matplotlib.text
import pandas as pd
from matplotlib import ticker
from matplotlib.transforms import ScaledTranslation
from tueplots import axes as tue_axes
from tueplots import bundles

from suite.errors import BenchError
from suite.plugins.registry import METHODS, Look
from suite.results import schema

#: print widths in inches: one column, and the two-column page
WIDTHS = {"one": 3.25, "two": 6.75}
#: the smallest text at print size (issue: readable in one column)
MIN_POINTS = 7


_SPARE_MARKERS = "o^sDvP<X>h"
#: a method that declared no colour
UNDECLARED_COLOR = "#999999"


def method_style(method: str) -> Look:
    """The label, colour and marker the method declared at registration (built-ins: Okabe-Ito,
    Tol's wine and grey); a method that declared none, or is not installed here, gets its
    name, grey and a marker fixed by its name."""
    try:
        entry = METHODS.find(method)
    except BenchError:  # a broken plugin: its runs are still drawn, in grey
        entry = None
    if entry is not None and entry.look is not None:
        return entry.look
    marker = _SPARE_MARKERS[zlib.crc32(method.encode()) % len(_SPARE_MARKERS)]
    return Look(method, UNDECLARED_COLOR, marker)


def options_text(options: dict | None) -> str:
    """``{"channel_keep": 0.5}`` as ``channel keep 0.5`` (never JSON)."""
    return ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in sorted((options or {}).items()))


@contextmanager
def paper_figure(
    width: str = "two", *, nrows: int = 1, ncols: int = 1, ratio: float = 0.62,
    height: float | None = None, stack: bool = True, heights: list[float] | None = None,
):
    """A figure ``width`` ("one" column or "two"-column page) wide, each panel ``ratio``
    times its width tall (or the whole figure ``height`` inches, or each row of panels its
    own of ``heights`` inches), in the paper style; yields (fig, axes as an nrows x ncols
    array). In one column, side-by-side panels are stacked unless ``stack`` is False."""
    rc = {
        **bundles.icml2024(column="half" if width == "one" else "full", usetex=False,
                           family="sans-serif"),
        **tue_axes.lines(),
        **tue_axes.grid(grid_alpha=0.3),
        "font.sans-serif": ["Helvetica", "Nimbus Sans", "DejaVu Sans"],
        **{key: MIN_POINTS for key in ("legend.fontsize", "xtick.labelsize", "ytick.labelsize")},
        "font.size": 8, "axes.labelsize": 8, "axes.titlesize": 8,
        "legend.title_fontsize": MIN_POINTS, "legend.frameon": False,
    }
    stacked = stack and width == "one" and ncols > 1
    rows, cols = (nrows * ncols, 1) if stacked else (nrows, ncols)
    tall = height if height is not None else WIDTHS[width] / cols * ratio * rows
    grid = None
    if heights is not None:
        ratios = [h for h in heights for _ in range(ncols)] if stacked else list(heights)
        tall, grid = sum(ratios), {"height_ratios": ratios}
    with plt.rc_context(rc):
        fig, axes = plt.subplots(rows, cols, figsize=(WIDTHS[width], tall), squeeze=False,
                                 gridspec_kw=grid)
        yield fig, axes.reshape(nrows, ncols)


#: figure name -> the pairs of its texts that overlap as saved (tests read it: none may)
OVERLAPS: dict[str, list[tuple[str, str]]] = {}


def _drawn_tick_labels(fig) -> tuple[list, set[int]]:
    """The tick labels of the figure's visible axes that fall inside their view, and the ids
    of every tick label: matplotlib keeps labels of ticks outside the view, which are never
    drawn and so must not count as overlapping (nor be picked up again as other texts).

    Returns:
        (the drawn tick labels, the ids of all tick labels).
    """
    drawn, ticks = [], set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            low, high = sorted(axis.get_view_interval())
            slack = (high - low) * 1e-9
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                labels = (tick.label1, tick.label2)
                ticks.update(map(id, labels))
                if ax.get_visible() and low - slack <= tick.get_loc() <= high + slack:
                    drawn += labels  # matplotlib keeps labels of ticks outside the view
    return drawn, ticks


def _text_boxes(fig, texts, renderer) -> list[tuple[str, object]]:
    """The (stripped text, box) of each of ``texts`` that is visible, non-empty, of ``fig``
    and has an area; each box shrunk by a pixel on every side, so texts that merely touch do
    not count as overlapping."""
    boxes = []
    for text in texts:
        if text.get_visible() and text.get_text().strip() and text.figure is fig:
            box = text.get_window_extent(renderer)
            if box.width > 0 and box.height > 0:
                boxes.append((text.get_text().strip(), box.expanded(1.0, 1.0).shrunk(
                    max(0.0, 1 - 2 / box.width), max(0.0, 1 - 2 / box.height))))
    return boxes


def _overlapping_pairs(boxes: list[tuple[str, object]]) -> list[tuple[str, str]]:
    """Every pair of ``boxes`` that overlap, as (earlier text, later text), in the order the
    boxes were found."""
    found = []
    for i, (a, box_a) in enumerate(boxes):
        for b, box_b in boxes[:i]:
            if box_a.overlaps(box_b):
                found.append((b, a))
    return found


def overlapping_texts(fig) -> list[tuple[str, str]]:
    """Pairs of the figure's visible texts (titles, labels, tick labels, legend entries,
    annotations) whose boxes overlap by more than a pixel, as drawn at 300 dpi."""
    fig.set_dpi(300)
    renderer = fig.canvas.get_renderer()
    fig.draw(renderer)  # the layout (constrained) places every text
    drawn, ticks = _drawn_tick_labels(fig)
    others = [t for t in fig.findobj(lambda a: isinstance(a, matplotlib.text.Text))
              if id(t) not in ticks and (t.axes is None or t.axes.get_visible())]
    return _overlapping_pairs(_text_boxes(fig, drawn + others, renderer))


def as_typed(fig) -> None:
    """Every text of ``fig`` drawn as typed, never parsed as math: titles, labels and
    legends carry run ids, options and workload names from run folders ("$x^2$" in a run id
    is its characters). Tick labels and the axes' offset texts keep matplotlib's own math
    (a log axis writes ``$10^{-2}$``)."""
    own = {id(axis.offsetText) for ax in fig.axes for axis in (ax.xaxis, ax.yaxis)}
    own |= {id(label) for ax in fig.axes for axis in (ax.xaxis, ax.yaxis)
            for tick in (*axis.get_major_ticks(), *axis.get_minor_ticks())
            for label in (tick.label1, tick.label2)}
    for text in fig.findobj(lambda a: isinstance(a, matplotlib.text.Text)):
        if id(text) not in own:
            text.set_parse_math(False)


def save(fig, out: Path, name: str) -> list[Path]:
    """PNG (first: what report.md and report.html show), PDF and SVG of ``fig``; which of its
    texts overlap is kept in ``OVERLAPS``."""
    files = [out / f"{name}.png", out / f"{name}.pdf", out / f"{name}.svg"]
    as_typed(fig)
    OVERLAPS[name] = overlapping_texts(fig)
    fig.savefig(files[0], dpi=300)
    for file in files[1:]:
        fig.savefig(file)
    plt.close(fig)
    return files


def legend_outside(fig, axes, **kwargs) -> None:
    """One legend for the figure, below the panels, never on the data (call it last: the
    figure grows by its height)."""
    handles, labels = {}, []
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            if label not in handles and not label.startswith("_"):
                handles[label] = handle
                labels.append(label)
    if handles:
        ncol = kwargs.pop("ncol", min(len(labels), 3))
        # as many columns as the longest label lets fit in the figure's width (a character
        # of 7 pt is about 0.55 of it wide; the handle and the gap about 30 pt)
        entry = max(map(len, labels)) * 0.55 * MIN_POINTS + 30
        ncol = max(1, min(ncol, len(labels), int(fig.get_figwidth() * 72 // entry)))
        # the figure grows by the legend's rows, so the panels keep their size however many
        # configurations it names (its width stays the paper's)
        rows = math.ceil(len(labels) / ncol)
        fig.set_figheight(fig.get_figheight() + rows * 1.45 * MIN_POINTS / 72 + 0.1)
        fig.legend([handles[label] for label in labels], labels, loc="outside lower center",
                   ncol=ncol, **kwargs)


def log_scale(ax, axis: str = "x") -> None:
    """A log axis (call after plotting) whose labels never run together: matplotlib labels
    the minor ticks of a range under about a decade (2x10^-1, 3x10^-1, ... side by side);
    here minor ticks are never labelled, and a range of under two decades gets major ticks at
    1, 2 and 5 of each decade, written plainly (0.2, 0.5, 1)."""
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
    scale = ax.xaxis if axis == "x" else ax.yaxis
    low, high = sorted(ax.get_xlim() if axis == "x" else ax.get_ylim())
    scale.set_minor_formatter(ticker.NullFormatter())
    if low > 0 and high / low < 100:
        scale.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0), numticks=8))
        scale.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:g}"))


LINESTYLES = ("-", "--", ":", "-.")
FILLSTYLES = ("full", "none", "left", "bottom")  # points have no line style to tell apart


def keep_of(options: dict | None) -> tuple:
    """A run's structured keeps (``schema.ALWAYS_SHOWN_OPTIONS``) as a sortable key:
    ``(("channel_keep", 0.5),)``, ``()`` for none."""
    return tuple((name, float(options[name])) for name in schema.ALWAYS_SHOWN_OPTIONS
                 if options and options.get(name) is not None)


def method_then_keep(method: str, keep: tuple) -> tuple:
    """The order of a legend, a figure's table and the paper table: by the method's display
    name, then by its keeps (``keep_of``)."""
    return method_style(method).name, keep


def series_styles(pairs, keeps: dict[str, tuple] | None = None) -> dict[str, dict]:
    """``(label, method)`` pairs -> plot keywords: the method's fixed colour and marker;
    several configurations of one method are told apart by line style and marker fill. With
    ``keeps`` (label -> ``keep_of``), the fill and line style follow the keep, the same keep
    the same look across methods (sorted: the smallest keep full, the next hollow, ...)."""
    styles: dict[str, dict] = {}
    used: dict[str, int] = {}
    order = sorted({k for k in (keeps or {}).values() if k})
    for label, method in pairs:
        if label not in styles:
            look = method_style(method)
            keep = (keeps or {}).get(label)
            if keep:
                n = order.index(keep)
            else:
                n = used.get(method, 0)
                used[method] = n + 1
            styles[label] = {"color": look.color, "marker": look.marker,
                             "ls": LINESTYLES[n % len(LINESTYLES)],
                             "fillstyle": FILLSTYLES[n % len(FILLSTYLES)]}
    return styles


def context_title(fig, text: str, title: str = "") -> None:
    """The figure's title (what it plots) over what its runs share
    (``suite.report.labels.figure_context``), at the smallest print size, wrapped to the
    figure's width."""
    if not text and not title:
        return
    chars = max(30, int(fig.get_figwidth() * 72 / (0.52 * MIN_POINTS)))
    lines = textwrap.wrap(title, chars) + textwrap.wrap(text, chars)
    fig.suptitle("\n".join(lines), fontsize=MIN_POINTS)


def axis_fraction(ax, axis: str, value: float) -> float:
    """Where ``value`` falls along ``axis`` of ``ax`` (0 at the lower limit, 1 at the upper),
    on the axis' own scale (log axes in log)."""
    low, high = ax.get_xlim() if axis == "x" else ax.get_ylim()
    scale = ax.get_xscale() if axis == "x" else ax.get_yscale()
    if scale == "log":
        if value <= 0 or low <= 0:
            return 0.0
        low, high, value = math.log(low), math.log(high), math.log(value)
    return 0.0 if high == low else (value - low) / (high - low)


def _marker_positions(ax, points: list[tuple[list, float, float]]) -> list[tuple[float, float]]:
    """Where each of ``points`` falls on the axes, in points from their lower left corner, at
    the axes' size now (so distances compare with a marker's size)."""
    box = ax.get_position()  # in figure fractions
    width = box.width * ax.figure.get_figwidth() * 72
    height = box.height * ax.figure.get_figheight() * 72
    return [(axis_fraction(ax, "x", x) * width, axis_fraction(ax, "y", y) * height)
            for _, x, y in points]


def _clusters(where: list[tuple[float, float]], near: float) -> list[list[int]]:
    """The indices of ``where`` grouped into clusters of markers that overlap, directly or
    through others (closer than ``near`` on both axes), by union-find; clusters in the order
    of their roots' first appearance, members in index order."""
    cluster = list(range(len(where)))

    def root(i: int) -> int:
        while cluster[i] != i:
            i = cluster[i]
        return i

    for i in range(len(where)):
        for j in range(i):
            if abs(where[i][0] - where[j][0]) < near and abs(where[i][1] - where[j][1]) < near:
                cluster[root(i)] = root(j)
    members: dict[int, list[int]] = {}
    for i in range(len(where)):
        members.setdefault(root(i), []).append(i)
    return list(members.values())


def _spread(groups: list[list[int]], where: list[tuple[float, float]],
            spacing: float) -> list[float]:
    """Each marker's sideways offset in points: the members of a cluster ``spacing`` apart,
    centred on where they are, in the order of their true x (ties by index), so left stays
    left; a lone marker is not moved."""
    offsets = [0.0] * len(where)
    for group in groups:
        group.sort(key=lambda i: (where[i][0], i))  # their true left-right order kept
        for rank, i in enumerate(group):
            offsets[i] = (rank - (len(group) - 1) / 2) * spacing
    return offsets


def _shift_markers(ax, points: list[tuple[list, float, float]], offsets: list[float]) -> None:
    """Move each moved marker's artists by its offset (a display offset: its data stay) and
    draw a thin line from it back to its true point, so the reader still sees where it is."""
    for (artists, x, y), offset in zip(points, offsets):
        if offset:
            shift = ScaledTranslation(offset / 72, 0, ax.figure.dpi_scale_trans)
            for artist in artists:
                artist.set_transform(ax.transData + shift)
            ax.annotate("", xy=(x, y), xytext=(offset, 0), textcoords="offset points",
                        arrowprops={"arrowstyle": "-", "lw": 0.4, "color": "0.4",
                                    "shrinkA": 0, "shrinkB": 0})


def dodge(ax, points: list[tuple[list, float, float]], near: float = 4.0,
          spacing: float = 5.0) -> list[float]:
    """Spread sideways the markers that would overlap on screen, so none hides another:
    ``points`` are (the artists of one marker, its x, its y) in data; markers closer than
    ``near`` points (a marker's size) on both axes, at the axes' size when called, form a
    cluster, and its members are moved ``spacing`` points apart about where they are, in the
    order of their true x (left stays left), each with a thin line to its true point (a
    display offset: the data and the axis limits are untouched). Call after the axes' scales
    and limits are set. Returns each marker's offset in points."""
    ax.autoscale_view()
    where = _marker_positions(ax, points)
    offsets = _spread(_clusters(where, near), where, spacing)
    _shift_markers(ax, points, offsets)
    return offsets


def draws_data(ax) -> bool:
    """Whether a panel drew anything: a line or marker with points, a bar, a collection
    (error bars, bands) with members, an image."""
    return (any(len(line.get_xdata()) for line in ax.lines) or bool(ax.patches)
            or any(len(c.get_paths()) for c in ax.collections) or bool(ax.images))


def hide_if_empty(ax) -> bool:
    """Hide a panel that drew nothing, rather than show empty axes; True if hidden."""
    if draws_data(ax):
        return False
    ax.set_visible(False)
    return True


def bars_in_range(ax, ends, axis: str = "x") -> None:
    """Limits that hold every bar and its error bar (``ends``: where each ends, error
    included), on linear axes from 0 and on log axes from below the smallest."""
    ends = [e for e in ends if e is not None and math.isfinite(e)]
    if not ends:
        return
    scale = ax.get_xscale() if axis == "x" else ax.get_yscale()
    high = max(ends) * (1.5 if scale == "log" else 1.05)
    low = min(e for e in ends if e > 0) / 2 if scale == "log" and any(e > 0 for e in ends) else 0
    (ax.set_xlim if axis == "x" else ax.set_ylim)(low, high)


def spread(ax, lines: list[list], spacing: float = 2.5) -> None:
    """Lines that share points (every scaling line starts at speedup 1) moved sideways by
    ``spacing`` points each, symmetrically, so no marker hides another."""
    for rank, artists in enumerate(lines):
        offset = (rank - (len(lines) - 1) / 2) * spacing
        if offset:
            shift = ScaledTranslation(offset / 72, 0, ax.figure.dpi_scale_trans)
            for artist in artists:
                artist.set_transform(ax.transData + shift)


def pareto_marker(ax, point, x: str, look: dict) -> list:
    """One configuration's marker: a plain marker for one run (no interval to draw), the
    mean with its 95 % interval for repeats; returns its artists."""
    common = {"ms": 4, "color": look["color"], "marker": look["marker"],
              "fillstyle": look["fillstyle"], "ls": "none", "label": point.label}
    if point.repeats > 1 and not pd.isna(point.accuracy_pct_ci95):
        bars = ax.errorbar(point[x], point.accuracy_pct, yerr=accuracy_bar(point), capsize=2,
                           lw=0.8, **common)
        return [bars.lines[0], *bars.lines[1], *bars.lines[2]]
    return ax.plot([point[x]], [point.accuracy_pct], **common)


def box_look(look: dict) -> dict:
    """A box's patch keywords for a ``series_styles`` look: the method's colour, filled for
    the look's first fill, hatched for the others, so a keep reads the same as its markers'
    fill."""
    hatches = {"full": "", "none": "", "left": "////", "bottom": "...."}
    filled = look["fillstyle"] == "full"
    return {"facecolor": look["color"] if filled else "white", "edgecolor": look["color"],
            "alpha": 0.6 if filled else 1.0, "hatch": hatches[look["fillstyle"]]}


def accuracy_bar(point) -> list[list[float]]:
    """The 95 % interval of a mean accuracy (%) as error-bar lengths, cut to 0-100 %: with
    two seeds t(0.975, 1) = 12.7 makes intervals wider than the scale."""
    half = 0.0 if pd.isna(point.accuracy_pct_ci95) else point.accuracy_pct_ci95
    return [[min(half, point.accuracy_pct)], [min(half, 100 - point.accuracy_pct)]]
