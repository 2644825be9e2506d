"""``bench compare``: two result sets, like with like, as a table (text, Markdown for a CI job
summary, or JSON for scripts); the exit code says whether anything regressed.

A baseline may be a tree of references per machine class (``reference/<class>/``):
the NEW runs are compared with the reference of their own class, and a class that has none
fails in one line naming ``nox -s reference``; NEW runs of which none matched a baseline run
fail too (never a silent pass with nothing compared).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd

from suite.errors import BenchError, RunFailed
from suite.plugins.registry import METHODS
from suite.results.compare import (
    activity_rows,
    as_json,
    compare,
    format_table,
    keys_of,
    load_summaries,
    parse_metrics,
    parse_threshold,
    with_exchange,
)
from suite.results.machine import class_folders
from suite.results.reference import no_reference


def load_baseline(baseline: str, new_classes: set[str]) -> tuple[pd.DataFrame, list[str]]:
    """The baseline's runs of the NEW runs' machine classes."""
    folders = class_folders(Path(baseline))
    if not folders:
        base, warnings = load_summaries(baseline, METHODS.defaults)
        held = set(base.machine_class) - {"-"}
        missing = new_classes - held
        if missing and held and not new_classes & held:
            raise RunFailed(no_reference(missing, baseline, held))
        return base, warnings
    missing = new_classes - set(folders)
    if missing:
        raise RunFailed(no_reference(missing, baseline, set(folders)))
    frames, warnings = [], []
    for name in sorted(new_classes):
        frame, warned = load_summaries(folders[name], METHODS.defaults)
        frames.append(frame)
        warnings += warned
    return pd.concat(frames, ignore_index=True), warnings


def declared_activity_check(method: str):
    """The activity check ``method`` registered (None: none, or not installed here)."""
    entry = METHODS.find(method)
    return entry.activity if entry is not None else None


def run_compare(
    baseline: str, new: str, max_regression: str, max_accuracy_drop: float,
    metric: tuple[str, ...], fmt: str, *, echo: Callable, max_time_regression: str | None = None,
    max_loss_regression: str | None = None, wide: bool = False,
) -> int:
    """Print the comparison; 1 when a metric regressed, a NEW run failed or did not do its
    method's job, there is no reference for the NEW runs' class, or no NEW run matched a
    baseline run (a gate that compared nothing must not pass), else 0 (bad input raises
    BenchError, exit 2)."""
    threshold = parse_threshold(max_regression)
    time_threshold = None if max_time_regression is None else parse_threshold(max_time_regression)
    loss_threshold = None if max_loss_regression is None else parse_threshold(max_loss_regression)
    if not 0 <= max_accuracy_drop <= 100:
        raise BenchError(f"--max-accuracy-drop must be in [0, 100] points, got "
                         f"{max_accuracy_drop}")
    metrics = parse_metrics(metric)
    new_runs, warn_new = load_summaries(new, METHODS.defaults)
    base, warn_base = load_baseline(baseline, set(new_runs.machine_class) - {"-"})
    table, unmatched = compare(base, new_runs, metrics, threshold, max_accuracy_drop,
                               time_threshold, loss_threshold)
    activity, warn_activity = activity_rows(new_runs, declared_activity_check)
    if activity:
        table = pd.concat([table, pd.DataFrame(activity)], ignore_index=True)
    table = with_exchange(table, base, new_runs)
    warnings = warn_base + warn_new + warn_activity
    for line in warnings:
        echo(f"warning: {line}", err=True)
    regressions = table[table["regression"]] if len(table) else table
    matched = len(keys_of(base) & keys_of(new_runs))
    failed = 1 if len(regressions) or (len(new_runs) and not matched) else 0
    if fmt == "json":
        echo(as_json(table, unmatched, len(regressions), warnings, matched))
        return failed
    echo(format_table(table, fmt, wide=wide))
    for side, keys in unmatched.items():
        for key in keys:
            echo(f"{'- ' if fmt == 'markdown' else ''}unmatched ({side}): {key}")
    times = "" if time_threshold is None else f" ({time_threshold:.1%} times)"
    times += "" if loss_threshold is None else f" ({loss_threshold:.1%} training loss)"
    echo(f"{len(regressions)} regression(s) beyond {threshold:.1%} (times, bytes){times} or "
         f"{max_accuracy_drop:g} accuracy points")
    if len(new_runs) and not matched:
        echo(f"nothing compared: none of the {len(new_runs)} NEW run(s) matches a baseline "
             "run (see the unmatched above), so the gate fails", err=True)
    return failed
