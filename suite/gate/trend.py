"""``bench trend HISTORY``: change points over the nightly history, per method and metric.

One committed reference cannot see drift (0.8 points a week never crosses a 1-point gate);
a history can. Each nightly appends its result set to a JSON-lines history (``--add``): one
line per run key with the nightly's commit, time, machine class and metrics (the mean over its
repeats), and, judged against the reference (``--against``), the gate's verdict of each metric,
the reference's value and the band its thresholds allow (what ``bench dashboard`` draws); a
key whose runs all failed gets a line too, with its status and no numbers. Per machine class,
key and metric, the series in time order goes to a change-point detector: ``ruptures``' PELT
with a least-squares cost and a BIC penalty (2 sigma^2 log n), sigma the series' noise
estimated from its successive differences (median absolute deviation, robust to the steps it
looks for), floored so deterministic series do not split on rounding.
A change point counts when its step is also beyond the gate's threshold for the metric
(``suite.gate.thresholds``: relative, accuracy in points). Apache Otava (e-divisive) was
the first choice; its 0.8.0 pins numpy 2.2 and scipy < 1.17, which would downgrade the numpy
2.4 that torch and pandas use here, and pulls BigQuery, Postgres and Slack clients; ruptures
has no such pins.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import numpy as np
import pandas as pd
from pydantic import Field

from suite.errors import BenchError
from suite.gate.compare import KEY, TIME_RATIO, load_summaries
from suite.gate.judge import Judgement
from suite.gate.reference import class_folders, reference_root
from suite.gate.thresholds import GENERIC, Gate, history_record, read_gate
from suite.results import schema
from suite.results.catalogue import SERIES_KEY as CATALOGUE_SERIES_KEY
from suite.results.catalogue import directions
from suite.results.records import (
    MAX_HISTORY_BYTES,
    Count,
    DamagedFile,
    Name,
    Number,
    Text,
    read_text,
    record,
    validate,
)
from suite.results.resultset import (
    COMMIT,
    MACHINE_CLASS,
    SHOWN_OPTIONS,
    nothing_declared,
)
from suite.results.schema import Status, Verdict

#: runs a series needs before it gets a verdict: a noise estimate and a segment on each side
MIN_RUNS = 6
#: metric -> +1 when higher is better, -1 when lower is better: the trended ones of the
#: catalogue (suite.results.catalogue)
TREND_METRICS = directions(trended_only=True)
#: a history's series (suite.results.catalogue)
SERIES_KEY = list(CATALOGUE_SERIES_KEY)
# -- a history line's keys, beyond SERIES_KEY, schema.STATUS and the metrics ---------------------
COMMIT_KEY = "commit"
#: when the key's first run started; NIGHT: when the set's first run started (one per nightly)
WHEN = "when"
NIGHT = "night"
REPEATS = "repeats"
#: metric (and ``activity``, ``status``) -> the gate's verdict, as bench compare prints it
VERDICTS = "verdicts"
#: metric -> the reference's value
REFERENCE = "reference"
#: metric -> [low, high]: the values the gate's thresholds let pass around the reference
BAND = "band"
#: the thresholds that judged the line: ``Gate.as_history``
THRESHOLDS = "thresholds"
#: the series in words, as a heading names it (``series_words``)
LABEL = "label"


@dataclass
class ChangePoint:
    series: str
    metric: str
    index: int  # the first run after the change
    commit: str
    when: str
    before: float
    after: float
    change: float  # signed, positive is better: points for accuracy, else relative
    unit: str
    length: int  # runs in the series
    key: tuple = ()  # the series' SERIES_KEY values

    @property
    def in_last_run(self) -> bool:
        return self.index == self.length - 1

    @property
    def worse(self) -> bool:
        return self.change < 0

    def line(self) -> str:
        shown = f"{self.change:+.2f} pts" if self.unit == "points" else f"{self.change:+.1%}"
        return (f"{self.series} {self.metric}: change at run {self.index + 1} (commit "
                f"{self.commit[:10]}, {self.when}): {self.before:.4g} -> {self.after:.4g} "
                f"({shown}, {'worse' if self.worse else 'better'})")


def history_rows(
    results_dir: str | Path, declared=None, judged: Judgement | None = None
) -> list[dict]:
    """One history line per run key of a result set: its commit, time, class, status and
    metrics, the mean over repeats (seeds); ``declared``: each method's option defaults, as
    ``bench compare`` matches runs (suite.gate.compare.load_summaries); ``judged``: the gate's
    judgement of the set, whose verdicts, reference values and bands the lines carry."""

    frame, _ = load_summaries(results_dir, declared or nothing_declared)
    if not (frame[schema.STATUS] == Status.OK).any():
        raise BenchError(f"{results_dir}: no finished runs to add to the history")
    for metric in TREND_METRICS:
        frame[metric] = pd.to_numeric(frame.get(metric), errors="coerce")
    verdicts = judged_by_series(judged) if judged is not None else {}
    night = min((str(v) for v in frame[schema.STARTED] if v not in (None, "-")), default="-")
    rows = []
    for key, group in frame.groupby(SERIES_KEY):
        ok = group[group[schema.STATUS] == Status.OK]
        row = {
            **dict(zip(SERIES_KEY, key)),
            COMMIT_KEY: str(group[COMMIT].iloc[0]),
            WHEN: str(group[schema.STARTED].min()),
            NIGHT: night,
            REPEATS: len(ok),
            schema.STATUS: Status.OK.value if len(ok) else str(group[schema.STATUS].iloc[0]),
            LABEL: series_words(key[SERIES_KEY.index(schema.METHOD)],
                                str(group[SHOWN_OPTIONS].iloc[0])),
            **{m: (float(ok[m].mean()) if ok[m].notna().any() else None)
               for m in TREND_METRICS},
        }
        row.update(verdicts.get(key, {}))
        rows.append(row)
    return rows


def series_words(method: str, options: str) -> str:
    """A series as a heading names it: the method and, in words, the options that differ
    from its defaults (``prunex: channel keep 0.5, local steps 4``; derived values left
    out, numbers to 3 significant digits)."""
    try:
        chosen = json.loads(options)
    except (TypeError, ValueError):
        chosen = {}
    if not isinstance(chosen, dict) or not chosen:
        return method
    words = [f"{name.replace('_', ' ')} {value:.3g}" if isinstance(value, float)
             else f"{name.replace('_', ' ')} {value}" for name, value in sorted(chosen.items())]
    return f"{method}: {', '.join(words)}"


def judged_by_series(judged: Judgement) -> dict[tuple, dict]:
    """Series key -> its lines' VERDICTS, REFERENCE, BAND and THRESHOLDS from the gate's
    table."""
    found: dict[tuple, dict] = {}
    table = judged.table
    if table.empty:
        return found
    for _, row in table.iterrows():
        fields = dict(zip(KEY, (row[k] for k in KEY)))
        series = tuple(fields[k] for k in SERIES_KEY)
        gate = judged.gates.get(fields[MACHINE_CLASS])
        entry = found.setdefault(series, {VERDICTS: {}, REFERENCE: {}, BAND: {},
                                          THRESHOLDS: None if gate is None
                                          else gate.as_history()})
        metric = row["metric"]
        entry[VERDICTS][metric] = row["verdict"]
        base = row.get("baseline")
        if metric in TREND_METRICS and isinstance(base, float) and math.isfinite(base):
            entry[REFERENCE][metric] = base
            if gate is not None:
                entry[BAND][metric] = band(metric, base, gate)
    return found


def recorded_gate(rows: pd.DataFrame) -> Gate | None:
    """The thresholds that judged the last judged line of ``rows`` (one class's), as the
    nightly recorded them, or None where no line was judged."""
    if THRESHOLDS not in rows:
        return None
    order = rows[NIGHT] if NIGHT in rows else rows[WHEN]
    ordered = rows.assign(_order=order.astype(str)).sort_values("_order")[THRESHOLDS]
    judged = [gate for gate in map(Gate.from_history, ordered) if gate is not None]
    return judged[-1] if judged else None


def class_gate(rows: pd.DataFrame, machine: str, reference: Path | None = None) -> Gate:
    """The thresholds a class's history is judged with, by hand as by the nightly: those
    its last judged night recorded, else its reference's ``gate.json`` (under ``reference``,
    default the committed references), else ``bench compare``'s defaults."""
    recorded = recorded_gate(rows)
    if recorded is not None:
        return recorded
    folder = class_folders(reference if reference is not None else reference_root()).get(machine)
    return read_gate(folder) if folder is not None else GENERIC


def busy_lines(lines: pd.DataFrame) -> pd.Series:
    """Which history lines' times the gate did not judge (the runner was busy): their times
    are left out of the time series' change points too."""
    if VERDICTS not in lines:
        return pd.Series(False, index=lines.index)
    return pd.Series([isinstance(v, dict) and str(v.get(TIME_RATIO, "")).startswith(
        Verdict.NOT_JUDGED.value) for v in lines[VERDICTS]], index=lines.index)


def band(metric: str, reference: float, gate: Gate) -> list[float]:
    """The values ``gate`` lets pass around ``reference`` (a change within the threshold)."""
    limit = gate.limit(metric)
    if metric == schema.FINAL_ACCURACY:
        return [reference - limit / 100, reference + limit / 100]
    return [reference * (1 - limit), reference * (1 + limit)]


def add_to_history(
    results_dir: str | Path, history: str | Path, declared=None, judged: Judgement | None = None
) -> int:
    """Append a result set's lines to the history, replacing the lines of the same night and
    series already there (the same set added twice is one night, not two), atomically."""
    rows = history_rows(results_dir, declared, judged)
    path = Path(history)
    path.parent.mkdir(parents=True, exist_ok=True)
    added = {line_identity(row) for row in rows}
    kept = []
    try:
        existing = read_text(path, what="history", limit=MAX_HISTORY_BYTES)
    except FileNotFoundError:
        existing = ""
    except DamagedFile as exc:
        raise BenchError(f"history {path} is {exc.problem}: nothing was added") from None
    if existing:
        for text in existing.splitlines():
            try:
                line = json.loads(text)
            except json.JSONDecodeError:
                kept.append(text)  # read_history names the damaged line
                continue
            if not (isinstance(line, dict) and line_identity(line) in added):
                kept.append(text)
    lines = kept + [json.dumps(row, sort_keys=True) for row in rows]
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text("".join(f"{text}\n" for text in lines))
    temporary.replace(path)
    return len(rows)


def line_identity(line: dict) -> tuple:
    """A history line's night and series: one line each in a history."""
    return (str(line.get(NIGHT)), *(str(line.get(k)) for k in SERIES_KEY))


#: a history line (``history_rows``): its series, its night, its metrics and the verdicts
#: that judged it
HistoryLine = record("HistoryLine", {
    # the series' key as bench compare's table holds it: words ("4" ranks, "-" where unknown)
    **dict.fromkeys(SERIES_KEY, Text), COMMIT_KEY: Text, WHEN: Text,
    NIGHT: Text, REPEATS: Count, schema.STATUS: Status, LABEL: Text,
    **dict.fromkeys(TREND_METRICS, Number),
    VERDICTS: dict[Name, Text], REFERENCE: dict[Name, Number],
    BAND: dict[Name, Annotated[list[Number], Field(min_length=2, max_length=2)]],
    THRESHOLDS: history_record(),
}, required=(*SERIES_KEY, WHEN))


def read_history(history: str | Path) -> pd.DataFrame:
    """The history's lines, each a valid ``HistoryLine``.

    Raises:
        BenchError: one line: the history is missing, not a regular text file, or a line is
            not JSON or not a history line (naming the line, the field and what it holds).
    """
    path = Path(history)
    try:
        content = read_text(path, what="history", limit=MAX_HISTORY_BYTES)
    except FileNotFoundError:
        raise BenchError(f"history {path} does not exist (bench trend --add RESULTS {path} "
                         "starts one)") from None
    except DamagedFile as exc:
        hint = (" (a history is JSON lines, one object per run key: bench trend --add writes "
                "it)" if exc.problem.startswith("not text") else "")
        raise BenchError(f"history {path} is {exc.problem}{hint}") from None
    lines = [history_line(text, f"history {path}: line {number}")
             for number, text in enumerate(content.splitlines(), 1) if text.strip()]
    if not lines:
        raise BenchError(f"history {path} is empty")
    return pd.DataFrame(lines)


def history_line(text: str, where: str) -> dict:
    """One line of a history, checked as a ``HistoryLine``.

    Raises:
        BenchError: it is not JSON, not an object with a method, or a field is wrong.
    """
    try:
        line = json.loads(text)
    except (ValueError, RecursionError):
        raise BenchError(f"{where} is not JSON") from None
    if not isinstance(line, dict) or not isinstance(line.get(schema.METHOD), str):
        raise BenchError(f"{where} is not a history line (a JSON object with a method and its "
                         "metrics)")
    try:
        validate(line, HistoryLine, where=where, text=text)
    except DamagedFile as exc:
        raise BenchError(str(exc)) from None
    return line


def noise(values: np.ndarray, floor: float) -> float:
    """The series' noise (sigma) from its successive differences, robust to steps."""
    diffs = np.diff(values)
    mad = float(np.median(np.abs(diffs - np.median(diffs)))) if len(diffs) else 0.0
    return max(1.4826 * mad / math.sqrt(2), floor)


def change_points(values: np.ndarray, floor: float) -> list[int]:
    """Indices where a new segment starts (PELT, least squares, BIC penalty)."""
    # lazy: ruptures costs ~0.7 s to import; only this path needs it
    import ruptures

    sigma = noise(values, floor)
    penalty = 2 * sigma**2 * math.log(len(values))
    breaks = ruptures.Pelt(model="l2", min_size=1, jump=1).fit(values.reshape(-1, 1))
    return [b for b in breaks.predict(pen=penalty) if b < len(values)]


def find_changes(history: pd.DataFrame, gate: Gate) -> tuple[list[ChangePoint], list[str], int]:
    """(change points beyond the thresholds, series too short for a verdict, runs in the
    longest series). Each metric steps by its threshold (``gate.limit``); times the gate did
    not judge (a busy runner) are left out of their series."""
    found, short, longest = [], [], 0
    for key, series in history.groupby(SERIES_KEY, sort=True):
        series = series.sort_values(WHEN)
        fields = dict(zip(SERIES_KEY, key))
        name = (f"[{fields[MACHINE_CLASS]}] {fields[schema.METHOD]} {fields[schema.WORKLOAD]} "
                f"{fields[schema.GPUS]} ranks {fields[schema.OPTIONS]}")
        longest = max(longest, len(series))
        if len(series) < MIN_RUNS:
            short.append(f"{name}: {len(series)} run(s)")
            continue
        for metric, sign in TREND_METRICS.items():
            if metric not in series:  # a history begun before the metric was kept
                continue
            found += series_changes(series, metric, sign, gate.limit(metric), name, key)
    return found, short, longest


def series_changes(series: pd.DataFrame, metric: str, sign: int, limit: float, name: str,
                   key: tuple) -> list[ChangePoint]:
    """The change points of one metric of one series that step beyond ``limit``."""
    points = series.assign(value=pd.to_numeric(series[metric], errors="coerce"))
    points = points[points["value"].notna()]  # e.g. no time ratio on a night DDP failed
    if metric in (TIME_RATIO, schema.ITERATION_SECONDS):  # as the gate: quiet runs only
        points = points[~busy_lines(points)]
    values = points["value"].to_numpy(dtype=float)
    if len(values) < MIN_RUNS:
        return []
    accuracy = metric == schema.FINAL_ACCURACY
    # rounding-level noise: 0.05 points of accuracy, 0.2 % of bytes and times
    floor = 0.0005 if accuracy else 0.002 * float(np.median(np.abs(values)))
    found = []
    for start in change_points(values, floor):
        before = float(np.mean(values[max(0, start - 3) : start]))
        after = float(np.mean(values[start : start + 3]))
        change = sign * step(before, after, accuracy)
        if abs(change) <= limit:
            continue
        row = points.iloc[start]
        found.append(ChangePoint(name, metric, start, str(row[COMMIT_KEY]), str(row[WHEN]),
                                 before, after, change, "points" if accuracy else "relative",
                                 len(points), key))
    return found


def step(before: float, after: float, accuracy: bool) -> float:
    """How far a series stepped: accuracy in points, anything else relative to before."""
    if accuracy:
        return 100 * (after - before)
    if before:
        return (after - before) / abs(before)
    return math.inf if after else 0.0
