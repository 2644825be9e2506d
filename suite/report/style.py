"""One look for every figure of every report: a fixed colour and marker per method, human
labels, and paper sizes.

A method's label, colour and marker are what it declared at registration (the built-ins:
Okabe & Ito's colour-blind-safe set, plus Tol's wine and grey), so PruneX has the same colour
in every figure and for any subset of runs, and a plugin brings its own; a phase's colour is
declared with the phase (:mod:`suite.cluster.phases`). Sizes and fonts come from
``tueplots`` (ICML's 3.25 in column and 6.75 in page width, sans-serif, no LaTeX needed),
with every text at 7 pt or more at print size. Every figure is saved as PDF (vector, for the
paper), SVG and PNG (300 dpi, for reports).
"""

from __future__ import annotations

import zlib
from contextlib import contextmanager
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib import ticker
from tueplots import axes as tue_axes
from tueplots import bundles

from suite.errors import BenchError
from suite.plugins.registry import METHODS, Look

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
    height: float | None = None, stack: bool = True,
):
    """A figure ``width`` ("one" column or "two"-column page) wide, each panel ``ratio``
    times its width tall (or the whole figure ``height`` inches), in the paper style; yields
    (fig, axes as an nrows x ncols array). In one column, side-by-side panels are stacked
    unless ``stack`` is False."""
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
    with plt.rc_context(rc):
        fig, axes = plt.subplots(rows, cols, figsize=(WIDTHS[width], tall), squeeze=False)
        yield fig, axes.reshape(nrows, ncols)


def save(fig, out: Path, name: str) -> list[Path]:
    """PNG (first: what report.md and report.html show), PDF and SVG of ``fig``."""
    files = [out / f"{name}.png", out / f"{name}.pdf", out / f"{name}.svg"]
    fig.savefig(files[0], dpi=300)
    for file in files[1:]:
        fig.savefig(file)
    plt.close(fig)
    return files


def legend_outside(fig, axes, **kwargs) -> None:
    """One legend for the figure, below the panels, never on the data."""
    handles, labels = {}, []
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            if label not in handles and not label.startswith("_"):
                handles[label] = handle
                labels.append(label)
    if handles:
        ncol = kwargs.pop("ncol", min(len(labels), 3))
        if fig.get_figwidth() < 4:  # one column: long labels side by side would not fit
            ncol = 1 if max(map(len, labels)) > 24 else min(ncol, 2)
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


def series_styles(pairs) -> dict[str, dict]:
    """``(label, method)`` pairs -> plot keywords: the method's fixed colour and marker;
    several configurations of one method are told apart by line style and marker fill."""
    styles: dict[str, dict] = {}
    used: dict[str, int] = {}
    for label, method in pairs:
        if label not in styles:
            look = method_style(method)
            n = used.get(method, 0)
            styles[label] = {"color": look.color, "marker": look.marker,
                             "ls": LINESTYLES[n % len(LINESTYLES)],
                             "fillstyle": FILLSTYLES[n % len(FILLSTYLES)]}
            used[method] = n + 1
    return styles
