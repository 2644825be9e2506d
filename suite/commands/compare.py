"""``bench compare``: two result sets, like with like, as a table (text, Markdown for a CI job
summary, or JSON for scripts); the exit code says whether anything regressed.

The judging is the gate's (suite.gate.judge): a baseline that is a reference (a tree of
per-class folders, ``reference/<class>/``, or one class's folder) judges NEW runs at
their class's thresholds (its ``gate.json``), flags override them, and the verdict line says
which judged; a class without a reference fails in one line naming ``nox -s reference``; NEW
runs of which none matched a baseline run fail too (never a silent pass with nothing
compared).
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable

from suite.gate.activity import crosses_nodes
from suite.gate.judge import judge_sets
from suite.gate.table import TEXT_WIDTH, as_json, format_table
from suite.plugins.registry import METHODS


def declared_activity_check(method: str):
    """The activity check ``method`` registered, else the default every method of several
    nodes must pass (``crosses_nodes``), also for a method not installed here."""
    entry = METHODS.find(method)
    return entry.activity if entry is not None and entry.activity is not None else crosses_nodes


def run_compare(
    baseline: str, new: str, given: dict[str, float | None], metric: tuple[str, ...], fmt: str,
    *, echo: Callable, wide: bool = False, allow_unmatched: bool = False,
) -> int:
    """Print the comparison; 1 when a metric regressed, a NEW run failed or did not do its
    method's job, there is no reference for the NEW runs' class, or no NEW run matched a
    baseline run (a gate that compared nothing must not pass), or a method ran under other
    settings than its baseline (unless ``allow_unmatched``), else 0 (bad input raises
    BenchError, exit 2). ``given``: the thresholds the command line gave
    (``suite.gate.thresholds.flag_thresholds``)."""
    judged = judge_sets(baseline, new, metrics=metric, given=given, declared=METHODS.defaults,
                        check_of=declared_activity_check, allow_unmatched=allow_unmatched)
    for line in judged.warnings:
        echo(f"warning: {line}", err=True)
    if fmt == "json":
        echo(as_json(judged.table, judged.unmatched, judged.regressions, judged.warnings,
                     judged.matched, {k: g.describe() for k, g in judged.gates.items()}))
        return int(judged.failed)
    echo(format_table(judged.table, fmt, wide=wide))
    for side, keys in judged.unmatched.items():
        for key in keys:
            echo(f"{'- ' if fmt == 'markdown' else ''}unmatched ({side}): {key}")
    line = judged.verdict_line()
    # the text table keeps to TEXT_WIDTH columns, and so does the verdict under it
    echo(line if fmt != "text" or wide else
         textwrap.fill(line, TEXT_WIDTH, subsequent_indent="  ", break_on_hyphens=False))
    if judged.new_runs and not judged.matched:
        echo(f"nothing compared: none of the {judged.new_runs} NEW run(s) matches a baseline "
             "run (see the unmatched above), so the gate fails", err=True)
    return int(judged.failed)
