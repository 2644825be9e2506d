"""Two result sets judged by the gate: the baseline's runs of the NEW runs' classes, each
class with its own thresholds (its reference's ``gate.json``, or the command line's), every
metric compared, every finished NEW run's activity check. ``bench compare`` prints it and the
nightly's history records it (``bench trend --add --against``), so both say the same."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from suite.errors import RunFailed
from suite.gate.activity import ActivityCheck
from suite.gate.compare import (
    activity_rows,
    compare,
    describe_key,
    keys_of,
    load_summaries,
    with_exchange,
)
from suite.gate.reference import class_folders, gate_for, is_reference, no_reference
from suite.gate.thresholds import Gate, parse_metrics
from suite.results.resultset import Declared, nothing_declared


@dataclass
class Judgement:
    """What the gate says of NEW against BASELINE.

    Attributes:
        table: one row per key and metric (and activity check, and failed key); ``verdict``
            the words, ``regression`` whether it fails the gate.
        unmatched: "only in baseline" / "only in new" -> the keys, described.
        warnings: lines for stderr.
        matched: keys compared.
        new_runs: NEW's runs.
        gates: machine class -> the thresholds its runs were judged with.
    """

    table: pd.DataFrame
    unmatched: dict[str, list[str]]
    warnings: list[str]
    matched: int
    new_runs: int
    gates: dict[str, Gate] = field(default_factory=dict)

    @property
    def regressions(self) -> int:
        table = self.table
        return int(table["regression"].sum()) if "regression" in table else 0

    @property
    def failed(self) -> bool:
        """A regression, or NEW runs of which none matched (a gate that compared nothing)."""
        return bool(self.regressions or (self.new_runs and not self.matched))

    def verdict_line(self) -> str:
        """``0 regression(s); cpu-gloo-portable-t1 judged at accuracy 5 points, ...``."""
        judged = "; ".join(f"{klass} judged at {gate.describe()}" if klass != "-"
                           else f"judged at {gate.describe()}"
                           for klass, gate in self.gates.items())
        return f"{self.regressions} regression(s); {judged}"


def load_baseline(
    baseline: str | Path, new_classes: set[str], declared: Declared = nothing_declared
) -> tuple[pd.DataFrame, list[str]]:
    """The baseline's runs of the NEW runs' machine classes (a tree of class folders is read
    for those classes only).

    Raises:
        RunFailed: the baseline holds no reference of a NEW class (one line naming
            ``nox -s reference``).
    """
    folders = class_folders(Path(baseline))
    if not folders:
        base, warnings = load_summaries(baseline, declared)
        held = set(base.machine_class) - {"-"}
        missing = new_classes - held
        if missing and held and not new_classes & held:
            if not is_reference(Path(baseline)) or any(m.startswith("sim-") for m in missing):
                raise RunFailed(nothing_compared(missing, held))
            raise RunFailed(no_reference(missing, str(baseline), held))
        return base, warnings
    missing = new_classes - set(folders)
    if missing and any(m.startswith("sim-") for m in missing):
        raise RunFailed(nothing_compared(missing, set(folders)))
    if missing:
        raise RunFailed(no_reference(missing, str(baseline), set(folders)))
    frames, warnings = [], []
    for name in sorted(new_classes) or [next(iter(folders))]:  # none: NEW runs name no class
        frame, warned = load_summaries(folders[name], declared)
        frames.append(frame if new_classes else frame.iloc[0:0])
        warnings += warned
    return pd.concat(frames, ignore_index=True), warnings


def nothing_compared(new_classes: set[str], held: set[str]) -> str:
    """The one line for two sets of different machine classes, neither a reference: runs
    are compared only within a class, and a simulated class has no machine to record one."""
    return (f"nothing compared: NEW holds runs of {', '.join(sorted(new_classes))}, the "
            f"baseline of {', '.join(sorted(held))}; runs are compared only within one machine "
            "class (simulated runs with runs of the same profile)")


def unmatched_hint(baseline: Path, machine: str) -> str:
    """What the line of a method run under other settings than its baseline says to do."""
    if is_reference(baseline) and not machine.startswith("sim-"):
        return (f"; re-record the reference of {machine} with `nox -s reference -- --replace` "
                "on such a runner (after an intended change of a default), or --allow-unmatched")
    return "; compare runs of the same settings, or --allow-unmatched to judge only those"


def judge_sets(
    baseline: str | Path,
    new: str | Path,
    *,
    metrics: tuple[str, ...] = (),
    given: dict | None = None,
    declared: Declared = nothing_declared,
    check_of: Callable[[str], ActivityCheck | None] = lambda method: None,
    allow_unmatched: bool = False,
) -> Judgement:
    """Judge NEW against BASELINE.

    Args:
        baseline: a reference (a tree of class folders, or one class's folder) or any set.
        new: the set judged.
        metrics: ``--metric``'s names (empty: the gate's metrics).
        given: thresholds given on the command line (``Gate`` field -> value or None:
            ``suite.gate.thresholds.flag_thresholds``); they override the class's.
        declared: each method's option defaults (``METHODS.defaults``).
        check_of: method -> its activity check.
        allow_unmatched: a method both sides ran under different settings is listed as
            unmatched instead of failing the gate (``compare.settings_rows``).

    Returns:
        The judgement.
    """
    new_runs, warnings_new = load_summaries(new, declared)
    classes = sorted(set(new_runs.machine_class)) or ["-"]
    base, warnings_base = load_baseline(baseline, set(classes) - {"-"}, declared)
    tables, gates = [], {}
    unmatched: dict[str, list[str]] = {"only in baseline": [], "only in new": []}
    for machine in classes:
        gate = gate_for(Path(baseline), machine).overridden(given or {})
        gates[machine] = gate
        chosen = parse_metrics(metrics) if metrics else list(gate.metrics)
        table, left = compare(
            base[base.machine_class == machine], new_runs[new_runs.machine_class == machine],
            chosen, gate, None if allow_unmatched else unmatched_hint(Path(baseline), machine))
        tables.append(table)
        for side, keys in left.items():
            unmatched[side] += keys
    others = base[~base.machine_class.isin(classes)]
    unmatched["only in baseline"] += [describe_key(k) for k in sorted(keys_of(others), key=str)]
    activity, warnings_activity = activity_rows(new_runs, check_of)
    parts = [part for part in (*tables, pd.DataFrame(activity)) if len(part)]
    table = with_exchange(pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(),
                          base, new_runs)
    return Judgement(
        table=table, unmatched=unmatched,
        warnings=warnings_base + warnings_new + warnings_activity,
        matched=len(keys_of(base) & keys_of(new_runs)), new_runs=len(new_runs), gates=gates)
