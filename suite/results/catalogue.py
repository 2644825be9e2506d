"""What identifies a run and what is measured of it, each declared once beside the schema's
names: the gate's comparisons, the nightly history's series, the report's configurations and
the dashboard's panels all derive their keys and metrics from here, so a key added to a run's
identity or a metric added to the gate reaches every reader at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from suite.results import schema
from suite.results.resultset import MACHINE_CLASS, SETTING

#: what makes two runs the same experiment, seeds aside: comparable by the gate, pooled as
#: repeats by the report. The order is the report's columns' (method first).
RUN_IDENTITY = (schema.METHOD, schema.WORKLOAD, schema.DATASET, schema.GPUS, schema.OPTIONS,
                SETTING, MACHINE_CLASS, schema.BATCH_SIZE, schema.LR, schema.LR_SCHEDULE,
                schema.EPOCHS)
#: the identity in the gate's order, machine class first: a comparison's table and a
#: history's series read class by class
GATE_KEY = (MACHINE_CLASS, *(key for key in RUN_IDENTITY if key != MACHINE_CLASS))
#: what a method chooses for itself: its name, its options and its optimizer's schedule
METHOD_CHOICES = (schema.METHOD, schema.OPTIONS, schema.LR, schema.LR_SCHEDULE)
#: what a run shares with its DDP twin (the dense reference of time ratios and activity
#: checks): the identity without the method's own choices
TWIN_KEY = tuple(key for key in GATE_KEY if key not in METHOD_CHOICES)
#: a nightly history's series: the identity without the recipe and budget the nightly fixes
SERIES_KEY = tuple(key for key in GATE_KEY if key not in (
    schema.BATCH_SIZE, schema.LR, schema.LR_SCHEDULE, schema.EPOCHS))

#: the dense method every other is measured against: time ratios divide by its twin's time,
#: activity checks by its bytes, and the nightly always runs it (the one plugin name the gate
#: knows, declared here only)
DENSE_METHOD = "ddp"
#: a run's time per step over its DENSE_METHOD twin's (computed by the gate, not recorded)
TIME_RATIO = "time_ratio"


@dataclass(frozen=True)
class Metric:
    """One number the gate judges.

    Attributes:
        name: its column (the summary's key, or ``TIME_RATIO``).
        alias: what ``--metric`` and the tables call it.
        words: what a chart's title calls it.
        direction: +1 when higher is better, -1 when lower is.
        scale: the factor its values are shown at (accuracy as %, bytes as MB).
        unit: the unit of the shown values.
        timing: a time, judged only on a quiet runner.
        trended: followed over the nightly history (``bench trend``).
        threshold: the field of the gate's thresholds that judges it
            (``suite.gate.thresholds.Gate``); the default, ``regression``, is the one of
            every metric that has none of its own.
    """

    name: str
    alias: str
    words: str
    direction: int
    scale: float = 1.0
    unit: str = ""
    timing: bool = False
    trended: bool = True
    threshold: str = "regression"


#: every metric of the gate, in the order tables list them
CATALOGUE = (
    Metric(schema.FINAL_ACCURACY, "accuracy", "accuracy", +1, 100.0, "%",
           threshold="accuracy_drop"),
    Metric(schema.FINAL_TRAIN_LOSS, "train-loss", "final training loss", -1,
           threshold="loss_regression"),
    Metric(TIME_RATIO, "time-ratio", "time ratio to DDP", -1, timing=True,
           threshold="time_regression"),
    Metric(schema.ITERATION_SECONDS, "time", "seconds per iteration", -1, unit=" s",
           timing=True, threshold="time_regression"),
    Metric(schema.TIME_TO_TARGET_SECONDS, "time-to-target", "seconds to the target accuracy", -1,
           unit=" s", timing=True, trended=False, threshold="time_regression"),
    Metric(schema.INTER_NODE_BYTES_PER_ITERATION, "bytes", "inter-node bytes per iteration", -1,
           1e-6, " MB"),
)
#: what ``--metric`` calls a metric -> its Metric
BY_ALIAS = {metric.alias: metric for metric in CATALOGUE}
#: a metric's column -> its Metric
BY_NAME = {metric.name: metric for metric in CATALOGUE}


def directions(*, trended_only: bool = False) -> dict[str, int]:
    """Metric name -> +1 (higher is better) or -1, for every metric or the trended ones."""
    return {m.name: m.direction for m in CATALOGUE if m.trended or not trended_only}


def insert_after(keys: tuple[str, ...], after: str, *inserted: str) -> list[str]:
    """``keys`` with ``inserted`` placed after ``after``: a reader's own columns among the
    identity's, in reading order."""
    at = keys.index(after) + 1
    return [*keys[:at], *inserted, *keys[at:]]
