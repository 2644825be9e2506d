"""``bench dashboard HISTORY -o DIR``: the nightly history as a static site, a page per machine
class and an index (asv's site per machine, Conbench's series per benchmark).

A class page lists the last night's failures first (failed runs, regressions, activity checks
not passed), then, per method, the gate's metrics over the nightlies: the final training loss,
accuracy, inter-node bytes per iteration and the time ratio to DDP, one series each, every
point with its commit, date and the gate's verdict on hover, the reference's value and the
band its thresholds let pass drawn behind it, and the change points ``bench trend`` finds at
the class's thresholds marked. Plotly draws it; its script is written once beside the pages
(``plotly.min.js``), so the site needs no server and no network: open ``index.html``.
"""

from __future__ import annotations

import html
import json
import math
import re
from pathlib import Path

import pandas as pd

from suite.errors import BenchError
from suite.gate.trend import (
    BAND,
    COMMIT_KEY,
    LABEL,
    NIGHT,
    REFERENCE,
    SERIES_KEY,
    THRESHOLDS,
    VERDICTS,
    WHEN,
    ChangePoint,
    class_gate,
    find_changes,
    read_history,
    series_words,
)
from suite.results import schema
from suite.results.catalogue import BY_ALIAS
from suite.results.resultset import MACHINE_CLASS
from suite.results.schema import Status, Verdict

#: what a class page draws per method: metric -> (title, scale of the values shown, unit)
PANELS = {BY_ALIAS[alias].name: (BY_ALIAS[alias].words, BY_ALIAS[alias].scale,
                                  BY_ALIAS[alias].unit)
          for alias in ("train-loss", "accuracy", "bytes", "time-ratio")}
SCRIPT = "plotly.min.js"
STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1200px; color: #222 }
h1 { font-size: 1.5em } h2 { font-size: 1.15em; margin-top: 1.6em }
table { border-collapse: collapse } td, th { padding: .25em .7em; border-bottom: 1px solid #ddd;
  text-align: left } .bad { color: #b00020; font-weight: 600 } .good { color: #1b7f3b }
.note { color: #555; font-size: .9em }
"""


def page_name(machine: str) -> str:
    """The class page's file name (``cpu-gloo-portable-t1.html``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", machine) + ".html"


def write_dashboard(history: str | Path, output: str | Path) -> Path:
    """Write the site for ``history`` into ``output``; returns its ``index.html``.

    Raises:
        BenchError: the history is missing, empty or not JSON lines.
    """
    frame = read_history(history)
    for column in (*SERIES_KEY, NIGHT, WHEN, COMMIT_KEY, schema.STATUS, VERDICTS, REFERENCE,
                   BAND, THRESHOLDS):
        if column not in frame:
            frame[column] = None
    frame[NIGHT] = frame[NIGHT].fillna(frame[WHEN])
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    # lazy: plotly costs ~1 s to import; only this command needs it
    from plotly.offline import get_plotlyjs

    (out / SCRIPT).write_text(get_plotlyjs())
    classes = []
    for machine, rows in frame.groupby(MACHINE_CLASS, sort=True):
        changes = class_changes(rows, machine)
        failures = last_night_failures(rows)
        (out / page_name(machine)).write_text(class_page(machine, rows, changes, failures))
        classes.append((machine, rows, failures))
    index = out / "index.html"
    index.write_text(index_page(classes, Path(history).name))
    return index


def class_changes(rows: pd.DataFrame, machine: str) -> list[ChangePoint]:
    """The change points ``bench trend`` finds in a class's series, at the thresholds it
    judges them with (suite.gate.trend.class_gate)."""
    changes, _, _ = find_changes(rows, class_gate(rows, machine))
    return changes


def last_night_failures(rows: pd.DataFrame) -> list[tuple[str, str, str]]:
    """(method, what, why) of the class's last night: runs that did not finish, then every
    verdict that failed the gate."""
    last = rows[rows[NIGHT] == rows[NIGHT].max()]
    found = []
    for _, row in last.sort_values(schema.METHOD).iterrows():
        if row[schema.STATUS] not in (None, Status.OK.value):
            found.append((row[schema.METHOD], "status", str(row[schema.STATUS])))
        for what, verdict in (row[VERDICTS] or {}).items():
            if str(verdict).startswith(Verdict.REGRESSION.value):
                found.append((row[schema.METHOD], what, str(verdict)))
    return found


def series_label(key: dict, series: pd.DataFrame) -> str:
    """A series as the page names it: its last line's words (``prunex: channel keep 0.5``),
    or, for lines written before they kept them, the method and its options in words."""
    labels = [v for v in series.get(LABEL, pd.Series(dtype=object)) if isinstance(v, str) and v]
    return labels[-1] if labels else series_words(key[schema.METHOD],
                                                   str(key.get(schema.OPTIONS) or "{}"))


def span(nights: list[str]) -> str:
    """``2026-11-26 11:37 UTC`` for one night, ``... to ...`` for several."""
    times = [t[:16] + (" UTC" if t[:4].isdigit() else "") for t in night_times(nights)]
    return times[0] if len(set(times)) == 1 else f"{times[0]} to {times[-1]}"


def plural(count: int, word: str, words: str) -> str:
    return f"{count} {word if count == 1 else words}"


def class_page(machine: str, rows: pd.DataFrame, changes: list[ChangePoint],
               failures: list[tuple[str, str, str]]) -> str:
    """One class's page: its failures, then a figure per series (method)."""
    nights = sorted(rows[NIGHT].unique())
    parts = [f"<h1>{html.escape(machine)}</h1>",
             f"<p class='note'>{plural(len(nights), 'nightly', 'nightlies')}, "
             f"{html.escape(span(nights))}. "
             "<a href='index.html'>All classes</a></p>",
             "<h2>Last night's failures</h2>"]
    if failures:
        parts.append("<table id='failures'><tr><th>method</th><th>what</th><th>verdict</th></tr>"
                     + "".join(f"<tr><td>{html.escape(m)}</td><td>{html.escape(w)}</td>"
                               f"<td class='bad'>{html.escape(v)}</td></tr>"
                               for m, w, v in failures) + "</table>")
    else:
        parts.append("<p id='failures' class='good'>none: every run finished and passed the "
                     "gate</p>")
    figures = []
    for number, (key, series) in enumerate(rows.groupby(SERIES_KEY, sort=True)):
        fields = dict(zip(SERIES_KEY, key))
        marked = [c for c in changes if tuple(c.key) == tuple(key)]
        div = f"series-{number}"
        series = series.sort_values(NIGHT)
        parts.append(f"<h2>{html.escape(series_label(fields, series))}</h2><div id='{div}'>"
                     "</div>")
        figures.append((div, series_figure(fields, series, marked)))
    judged = [t for t in rows.sort_values(NIGHT)[THRESHOLDS] if isinstance(t, dict)]
    if judged:
        parts.append(f"<p class='note'>Judged at {html.escape(judged[-1]['source'])}. The "
                     "dashed line is the reference's value, the shaded band what passes around "
                     "it; a red point failed the gate, a hollow one was not judged (hover for "
                     "why), a red cross is a change point (bench trend).</p>")
    # no toolbar: at these sizes it sits on the panels' titles
    script = "\n".join(f"var figure = {figure.to_json()};\n"
                       f"Plotly.newPlot({json.dumps(div)}, figure.data, figure.layout, "
                       "{responsive: true, displayModeBar: false});" for div, figure in figures)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(machine)}"
            f" nightly</title><style>{STYLE}</style><script src='{SCRIPT}'></script></head>"
            f"<body>{''.join(parts)}<script>{script}</script></body></html>")


def _number(value) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def night_times(nights) -> list[str]:
    """Nights as times Plotly's date axis reads (``2026-11-28 02:30:00``, UTC); a night that
    is not a time stays as it is."""
    out = []
    for night in nights:
        try:
            stamp = pd.Timestamp(str(night))
        except (TypeError, ValueError):
            out.append(str(night))
            continue
        if stamp.tzinfo is not None:
            stamp = stamp.tz_convert("UTC").tz_localize(None)
        out.append(stamp.strftime("%Y-%m-%d %H:%M:%S"))
    return out


#: a day, in the milliseconds of Plotly's date axis
DAY_MS = 86_400_000


def date_axis(times: list[str]) -> dict:
    """A date axis of whole days around ``times``: half a day of room on each side (one night
    is a point in a day, not a sub-millisecond range) and a tick every day, or every few
    days so that about six ticks fit."""
    try:
        stamps = [pd.Timestamp(t) for t in times]
    except (TypeError, ValueError):
        return {"type": "category"}
    first, last = min(stamps), max(stamps)
    days = max(1, math.ceil((last - first) / pd.Timedelta(days=1) / 6))
    pad = pd.Timedelta(hours=12)
    return {"type": "date", "tickformat": "%b %d", "dtick": days * DAY_MS,
            "tick0": first.strftime("%Y-%m-%d %H:%M:%S"),  # ticks at the nightly's hour
            "range": [(first - pad).strftime("%Y-%m-%d %H:%M:%S"),
                      (last + pad).strftime("%Y-%m-%d %H:%M:%S")]}


def stepped(times: list[str], values: list) -> tuple[list[str], list]:
    """A per-night level drawn across the whole axis: each night's value from half a day
    before it to the next night, the last one half a day past it (a band of one night is a
    band, not a point)."""
    try:
        stamps = [pd.Timestamp(t) for t in times]
    except (TypeError, ValueError):
        return times, values
    pad = pd.Timedelta(hours=12)
    xs = [(stamps[0] - pad).strftime("%Y-%m-%d %H:%M:%S"), *times,
          (stamps[-1] + pad).strftime("%Y-%m-%d %H:%M:%S")]
    return xs, [values[0], *values, values[-1]]


def series_figure(key: dict, series: pd.DataFrame, changes: list[ChangePoint]):
    """A row of panels, one per gate metric: the series, the reference and its band, the
    change points. Every trace carries ``meta`` (kind, method, metric) for readers of the
    page."""
    # lazy: plotly costs ~1 s to import; only this command needs it
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    method = key[schema.METHOD]
    figure = make_subplots(rows=1, cols=len(PANELS), horizontal_spacing=0.07, subplot_titles=[
        title + (f" ({unit.strip()})" if unit else "") for title, _, unit in PANELS.values()])
    nights = list(series[NIGHT])
    times = night_times(nights)
    size = max(3.0, min(7.0, 300 / max(1, len(nights))))  # points, not a bar, at 300 nights
    for column, (metric, (title, scale, unit)) in enumerate(PANELS.items(), start=1):
        values = [_number(v) for v in (series[metric] if metric in series
                                       else [None] * len(series))]
        shown = [None if v is None else v * scale for v in values]
        verdicts = [(row or {}).get(metric, "not judged (no reference)")
                    for row in series[VERDICTS]]
        hover = [f"{method} {title}: {'-' if v is None else f'{v:.4g}{unit}'}<br>night {n}<br>"
                 f"commit {str(c)[:10]}<br>verdict: {html.escape(str(d))}"
                 for v, n, c, d in zip(shown, nights, series[COMMIT_KEY], verdicts)]
        meta = {schema.METHOD: method, "metric": metric}
        references = [_number((row or {}).get(metric)) for row in series[REFERENCE]]
        bands = [(row or {}).get(metric) for row in series[BAND]]
        add_band(figure, column, times, bands, scale, meta)
        add_reference(figure, column, times, references, scale, meta)
        failed = [str(d).startswith(Verdict.REGRESSION.value) for d in verdicts]
        judged = [not str(d).startswith(Verdict.NOT_JUDGED.value) for d in verdicts]
        colours = ["#b00020" if bad else "#1f4e99" for bad in failed]
        symbols = ["circle" if yes else "circle-open" for yes in judged]
        figure.add_trace(go.Scatter(x=times, y=shown, mode="lines+markers", name=title,
                                    marker={"color": colours, "symbol": symbols, "size": size,
                                            "line": {"width": 1.5, "color": colours}},
                                    line={"color": "#1f4e99", "width": 1.5 if size > 4 else 1},
                                    hovertext=hover,
                                    hoverinfo="text", showlegend=False,
                                    meta={**meta, "kind": "series", "judged": judged}),
                         row=1, col=column)
        add_changes(figure, column, [c for c in changes if c.metric == metric], series, times,
                    shown, meta)
    figure.update_layout(height=300, margin={"l": 50, "r": 20, "t": 50, "b": 50},
                         template="plotly_white", hovermode="closest")
    figure.update_annotations(font={"size": 13})  # the panels' titles
    figure.update_xaxes(**date_axis(times), tickangle=0, tickfont={"size": 10},
                        automargin=True)
    figure.update_yaxes(tickfont={"size": 10}, automargin=True, nticks=6)
    return figure


def add_band(figure, column: int, times: list[str], bands: list, scale: float,
             meta: dict) -> None:
    """The reference's band as a shaded step between its low and high edges (two traces,
    the second filled to the first); nothing where no night has a band.

    Args:
        figure: the dashboard's row of panels.
        column: the metric's panel, from 1.
        times: the nights as the date axis reads them.
        bands: each night's ``(low, high)`` in the metric's own unit, or None.
        scale: what the panel multiplies the metric by.
        meta: the trace's method and metric.
    """
    import plotly.graph_objects as go  # lazy, as in series_figure

    if not any(b for b in bands):
        return
    low = [None if not b else b[0] * scale for b in bands]
    high = [None if not b else b[1] * scale for b in bands]
    xs, low = stepped(times, low)
    _, high = stepped(times, high)
    figure.add_trace(go.Scatter(x=xs, y=low, mode="lines", line={"width": 0, "shape": "hv"},
                                hoverinfo="skip", showlegend=False,
                                meta={**meta, "kind": "band"}), row=1, col=column)
    figure.add_trace(go.Scatter(x=xs, y=high, mode="lines", line={"width": 0, "shape": "hv"},
                                fill="tonexty", fillcolor="rgba(27,127,59,0.15)",
                                hoverinfo="skip", showlegend=False,
                                meta={**meta, "kind": "band"}), row=1, col=column)


def add_reference(figure, column: int, times: list[str], references: list, scale: float,
                  meta: dict) -> None:
    """The reference as a dashed step across the nights; nothing where no night has one
    (``references`` in the metric's unit, None for a night without; the rest as in
    ``add_band``)."""
    import plotly.graph_objects as go  # lazy, as in series_figure

    if not any(r is not None for r in references):
        return
    xs, levels = stepped(times, [None if r is None else r * scale for r in references])
    figure.add_trace(go.Scatter(
        x=xs, y=levels, mode="lines",
        line={"dash": "dash", "color": "#1b7f3b", "width": 1, "shape": "hv"},
        name="reference", hoverinfo="skip", showlegend=False,
        meta={**meta, "kind": "reference"}), row=1, col=column)


def add_changes(figure, column: int, steps: list[ChangePoint], series: pd.DataFrame,
                times: list[str], shown: list, meta: dict) -> None:
    """A cross on the series at each of the metric's change points whose night is in the
    series, its line as the hover; nothing without change points.

    Args:
        figure: the dashboard's row of panels.
        column: the metric's panel, from 1.
        steps: the metric's change points.
        series: the class's nights (their ``when`` is what a change point names its night by).
        times: the nights as the date axis reads them.
        shown: the series' values as the panel draws them.
        meta: the trace's method and metric.
    """
    import plotly.graph_objects as go  # lazy, as in series_figure

    if not steps:
        return
    whens = list(series[WHEN])
    at = [whens.index(c.when) for c in steps if c.when in whens]
    figure.add_trace(go.Scatter(
        x=[times[i] for i in at], y=[shown[i] for i in at], mode="markers",
        marker={"symbol": "x", "size": 14, "color": "#b00020"},
        hovertext=[c.line() for c in steps if c.when in whens], hoverinfo="text",
        showlegend=False, meta={**meta, "kind": "change"}), row=1, col=column)


def index_page(classes: list, source: str) -> str:
    """The index: a line per class with its last night and its failures, linked."""
    rows = []
    for machine, frame, failures in classes:
        last = frame[frame[NIGHT] == frame[NIGHT].max()]
        rows.append(
            f"<tr><td><a href='{page_name(machine)}'>{html.escape(machine)}</a></td>"
            f"<td>{frame[NIGHT].nunique()}</td><td>{html.escape(str(last[NIGHT].iloc[0]))}</td>"
            f"<td>{html.escape(str(last[COMMIT_KEY].iloc[0])[:10])}</td>"
            f"<td class='{'bad' if failures else 'good'}'>"
            f"{len(failures) or 'none'}</td></tr>")
    if not rows:
        raise BenchError(f"{source}: no machine class in the history")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>prunex-bench nightly"
            f"</title><style>{STYLE}</style></head><body><h1>prunex-bench nightly</h1>"
            f"<p class='note'>From {html.escape(source)}: a page per machine class.</p>"
            "<table id='classes'><tr><th>machine class</th><th>nightlies</th><th>last night"
            "</th><th>commit</th><th>last night's failures</th></tr>"
            f"{''.join(rows)}</table></body></html>")
