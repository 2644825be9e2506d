"""``bench trend HISTORY``: add a nightly to the history, print its change points."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from suite.commands.compare import declared_activity_check, given_thresholds
from suite.gate.judge import judge_sets
from suite.gate.reference import GENERIC, gate_for
from suite.gate.trend import MIN_RUNS, add_to_history, find_changes, read_history
from suite.plugins.registry import METHODS


def run_trend(
    history: str, add: str | None, max_regression: str | None,
    max_accuracy_drop: float | None, fail_on_last: bool, *, echo: Callable,
    max_time_regression: str | None = None, against: str | None = None,
) -> int:
    """1 with --fail-on-last when a series' last run starts a worse segment, else 0. With
    --against REFERENCE the added lines carry the gate's verdicts, and the steps are judged at
    the reference class's thresholds (flags override them), as ``bench compare`` judges."""
    given = given_thresholds(max_regression, max_accuracy_drop, max_time_regression, None)
    gate = GENERIC.overridden(given)
    if add:
        judged = None
        if against:
            judged = judge_sets(against, add, given=given, declared=METHODS.defaults,
                                check_of=declared_activity_check)
            if len(judged.gates) == 1:
                gate = next(iter(judged.gates.values()))
        added = add_to_history(add, history, METHODS.defaults, judged)
        echo(f"added {added} series point(s) from {add} to {history}")
    elif against:
        frame = read_history(history)
        classes = sorted(set(frame.machine_class) - {"-"})
        if len(classes) == 1:
            gate = gate_for(Path(against), classes[0]).overridden(given)
    frame = read_history(history)
    changes, short, longest = find_changes(frame, gate.max_regression, gate.max_accuracy_drop,
                                           gate.max_time_regression, gate.max_loss_regression)
    for change in changes:
        echo(change.line())
    if short:
        echo(f"{len(short)} series have fewer than {MIN_RUNS} runs, the least a verdict needs "
             f"(longest here: {longest}): {'; '.join(short[:3])}"
             f"{' ...' if len(short) > 3 else ''}")
    last = [c for c in changes if c.worse and c.in_last_run]
    echo(f"{len(changes)} change point(s) at {gate.describe()}; {len(last)} worse in the "
         "last run")
    return 1 if fail_on_last and last else 0
