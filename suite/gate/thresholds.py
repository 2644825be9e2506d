"""The gate's thresholds: one ``Gate`` says how far each metric may move, and this module is
the one place that reads and writes them (a class's ``gate.json``, the command line's
overrides, a history line's record of what judged it).

Each threshold is declared once, as a field of ``Gate`` (``threshold``): its key, which is
also its ``gate.json`` key, the history's and the command-line flag's name
(``max_accuracy_drop`` / ``--max-accuracy-drop``), its unit, its default and how the verdict
line names it. Each metric of the catalogue names the field that judges it
(``suite.results.catalogue.Metric.threshold``), so ``Gate.limit`` is the one answer that
``bench compare``, ``bench trend`` and the dashboard use, and a metric with a threshold of
its own is one catalogue row and one field here. No other module of the suite spells a
threshold's key (tests/gate/test_thresholds.py holds it to this module and the CLI).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated

from pydantic import Field, PlainValidator, StringConstraints

from suite.config import flag_of
from suite.errors import BenchError
from suite.results.catalogue import BY_ALIAS, BY_NAME, CATALOGUE, Metric
from suite.results.records import DamagedFile, Name, Number, Text, read_record, record

#: a class's thresholds, in its reference folder
GATE_FILE = "gate.json"
#: a threshold in accuracy points (an absolute change of 100 x the fraction)
POINTS = "points"
#: a threshold relative to the baseline's value (``"5%"`` or ``0.05`` in a file or a flag)
RELATIVE = "relative"
#: what ``--metric`` and gate.json call each metric -> its column
ALIASES = {alias: metric.name for alias, metric in BY_ALIAS.items()}
#: the most accuracy points a threshold may allow: a drop of all of it
MAX_POINTS = 100.0
#: the most a relative threshold may allow (1000 %): beyond it a threshold judges nothing
MAX_RELATIVE = 10.0


def threshold(key: str, default: float | None, words: str | None, unit: str = RELATIVE, *,
              always_kept: bool = False, none_means: str | None = None):
    """A ``Gate`` field that is a threshold.

    Args:
        key: its name in gate.json, in a history line and, as a flag, on the command line.
        default: its value for a class that has not measured its own (``DEFAULT``).
        words: what the verdict line calls what it judges (None: it judges no metric).
        unit: ``POINTS`` or ``RELATIVE``.
        always_kept: every judged history line holds it (a threshold added later is not
            held by older lines, which take its default).
        none_means: what None says where it is a value of the threshold (gate.json's null
            then says it, where an absent key takes the default); None: a threshold that is
            always a number, which a file may not give as null.
    """
    return field(default=default, metadata={"key": key, "words": words, "unit": unit,
                                            "always_kept": always_kept,
                                            "none_means": none_means})


#: the metrics a class's gate compares unless its gate.json says otherwise (aliases)
DEFAULT_METRICS = ("accuracy", "train-loss", "bytes", "time-ratio")


def parse_metrics(names: tuple[str, ...]) -> list[str]:
    """``--metric``'s (or gate.json's) names, aliases or columns, as columns, in the order
    given (a comma list counts as several); every metric of the catalogue when none.

    Raises:
        BenchError: a name no metric has, with the names known.
    """
    chosen = []
    for name in (n for item in names for n in item.split(",") if n):
        metric = ALIASES.get(name, name)
        if metric not in BY_NAME:
            known = ", ".join([*BY_NAME, *ALIASES])
            raise BenchError(f"unknown metric {name!r}; known: {known}")
        chosen.append(metric)
    return chosen or list(BY_NAME)


def parse_threshold(text, name: str) -> float:
    """``5%`` or ``0.05`` -> 0.05 (``name``: the flag or key the value came from, as a
    refusal names it; no default, which would name one threshold for all).

    Raises:
        BenchError: not a number or percentage, or outside 0 % to 1000 %.
    """
    raw = str(text).strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise BenchError(f"{name} {text!r} is not a fraction or percentage") from None
    if not 0 <= value <= MAX_RELATIVE:
        raise BenchError(f"{name} {text!r} must be between 0% and {MAX_RELATIVE:.0%}")
    return value


@dataclass(frozen=True)
class Gate:
    """The thresholds one comparison is judged with, and where they come from. Fields made
    by ``threshold`` are the thresholds (their declaration order is the verdict line's).

    Attributes:
        accuracy_drop: the final accuracy, in points.
        loss_regression: the final training loss, relative.
        regression: bytes and any metric that names no threshold of its own, relative.
        time_regression: times and the time ratio, relative.
        outside_load: the share of a runner's cores other processes may take before its
            times are not judged (None: always judged).
        metrics: what is compared (the catalogue's columns).
        source: where the thresholds come from, as the verdict line says.
    """

    accuracy_drop: float = threshold("max_accuracy_drop", 5.0, "accuracy", POINTS,
                                     always_kept=True)
    loss_regression: float = threshold("max_loss_regression", 0.02, "training loss",
                                       always_kept=True)
    regression: float = threshold("max_regression", 0.05, "bytes", always_kept=True)
    time_regression: float = threshold("max_time_regression", 0.15, "time", always_kept=True)
    outside_load: float | None = threshold("max_outside_load", 0.25, None,
                                           none_means="times are always judged")
    metrics: tuple[str, ...] = tuple(parse_metrics(DEFAULT_METRICS))
    source: str = "the gate's defaults"

    @classmethod
    def thresholds(cls) -> tuple[dataclasses.Field, ...]:
        """The fields that are thresholds, in declaration order."""
        return tuple(f for f in dataclasses.fields(cls) if "key" in f.metadata)

    @classmethod
    def threshold_of(cls, key: str) -> dataclasses.Field:
        """The threshold a key (``max_time_regression``) names."""
        return next(f for f in cls.thresholds() if f.metadata["key"] == key)

    def limit(self, metric: str | Metric) -> float:
        """How far ``metric`` (its column, or the catalogue's ``Metric``) may move: the
        threshold its catalogue row names, in that threshold's unit."""
        row = BY_NAME[metric] if isinstance(metric, str) else metric
        return getattr(self, row.threshold)

    def describe(self) -> str:
        """``accuracy 5 points, training loss 2.0%, bytes 5.0%, time 15.0% (cpu-gloo-...'s
        gate.json)``: the verdict line's account of its thresholds."""
        parts = []
        for f in self.thresholds():
            words, value = f.metadata["words"], getattr(self, f.name)
            if words is not None:
                parts.append(f"{words} {value:g} points" if f.metadata["unit"] == POINTS
                             else f"{words} {value:.1%}")
        quiet = ("" if self.outside_load is None else
                 f" on a runner at most {self.outside_load:.0%} busy")
        return f"{', '.join(parts)}{quiet} ({self.source})"

    def bounded(self) -> Gate:
        """These thresholds within what gate.json may hold (``MAX_POINTS``, ``MAX_RELATIVE``):
        a threshold measured from a wild spread (twice a 60-point accuracy deviation) allows
        everything at the bound, and a file written with it reads back."""
        tops = {POINTS: MAX_POINTS, RELATIVE: MAX_RELATIVE}
        return replace(self, **{f.name: min(value, tops[f.metadata["unit"]])
                                for f in self.thresholds()
                                if (value := getattr(self, f.name)) is not None})

    def overridden(self, given: dict[str, float]) -> Gate:
        """These thresholds with the ones given on the command line (``flag_thresholds``:
        field -> value; None: not given)."""
        chosen = {k: v for k, v in given.items() if v is not None}
        if not chosen:
            return self
        keys = {f.name: f.metadata["key"] for f in self.thresholds()}
        flags = ", ".join(flag_of(keys[name]) for name in chosen)
        return replace(self, **chosen, source=f"{self.source}; {flags} from the command line")

    def as_file(self) -> dict:
        """The thresholds as gate.json writes them: relative ones as percentages (``"15%"``),
        points as numbers, the metrics by their aliases."""
        document = {}
        for f in self.thresholds():
            value = getattr(self, f.name)
            relative = f.metadata["unit"] == RELATIVE and value is not None
            document[f.metadata["key"]] = f"{100 * value:g}%" if relative else value
        aliases = {metric.name: metric.alias for metric in CATALOGUE}
        return {**document, "metrics": [aliases[name] for name in self.metrics]}

    def as_history(self) -> dict:
        """The gate as a history line keeps it: its thresholds by key, what they were
        (``source``: ``describe``) and where they came from (``origin``)."""
        return {**{f.metadata["key"]: getattr(self, f.name) for f in self.thresholds()},
                "source": self.describe(), "origin": self.source}

    @classmethod
    def from_history(cls, kept) -> Gate | None:
        """The gate a history line recorded (``as_history``), or None where it records none
        (a line the gate did not judge)."""
        keys = [f.metadata["key"] for f in cls.thresholds() if f.metadata["always_kept"]]
        if not isinstance(kept, dict) or any(kept.get(key) is None for key in keys):
            return None
        values = {f.name: None if kept[key] is None else float(kept[key])
                  for f in cls.thresholds() if (key := f.metadata["key"]) in kept}
        return cls(**values, metrics=(),
                   source=f"{kept.get('origin') or 'its thresholds'}, as the history's last "
                   "judged night recorded them")


#: the thresholds of a class that has not measured its own, from cpu-gloo-amd25-avx512-t1's
#: perturbation study (benchmarks/measured/nightly_gate.md): a kernel change (AVX2, the
#: portable kernels, 2 threads per rank) moved the same seed's final training loss by at most
#: 0.05 % and accuracy by up to 2.2 points at a tenth of an epoch, the learning rate off by 10x
#: raised the loss by 43-78 %; bytes are exact; the time ratio's largest deviation over 5
#: quiet nightlies was 8.6 %. Time is judged only where other processes took at most a quarter
#: of the runner's cores over the run: a load of L cores outside a run of R ranks slows them by
#: up to L/R, which at a quarter of 2 cores is already a third of the time threshold.
DEFAULT = Gate()
#: ``DEFAULT`` as a gate.json holds it
DEFAULT_GATE = DEFAULT.as_file()
#: ``bench compare``'s thresholds for two sets neither of which is a reference
GENERIC = Gate(accuracy_drop=1.0, loss_regression=0.05, regression=0.05, time_regression=0.05,
               outside_load=None, metrics=tuple(parse_metrics(())),
               source="bench compare's defaults: the baseline is no reference")


#: the longest relative threshold gate.json may spell (``"12.5%"``)
MAX_RELATIVE_TEXT = 40


def _relative(value):
    """A relative threshold's JSON type, checked as one (pydantic would name the part of a
    ``float | str`` union that refused it, ``max_regression.float``, a field no file has);
    its value is ``parse_threshold``'s to judge."""
    if isinstance(value, bool) or not isinstance(value, int | float | str) or (
            isinstance(value, str) and len(value) > MAX_RELATIVE_TEXT):
        raise ValueError(f'should be a fraction (0.05) or a percentage ("5%") of at most '
                         f"{MAX_RELATIVE_TEXT} characters")
    return value


#: a relative threshold as gate.json writes it: ``"5%"`` or ``0.05``
Relative = Annotated[float | str, PlainValidator(_relative, json_schema_input_type=(
    float | Annotated[str, StringConstraints(max_length=MAX_RELATIVE_TEXT)]))]
#: accuracy points as gate.json writes them
Points = Annotated[float, Field(ge=0, le=MAX_POINTS)]


@functools.cache
def file_record(gate: type[Gate] = Gate) -> type:
    """gate.json's record: each threshold of ``gate`` by its key (any a class does not give
    are ``DEFAULT``'s) and the metrics."""
    return record(f"{gate.__name__}File", {
        **{f.metadata["key"]: Points if f.metadata["unit"] == POINTS else Relative
           for f in gate.thresholds()},
        "metrics": Annotated[list[Name], Field(max_length=64)],
    })


@functools.cache
def history_record(gate: type[Gate] = Gate) -> type:
    """A history line's record of the thresholds that judged it (``Gate.as_history``):
    points within what gate.json and the flag allow."""
    return record("Thresholds", {**{f.metadata["key"]: Points if f.metadata["unit"] == POINTS
                                    else Number for f in gate.thresholds()},
                                 "source": Text, "origin": Text},
                  required=(*(f.metadata["key"] for f in gate.thresholds()
                              if f.metadata["always_kept"]), "source"))


#: gate.json: a class's thresholds
GateFile = file_record()


def file_threshold(declared: dataclasses.Field, value) -> float | None:
    """A threshold as gate.json gives it (its record's type checked) -> its value: null is
    None where None says something (``max_outside_load``: times always judged), and
    refused elsewhere rather than read as the default an absent key takes.

    Raises:
        BenchError: null for a threshold that is always a number, or a value out of range.
    """
    key, default = declared.metadata["key"], declared.default
    if value is None:
        if declared.metadata["none_means"] is None:
            raise BenchError(f"{key}: null, but it is always a number (leave it out for the "
                             f"default, {default:g})")
        return None
    return float(value) if declared.metadata["unit"] == POINTS else parse_threshold(value, key)


def read_gate(folder: Path, gate: type[Gate] = Gate) -> Gate:
    """A class's thresholds: its reference's gate.json over ``gate``'s defaults.

    Raises:
        BenchError: the gate.json is not a valid one (one line naming the field).
    """
    path = Path(folder) / GATE_FILE
    try:
        measured = read_record(path, file_record(gate), what="gate file")
    except FileNotFoundError:
        measured = None
    except DamagedFile as exc:
        raise BenchError(str(exc)) from None
    given = measured or {}
    source = (f"{Path(folder).name}/{GATE_FILE}" if measured is not None
              else f"the gate's defaults: {Path(folder).name} has no {GATE_FILE}")
    values = {}
    try:
        for f in gate.thresholds():
            if f.metadata["key"] in given:  # null is a value where it says something
                values[f.name] = file_threshold(f, given[f.metadata["key"]])
        if given.get("metrics") is not None:
            values["metrics"] = tuple(parse_metrics(tuple(given["metrics"])))
    except BenchError as exc:
        raise BenchError(f"{path}: {exc}") from None
    return gate(**values, source=source)


def write_gate(folder: Path, gate: Gate, measured: dict) -> Path:
    """Write ``gate`` as ``folder``'s gate.json, with how its thresholds were ``measured``;
    returns its path."""
    path = Path(folder) / GATE_FILE
    path.write_text(json.dumps({**gate.as_file(), "measured": measured}, indent=2) + "\n")
    return path


def flag_thresholds(gate: type[Gate] = Gate, **flags) -> dict[str, float | None]:
    """The thresholds given on the command line (flag name as its key -> the text or number
    given, None: not given), parsed, by field.

    Raises:
        BenchError: a value that is not a threshold, naming its flag.
    """
    given = {}
    for key, value in flags.items():
        declared = gate.threshold_of(key)
        if value is None:
            given[declared.name] = None
        elif declared.metadata["unit"] == POINTS:
            if not 0 <= float(value) <= MAX_POINTS:
                raise BenchError(f"{flag_of(key)} must be in [0, {MAX_POINTS:g}] points, "
                                 f"got {value}")
            given[declared.name] = float(value)
        else:
            given[declared.name] = parse_threshold(value, flag_of(key))
    return given
