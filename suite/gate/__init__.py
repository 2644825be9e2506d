"""The regression gate, above the run-folder format: comparing result sets (``compare``),
each method's activity check (``activity``), judging two sets at a class's thresholds
(``judge``), change points over the nightly history (``trend``), the history as a static site
(``dashboard``), the reference policy (``reference``) and the thresholds that judge
(``thresholds``). ``bench compare``, ``bench trend``,
``bench dashboard`` and the nox sessions use this face; the rest is the modules' own.
"""

from suite.gate.judge import Judgement, judge_sets
from suite.gate.reference import (
    MIN_NIGHTLIES,
    NightlyPlan,
    calibrate_gate,
    chosen_methods,
    gate_for,
    kernels_repeat,
    plan_nightly,
    record_reference,
    reference_root,
    staging_root,
    this_machine_class,
)
from suite.gate.thresholds import DEFAULT_GATE, Gate

__all__ = [
    "DEFAULT_GATE",
    "MIN_NIGHTLIES",
    "Gate",
    "Judgement",
    "NightlyPlan",
    "calibrate_gate",
    "chosen_methods",
    "gate_for",
    "judge_sets",
    "kernels_repeat",
    "plan_nightly",
    "record_reference",
    "reference_root",
    "staging_root",
    "this_machine_class",
]
