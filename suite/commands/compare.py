"""``bench compare``: two result sets, like with like, as a table (text, Markdown for a CI job
summary, or JSON for scripts); the exit code says whether anything regressed."""

from __future__ import annotations

from collections.abc import Callable

from suite.errors import BenchError
from suite.results.compare import (
    as_json,
    compare,
    format_table,
    load_summaries,
    parse_metrics,
    parse_threshold,
)


def run_compare(
    baseline: str, new: str, max_regression: str, max_accuracy_drop: float,
    metric: tuple[str, ...], fmt: str, *, echo: Callable,
) -> int:  # fmt: skip
    """Print the comparison; 1 when a metric regressed or a NEW run failed, else 0 (bad
    input raises BenchError, exit 2)."""
    threshold = parse_threshold(max_regression)
    if not 0 <= max_accuracy_drop <= 100:
        raise BenchError(f"--max-accuracy-drop must be in [0, 100] points, got "
                         f"{max_accuracy_drop}")  # fmt: skip
    metrics = parse_metrics(metric)
    base, warn_base = load_summaries(baseline)
    new_runs, warn_new = load_summaries(new)
    warnings = warn_base + warn_new
    for line in warnings:
        echo(f"warning: {line}", err=True)
    table, unmatched = compare(base, new_runs, metrics, threshold, max_accuracy_drop)
    regressions = table[table.verdict.str.startswith("REGRESSION")] if len(table) else table
    if fmt == "json":
        echo(as_json(table, unmatched, len(regressions), warnings))
        return 1 if len(regressions) else 0
    echo(format_table(table, fmt))
    for side, keys in unmatched.items():
        for key in keys:
            echo(f"{'- ' if fmt == 'markdown' else ''}unmatched ({side}): {key}")
    echo(f"{len(regressions)} regression(s) beyond {threshold:.1%} (times, bytes) or "
         f"{max_accuracy_drop:g} accuracy points")  # fmt: skip
    return 1 if len(regressions) else 0
