"""``bench trend HISTORY``: add a nightly to the history, print its change points.

Each class's steps are judged at the thresholds the nightly judged it with: those its last
judged night recorded in the history, else its reference's ``gate.json``, else ``bench
compare``'s defaults (``suite.gate.trend.class_gate``); flags override them. So ``bench trend``
by hand and the nightly's give one verdict on one history, and the last line says which
thresholds judged.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from suite.commands.compare import declared_activity_check
from suite.gate.judge import judge_sets
from suite.gate.trend import MIN_RUNS, add_to_history, class_gate, find_changes, read_history
from suite.plugins.registry import METHODS
from suite.results.resultset import MACHINE_CLASS


def run_trend(
    history: str, add: str | None, given: dict[str, float | None], fail_on_last: bool, *,
    echo: Callable, against: str | None = None,
) -> int:
    """1 with --fail-on-last when a series' last run starts a worse segment, else 0. With
    --add and --against REFERENCE the added lines carry the gate's verdicts and the thresholds
    that judged them; with --against alone a class without judged lines is judged at the
    reference's ``gate.json``. ``given``: the thresholds the command line gave
    (``suite.gate.thresholds.flag_thresholds``)."""
    if add:
        judged = None
        if against:
            judged = judge_sets(against, add, given=given, declared=METHODS.defaults,
                                check_of=declared_activity_check)
        added = add_to_history(add, history, METHODS.defaults, judged)
        echo(f"added {added} series point(s) from {add} to {history}")
    frame = read_history(history)
    if MACHINE_CLASS not in frame:
        frame[MACHINE_CLASS] = "-"
    found, worse_last = 0, 0
    for machine, rows in frame.groupby(frame[MACHINE_CLASS].fillna("-"), sort=True):
        gate = class_gate(rows, str(machine), Path(against) if against else None)
        gate = gate.overridden(given)
        changes, short, longest = find_changes(rows, gate)
        for change in changes:
            echo(change.line())
        if short:
            echo(f"{len(short)} series have fewer than {MIN_RUNS} runs, the least a verdict "
                 f"needs (longest here: {longest}): {'; '.join(short[:3])}"
                 f"{' ...' if len(short) > 3 else ''}")
        last = [c for c in changes if c.worse and c.in_last_run]
        echo(f"{machine}: {len(changes)} change point(s) at {gate.describe()}; {len(last)} "
             "worse in the last run")
        found, worse_last = found + len(changes), worse_last + len(last)
    echo(f"{found} change point(s) in all; {worse_last} worse in the last run")
    return 1 if fail_on_last and worse_last else 0
