"""``bench trend HISTORY``: add a nightly to the history, print its change points."""

from __future__ import annotations

from collections.abc import Callable

from suite.plugins.registry import METHODS
from suite.gate.compare import parse_threshold
from suite.gate.trend import MIN_RUNS, add_to_history, find_changes, read_history


def run_trend(
    history: str, add: str | None, max_regression: str, max_accuracy_drop: float,
    fail_on_last: bool, *, echo: Callable, max_time_regression: str | None = None,
) -> int:
    """1 with --fail-on-last when a series' last run starts a worse segment, else 0."""
    threshold = parse_threshold(max_regression)
    time_threshold = (
        threshold if max_time_regression is None else parse_threshold(max_time_regression)
    )
    if add:
        added = add_to_history(add, history, METHODS.defaults)
        echo(f"added {added} series point(s) from {add} to {history}")
    frame = read_history(history)
    changes, short, longest = find_changes(frame, threshold, max_accuracy_drop, time_threshold)
    for change in changes:
        echo(change.line())
    if short:
        echo(f"{len(short)} series have fewer than {MIN_RUNS} runs, the least a verdict needs "
             f"(longest here: {longest}): {'; '.join(short[:3])}"
             f"{' ...' if len(short) > 3 else ''}")
    last = [c for c in changes if c.worse and c.in_last_run]
    echo(f"{len(changes)} change point(s) beyond {threshold:.1%} (bytes, times) or "
         f"{max_accuracy_drop:g} accuracy points; {len(last)} worse in the last run")
    return 1 if fail_on_last and last else 0
